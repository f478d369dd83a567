//! Claims: every conclusion of the report is a statement with the check that decides it, and
//! its outcome is computed from the experiment's own numbers.
//!
//! An experiment's `analyze` turns its measured cells into [`Claim`]s with a pure function, so
//! that tests can feed it numbers that contradict a claim and watch it fail. A claim is the
//! article's (it quotes the article's sentence, see `article.rs`) or the lab's own. Every
//! threshold, margin and level is an argument written beside the claim in the code, fixed before
//! any run. The experiment's [`Verdict`] follows from all of its claims.

use serde::Serialize;

use crate::article::Quote;
use crate::stats::Estimate;

/// How a claim came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
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
    /// The design could not have decided it whatever the data (e.g. a ratio of steps that the
    /// step budget cannot show): never counted as a failure.
    OutOfReach,
}

impl Outcome {
    /// As printed in the report.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Holds => "holds",
            Outcome::Fails => "FAILS",
            Outcome::Conditional => "conditional",
            Outcome::Undecided => "undecided",
            Outcome::OutOfReach => "cannot be decided with this design",
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

    /// The outcome of a sentence whose parts are joined by "and": it holds when every part
    /// holds, fails when a part fails (or holds only under some conditions), and is undecided
    /// otherwise (no parts: undecided).
    pub fn all(parts: &[Outcome]) -> Self {
        let tally = Tally::of(parts);
        if parts.is_empty() {
            Outcome::Undecided
        } else if tally.fails + tally.conditional > 0 {
            Outcome::Fails
        } else if tally.holds == parts.len() {
            Outcome::Holds
        } else {
            Outcome::Undecided
        }
    }

    /// The outcome of a claim checked under several conditions, by one rule (stated in the
    /// README): **holds** when it holds in every condition; **FAILS** when it fails in at least
    /// one and holds in none; **conditional** when it holds in at least one and fails in at least
    /// one; **undecided** otherwise (it fails nowhere and some condition could not decide it, or
    /// there is no condition), or **cannot be decided with this design** when no condition could
    /// have decided it. A condition that is itself conditional counts as both a hold and a
    /// failure.
    pub fn across(outcomes: &[Outcome]) -> Self {
        let tally = Tally::of(outcomes);
        let (holds, fails) = (
            tally.holds + tally.conditional,
            tally.fails + tally.conditional,
        );
        if outcomes.is_empty() {
            Outcome::Undecided
        } else if tally.holds == outcomes.len() {
            Outcome::Holds
        } else if holds > 0 && fails > 0 {
            Outcome::Conditional
        } else if fails > 0 {
            Outcome::Fails
        } else if tally.out_of_reach == outcomes.len() {
            Outcome::OutOfReach
        } else {
            Outcome::Undecided
        }
    }
}

/// How many conditions of a claim hold, fail, are conditional or undecided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Conditions where the claim holds.
    pub holds: usize,
    /// Where it fails.
    pub fails: usize,
    /// Where it is itself conditional.
    pub conditional: usize,
    /// Where the data cannot decide it.
    pub undecided: usize,
    /// Where the design could not have decided it.
    pub out_of_reach: usize,
}

impl Tally {
    /// The tally of `outcomes`.
    pub fn of(outcomes: &[Outcome]) -> Self {
        let count = |o: Outcome| outcomes.iter().filter(|x| **x == o).count();
        Self {
            holds: count(Outcome::Holds),
            fails: count(Outcome::Fails),
            conditional: count(Outcome::Conditional),
            undecided: count(Outcome::Undecided),
            out_of_reach: count(Outcome::OutOfReach),
        }
    }

    /// Everything counted.
    pub fn total(&self) -> usize {
        self.holds + self.fails + self.conditional + self.undecided + self.out_of_reach
    }

    /// E.g. `holds in 3, fails in 2, undecided in 3 of 8 conditions`.
    pub fn show(&self, unit: &str) -> String {
        let parts: Vec<String> = [
            (self.holds, "holds in"),
            (self.fails, "fails in"),
            (self.conditional, "conditional in"),
            (self.undecided, "undecided in"),
            (self.out_of_reach, "cannot be decided with this design in"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, word)| format!("{word} {n}"))
        .collect();
        format!("{} of {} {unit}", parts.join(", "), self.total())
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
    /// Whether `conditions` are the parts of one sentence joined by "and" (it holds when every
    /// part holds and fails when one fails) rather than conditions it is checked under.
    pub conjunction: bool,
    /// Why the claim could not have failed, for one that could not (arithmetic, an identity, a
    /// band the setup meets by construction): shown, never counted in a tally.
    pub cannot_fail: Option<String>,
    /// The result that would have made it fail, in words (the report prints it beside the
    /// check, so that a reader sees the claim could have come out either way).
    pub fails_if: Option<String>,
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
            conjunction: false,
            cannot_fail: None,
            fails_if: None,
        }
    }

    /// Says what result would have made the claim fail.
    pub fn fails_if(mut self, result: impl Into<String>) -> Self {
        self.fails_if = Some(result.into());
        self
    }

    /// Marks a claim that could not have failed, with the reason: it is shown but not counted.
    pub fn cannot_fail(mut self, reason: impl Into<String>) -> Self {
        self.cannot_fail = Some(reason.into());
        self
    }

    /// Whether the claim counts in a tally (it could have failed).
    pub fn counts(&self) -> bool {
        self.cannot_fail.is_none()
    }

    /// How many of its conditions hold, fail, are conditional or undecided (`None` for a claim
    /// decided once).
    pub fn tally(&self) -> Option<Tally> {
        (!self.conditions.is_empty()).then(|| {
            Tally::of(
                &self
                    .conditions
                    .iter()
                    .map(|c| c.outcome)
                    .collect::<Vec<_>>(),
            )
        })
    }

    /// Its outcome as the report prints it: the label, and for a claim over conditions how many
    /// hold, fail and are undecided.
    pub fn outcome_text(&self) -> String {
        let unit = if self.conjunction {
            "parts"
        } else {
            "conditions"
        };
        // A claim that could not have failed gets no bold verdict: it is shown, not counted.
        let label = if self.counts() {
            format!("**{}**", self.outcome.label())
        } else {
            self.outcome.label().to_string()
        };
        match self.tally() {
            Some(t) => format!("{label} ({})", t.show(unit)),
            None => label,
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
            conjunction: false,
            cannot_fail: None,
            fails_if: None,
        }
    }

    /// A sentence made of parts joined by "and", each checked on its own: it **holds** when every
    /// part holds, **FAILS** when any part fails, and is undecided otherwise.
    pub fn all_of(
        id: &str,
        source: Source,
        statement: impl Into<String>,
        check: impl Into<String>,
        parts: Vec<Condition>,
    ) -> Self {
        let outcome = Outcome::all(&parts.iter().map(|c| c.outcome).collect::<Vec<_>>());
        Self {
            outcome,
            conjunction: true,
            ..Self::per_condition(id, source, statement, check, parts)
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
        .fails_if(format!(
            "the 95% interval of {what} at or above {threshold}"
        ))
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
        .fails_if(format!(
            "the 95% interval of {what} at or below {threshold}"
        ))
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
            format!(
                "{what} = {}{}, n = {}",
                show(estimate),
                estimate
                    .ci90
                    .map(|(a, b)| format!(" (90%: [{}, {}])", short(a), short(b)))
                    .unwrap_or_default(),
                estimate.n
            ),
            inside(estimate, lo, hi),
        )
        .fails_if(format!(
            "the 95% interval of {what} entirely outside [{lo}, {hi}]"
        ))
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
        .fails_if(format!("{what} more than {tolerance} from {target}"))
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

/// How an experiment's measurements relate to the article: decided by the **article's** claims
/// alone (the lab's own hypotheses are reported on their own line, [`lab_summary`]), with one
/// vocabulary applied the same way everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Every claim of the article holds.
    Reproduced,
    /// No claim of the article fails outright, but some holds only under some conditions.
    Conditional,
    /// Some claims of the article hold (or hold under conditions) and some fail.
    PartlySupported,
    /// The article's claims fail and none holds.
    NotSupported,
    /// No claim of the article fails, but some could not be decided by this run.
    Undecided,
    /// The experiment tests no claim of the article (only the lab's own).
    LabOnly,
}

impl Verdict {
    /// As written in the report.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Conditional => "conditional",
            Verdict::PartlySupported => "partly supported",
            Verdict::NotSupported => "not supported",
            Verdict::Undecided => "undecided",
            Verdict::LabOnly => "no article claim",
        }
    }

    /// The verdict on the article from a list of claims (the lab's are ignored).
    pub fn from_claims(claims: &[Claim]) -> Self {
        // A claim that could not have failed is no evidence either way: not counted. A part of a
        // sentence (its quote with the part's name in brackets) whose whole sentence has a
        // counted row of its own is decided by that row: the «or» of the training sentence holds
        // through one half while the other is undecided.
        let quote = |c: &Claim| match &c.source {
            Source::Article(q) => q.zh,
            Source::Lab => "",
        };
        let counted: Vec<&Claim> = claims
            .iter()
            .filter(|c| c.source.is_article() && c.counts())
            .collect();
        let article: Vec<Outcome> = counted
            .iter()
            .filter(|c| {
                let zh = quote(c);
                let whole = sentence_of(zh);
                whole == zh || !counted.iter().any(|w| quote(w) == whole)
            })
            .map(|c| c.outcome)
            .collect();
        let has = |o: Outcome| article.contains(&o);
        if article.is_empty() {
            Verdict::LabOnly
        } else if article.iter().all(|o| *o == Outcome::Holds) {
            Verdict::Reproduced
        } else if has(Outcome::Fails) {
            if has(Outcome::Holds) || has(Outcome::Conditional) {
                Verdict::PartlySupported
            } else {
                Verdict::NotSupported
            }
        } else if has(Outcome::Conditional) {
            Verdict::Conditional
        } else {
            Verdict::Undecided
        }
    }
}

#[path = "claims_text.rs"]
mod text;
pub use text::{
    article_summary, claims_table, lab_summary, sentence_of, short, short_p, show, show_p, summary,
};

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;
