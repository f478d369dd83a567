//! Claims: every conclusion of the report is a statement with the check that decides it, and
//! its outcome is computed from the experiment's own numbers.
//!
//! An experiment turns its measured results into a list of [`Claim`]s with a pure function (so
//! that tests can feed it numbers that contradict a claim and watch it fail). Claims of the
//! article say what the article says; the lab's own claims state the correction or the
//! measurement the article does not make. The experiment's [`Verdict`] follows from them.

use serde::Serialize;

use crate::stats::Estimate;

/// How a claim came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// The check passed.
    Holds,
    /// The check failed: the data contradict the claim.
    Fails,
    /// The data cannot decide (an interval straddles the threshold, or the run was too small).
    Undecided,
}

impl Outcome {
    /// As printed in the report.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Holds => "holds",
            Outcome::Fails => "FAILS",
            Outcome::Undecided => "undecided",
        }
    }
}

/// Who makes a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Source {
    /// The article, in the section named.
    Article(&'static str),
    /// This lab: a correction of the article, or a measurement it does not make.
    Lab,
}

/// A statement, the check that decides it and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Claim {
    /// Unique within the experiment, e.g. `jacobian-vanishes`.
    pub id: &'static str,
    /// Who makes it.
    pub source: Source,
    /// What is claimed, in one line (for the article: a paraphrase).
    pub statement: String,
    /// How it is decided: the statistic, its interval and the threshold.
    pub check: String,
    /// The measured numbers the check used.
    pub measured: String,
    /// The outcome.
    pub outcome: Outcome,
}

impl Claim {
    /// A claim decided by `holds` (None: undecided), with its check and measurement in words.
    pub fn decided(
        id: &'static str,
        source: Source,
        statement: impl Into<String>,
        check: impl Into<String>,
        measured: impl Into<String>,
        holds: Option<bool>,
    ) -> Self {
        Self {
            id,
            source,
            statement: statement.into(),
            check: check.into(),
            measured: measured.into(),
            outcome: match holds {
                Some(true) => Outcome::Holds,
                Some(false) => Outcome::Fails,
                None => Outcome::Undecided,
            },
        }
    }

    /// Holds when the whole 95% interval of `estimate` is below `threshold`, fails when the whole
    /// interval is at or above it, undecided when it straddles it (or has no width: one draw).
    pub fn below(
        id: &'static str,
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

    /// Holds when the whole 95% interval of `estimate` is above `threshold` (see [`below`](Self::below)).
    pub fn above(
        id: &'static str,
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

    /// Holds when the whole 95% interval of `estimate` lies in `[lo, hi]`, fails when it lies
    /// entirely outside, undecided otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn in_range(
        id: &'static str,
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
            format!("{what}: 95% interval inside [{lo}, {hi}]"),
            format!("{what} = {}, n = {}", show(estimate), estimate.n),
            inside(estimate, lo, hi),
        )
    }

    /// Holds when `value` is within `tolerance` of `target` (a deterministic figure).
    pub fn within(
        id: &'static str,
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

/// Whether the whole 95% interval of `e` lies in `[lo, hi]`: true when it does, false when it
/// lies entirely outside, `None` when it straddles a bound or has no finite ends.
pub fn inside(e: Estimate, lo: f64, hi: f64) -> Option<bool> {
    if !(e.lo.is_finite() && e.hi.is_finite()) {
        None
    } else if e.lo >= lo && e.hi <= hi {
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
fn side(e: Estimate, threshold: f64, below: bool) -> Option<bool> {
    if !(e.lo.is_finite() && e.hi.is_finite()) || e.lo > e.hi {
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
    if x == 0.0 || (1e-3..1e4).contains(&x.abs()) {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

/// An estimate with its interval (or a note that there is too little data for one).
pub fn show(e: Estimate) -> String {
    if e.lo.is_finite() && e.hi.is_finite() {
        format!("{} [{}, {}]", short(e.value), short(e.lo), short(e.hi))
    } else if e.value.is_finite() {
        format!("{} (no interval from {} points)", short(e.value), e.n)
    } else {
        format!("not measurable ({} points)", e.n)
    }
}

/// How an experiment's measurement relates to the article, from its claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Every claim of the article that the experiment checks holds.
    Reproduced,
    /// No claim of the article holds as stated, and the lab's corrected claims hold.
    Corrected,
    /// Some of the article's claims hold and some fail.
    PartlySupported,
    /// No claim of the article holds, and the lab has no correction that holds either.
    NotSupported,
    /// Nothing failed, but some claim could not be decided by this run (e.g. `--quick`).
    Undecided,
}

impl Verdict {
    /// As written in the report.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Corrected => "corrected",
            Verdict::PartlySupported => "partly supported",
            Verdict::NotSupported => "not supported",
            Verdict::Undecided => "undecided by this run",
        }
    }

    /// The verdict a list of claims gives.
    pub fn from_claims(claims: &[Claim]) -> Self {
        let count = |article: bool, outcome: Outcome| {
            claims
                .iter()
                .filter(|c| (c.source != Source::Lab) == article && c.outcome == outcome)
                .count()
        };
        let (held, failed, undecided) = (
            count(true, Outcome::Holds),
            count(true, Outcome::Fails),
            count(true, Outcome::Undecided),
        );
        let lab_total = claims.iter().filter(|c| c.source == Source::Lab).count();
        let lab_held = count(false, Outcome::Holds);
        if failed == 0 && undecided == 0 && held > 0 {
            Verdict::Reproduced
        } else if failed == 0 {
            Verdict::Undecided
        } else if held > 0 {
            Verdict::PartlySupported
        } else if lab_total > 0 && lab_held == lab_total {
            Verdict::Corrected
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
                match c.source {
                    Source::Article(section) => format!("article {section}"),
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

/// One sentence from the claims: what held, what failed, what is undecided.
pub fn summary(claims: &[Claim]) -> String {
    let of = |outcome: Outcome| claims.iter().filter(|c| c.outcome == outcome).count();
    let mut s = format!("{} of {} claims hold", of(Outcome::Holds), claims.len());
    let failed: Vec<&str> = claims
        .iter()
        .filter(|c| c.outcome == Outcome::Fails)
        .map(|c| c.id)
        .collect();
    if !failed.is_empty() {
        s.push_str(&format!("; failed: {}", failed.join(", ")));
    }
    if of(Outcome::Undecided) > 0 {
        s.push_str(&format!("; {} undecided", of(Outcome::Undecided)));
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
    fn verdicts_follow_the_claims() {
        let claim = |source, outcome| Claim {
            id: "c",
            source,
            statement: String::new(),
            check: String::new(),
            measured: String::new(),
            outcome,
        };
        let article = |o| claim(Source::Article("§1"), o);
        let lab = |o| claim(Source::Lab, o);
        use Outcome::*;
        assert_eq!(
            Verdict::from_claims(&[article(Holds), lab(Holds)]),
            Verdict::Reproduced
        );
        assert_eq!(
            Verdict::from_claims(&[article(Fails), lab(Holds)]),
            Verdict::Corrected
        );
        assert_eq!(
            Verdict::from_claims(&[article(Fails), lab(Fails)]),
            Verdict::NotSupported
        );
        assert_eq!(
            Verdict::from_claims(&[article(Holds), article(Fails)]),
            Verdict::PartlySupported
        );
        assert_eq!(
            Verdict::from_claims(&[article(Holds), article(Undecided)]),
            Verdict::Undecided
        );
    }
}
