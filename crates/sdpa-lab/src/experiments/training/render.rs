//! `training`'s section: the design, the learning rates, the paired comparisons, the premise
//! and the mechanism, the CSV of every run and the plots.

#[path = "answer.rs"]
mod answer;

use super::analyze::TrainingData;
use super::design::{
    ALPHA, EQUIVALENCE_RATIO, FAILED_ACCURACY, Part, SENSITIVITY_FACTOR, SLOW_FACTOR,
    TUNING_SEED_OFFSET,
};
use crate::claims::{show, show_p};
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::measures::training::{TARGET, init_name, optimizer_name};

fn condition(c: &super::design::Condition) -> String {
    format!(
        "{}, {} init, d_k = {}",
        optimizer_name(c.optimizer),
        init_name(c.init),
        c.d_k
    )
}

fn comparison_table(data: &TrainingData, part: Part) -> String {
    md_table(
        &[
            "condition",
            "arms (lr)",
            "pairs",
            "stuck at budget: other / reference (Wilson 95%)",
            "McNemar p (Holm)",
            "failed completely (other; family-wise 95%)",
            "KM median steps: other / reference",
            "other later / sooner / tied; sign p (Holm)",
            "median paired difference (95%)",
            "median paired ratio (family-wise 95%)",
        ],
        &super::analyze::of_part(data, part)
            .map(|s| {
                let c = &s.comparison;
                vec![
                    condition(&c.condition),
                    format!(
                        "{} ({}{}) vs {} ({}{})",
                        c.other.label(),
                        s.lr_other,
                        if s.other_lr_at_edge { "†" } else { "" },
                        c.reference.label(),
                        s.lr_reference,
                        if s.reference_lr_at_edge { "†" } else { "" }
                    ),
                    s.pairs.to_string(),
                    format!("{} / {}", show(s.other_stuck), show(s.reference_stuck)),
                    format!("{} ({})", show_p(s.mcnemar_p), show_p(s.mcnemar_p_holm)),
                    show(s.other_failed),
                    format!(
                        "{} / {}",
                        s.other_km.show(s.budget as f64),
                        s.reference_km.show(s.budget as f64)
                    ),
                    format!(
                        "{} / {} / {}; {} ({})",
                        s.other_slower,
                        s.other_faster,
                        s.ties,
                        show_p(s.sign_p),
                        show_p(s.sign_p_holm)
                    ),
                    show(s.difference),
                    super::claims::show_ratio(s),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

fn premise_table(data: &TrainingData) -> String {
    md_table(
        &[
            "condition",
            "arm",
            "q std at init",
            "k std at init",
            "q std at the end (family-wise 95%)",
            "k std at the end (family-wise 95%)",
            "q std end / init, per run",
            "k std end / init, per run",
        ],
        &data
            .premise
            .iter()
            .map(|p| {
                vec![
                    condition(&p.condition),
                    p.arm.label(),
                    show(p.query_initial),
                    show(p.key_initial),
                    show(p.query_final),
                    show(p.key_final),
                    show(p.query_change),
                    show(p.key_change),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

fn write_csv(data: &TrainingData, canvas: &mut Canvas) -> Result<(), LabError> {
    // The curves are the sweep's (`--tune`): no file without them.
    if !data.curves.is_empty() {
        canvas.csv(
            "training_lr_curves.csv",
            super::sweep_plot::CSV_HEADER,
            &super::sweep_plot::csv_rows(data),
        )?;
    }
    canvas.csv(
        "training_runs.csv",
        "optimizer,init,d_k,arm,seed,lr,budget,steps_to_target,steps_run,final_accuracy,diverged_at,\
         initial_logit_std,initial_max_p,initial_saturated_fraction,initial_query_std,initial_key_std,\
         final_query_std,final_key_std,final_temperature",
        &data
            .runs
            .iter()
            .map(|r| {
                let o = &r.outcome;
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    optimizer_name(r.condition.optimizer),
                    init_name(r.condition.init),
                    r.condition.d_k,
                    r.arm.slug(),
                    r.seed,
                    r.lr,
                    r.budget,
                    o.steps_to_target.map_or(String::new(), |s| s.to_string()),
                    o.steps_run,
                    o.final_accuracy,
                    o.diverged_at.map_or(String::new(), |s| s.to_string()),
                    o.initial.logit_std,
                    o.initial.max_prob,
                    o.initial.saturated_fraction,
                    o.initial.query_std,
                    o.initial.key_std,
                    o.last.query_std,
                    o.last.key_std,
                    o.final_temperature.map_or(String::new(), |t| t.to_string()),
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Where the evaluation runs' learning rates came from: this run's tuning, the committed table,
/// or both (the quick design tunes the arms the table lacks); with `--tune`, the arms whose
/// tuned rate differs from the committed one.
fn rates_note(data: &TrainingData) -> String {
    use super::rates::RateSource;
    let n_committed = data
        .tuned
        .iter()
        .filter(|t| t.source == Some(RateSource::Committed))
        .count();
    let n_tuned = data
        .tuned
        .iter()
        .filter(|t| t.source == Some(RateSource::Tuned))
        .count();
    let differ: Vec<String> = data
        .tuned
        .iter()
        .filter(|t| t.source == Some(RateSource::Tuned))
        .filter_map(|t| {
            let (chosen, committed) = (t.chosen?, t.committed?);
            (chosen != committed).then(|| {
                format!(
                    "{}, {}: {chosen} (committed {committed})",
                    condition(&t.condition),
                    t.arm.label()
                )
            })
        })
        .collect();
    let from = "the rate the full sweep chose in the report of commit 5a13d16, committed in \
                `experiments/training/rates.rs` (its seeds, grid and rule are fixed and its runs \
                deterministic, so on the same code it chooses the same rates)";
    if n_tuned == 0 {
        format!(
            "**In this run the sweep did not run**: every arm trains at {from}. `sdpa report --tune` \
             runs it and evaluates at the rates it chooses."
        )
    } else if n_committed > 0 {
        format!(
            "**In this run** {n_committed} arms train at {from}; the {n_tuned} arms without a committed \
             rate were tuned here (`sdpa report --tune` tunes every arm)."
        )
    } else if differ.is_empty() {
        "**In this run** every arm was tuned (`--tune`), and every tuned rate equals the committed one \
         (`experiments/training/rates.rs`), which the default report (without `--tune`) uses."
            .into()
    } else {
        format!(
            "**In this run** every arm was tuned (`--tune`); where the rate differs from the committed one \
             (`experiments/training/rates.rs`, which the default report uses): {}.",
            differ.join("; ")
        )
    }
}

/// The section.
pub fn render(data: &TrainingData, canvas: &mut Canvas) -> Result<String, LabError> {
    write_csv(data, canvas)?;
    let plots = super::plot::plots(data, canvas)?;
    let sweep_plots = super::sweep_plot::plots(data, canvas)?;
    answer::answer(
        data,
        canvas,
        plots
            .iter()
            .find(|p| p.contains("training_paired_unit.png"))
            .map(String::as_str),
    );
    let sizes = &data.sizes;
    let mechanism = data
        .mechanism
        .iter()
        .map(|m| {
            format!(
                "{} init, d_k = {}, {}: ρ = {}",
                m.init,
                m.d_k,
                m.arm.label(),
                show(m.rho)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let curves = if data.curves.is_empty() {
        "**Learning-rate curves**: not drawn in this run. They are the sweep's tuning runs (7 rates × \
         5 tuning seeds per arm, 1 400 runs, about 33 minutes more on 2 cores), which run with \
         `sdpa report --tune`; the rendered report in `docs/report` has them."
            .to_string()
    } else {
        format!(
            "**Learning-rate curves** (after Wortsman et al. 2023): per arm, the best rate by the median steps \
         to 99% over the tuning seeds (a run short of it counted as never; the best of 7 medians of 5 seeds \
         is a selected, optimistic figure: the evaluation runs' Kaplan–Meier median at the evaluation rate \
         stands beside it), the seeds' range, and the range of rates whose median is within \
         {SENSITIVITY_FACTOR}× of that best (its width in grid steps, each ×3 or ×3.33); the best rate by the \
         median held-out loss at step {}. The claims compare the arms seed by seed on three numbers: \
         Wortsman et al.'s learning-rate sensitivity of the final losses, the final loss at each arm's best \
         rate, and the width. Disclosed: the width was first counted in decades, which made a range moved \
         along the uneven grid look narrower, and a seed that never reached 99% at any rate counted as a \
         width of 0; a reviewer of this run's first rendering found both, and the sensitivity and best-loss \
         measures were added then, after the runs were seen (they need no threshold). Every point is in \
         `training_lr_curves.csv`; the plots (the four arms the sweep asks for; hollow markers where the \
         median never got there) follow the table. The rate for evaluation follows the rule above on the \
         same runs, so it can differ from the best median.\n\n{}\n{}",
            sizes.budget,
            super::sweep_plot::table(data),
            sweep_plots.join("\n"),
        )
    };
    let rates_note = rates_note(data);
    Ok(format!(
        "**Design** (fixed in `experiments/training/design.rs` before this run; its comments say which \
         values an earlier run informed, and which were chosen after these runs were seen: the equivalence \
         margin and the saturation split of the abstract). The model: *match* (k = 8, \
         vocabulary 64), d_model 64, one head of size d_k, d_v = 64, pre-LayerNorm, batches of 64, a held-out \
         evaluation every 10 steps on 2 batches; a run stops at {:.0}% held-out accuracy or at the budget of \
         {} steps. **Paired seeds**: {} evaluation seeds per arm, the same for every arm, so that two arms \
         with one seed start from the same parameters and see the same batches. **Learning rates**: each arm \
         of each condition gets its own, from Adam's grid {:?} (SGD with momentum 0.9: {:?}), chosen on {} \
         tuning seeds (from seed + {TUNING_SEED_OFFSET}, never evaluation seeds) by the fewest runs short of \
         the target, then the fewest steps (a run short of it counting the budget). Tuning runs train the \
         whole budget: they are also the **learning-rate curves** below (every tuned arm, and 1/√d_k, none, \
         1/d_k and QK-norm at d_k {:?} for both initializations). **Censoring**: a run that never reaches the target is censored at \
         the budget, never averaged as a number: Kaplan–Meier medians (Brookmeyer–Crowley 95% intervals), \
         sign tests with it ranked last, McNemar's exact test on stuck / not stuck (the primary endpoint), \
         Holm's correction across each claim's conditions, α = {ALPHA}; the intervals a claim decides on are \
         family-wise over its conditions (Bonferroni). **Thresholds**: extremely slow = the median paired \
         ratio of steps at least {SLOW_FACTOR}; failed completely = held-out accuracy below {FAILED_ACCURACY} \
         at the budget; equivalent = the median paired ratio's family-wise 90% interval inside \
         [1/{EQUIVALENCE_RATIO}, {EQUIVALENCE_RATIO}]. A learning rate marked † is an end of its grid: that arm's best rate \
         may lie beyond it.\n\n\
         {rates_note}\n\n{curves}\n\n\
         **The article's question: 1/√d_k vs none (Adam)**\n\n{}\n\
         **Temperature: 1/d_k and a learned temperature (starting at 1, unscaled).** The learned \
         temperature's θ = ln τ shares the model's Adam rate: Adam moves it by about the rate per step \
         whatever its gradient (typically; a step after a gradient spike can be a few times larger), so \
         within the budget it typically moves ≲ rate × {} (the claims print it per condition beside \
         ln √d_k, what 1/√d_k would need, and where it cannot get there): this arm measures the optimizer's \
         step as much as whether the scale can be learned; giving θ its own rate is left to a later \
         run.\n\n{}\n\
         **Controls at d_k = {} (unit init): soft-cap {}, QK-norm**\n\n{}\n\
         **SGD (secondary)**\n\n{}\n\
         **Interventions: unscaled, W_Q and W_K initialized × d_k^−¼** (its logits start exactly as 1/√d_k's, \
         same seed and draws; training follows the unscaled gradients); **and 1/√d_k with W_Q and W_K initialized × \
         d_k^¼** (its logits start exactly as the unscaled arm's; it trains at 1/√d_k's tuned rate, not a rate \
         of its own, so that its start is the one difference; under Adam, ε aside, it is unscaled attention \
         with W_Q, W_K stepped d_k^¼ slower, which a test of the lab checks)\n\n{}\n\
         **The premise: q and k components entering attention** (std over every component, at step 0 and at \
         the end of each run; Burn's default init gives q = LN(x)·W with W ~ U(±1/√64): std 1/√3 ≈ 0.577)\n\n{}\n\
         **Mechanism**: Spearman's ρ of the initial logit std and the steps to 99% within each arm and d_k \
         (over its evaluation seeds; family-wise 95% bootstrap intervals over seeds): {mechanism}.\n\n{}\n",
        100.0 * TARGET,
        sizes.budget,
        sizes.eval_seeds,
        sizes.adam_lrs,
        sizes.sgd_lrs,
        sizes.tuning_seeds,
        sizes.sweep_dims,
        comparison_table(data, Part::Main),
        sizes.budget,
        comparison_table(data, Part::Temperature),
        sizes.controls_dim,
        super::design::SOFTCAP,
        comparison_table(data, Part::Controls),
        comparison_table(data, Part::Sgd),
        comparison_table(data, Part::Intervention),
        premise_table(data),
        plots.join("\n"),
    ))
}
