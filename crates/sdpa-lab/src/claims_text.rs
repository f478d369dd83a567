//! How claims are written out: numbers as the report prints them, a claims table, and the
//! one-line summaries of an experiment's claims.

use super::{Claim, Outcome, Source};
use crate::stats::Estimate;

/// The sentence a claim's quote checks: a sentence checked in parts has its part's name in
/// brackets after the quote.
pub fn sentence_of(zh: &str) -> &str {
    zh.split('（').next().unwrap_or(zh)
}

/// A number in a few significant digits.
pub fn short(x: f64) -> String {
    if x.is_infinite() {
        if x > 0.0 {
            "∞".into()
        } else {
            "−∞".into()
        }
    } else if x == 0.0 || (1e-3..1e4).contains(&x.abs()) {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

/// An estimate with its interval (or a note that there is too little data for one).
pub fn show(e: Estimate) -> String {
    if !e.lo.is_nan() && !e.hi.is_nan() {
        format!("{} [{}, {}]", short(e.value), short(e.lo), short(e.hi))
    } else if e.value.is_finite() {
        format!("{} (no interval from {} points)", short(e.value), e.n)
    } else {
        format!("not measurable ({} points)", e.n)
    }
}

/// A p-value in a few digits.
pub fn show_p(p: f64) -> String {
    if p < 1e-4 {
        format!("{p:.1e}")
    } else {
        format!("{p:.4}")
    }
}

/// A p-value with its relation, for prose: `= 0.42`, or `< 0.001` below it.
pub fn short_p(p: f64) -> String {
    if p < 0.001 {
        "< 0.001".into()
    } else {
        format!("= {p:.2}")
    }
}

/// The Markdown table of an experiment's claims.
pub fn claims_table(claims: &[Claim]) -> String {
    let rows: Vec<Vec<String>> = claims
        .iter()
        .map(|c| {
            vec![
                match &c.source {
                    Source::Article(q) => format!("article {}: «{}»", q.section, q.en),
                    Source::Lab => "lab".into(),
                },
                c.statement.clone(),
                c.check.clone(),
                c.measured.clone(),
                match &c.cannot_fail {
                    Some(why) => format!("{} (not counted: {why})", c.outcome_text()),
                    None => c.outcome_text(),
                },
            ]
        })
        .collect();
    crate::markdown::md_table(
        &["claim by", "statement", "check", "measured", "outcome"],
        &rows,
    )
}

/// One sentence on the article's claims: what held, what failed, what is conditional or
/// undecided ("no claim of the article" when there is none).
pub fn article_summary(claims: &[Claim]) -> String {
    summary_of(claims, true, "no claim of the article")
}

/// One line on the lab's own hypotheses (its corrections and added measurements), apart from
/// the verdict on the article ("none" when the experiment adds none).
pub fn lab_summary(claims: &[Claim]) -> String {
    summary_of(claims, false, "none")
}

/// [`summary`] of the article's claims (`article`) or the lab's, `empty` when there is none; a
/// claim that could not have failed is not counted, only named.
fn summary_of(claims: &[Claim], article: bool, empty: &str) -> String {
    let picked: Vec<Claim> = claims
        .iter()
        .filter(|c| c.source.is_article() == article && c.counts())
        .cloned()
        .collect();
    let uncounted: Vec<&str> = claims
        .iter()
        .filter(|c| c.source.is_article() == article && !c.counts())
        .map(|c| c.id.as_str())
        .collect();
    let mut s = if picked.is_empty() {
        empty.to_string()
    } else {
        summary(&picked)
    };
    if !uncounted.is_empty() {
        s.push_str(&format!(
            "; not counted (the ledger says why): {}",
            uncounted.join(", ")
        ));
    }
    s
}

/// One sentence from the claims: what held, what failed, what is conditional or undecided.
pub fn summary(claims: &[Claim]) -> String {
    let of = |outcome: Outcome| claims.iter().filter(|c| c.outcome == outcome).count();
    let ids = |outcome: Outcome| {
        claims
            .iter()
            .filter(|c| c.outcome == outcome)
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut s = format!("{} of {} claims hold", of(Outcome::Holds), claims.len());
    for (outcome, word) in [
        (Outcome::Fails, "failed"),
        (Outcome::Conditional, "conditional"),
        (Outcome::Undecided, "undecided"),
    ] {
        if of(outcome) > 0 {
            s.push_str(&format!("; {word}: {}", ids(outcome)));
        }
    }
    s
}
