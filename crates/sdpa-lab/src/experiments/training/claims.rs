//! `training`'s claims: each decided per condition (initialization × d_k, or optimizer) by the
//! paired statistics, with the thresholds of [`super::design`].

use super::analyze::{PairStats, TrainingData, of_part};
use super::design::{ALPHA, EQUIVALENCE_STEPS, FAILED_ACCURACY, PREMISE_FACTOR, Part, SLOW_FACTOR};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source, inside, show, show_p, side};
use crate::measures::training::{Arm, init_name, optimizer_name};
use crate::stats::hypothesis::tost;

/// `default init, d_k = 64` (and the optimizer when it is not Adam).
fn label(s: &PairStats) -> String {
    let c = &s.comparison.condition;
    let opt = match c.optimizer {
        sdpa_model::OptimizerKind::Adam => String::new(),
        o => format!("{}, ", optimizer_name(o)),
    };
    format!("{opt}{} init, d_k = {}", init_name(c.init), c.d_k)
}

/// Is the other arm slower (`slower`) or faster than the reference, by the Holm-adjusted sign
/// test: holds when significant in the claimed direction, fails when significant in the other,
/// undecided otherwise.
fn direction(s: &PairStats, slower: bool) -> Outcome {
    if s.sign_p_holm >= ALPHA {
        return Outcome::Undecided;
    }
    let is_slower = s.other_slower > s.other_faster;
    Outcome::of(Some(is_slower == slower))
}

fn sign_measured(s: &PairStats) -> String {
    format!(
        "{} later / {} sooner / {} tied of {} pairs, sign test p = {} (Holm {}); KM median {} vs {}",
        s.other_slower,
        s.other_faster,
        s.ties,
        s.pairs,
        show_p(s.sign_p),
        show_p(s.sign_p_holm),
        s.other_km.show(s.budget as f64),
        s.reference_km.show(s.budget as f64)
    )
}

/// A claim over the comparisons `stats`, each condition decided by `decide`.
fn over(
    id: &str,
    source: Source,
    statement: String,
    check: &str,
    stats: &[&PairStats],
    decide: &dyn Fn(&PairStats) -> (Outcome, String),
) -> Claim {
    let conditions = stats
        .iter()
        .map(|s| {
            let (outcome, measured) = decide(s);
            Condition {
                label: label(s),
                measured,
                outcome,
            }
        })
        .collect();
    Claim::per_condition(id, source, statement, check, conditions)
}

fn select(data: &TrainingData, part: Part, reference: Arm, other: Arm) -> Vec<&PairStats> {
    of_part(data, part)
        .filter(|s| s.comparison.reference == reference && s.comparison.other == other)
        .collect()
}

/// "Fails completely" in one condition: most unscaled runs failed (Wilson against ½).
fn fails(s: &PairStats) -> (Outcome, String) {
    (
        Outcome::of(side(s.other_failed, 0.5, false)),
        format!(
            "{} of runs failed (accuracy < {FAILED_ACCURACY} at step {})",
            show(s.other_failed),
            s.budget
        ),
    )
}

/// "Extremely slow" in one condition: the median paired ratio of steps against SLOW_FACTOR.
fn slow(s: &PairStats) -> (Outcome, String) {
    let r = s.ratio;
    (
        Outcome::of(if r.lo.is_nan() {
            None
        } else if r.lo >= SLOW_FACTOR {
            Some(true)
        } else if r.hi < SLOW_FACTOR {
            Some(false)
        } else {
            None
        }),
        format!(
            "median paired ratio none / 1/√d_k {} over {} pairs (KM medians {} vs {})",
            show(r),
            r.n,
            s.other_km.show(s.budget as f64),
            s.reference_km.show(s.budget as f64)
        ),
    )
}

/// The article's two halves of Q1, per initialization and d_k (Adam).
fn article_claims(main: &[&PairStats]) -> Vec<Claim> {
    let either = |s: &PairStats| {
        let (a, b) = (fails(s).0, slow(s).0);
        let outcome = if a == Outcome::Holds || b == Outcome::Holds {
            Outcome::Holds
        } else if a == Outcome::Fails && b == Outcome::Fails {
            Outcome::Fails
        } else {
            Outcome::Undecided
        };
        (
            outcome,
            format!(
                "fails completely: {}; extremely slow: {}",
                a.label(),
                b.label()
            ),
        )
    };
    vec![
        over(
            "fails-completely",
            Source::Article(&article::TRAINING_FAILS),
            format!(
                "without √d_k, training fails completely: most runs never learn (held-out accuracy below \
                 {FAILED_ACCURACY} at the budget; chance is 1/8)"
            ),
            "Wilson 95% interval of the share of unscaled runs that failed, against ½, per condition (Adam)",
            main,
            &fails,
        ),
        over(
            "extremely-slow",
            Source::Article(&article::TRAINING_EXTREMELY_SLOW),
            format!(
                "without √d_k, training is extremely slow: it takes at least {SLOW_FACTOR}× the steps to 99% \
                 that the same seed takes with √d_k"
            ),
            "median over seeds of the paired ratio of steps to 99% (a run that never got there counts ∞; pairs \
             where neither did are left out), 95% order-statistics interval: holds when its lower end ≥ 4, \
             fails when its upper end < 4 (Adam)",
            main,
            &slow,
        ),
        over(
            "fails-or-extremely-slow",
            Source::Lab,
            "the article's sentence as a whole: fails completely *or* extremely slow".into(),
            "holds where either half holds, fails where both fail",
            main,
            &either,
        ),
    ]
}

/// The premise of §6: q/k component std near 1 after LayerNorm and training; and right after
/// projection, of the order of 1/√d_in.
fn premise_claims(data: &TrainingData) -> Vec<Claim> {
    let (lo, hi) = (1.0 / PREMISE_FACTOR, PREMISE_FACTOR);
    let conditions: Vec<Condition> = data
        .premise
        .iter()
        .filter(|p| {
            p.arm == Arm::Scaled && p.condition.optimizer == sdpa_model::OptimizerKind::Adam
        })
        .map(|p| {
            let outcomes = [inside(p.query_final, lo, hi), inside(p.key_final, lo, hi)];
            Condition {
                label: format!(
                    "{} init, d_k = {}",
                    init_name(p.condition.init),
                    p.condition.d_k
                ),
                measured: format!(
                    "after training: query std {}, key std {} (at initialization {}, {})",
                    show(p.query_final),
                    show(p.key_final),
                    show(p.query_initial),
                    show(p.key_initial)
                ),
                outcome: Outcome::across(&outcomes.map(Outcome::of)),
            }
        })
        .collect();
    let mut claims = vec![Claim::per_condition(
        "premise-std-near-one",
        Source::Article(&article::PREMISE_STD_ONE),
        format!(
            "after LayerNorm and training, the q and k components entering attention have std close to 1 \
             (within a factor {PREMISE_FACTOR}), in the trained model (1/√d_k arm, Adam)"
        ),
        "90% interval of the mean final q std and k std over seeds inside [0.5, 2] (TOST), per condition",
        conditions,
    )];
    let d_in = 64.0f64;
    if let Some(p) = data
        .premise
        .iter()
        .find(|p| p.arm == Arm::Scaled && p.condition.init == sdpa_model::QkInit::Default)
    {
        let target = 1.0 / d_in.sqrt();
        claims.push(Claim::in_range(
            "projected-std-of-order-inv-sqrt-d-in",
            Source::Article(&article::PROJECTED_STD_SMALL),
            format!(
                "right after the W_Q projection (Burn's default initialization, d_in = {d_in}), q's components \
                 have std of the order of 1/√d_in = {target:.3} (within a factor 2)"
            ),
            "query std at initialization",
            p.query_initial,
            target / 2.0,
            target * 2.0,
        ));
    }
    claims
}

fn slower_claim(id: &str, statement: String, stats: &[&PairStats], slower: bool) -> Claim {
    over(
        id,
        Source::Lab,
        statement,
        "exact sign test on the paired steps to 99% (a run that never got there ranked last), Holm across d_k, α = 0.05",
        stats,
        &|s| (direction(s, slower), sign_measured(s)),
    )
}

fn equivalence_claim(id: &str, statement: String, stats: &[&PairStats]) -> Claim {
    over(
        id,
        Source::Lab,
        statement,
        &format!(
            "median paired difference of the steps to 99% (censored runs ±∞): equivalent when its 90% \
             order-statistics interval lies inside ±{EQUIVALENCE_STEPS} steps (TOST), not when its 95% interval \
             excludes 0 and the 90% one leaves the margin"
        ),
        stats,
        &|s| {
            (
                Outcome::of(tost(s.difference90, s.difference, EQUIVALENCE_STEPS)),
                format!(
                    "difference {} (90%: [{}, {}])",
                    show(s.difference),
                    crate::claims::short(s.difference90.lo),
                    crate::claims::short(s.difference90.hi)
                ),
            )
        },
    )
}

/// SGD, the temperatures and the controls beside 1/√d_k and no scaling.
fn beyond_the_scale(data: &TrainingData) -> Vec<Claim> {
    use Arm::*;
    let mut claims = vec![
        slower_claim(
        "not-a-step-size-artifact",
        "with SGD, each arm at its own learning rate, unscaled is still slower: its trouble is not a too-large step".into(),
        &select(data, Part::Sgd, Scaled, Unscaled),
        true,
        ),
        slower_claim(
        "inv-dk-slower",
        "1/d_k (logits of std 1/√d_k at unit init) trains slower than 1/√d_k".into(),
        &select(data, Part::Temperature, Scaled, InvDk),
        true,
        ),
        slower_claim(
        "learned-temperature-slower",
        "a learned temperature starting at 1 (unscaled) trains slower than a fixed 1/√d_k".into(),
        &select(data, Part::Temperature, Scaled, Learned),
        true,
        ),
        slower_claim(
        "learned-temperature-rescues",
        "a learned temperature trains faster than no scaling at all".into(),
        &select(data, Part::Temperature, Unscaled, Learned),
        false,
        ),
    ];
    for (id, arm, what) in [
        (
            "cap-as-fast",
            SoftCap(super::design::SOFTCAP),
            "a soft-cap of 5 without scaling",
        ),
        ("qk-norm-as-fast", QkNorm, "QK-norm without scaling"),
        (
            "qk-norm-scaled-as-fast",
            QkNormScaled,
            "QK-norm with 1/√d_k",
        ),
    ] {
        claims.push(equivalence_claim(
            id,
            format!("{what} trains as fast as 1/√d_k"),
            &select(data, Part::Controls, Scaled, arm),
        ));
    }
    claims.push(slower_claim(
        "qk-norm-rescues-unscaled",
        "QK-norm without scaling trains faster than no control at all".into(),
        &select(data, Part::Controls, Unscaled, QkNorm),
        false,
    ));
    claims
}

/// Every claim of `training`, decided by its data.
pub fn claims(data: &TrainingData) -> Vec<Claim> {
    use Arm::*;
    let main = select(data, Part::Main, Scaled, Unscaled);
    let mut claims = article_claims(&main);
    claims.extend(premise_claims(data));
    claims.push(slower_claim(
        "unscaled-slower",
        "without √d_k the model reaches 99% later than with it (Adam, each arm at its own learning rate)".into(),
        &main,
        true,
    ));
    claims.push(over(
        "unscaled-stuck-more-often",
        Source::Lab,
        "primary endpoint: without √d_k more runs are still short of 99% at the budget".into(),
        "exact McNemar test on the paired stuck / not stuck outcomes, Holm across d_k, α = 0.05",
        &main,
        &|s| {
            let outcome = if s.mcnemar_p_holm >= ALPHA {
                Outcome::Undecided
            } else {
                Outcome::of(Some(s.only_other_stuck > s.only_reference_stuck))
            };
            (
                outcome,
                format!(
                    "stuck: none {} vs 1/√d_k {}; discordant {} / {}, p = {} (Holm {})",
                    show(s.other_stuck),
                    show(s.reference_stuck),
                    s.only_other_stuck,
                    s.only_reference_stuck,
                    show_p(s.mcnemar_p),
                    show_p(s.mcnemar_p_holm)
                ),
            )
        },
    ));
    let smallest = data.sizes.main_dims.first().copied().unwrap_or(0);
    let small: Vec<&PairStats> = main
        .iter()
        .copied()
        .filter(|s| s.comparison.condition.d_k == smallest)
        .collect();
    claims.push(equivalence_claim(
        "small-dk-no-practical-difference",
        format!("at d_k = {smallest} scaling makes no practical difference to the time to 99%"),
        &small,
    ));
    claims.extend(beyond_the_scale(data));
    claims.push(Claim::per_condition(
        "initial-logits-predict-the-delay",
        Source::Lab,
        "the mechanism: the larger the initial logit std of a run, the longer it takes to 99%",
        "Spearman's ρ of initial logit std and steps to 99% (censored last) over both arms and every d_k, 95% interval above 0",
        data.mechanism
            .iter()
            .map(|m| Condition {
                label: format!("{} init", m.init),
                measured: format!("ρ = {}", show(m.rho)),
                outcome: Outcome::of(side(m.rho, 0.0, false)),
            })
            .collect(),
    ));
    claims
}
