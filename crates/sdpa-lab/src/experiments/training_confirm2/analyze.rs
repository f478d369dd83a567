//! `training-confirm-2`'s analysis: the rates the tuning chose, the pre-registered hypotheses
//! under both rate schemes, each condition beside them, and the claims.

use sdpa_model::QkInit;
use serde::Serialize;

use super::design::RateScheme;
use super::hypotheses::{Decided, across_schemes, decide};
use super::rates::{Chosen, choose_all};
use super::runs::{COMMITTED, Row, parse};
use super::{Sizes, measures};
use crate::article;
use crate::claims::{Claim, Outcome, Source, show_p};
use crate::experiment::{Analysis, Plan};
use crate::experiments::training::Run;
use crate::experiments::training_confirm::hypotheses::Pair;
use crate::measures::training::init_name;

/// One scheme's hypotheses, pooled and per condition.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeResult {
    /// The scheme.
    pub scheme: RateScheme,
    /// Pooled over the conditions: what the hypotheses decide.
    pub pooled: Decided,
    /// Each condition's (described, not tested).
    pub per_condition: Vec<((QkInit, usize), Decided)>,
    /// Every pair.
    pub pairs: Vec<Pair>,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct Confirm2Data {
    /// The sizes.
    pub sizes: Sizes,
    /// Whether this run measured the experiment (`false`: the committed measurement).
    pub measured_here: bool,
    /// Why there is nothing to analyse, when there is not.
    pub missing: Option<String>,
    /// The chosen rates per condition.
    pub chosen: Vec<Chosen>,
    /// Both schemes.
    pub schemes: Vec<SchemeResult>,
    /// Every run.
    pub rows: Vec<Row>,
}

impl Confirm2Data {
    /// The result under `scheme`.
    pub fn scheme(&self, scheme: RateScheme) -> Option<&SchemeResult> {
        self.schemes.iter().find(|s| s.scheme == scheme)
    }
}

/// The test pairs of one condition under `scheme`: the seeds run by both arms at the scheme's
/// rates.
fn pairs(rows: &[Row], chosen: &Chosen, scheme: RateScheme) -> Vec<Pair> {
    let (scaled_lr, unscaled_lr) = chosen.rates(scheme);
    let test = |scaled: bool, lr: f64| {
        rows.iter().filter(move |r| {
            !r.tuning
                && (r.init, r.d_k) == (chosen.init, chosen.d_k)
                && r.scaled == scaled
                && r.lr == lr
        })
    };
    let mut out: Vec<Pair> = test(true, scaled_lr)
        .filter_map(|a| {
            let u = test(false, unscaled_lr).find(|u| u.seed == a.seed)?;
            Some(Pair {
                init: a.init,
                d_k: a.d_k,
                scaled: a.steps,
                unscaled: u.steps,
                unscaled_near_chance: u.near_chance,
                scaled_near_chance: a.near_chance,
                budget: a.budget.min(u.budget),
            })
        })
        .collect();
    out.sort_by_key(|p| (p.d_k, p.scaled));
    out
}

/// The runs to analyse: the measured cells, or the committed measurement.
fn rows_of(plan: &Plan, cells: &[Run]) -> (Vec<Row>, bool, Option<String>) {
    if measures(plan) {
        return (cells.iter().map(Row::of).collect(), true, None);
    }
    match parse(COMMITTED) {
        Ok(rows) if rows.is_empty() => (
            rows,
            false,
            Some("not measured yet: run `sdpa report --long` (about 70 minutes on 2 cores)".into()),
        ),
        Ok(rows) => (rows, false, None),
        Err(e) => (
            Vec::new(),
            false,
            Some(format!("the committed runs do not parse: {e}")),
        ),
    }
}

/// The hypotheses and claims.
pub fn analyze(plan: &Plan, cells: &[Run]) -> Analysis<Confirm2Data> {
    let sizes = Sizes::new(plan.quick);
    let (rows, measured_here, missing) = rows_of(plan, cells);
    let refs: Vec<&Row> = rows.iter().collect();
    let chosen = choose_all(&sizes, &refs);
    let schemes: Vec<SchemeResult> = RateScheme::ALL
        .iter()
        .filter_map(|&scheme| {
            let per: Vec<((QkInit, usize), Vec<Pair>)> = chosen
                .iter()
                .map(|c| ((c.init, c.d_k), pairs(&rows, c, scheme)))
                .collect();
            let all: Vec<Pair> = per.iter().flat_map(|(_, p)| p.iter().copied()).collect();
            if all.is_empty() {
                return None;
            }
            let all_refs: Vec<&Pair> = all.iter().collect();
            Some(SchemeResult {
                scheme,
                pooled: decide(&all_refs),
                per_condition: per
                    .iter()
                    .map(|(c, p)| (*c, decide(&p.iter().collect::<Vec<_>>())))
                    .collect(),
                pairs: all,
            })
        })
        .collect();
    let data = Confirm2Data {
        sizes,
        measured_here,
        missing,
        chosen,
        schemes,
        rows,
    };
    let claims = claims(&data);
    Analysis::new(claims, data)
}

/// The premise conditions in words.
pub fn premise_words(sizes: &Sizes) -> String {
    sizes
        .conditions
        .iter()
        .map(|(init, d_k)| format!("{} init d_k {d_k}", init_name(*init)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One hypothesis over both schemes: the outcome they share, or undecided with both named.
fn both(
    data: &Confirm2Data,
    index: usize,
    number: impl Fn(&Decided) -> String,
) -> (Outcome, String) {
    let own = data.scheme(RateScheme::Own);
    let shared = data.scheme(RateScheme::Shared);
    let (Some(own), Some(shared)) = (own, shared) else {
        return (Outcome::Undecided, "not measured".into());
    };
    let (o, s) = (own.pooled.outcomes[index], shared.pooled.outcomes[index]);
    let text = format!(
        "own rates: {} ({}); shared rate: {} ({})",
        number(&own.pooled),
        o.label(),
        number(&shared.pooled),
        s.label()
    );
    match across_schemes(o, s) {
        Some(outcome) => (outcome, text),
        None => (
            Outcome::Undecided,
            format!("{text}: it depends on the learning rates"),
        ),
    }
}

fn ratio_text(d: &Decided) -> String {
    let end = |x: Option<f64>| x.map_or("∞ (not reached)".to_string(), |v| format!("{v:.2}"));
    format!(
        "median ratio {} [{}, {}], {} of {} pairs censored{}",
        end(d.ratio.km.value),
        end(d.ratio.km.lo),
        end(d.ratio.km.hi),
        d.ratio.km.censored,
        d.ratio.km.n,
        if d.ratio.left_out > 0 {
            format!(
                ", {} left out (the scaled run never reached 99%)",
                d.ratio.left_out
            )
        } else {
            String::new()
        }
    )
}

fn claim(
    id: &str,
    source: Source,
    statement: String,
    check: &str,
    (outcome, measured): (Outcome, String),
) -> Claim {
    let mut c = Claim::decided(id, source, statement, check, measured, None);
    c.outcome = outcome;
    c
}

/// The pre-registered hypotheses as claims (none when nothing was measured).
fn claims(data: &Confirm2Data) -> Vec<Claim> {
    if data.schemes.len() < RateScheme::ALL.len() {
        return Vec::new();
    }
    let fails_if = |id: &str| -> &'static str {
        match id {
            "confirm2-sentence" => "both halves failing under both learning-rate schemes",
            "confirm2-fails-completely" => {
                "the share's 97.5% interval entirely below ½ under both schemes (most unscaled runs \
                 not stuck)"
            }
            "confirm2-extremely-slow" => {
                "the median ratio's 97.5% interval entirely below 4 under both schemes"
            }
            _ => {
                "a significant split the other way under both schemes (the scaled runs stuck more \
                 often, or later)"
            }
        }
    };
    claims_of(data)
        .into_iter()
        .map(|c| {
            let text = fails_if(&c.id);
            c.fails_if(text)
        })
        .collect()
}

fn claims_of(data: &Confirm2Data) -> Vec<Claim> {
    let premise = premise_words(&data.sizes);
    vec![
        claim(
            "confirm2-sentence",
            Source::Article(&article::TRAINING_SENTENCE),
            format!(
                "primary: without √d_k training fails completely or is extremely slow, where the \
                 starting logits are at least as spread as in the article's example ({premise})"
            ),
            "holds under a learning-rate scheme when either half holds at 2.5% (below), fails \
             when both fail; decided under each arm's own rate and under one shared rate",
            both(data, 2, |d| {
                format!(
                    "fails completely {}, extremely slow {}",
                    d.outcomes[0].label(),
                    d.outcomes[1].label()
                )
            }),
        ),
        claim(
            "confirm2-fails-completely",
            Source::Article(&article::TRAINING_FAILS),
            format!("without √d_k most runs get stuck near chance ({premise})"),
            "share of unscaled runs never at 99% with held-out accuracy below 0.5 (or diverged), \
             97.5% Wilson interval against ½",
            both(data, 0, |d| {
                format!(
                    "{} of {} stuck near chance [{:.2}, {:.2}]",
                    d.near_chance.count, d.near_chance.n, d.near_chance.lo, d.near_chance.hi
                )
            }),
        ),
        claim(
            "confirm2-extremely-slow",
            Source::Article(&article::TRAINING_EXTREMELY_SLOW),
            format!("without √d_k training takes at least 4× the steps to 99% ({premise})"),
            "Kaplan–Meier median of the paired ratio of steps (a pair whose unscaled run never got \
             there censored at budget / scaled steps), Brookmeyer–Crowley 97.5% interval: lower \
             end ≥ 4 holds, upper end < 4 fails; every finite end is a finished pair's ratio",
            both(data, 1, ratio_text),
        ),
        claim(
            "confirm2-stuck",
            Source::Lab,
            format!("secondary: without √d_k more runs are short of 99% at the budget ({premise})"),
            "stratified McNemar, exact two-sided, α = 0.05",
            both(data, 3, |d| {
                format!(
                    "{} vs {} discordant pairs, p = {}",
                    d.stuck.yes,
                    d.stuck.no,
                    show_p(d.stuck.p)
                )
            }),
        ),
        claim(
            "confirm2-later",
            Source::Lab,
            format!("secondary: without √d_k runs reach 99% later ({premise})"),
            "stratified sign test on the paired steps, exact two-sided, α = 0.05",
            both(data, 4, |d| {
                format!(
                    "later in {}, sooner in {}, p = {}",
                    d.later.yes,
                    d.later.no,
                    show_p(d.later.p)
                )
            }),
        ),
    ]
}
