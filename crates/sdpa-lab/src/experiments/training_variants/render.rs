//! `training-variants`' table, CSV, plots and abstract line.

use super::analyze::{ArmRow, Measure, RunRow, VariantsData};
use super::design::{ALPHA, D_K, LEARNED_ACCURACY, TUNING_SEED_OFFSET, Variant};
use crate::claims::{Claim, Outcome};
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::measures::training::{Arm, CurvePoint, EVAL_EVERY};
use crate::plot::{LinePlot, Series};
use crate::stats::quantile;

fn num(x: f64) -> String {
    if x.is_nan() {
        "–".into()
    } else {
        format!("{x:.3}")
    }
}

fn table(data: &VariantsData) -> String {
    let rows: Vec<Vec<String>> = data
        .arms
        .iter()
        .map(|r: &ArmRow| {
            let m = &r.medians;
            vec![
                r.variant.label().into(),
                r.arm.label(),
                format!("{}{}", r.lr, if r.lr_at_edge { " †" } else { "" }),
                r.km.show(r.budget as f64),
                format!("{} of {}", r.km.n - r.km.censored, r.km.n),
                num(m.initial_entropy),
                format!("{} → {}", num(m.initial_max_logit), num(m.final_max_logit)),
                num(m.final_accuracy),
            ]
        })
        .collect();
    md_table(
        &[
            "variant",
            "arm",
            "rate",
            "KM median steps to 99% [95%]",
            "runs at 99%",
            "normalized entropy at step 0",
            "largest logit: step 0 → end",
            "held-out accuracy at the end",
        ],
        &rows,
    )
}

fn write_csv(data: &VariantsData, canvas: &mut Canvas) -> Result<(), LabError> {
    let rows: Vec<String> = data
        .runs
        .iter()
        .flat_map(|r: &RunRow| {
            r.outcome.curve.iter().map(move |p: &CurvePoint| {
                format!(
                    "{},{},{},{},{},{},{},{},{}",
                    r.variant.slug(),
                    r.arm.slug(),
                    r.lr,
                    r.seed,
                    p.step,
                    p.accuracy,
                    p.eval_loss,
                    p.entropy,
                    p.max_logit
                )
            })
        })
        .collect();
    canvas.csv(
        "training_variants.csv",
        "variant,arm,lr,seed,step,held_out_accuracy,held_out_loss,normalized_entropy,max_logit",
        &rows,
    )?;
    Ok(())
}

/// Median and quartiles over one arm's runs of `pick` at every evaluation step (the runs train
/// the whole budget, so every run has every step).
fn band(
    runs: &[&RunRow],
    budget: usize,
    pick: fn(&CurvePoint) -> f64,
) -> Vec<(f64, f64, f64, f64)> {
    (0..=budget)
        .step_by(EVAL_EVERY)
        .filter_map(|t| {
            let mut v: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.outcome.curve.iter().find(|p| p.step == t).map(pick))
                .filter(|x| x.is_finite())
                .collect();
            v.sort_by(|a, b| a.total_cmp(b));
            (!v.is_empty()).then(|| {
                (
                    t as f64,
                    quantile(&v, 0.5),
                    quantile(&v, 0.25),
                    quantile(&v, 0.75),
                )
            })
        })
        .collect()
}

/// Per variant: the normalized entropy beside the held-out accuracy, and the largest logit
/// (log axis), median and quartiles over seeds per arm.
fn plots(data: &VariantsData, canvas: &mut Canvas) -> Result<Vec<String>, LabError> {
    let mut links = Vec::new();
    for variant in Variant::ALL {
        let runs = |arm: Arm| -> Vec<&RunRow> {
            data.runs
                .iter()
                .filter(|r| r.variant == variant && r.arm == arm)
                .collect()
        };
        let budget = data.sizes.budget(variant);
        let (mut sharp, mut logits) = (Vec::new(), Vec::new());
        for (i, arm) in [Arm::Scaled, Arm::Unscaled].into_iter().enumerate() {
            let rs = runs(arm);
            if rs.is_empty() {
                continue;
            }
            let label = arm.label();
            sharp.push(
                Series::with_band(
                    format!("entropy, {label} (median, quartiles)"),
                    band(&rs, budget, |p| p.entropy),
                )
                .colored(i),
            );
            let accuracy = band(&rs, budget, |p| p.accuracy);
            sharp.push(
                Series::reference(
                    format!("held-out accuracy, {label} (median)"),
                    accuracy.iter().map(|p| (p.0, p.1)).collect(),
                )
                .colored(i),
            );
            logits.push(
                Series::with_band(
                    format!("{label} (median, quartiles)"),
                    band(&rs, budget, |p| p.max_logit),
                )
                .colored(i),
            );
        }
        if sharp.is_empty() {
            continue;
        }
        let title = |what: &str| {
            format!(
                "{what}: {}; d_k {D_K}, default init, Adam, {} paired seeds",
                variant.label(),
                data.sizes.eval_seeds
            )
        };
        links.push(canvas.line_plot(
            &format!("training_variants_{}_entropy.png", variant.slug()),
            &LinePlot {
                title: title("Entropy / ln(keys), accuracy"),
                x_label: "step".into(),
                y_label: "entropy / ln(keys) (solid), held-out accuracy (dashed)".into(),
                log_x: false,
                log_y: false,
                series: sharp,
            },
        )?);
        links.push(canvas.line_plot(
            &format!("training_variants_{}_max_logit.png", variant.slug()),
            &LinePlot {
                title: title("Largest attention logit"),
                x_label: "step".into(),
                y_label: "largest logit of the step's batch".into(),
                log_x: false,
                log_y: true,
                series: logits,
            },
        )?);
    }
    Ok(links)
}

/// The section.
pub fn render(data: &VariantsData, canvas: &mut Canvas) -> Result<String, LabError> {
    write_csv(data, canvas)?;
    let plots = plots(data, canvas)?;
    Ok(format!(
        "**Design** (fixed in `experiments/training_variants/design.rs` before this experiment's first \
         run). The article's question on four variants of `training`'s model, all at Burn's default \
         initialization, d_k = {D_K}, Adam: the base model (seq 16, one layer of one head, pre-LayerNorm); \
         seq 128 (*match* with k = 64, vocabulary 256, budget 600 steps, 300 for the others: a pilot showed a ~200-step plateau before \
         either arm learns; length, number of classes and budget change together, so this variant is a larger \
         task as well as a longer sequence); no LayerNorm; 2 layers × 4 heads (d_v = 16). Each (variant, arm) {}tunes its rate \
         on {} seeds (from seed + {TUNING_SEED_OFFSET}) over {:?} (the rates `training`'s sweep \
         chose for these arms at d_k = 64, one step below and one above: narrower than its grid, to fit the \
         report's time; † marks a rate at an end; disclosed: 3e-2 was added after this experiment's first run, \
         where 1/√d_k chose the then top rate 1e-2 in every variant) by `training`'s rule{}; then {} paired evaluation seeds per \
         arm train the **whole budget**, and at every evaluation (every {EVAL_EVERY} steps) the run records \
         the held-out accuracy and, from the training forward's row statistics, the attention's normalized \
         entropy (entropy / ln of the visible keys, mean over rows and heads, and over layers) and its largest \
         logit (over rows, heads and layers); the plots show their median and quartiles over the seeds. \
         The entropy is over every row, also the first half's, whose outputs the loss does not read. \
         «Before learning» = the recorded steps from the first update up to the first step where either \
         run of the pair has held-out accuracy ≥ {LEARNED_ACCURACY}: the same steps in both arms (disclosed: \
         the first run of this experiment averaged each run over its own window from step 0, longer for the \
         arm that learns later; changed after its claims were seen, see `design.rs`; that run's outcome, holds in \
         4 of 4 variants, was the same under both windows, recomputed from its saved curves). Sign tests pair the seeds, Holm over the four variants, \
         α = {ALPHA} (within each claim; the three claims are separate questions, not one family). Every \
         claim here is the lab's; the article trains nothing. The base model repeats `training`'s main \
         comparison (default init, d_k = 64) on new seeds and its own tuning: a replication.\n\n{}\n{}\n\
         Every recorded point of every evaluation run is in `training_variants.csv`.\n",
        if data.tuned {
            ""
        } else {
            "trains at the rate its tuning chose (the tuning that "
        },
        data.sizes.tuning_seeds,
        data.sizes.lrs,
        if data.tuned {
            ""
        } else {
            ", in the report of commit 5a13d16; committed in `design.rs`, `COMMITTED_LRS`: this run did \
             not tune, `sdpa report --tune` does, about 8 minutes more)"
        },
        data.sizes.eval_seeds,
        table(data),
        plots.join("\n"),
    ))
}

/// The abstract's line: each claim's outcome with its tally over the variants, and the
/// variants where it does not hold (`None` without claims).
pub fn headline(data: &VariantsData, claims: &[Claim]) -> Option<String> {
    let part = |id: &str, words: &str| {
        claims.iter().find(|c| c.id == id).map(|c| {
            let others: Vec<String> = c
                .conditions
                .iter()
                .filter(|k| k.outcome != Outcome::Holds)
                .map(|k| format!("{}: {}", k.label, k.outcome.label()))
                .collect();
            let except = if others.is_empty() {
                String::new()
            } else {
                format!(" — {}", others.join(", "))
            };
            format!("{words} {}{except}", c.outcome_text())
        })
    };
    let parts: Vec<String> = [
        part(
            Measure::Steps.claim_id(),
            "«reaches 99% later without √d_k»",
        ),
        part(
            Measure::EarlyEntropy.claim_id(),
            "«its attention stays sharper until it learns» (it starts sharper by construction: this reads the start and training together)",
        ),
        part(
            Measure::FinalMaxLogit.claim_id(),
            "«its largest logit ends larger» (each arm at its own rate)",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let seeds = data
        .paired
        .iter()
        .map(|p| p.larger + p.smaller + p.ties + p.excluded)
        .max()
        .unwrap_or(0);
    (!parts.is_empty()).then(|| {
        format!(
            "**Beyond the small model** (the base model, seq 128 (k = 64: a larger task too), no LayerNorm, \
             2 layers × 4 heads; \
             default init, d_k = {D_K}, Adam, each arm at its own rate, {seeds} paired seeds): {}.",
            parts.join("; ")
        )
    })
}
