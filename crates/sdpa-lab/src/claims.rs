//! Claims: every conclusion of the report is a statement with the check that decides it, and
//! its outcome is computed from the experiment's own numbers.
//!
//! An experiment's `analyze` turns its measured cells into [`Claim`]s with a pure function, so
//! that tests can feed it numbers that contradict a claim and watch it fail. A claim is the
//! article's (it quotes the article's sentence, see [`crate::article`]) or the lab's own. Every
//! threshold, margin and level is an argument written beside the claim in the code, fixed before
//! any run. The experiment's [`Verdict`] follows from all of its claims.

use serde::Serialize;

use crate::article::Quote;
use crate::stats::Estimate;

/// How a claim came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// The check passed.
    Holds,
    /// The check failed: the data contradict the claim.
    Fails,
    /// Holds under some of the conditions it was checked in and fails under others (they are
    /// listed in the claim).
    Conditional,
    /// The data cannot decide (an interval straddles the threshold, or the run was too small).
    Undecided,
}

impl Outcome {
    /// As printed in the report.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Holds => "holds",
            Outcome::Fails => "FAILS",
            Outcome::Conditional => "conditional",
            Outcome::Undecided => "undecided",
        }
    }

    /// From a decision: `Some(true)` holds, `Some(false)` fails, `None` undecided.
    pub fn of(decision: Option<bool>) -> Self {
        match decision {
            Some(true) => Outcome::Holds,
            Some(false) => Outcome::Fails,
            None => Outcome::Undecided,
        }
    }

    /// The outcome of a claim checked under several conditions: holds when it holds in all,
    /// fails when it fails in all, conditional when it holds in some and fails in others,
    /// undecided otherwise (some undecided and the decided ones agree, or no condition).
    pub fn across(outcomes: &[Outcome]) -> Self {
        let any = |o: Outcome| outcomes.contains(&o);
        if outcomes.is_empty() {
            Outcome::Undecided
        } else if outcomes.iter().all(|o| *o == Outcome::Holds) {
            Outcome::Holds
        } else if outcomes.iter().all(|o| *o == Outcome::Fails) {
            Outcome::Fails
        } else if (any(Outcome::Holds) || any(Outcome::Conditional))
            && (any(Outcome::Fails) || any(Outcome::Conditional))
        {
            Outcome::Conditional
        } else {
            Outcome::Undecided
        }
    }
}

/// Who makes a claim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Source {
    /// The article, in its own words.
    Article(&'static Quote),
    /// This lab: a correction of the article, or a measurement it does not make.
    Lab,
}

impl Source {
    /// Whether the article makes the claim.
    pub fn is_article(&self) -> bool {
        matches!(self, Source::Article(_))
    }
}

/// One condition of a claim checked under several (e.g. one initialization and d_k).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Condition {
    /// The condition, e.g. `unit init, d_k = 1024`.
    pub label: String,
    /// What was measured there.
    pub measured: String,
    /// The outcome there.
    pub outcome: Outcome,
}

/// A statement, the check that decides it and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Claim {
    /// Unique within the experiment, e.g. `jacobian-almost-zero`.
    pub id: String,
    /// Who makes it.
    pub source: Source,
    /// What is claimed, in one line (for the article: what the quoted sentence says, as tested).
    pub statement: String,
    /// How it is decided: the statistic, its interval or test, and the threshold.
    pub check: String,
    /// The measured numbers the check used.
    pub measured: String,
    /// The outcome.
    pub outcome: Outcome,
    /// The conditions it was checked under, when more than one.
    pub conditions: Vec<Condition>,
}

impl Claim {
    /// A claim decided by `holds` (None: undecided), with its check and measurement in words.
    pub fn decided(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        check: impl Into<String>,
        measured: impl Into<String>,
        holds: Option<bool>,
    ) -> Self {
        Self {
            id: id.into(),
            source,
            statement: statement.into(),
            check: check.into(),
            measured: measured.into(),
            outcome: Outcome::of(holds),
            conditions: Vec::new(),
        }
    }

    /// A claim checked under several conditions; its outcome is [`Outcome::across`] them.
    pub fn per_condition(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        check: impl Into<String>,
        conditions: Vec<Condition>,
    ) -> Self {
        let outcomes: Vec<Outcome> = conditions.iter().map(|c| c.outcome).collect();
        let outcome = Outcome::across(&outcomes);
        let measured = conditions
            .iter()
            .map(|c| format!("{}: {} ({})", c.label, c.measured, c.outcome.label()))
            .collect::<Vec<_>>()
            .join("; ");
        Self {
            id: id.into(),
            source,
            statement: statement.into(),
            check: check.into(),
            measured,
            outcome,
            conditions,
        }
    }

    /// Holds when the whole 95% interval of `estimate` is below `threshold`, fails when the whole
    /// interval is at or above it, undecided when it straddles it (or has no width: one draw).
    pub fn below(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        what: &str,
        estimate: Estimate,
        threshold: f64,
    ) -> Self {
        Self::decided(
            id,
            source,
            statement,
            format!("{what}: 95% interval below {threshold}"),
            format!("{what} = {}, n = {}", show(estimate), estimate.n),
            side(estimate, threshold, true),
        )
    }

    /// Holds when the whole 95% interval of `estimate` is above `threshold` (see
    /// [`below`](Self::below)).
    pub fn above(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        what: &str,
        estimate: Estimate,
        threshold: f64,
    ) -> Self {
        Self::decided(
            id,
            source,
            statement,
            format!("{what}: 95% interval above {threshold}"),
            format!("{what} = {}, n = {}", show(estimate), estimate.n),
            side(estimate, threshold, false),
        )
    }

    /// An equivalence claim, "the value lies in `[lo, hi]`", decided by two one-sided tests at
    /// 5% each: holds when the 90% interval lies inside the band, fails when the 95% interval
    /// lies entirely outside it, undecided otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn in_range(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        what: &str,
        estimate: Estimate,
        lo: f64,
        hi: f64,
    ) -> Self {
        Self::decided(
            id,
            source,
            statement,
            format!("{what}: 90% interval inside [{lo}, {hi}] (TOST at 5% per side)"),
            format!("{what} = {}, n = {}", show(estimate), estimate.n),
            inside(estimate, lo, hi),
        )
    }

    /// Holds when `value` is within `tolerance` of `target` (a deterministic figure).
    pub fn within(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        what: &str,
        value: f64,
        target: f64,
        tolerance: f64,
    ) -> Self {
        Self::decided(
            id,
            source,
            statement,
            format!("|{what} − {target}| ≤ {tolerance}"),
            format!("{what} = {}", short(value)),
            Some((value - target).abs() <= tolerance),
        )
    }
}

/// The equivalence decision "the value lies in `[lo, hi]`": true when the 90% interval (the 95%
/// one when the estimate has no 90% interval: stricter) lies inside, false when the 95% interval
/// lies entirely outside, `None` when neither (or no finite interval).
pub fn inside(e: Estimate, lo: f64, hi: f64) -> Option<bool> {
    let (a, b) = e.ci90.unwrap_or((e.lo, e.hi));
    if !(a.is_finite() && b.is_finite() && e.lo.is_finite() && e.hi.is_finite()) {
        None
    } else if a >= lo && b <= hi {
        Some(true)
    } else if e.hi < lo || e.lo > hi {
        Some(false)
    } else {
        None
    }
}

/// Whether `a`'s 95% interval lies entirely below `b`'s: true when it does, false when it lies
/// entirely above, `None` when they overlap.
pub fn interval_below(a: Estimate, b: Estimate) -> Option<bool> {
    if a.hi < b.lo {
        Some(true)
    } else if a.lo > b.hi {
        Some(false)
    } else {
        None
    }
}

/// Holds / fails / undecided for an interval against a threshold.
pub fn side(e: Estimate, threshold: f64, below: bool) -> Option<bool> {
    if e.lo.is_nan() || e.hi.is_nan() || e.lo > e.hi {
        return None;
    }
    let (all_below, all_above) = (e.hi < threshold, e.lo >= threshold);
    match (below, all_below, all_above) {
        (true, true, _) | (false, _, true) => Some(true),
        (true, _, true) | (false, true, _) => Some(false),
        _ => None,
    }
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

/// How an experiment's measurements relate to the article, from all of its claims (the
/// article's and the lab's), with one vocabulary applied the same way everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Every claim holds.
    Reproduced,
    /// Some claim of the article fails, and every claim of the lab (its corrections and
    /// measurements) holds.
    Corrected,
    /// Nothing fails outright, but some claim holds only under some conditions (listed).
    Conditional,
    /// Some claims hold and some fail (a failed lab claim included).
    PartlySupported,
    /// Claims fail and none holds.
    NotSupported,
    /// Nothing fails, but some claim could not be decided by this run (e.g. `--quick`).
    Undecided,
}

impl Verdict {
    /// As written in the report.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Corrected => "corrected",
            Verdict::Conditional => "conditional",
            Verdict::PartlySupported => "partly supported",
            Verdict::NotSupported => "not supported",
            Verdict::Undecided => "undecided",
        }
    }

    /// The verdict a list of claims gives.
    pub fn from_claims(claims: &[Claim]) -> Self {
        let has = |o: Outcome| claims.iter().any(|c| c.outcome == o);
        let article_fails = claims
            .iter()
            .any(|c| c.source.is_article() && c.outcome == Outcome::Fails);
        let lab_all_hold = claims
            .iter()
            .filter(|c| !c.source.is_article())
            .all(|c| c.outcome == Outcome::Holds);
        if !claims.is_empty() && claims.iter().all(|c| c.outcome == Outcome::Holds) {
            Verdict::Reproduced
        } else if !has(Outcome::Fails) && has(Outcome::Conditional) {
            Verdict::Conditional
        } else if !has(Outcome::Fails) {
            Verdict::Undecided
        } else if article_fails && lab_all_hold {
            Verdict::Corrected
        } else if has(Outcome::Holds) || has(Outcome::Conditional) {
            Verdict::PartlySupported
        } else {
            Verdict::NotSupported
        }
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
                format!("**{}**", c.outcome.label()),
            ]
        })
        .collect();
    crate::markdown::md_table(
        &["claim by", "statement", "check", "measured", "outcome"],
        &rows,
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(value: f64, lo: f64, hi: f64) -> Estimate {
        Estimate {
            value,
            lo,
            hi,
            n: 10,
            ci90: None,
        }
    }

    #[test]
    fn intervals_decide_or_abstain() {
        let c = |e| Claim::below("x", Source::Lab, "x < 0", "x", e, 0.0).outcome;
        assert_eq!(c(estimate(-1.0, -1.5, -0.5)), Outcome::Holds);
        assert_eq!(c(estimate(1.0, 0.5, 1.5)), Outcome::Fails);
        assert_eq!(c(estimate(0.1, -0.5, 0.7)), Outcome::Undecided);
        assert_eq!(c(estimate(0.1, f64::NAN, f64::NAN)), Outcome::Undecided);
        let a = |e| Claim::above("x", Source::Lab, "x > 0", "x", e, 0.0).outcome;
        assert_eq!(a(estimate(1.0, 0.5, 1.5)), Outcome::Holds);
        assert_eq!(a(estimate(-1.0, -1.5, -0.5)), Outcome::Fails);
    }

    #[test]
    fn equivalence_reads_the_90_percent_interval() {
        // 95% interval pokes out of the band, 90% interval is inside: equivalent (TOST).
        let e = Estimate {
            ci90: Some((0.96, 1.04)),
            ..estimate(1.0, 0.94, 1.06)
        };
        assert_eq!(inside(e, 0.95, 1.05), Some(true));
        assert_eq!(inside(estimate(1.0, 0.94, 1.06), 0.95, 1.05), None);
        assert_eq!(inside(estimate(2.0, 1.9, 2.1), 0.95, 1.05), Some(false));
    }

    #[test]
    fn conditions_combine() {
        use Outcome::*;
        assert_eq!(Outcome::across(&[Holds, Holds]), Holds);
        assert_eq!(Outcome::across(&[Fails, Fails]), Fails);
        assert_eq!(Outcome::across(&[Holds, Fails]), Conditional);
        assert_eq!(Outcome::across(&[Holds, Undecided]), Undecided);
        assert_eq!(Outcome::across(&[Holds, Fails, Undecided]), Conditional);
        assert_eq!(Outcome::across(&[]), Undecided);
    }

    #[test]
    fn verdicts_follow_all_claims() {
        static Q: Quote = Quote {
            section: "§1",
            zh: "",
            en: "",
        };
        let claim = |source, outcome| Claim {
            id: "c".into(),
            source,
            statement: String::new(),
            check: String::new(),
            measured: String::new(),
            outcome,
            conditions: Vec::new(),
        };
        let article = |o| claim(Source::Article(&Q), o);
        let lab = |o| claim(Source::Lab, o);
        use Outcome::*;
        let v = Verdict::from_claims;
        assert_eq!(v(&[article(Holds), lab(Holds)]), Verdict::Reproduced);
        assert_eq!(v(&[article(Fails), lab(Holds)]), Verdict::Corrected);
        assert_eq!(
            v(&[article(Holds), article(Fails), lab(Holds)]),
            Verdict::Corrected
        );
        assert_eq!(v(&[article(Fails), lab(Fails)]), Verdict::NotSupported);
        // A failed lab claim counts: nothing is "undecided" once something failed.
        assert_eq!(v(&[article(Holds), lab(Fails)]), Verdict::PartlySupported);
        assert_eq!(v(&[article(Holds), lab(Undecided)]), Verdict::Undecided);
        assert_eq!(v(&[article(Conditional), lab(Holds)]), Verdict::Conditional);
        assert_eq!(
            v(&[article(Conditional), lab(Fails)]),
            Verdict::PartlySupported
        );
    }
}
