//! The lab end to end: each experiment at `--quick` sizes with an invariant that could fail,
//! and the runner's promises (resume after a kill, render-only, shards merged bit for bit, the
//! cache never reusing another configuration's cell, the output folder's ownership).

mod claims;
mod docs_links;
mod runner_promises;

use std::path::Path;

use sdpa::BackendKind;
use sdpa::lab::runner::{self, RunOptions, RunOutcome, Shard};
use sdpa::lab::{Env, LabBackend, Outcome, Plan, Report, Verdict, find_experiment};
use sdpa::model::ProgressMode;

/// Every heap allocation counted, as in the `sdpa` binary (the `complexity` experiment reads it).
#[global_allocator]
static ALLOCATOR: sdpa::lab::memory::CountingAllocator = sdpa::lab::memory::CountingAllocator;

/// The environment: flex alone, or every compiled backend that opens a device here (flex
/// first). A compiled-in backend that opens none fails the test, but one that needs a GPU
/// ([`BackendKind::needs_gpu`], CUDA) on a machine without one, which is left out with a note.
pub fn env(all_backends: bool) -> Env {
    let mut kinds = if all_backends {
        usable_backends()
    } else {
        vec![BackendKind::Flex]
    };
    kinds.sort_by_key(|k| *k != BackendKind::Flex);
    Env {
        backends: kinds
            .into_iter()
            .map(|k| LabBackend {
                name: k.name().into(),
                device: k.device().unwrap_or_else(|e| panic!("{e}")),
            })
            .collect(),
    }
}

/// The compiled-in backends `env(true)` runs on (see [`env`]).
pub fn usable_backends() -> Vec<BackendKind> {
    let (usable, unusable) = BackendKind::usable();
    for (b, e) in unusable {
        assert!(
            b.needs_gpu(),
            "backend {b} is compiled in but unusable: {e}"
        );
        eprintln!("note: {b} left out: {e}");
    }
    usable.into_iter().map(|(b, _)| b).collect()
}

/// Options of a quick run into `out` (without `--tune`, as `sdpa report --quick`).
pub fn options(env: &Env, out: &Path, shard: Option<Shard>) -> RunOptions {
    RunOptions {
        plan: Plan {
            quick: true,
            seed: 42,
            backends: env.backends.iter().map(|b| b.name.clone()).collect(),
            tune: false,
            long: false,
        },
        out: out.to_path_buf(),
        shard,
        progress: ProgressMode::Quiet,
        skipped_backends: Vec::new(),
    }
}

/// Runs the named experiments at quick sizes into `out` and returns the report.
pub fn report(names: &[&str], all_backends: bool, out: &Path) -> Report {
    report_tuned(names, all_backends, out, false)
}

/// [`report`], with the learning-rate sweeps when `tune` (`sdpa report --quick --tune`).
pub fn report_tuned(names: &[&str], all_backends: bool, out: &Path, tune: bool) -> Report {
    let experiments: Vec<_> = names
        .iter()
        .map(|n| find_experiment(n).unwrap_or_else(|| panic!("no experiment {n}")))
        .collect();
    let env = env(all_backends);
    let mut options = options(&env, out, None);
    options.plan.tune = tune;
    match runner::run(&experiments, &env, &options).expect("report runs") {
        RunOutcome::Report(r) => {
            assert!(r.failures.is_empty(), "{:?}", r.failures);
            *r
        }
        RunOutcome::Shard { .. } => panic!("not a shard"),
    }
}

/// Runs one experiment and checks what every experiment owes: claims whose verdict follows, a
/// check and a measurement for each, files that exist.
fn run(name: &str, all_backends: bool) -> (tempfile::TempDir, sdpa::lab::report::ExperimentReport) {
    run_tuned(name, all_backends, false)
}

/// [`run`], with the learning-rate sweeps when `tune`.
fn run_tuned(
    name: &str,
    all_backends: bool,
    tune: bool,
) -> (tempfile::TempDir, sdpa::lab::report::ExperimentReport) {
    let tmp = tempfile::tempdir().expect("tmp");
    let r = report_tuned(&[name], all_backends, tmp.path(), tune);
    let e = r.experiments.into_iter().next().expect("one experiment");
    assert!(!e.claims.is_empty(), "{name}: no claims");
    assert_eq!(e.verdict, Verdict::from_claims(&e.claims), "{name}");
    for c in &e.claims {
        assert!(
            !c.check.is_empty() && !c.measured.is_empty(),
            "{name}: {c:?}"
        );
        // Every article claim that counts says what result would have made it fail (issue 66:
        // a verdict that could not have come out either way is not counted).
        assert!(
            !c.source.is_article() || !c.counts() || c.fails_if.is_some(),
            "{name}: {} says nothing of what would have failed it",
            c.id
        );
    }
    for p in e.plots.iter().chain(&e.csv) {
        let len = std::fs::metadata(tmp.path().join(p))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 100, "{name}: {p} missing or empty");
    }
    let md = std::fs::read_to_string(tmp.path().join("APPENDIX.md")).expect("APPENDIX.md");
    assert!(md.contains("**Claims.**") && md.contains(&format!("## {name}:")));
    (tmp, e)
}

/// The outcome of one claim.
fn outcome(e: &sdpa::lab::report::ExperimentReport, id: &str) -> Outcome {
    e.claims
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("{}: no claim {id}", e.name))
        .outcome
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number `{key}` in {v}"))
}

#[test]
fn dot_std_grows_like_sqrt_d() {
    let (_t, e) = run("dot-std", false);
    for r in e.data["rows"].as_array().expect("rows") {
        let ratio = num(r, "pooled_std") / num(r, "sqrt_d");
        assert!(
            (ratio - 1.0).abs() < 0.05,
            "std/√d = {ratio} at d = {}",
            r["d"]
        );
    }
    assert_eq!(outcome(&e, "std-grows-as-sqrt-d"), Outcome::Holds);
}

#[test]
fn saturation_matches_the_article_table() {
    let (_t, e) = run("saturation", false);
    let rows: Vec<&serde_json::Value> = e.data["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| !r["article_max_p"].is_null())
        .collect();
    assert_eq!(rows.len(), 12);
    for r in rows {
        assert!(
            (num(&r["max_p"], "value") - num(r, "article_max_p")).abs() <= 0.03,
            "{r}"
        );
        assert!(
            (num(&r["entropy"], "value") - num(r, "article_entropy")).abs() <= 0.08,
            "{r}"
        );
    }
    assert_eq!(outcome(&e, "larger-logits-saturate"), Outcome::Holds);
}

#[test]
fn attention_saturation_corrects_the_one_hot_claim_on_every_backend() {
    let (_t, e) = run("attention-saturation", true);
    let rows = e.data["corrected"].as_array().expect("corrected");
    let get = |d: u64, scaled: bool| {
        rows.iter()
            .find(|r| r["d"] == d && r["scaled"] == scaled)
            .cloned()
            .expect("row")
    };
    for d in [16, 64, 256, 1024] {
        let std = num(&get(d, true)["logit_std"], "value");
        assert!(
            (std - 1.0).abs() < 0.15,
            "scaled logit std {std} at d = {d}"
        );
    }
    assert!(num(&get(1024, false)["max_p"], "value") > 0.8);
    // Peaked, but not the article's 0.9999 one-hot per query.
    assert!(num(&get(1024, false)["max_p"], "value") < 0.99);
    assert_ne!(outcome(&e, "unscaled-is-one-hot"), Outcome::Holds);
    for r in e.data["replicated"].as_array().expect("replicated") {
        let b = r["scaled"][0].as_f64().expect("b");
        assert!((num(r, "article_entropy_formula") + b * (b + 1e-10).ln()).abs() < 1e-9);
    }
    // Measured on every backend: each cross-backend entry has every backend.
    let n = usable_backends().len();
    if n > 1 {
        assert!(!e.per_backend.is_empty());
        assert!(e.per_backend.iter().all(|b| b.values.len() == n));
    }
}

#[test]
fn gradients_autodiff_jacobian_equals_analytic_on_every_backend() {
    let (_t, e) = run("gradients", true);
    let rows = e.data["rows"].as_array().expect("rows");
    let n = usable_backends().len();
    // 4 d × 2 scalings × (every backend in the primary design + flex in the d_v = d one).
    assert_eq!(rows.len(), 4 * 2 * (n + 1));
    for r in rows.iter().filter(|r| !r["jacobian_check"].is_null()) {
        assert!(num(r, "jacobian_check") <= 1e-4, "{r}");
    }
    assert_eq!(outcome(&e, "autodiff-equals-analytic"), Outcome::Holds);
    assert_eq!(outcome(&e, "jacobian-tends-to-zero"), Outcome::Holds);
    // The key sweep (m = 256 in the quick run) beside the main m = 64: one crossover per m.
    assert_eq!(
        e.data["crossover_by_keys"]
            .as_array()
            .expect("crossovers")
            .len(),
        2
    );
    let every = e
        .claims
        .iter()
        .find(|c| c.id == "autodiff-equals-analytic")
        .expect("claim");
    assert_eq!(every.conditions.len(), n, "one condition per backend");
    if n > 1 {
        assert_eq!(outcome(&e, "backends-agree"), Outcome::Holds);
    } else {
        // "On every backend" is never claimed from one backend.
        assert!(e.claims.iter().all(|c| c.id != "backends-agree"));
    }
}

#[test]
fn compare_agrees_and_causality_holds_on_every_backend() {
    let (_t, e) = run("compare", true);
    let rows = e.data["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), usable_backends().len());
    // "Ours" is the path Auto takes: the CPU kernel on flex, not the naive path.
    for row in rows {
        if row[0] == "flex" {
            assert_eq!(row[1]["ours_path"], "cpu_kernel", "{row}");
        }
    }
    assert_eq!(e.verdict, Verdict::Reproduced);
}

#[test]
fn attention_map_trained_model_finds_twins() {
    let (_t, e) = run("attention-map", false);
    assert!(num(&e.data["trained"], "accuracy") > 0.9);
    assert_eq!(outcome(&e, "training-learns-matching"), Outcome::Holds);
    assert_eq!(outcome(&e, "copies-attend-to-twins"), Outcome::Fails);
}

#[test]
fn masks_split_the_minus_inf_claim_and_the_module_never_gives_nan() {
    let (_t, e) = run("masks", true);
    assert_eq!(outcome(&e, "module-bool-mask-is-exact"), Outcome::Holds);
    assert_eq!(outcome(&e, "module-never-nan"), Outcome::Holds);
    assert_eq!(outcome(&e, "minus-inf-causal-safe"), Outcome::Holds);
    assert_eq!(
        outcome(&e, "minus-inf-fully-masked-row-is-nan"),
        Outcome::Holds
    );
    assert_eq!(outcome(&e, "minus-1e9-at-the-edge-of-f32"), Outcome::Fails);
    assert_eq!(outcome(&e, "two-masks-overflow"), Outcome::Fails);
    assert_eq!(outcome(&e, "minus-1e9-example"), Outcome::Holds);
    // ndarray has no half precision: reported as skipped, not dropped.
    if BackendKind::Ndarray.is_compiled() {
        assert!(
            e.skipped.iter().any(|s| s.contains("ndarray")),
            "{:?}",
            e.skipped
        );
    }
}

#[test]
fn why_softmax_bounds_the_output_and_selects() {
    let (_t, e) = run("why-softmax", false);
    assert_eq!(outcome(&e, "raw-explodes"), Outcome::Holds);
    assert_eq!(outcome(&e, "softmax-budget"), Outcome::Holds);
    assert_eq!(outcome(&e, "softmax-selects"), Outcome::Holds);
}

#[test]
fn complexity_counts_the_weights_it_materializes() {
    let (_t, e) = run("complexity", false);
    let llama = &e.data["llama"];
    assert_eq!(llama["bytes_per_layer"], 2u64 * 32 * 4096 * 4096 * 2);
    assert_eq!(outcome(&e, "llama-per-layer"), Outcome::Holds);
    for r in e.data["rows"].as_array().expect("rows") {
        let held = num(r, "allocated_mib");
        if r["path"] == "Materialized" {
            // The counting allocator sees at least the weights tensor.
            assert!(held >= num(r, "weights_mib"), "{r}");
        }
    }
    assert_eq!(outcome(&e, "fast-path-holds-no-matrix"), Outcome::Holds);
}

#[test]
fn training_pairs_seeds_tunes_each_arm_and_never_averages_a_censored_run() {
    let (_t, e) = run_tuned("training", false, true);
    let d = &e.data;
    let comparisons = d["comparisons"].as_array().expect("comparisons");
    assert!(!comparisons.is_empty());
    for c in comparisons {
        // Pairs are complete: both arms ran every evaluation seed.
        assert_eq!(c["pairs"], d["sizes"]["eval_seeds"], "{c}");
        let (slower, faster, ties) = (
            num(c, "other_slower"),
            num(c, "other_faster"),
            num(c, "ties"),
        );
        assert_eq!(slower + faster + ties, num(c, "pairs"));
        assert!(num(c, "sign_p_holm") >= num(c, "sign_p"));
    }
    // With --tune every arm is tuned, and its learning-rate curve drawn.
    for t in d["tuned"].as_array().expect("tuned") {
        assert!(!t["chosen"].is_null(), "every arm got a rate: {t}");
        assert_eq!(t["source"], "Tuned", "{t}");
    }
    assert!(!d["curves"].as_array().expect("curves").is_empty());
    for r in d["runs"].as_array().expect("runs") {
        let o = &r["outcome"];
        assert!(num(&o["initial"], "logit_std") > 0.0);
        // A run short of the target is censored: no steps to target, never a number.
        if o["steps_to_target"].is_null() {
            assert_eq!(o["steps_run"], r["budget"], "{o}");
        }
    }
}

/// Without --tune (the default report, issue 54 item 7) the evaluation runs train at the
/// committed rates; only an arm without one (the quick design's controls at d_k 64) is tuned,
/// no learning-rate curve is drawn, and the section says how to run the sweep.
#[test]
fn training_without_tune_evaluates_at_the_committed_rates() {
    use sdpa::lab::experiments::training::rates::COMMITTED_LRS;
    let (t, e) = run("training", false);
    let d = &e.data;
    let mut committed = 0;
    for row in d["tuned"].as_array().expect("tuned") {
        assert!(!row["chosen"].is_null(), "every arm got a rate: {row}");
        if row["source"] == "Committed" {
            committed += 1;
            assert_eq!(row["chosen"], row["committed"], "{row}");
            assert!(
                row["scores"].as_array().is_some_and(|s| s.is_empty()),
                "{row}"
            );
        } else {
            assert!(
                row["committed"].is_null(),
                "tuned only without a committed rate: {row}"
            );
        }
    }
    assert!(committed >= 4, "{committed} arms at committed rates");
    assert!(COMMITTED_LRS.len() >= committed);
    // Curves only for the arms tuned here, none of which has a committed rate.
    for c in d["curves"].as_array().expect("curves") {
        let tuned = d["tuned"]
            .as_array()
            .expect("tuned")
            .iter()
            .find(|t| t["condition"] == c["condition"] && t["arm"] == c["arm"]);
        assert!(tuned.is_none_or(|t| t["source"] == "Tuned"), "{c}");
    }
    let appendix = std::fs::read_to_string(t.path().join("APPENDIX.md")).expect("APPENDIX.md");
    assert!(appendix.contains("--tune"), "the section names the switch");
    assert!(
        !e.plots.iter().any(|p| p.starts_with("training_lr_")),
        "{:?}",
        e.plots
    );
}

#[test]
fn training_variants_record_the_attention_over_the_whole_budget() {
    let (_t, e) = run("training-variants", false);
    let d = &e.data;
    let eval_seeds = d["sizes"]["eval_seeds"].as_u64().expect("eval seeds");
    let runs = d["runs"].as_array().expect("runs");
    // Four variants × two arms, every evaluation seed.
    assert_eq!(runs.len() as u64, 4 * 2 * eval_seeds);
    for r in runs {
        let curve = r["outcome"]["curve"].as_array().expect("curve");
        // Evaluation runs train the whole budget: their curves reach it, one point every 10
        // steps from step 0.
        let budget = r["budget"].as_u64().expect("budget");
        assert_eq!(num(&curve[0], "step"), 0.0);
        assert!(
            num(&curve[curve.len() - 1], "step") as u64 >= budget - 10,
            "{r}"
        );
        for p in curve {
            let (entropy, max_logit) = (num(p, "entropy"), num(p, "max_logit"));
            assert!((0.0..=1.0 + 1e-6).contains(&entropy), "{p}");
            assert!(max_logit.is_finite(), "{p}");
        }
    }
    // At step 0 the unscaled arm's logits are √64 = 8× the scaled arm's on the same draws, so
    // its attention is sharper and its largest logit larger, seed by seed.
    let step0 = |arm: &str, seed: &serde_json::Value, variant: &serde_json::Value, key: &str| {
        runs.iter()
            .find(|r| r["arm"] == arm && &r["seed"] == seed && &r["variant"] == variant)
            .map(|r| num(&r["outcome"]["curve"][0], key))
            .expect("the pair's other run")
    };
    for r in runs.iter().filter(|r| r["arm"] == "Scaled") {
        let (seed, variant) = (&r["seed"], &r["variant"]);
        assert!(
            step0("Unscaled", seed, variant, "entropy") < step0("Scaled", seed, variant, "entropy")
        );
        assert!(
            step0("Unscaled", seed, variant, "max_logit")
                > step0("Scaled", seed, variant, "max_logit")
        );
    }
    for c in d["paired"].as_array().expect("paired") {
        let n = num(c, "larger") + num(c, "smaller") + num(c, "ties") + num(c, "excluded");
        assert_eq!(n as u64, eval_seeds, "{c}");
        assert!(num(c, "p_holm") >= num(c, "p"));
    }
    for id in [
        "slower-beyond-the-small-model",
        "sharp-before-learning",
        "larger-logits-after-training",
    ] {
        let _ = outcome(&e, id);
    }
}

#[test]
fn logit_control_measures_every_control() {
    let (_t, e) = run("logit-control", false);
    let rows = e.data["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4 * 7);
    let std_of = |d_k: u64, control: &str| {
        rows.iter()
            .find(|r| r["d_k"] == d_k && r["control"].to_string().contains(control))
            .map(|r| num(&r["logit_std"], "value"))
            .unwrap_or_else(|| panic!("no row {d_k} {control}"))
    };
    // The measured logit stds follow their definitions: ≈ 1 scaled, ≈ √d_k unscaled, < c capped.
    assert!((std_of(1024, "\"Scaled\"") - 1.0).abs() < 0.1);
    assert!((std_of(1024, "\"Unscaled\"") - 32.0).abs() < 3.0);
    assert!(std_of(1024, "SoftCap") < 5.0);
}

#[test]
fn a_diverging_training_run_is_a_result_not_an_error() {
    use sdpa::lab::measures::training::{Arm, TrainingSpec, run};
    let spec = TrainingSpec {
        d_k: 64,
        arm: Arm::Unscaled,
        init: sdpa::model::QkInit::Unit,
        optimizer: sdpa::model::OptimizerKind::Sgd,
        lr: 1e6,
        seed: 1,
        budget: 60,
        stop_at_target: true,
        backend: "flex".into(),
    };
    let env = env(false);
    let o = run(&spec, &env.backends[0].device).expect("a diverged run is a result");
    assert!(o.diverged_at.is_some(), "{o:?}");
    assert!(o.steps_to_target.is_none());
    // It survives the cache's JSON (NaN accuracy included).
    let text = serde_json::to_string(&o).expect("json");
    let back: sdpa::lab::measures::training::TrainingOutcome =
        serde_json::from_str(&text).expect("back");
    assert!(back.final_accuracy.is_nan());
}

/// The intervention arm starts exactly where 1/√d_k starts (its W_Q, W_K × d_k^−¼ make the
/// unscaled logits equal to the scaled ones, same seed and draws) and then trains differently;
/// a sweep run (`stop_at_target: false`) trains its whole budget and reports its held-out loss.
#[test]
fn the_small_init_arm_starts_as_the_scaled_arm() {
    use sdpa::lab::measures::training::{Arm, TrainingSpec, run};
    let env = env(false);
    let device = &env.backends[0].device;
    for init in [sdpa::model::QkInit::Default, sdpa::model::QkInit::Unit] {
        let spec = |arm| TrainingSpec {
            d_k: 256,
            arm,
            init,
            optimizer: sdpa::model::OptimizerKind::Adam,
            lr: 1e-2,
            seed: 5,
            budget: 20,
            stop_at_target: false,
            backend: "flex".into(),
        };
        let scaled = run(&spec(Arm::Scaled), device).expect("scaled");
        let small = run(&spec(Arm::UnscaledSmallInit), device).expect("small init");
        let unscaled = run(&spec(Arm::Unscaled), device).expect("unscaled");
        let (a, b) = (scaled.initial.logit_std, small.initial.logit_std);
        assert!((a - b).abs() <= 1e-4 * a, "{init:?}: {a} vs {b}");
        // 16 = √256 times the unscaled arm's logits from the usual initialization.
        let ratio = unscaled.initial.logit_std / b;
        assert!((ratio - 16.0).abs() < 1e-2, "{init:?}: {ratio}");
        // Same start, different dynamics: the curves part after the first step.
        let (l0, m0) = (scaled.curve[0].eval_loss, small.curve[0].eval_loss);
        assert!((l0 - m0).abs() <= 1e-5 * l0, "{init:?}: {l0} vs {m0}");
        let (l1, m1) = (scaled.curve[1].eval_loss, small.curve[1].eval_loss);
        assert!((l1 - m1).abs() > 1e-4 * l1, "{init:?}: {l1} vs {m1}");
        // The whole budget, and the held-out loss at its end.
        assert_eq!(small.steps_run, 20);
        assert!(small.final_loss.is_finite() && small.final_loss > 0.0);
    }
}

/// The other intervention arm (1/√d_k, W_Q and W_K started × d_k^¼) starts as the unscaled arm
/// and trains as unscaled attention whose W_Q, W_K step at the rate × d_k^−¼: under Adam, which is
/// blind to a gradient's scale but for its ε, the two runs follow one trajectory of the logits.
/// ε (1e-5 in Burn's Adam) meets gradients d_k^¼ apart in the two, so they drift apart slowly:
/// about 1% of the largest logit by step 10 here, hence the tolerances.
#[test]
fn the_large_init_arm_is_unscaled_attention_with_slower_qk_steps() {
    use sdpa::lab::measures::training::{Arm, TrainingSpec, run_config, train_config};
    let env = env(false);
    let device = &env.backends[0].device;
    let d_k = 256;
    let spec = |arm| TrainingSpec {
        d_k,
        arm,
        init: sdpa::model::QkInit::Default,
        optimizer: sdpa::model::OptimizerKind::Adam,
        lr: 3e-3,
        seed: 7,
        budget: 30,
        stop_at_target: false,
        backend: "flex".into(),
    };
    let mut slow = train_config(&spec(Arm::Unscaled));
    slow.qk_lr_factor = (d_k as f64).powf(-0.25);
    let large = train_config(&spec(Arm::ScaledLargeInit));
    assert_eq!(Arm::ScaledLargeInit.rate_arm(), Arm::Scaled);
    let a = run_config(&slow, "flex", device).expect("unscaled, slow qk");
    let b = run_config(&large, "flex", device).expect("scaled, large start");
    let unscaled = run_config(&train_config(&spec(Arm::Unscaled)), "flex", device).expect("none");
    // It starts exactly as the unscaled arm (16 = √256 times the usual 1/√d_k's logits)…
    let (s0, u0) = (b.initial.logit_std, unscaled.initial.logit_std);
    assert!((s0 - u0).abs() <= 1e-4 * u0, "{s0} vs {u0}");
    // …and trains as unscaled attention with W_Q, W_K stepped d_k^¼ slower.
    for (p, q) in a.curve.iter().zip(&b.curve) {
        let rel = (p.eval_loss - q.eval_loss).abs() / q.eval_loss;
        assert!(
            rel < 1e-2,
            "step {}: {} vs {}",
            p.step,
            p.eval_loss,
            q.eval_loss
        );
        assert!(
            (p.max_logit - q.max_logit).abs() <= 3e-2 * q.max_logit.abs(),
            "step {}: largest logit {} vs {}",
            p.step,
            p.max_logit,
            q.max_logit
        );
    }
    // Not the plain unscaled run's: the curves part after the first step.
    let (l1, m1) = (unscaled.curve[1].eval_loss, b.curve[1].eval_loss);
    assert!((l1 - m1).abs() > 1e-4 * l1, "{l1} vs {m1}");
}

#[test]
fn bench_smoke_run_times_every_path_and_writes_its_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let env = env(false);
    let ctx = sdpa::lab::bench::BenchContext {
        progress: ProgressMode::Quiet,
        seed: 42,
    };
    let config = sdpa::lab::bench::BenchConfig::new(true);
    let report = sdpa::lab::bench::run_bench(&env.backends[0], &config, &ctx).expect("bench");
    // (6 paths dense forward and forward+backward, 5 in the padded, causal and the two packed
    // modes, where the baseline takes no mask) × 2 sizes.
    assert_eq!(report.rows.len(), 104);
    assert_eq!(
        report
            .rows
            .iter()
            .filter(|r| r.path == "cpu_kernel")
            .count(),
        20
    );
    assert!(
        report
            .rows
            .iter()
            .any(|r| r.mode == "forward+backward, packed")
    );
    assert!(
        report
            .rows
            .iter()
            .any(|r| r.mode == "forward+backward, causal")
    );
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert!(
        report
            .rows
            .iter()
            .filter(|r| r.path == "auto")
            .all(|r| r.takes.as_deref() == Some("cpu_kernel"))
    );
    assert!(
        report
            .rows
            .iter()
            .all(|r| r.median_ms > 0.0 && r.gflops > 0.0 && r.times_ms.len() == config.reps)
    );
    let names = sdpa::lab::bench::file_names(&report.backend, &config);
    let mut folder =
        sdpa::lab::bench::BenchFolder::claim(tmp.path(), &names, false).expect("its folder");
    let files = sdpa::lab::bench::write(&report, &mut folder).expect("write");
    // Every file written is one it planned, and its manifest lists it.
    let manifest = std::fs::read_to_string(tmp.path().join(sdpa::lab::bench::BENCH_MANIFEST))
        .expect("the manifest");
    for f in &files {
        let name = std::path::Path::new(f)
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert!(names.iter().any(|n| *n == name), "{name} not in {names:?}");
        assert!(manifest.lines().any(|l| l == name), "{name}: {manifest}");
    }
    for f in files {
        assert!(
            std::fs::metadata(&f)
                .map(|m| m.len() > 100)
                .unwrap_or(false),
            "{f}"
        );
    }
}

/// The report's first screen (issue 54): four answers in at most
/// [`FIRST_SCREEN_WORDS`](sdpa::lab::report::FIRST_SCREEN_WORDS) words, each with a number and
/// its interval, the key figure and the verdict table; then a screen per question; the
/// bookkeeping in `APPENDIX.md`.
#[test]
fn the_first_screen_answers_the_four_questions() {
    use sdpa::lab::answers::{Question, words};
    use sdpa::lab::report::{FIRST_SCREEN_WORDS, first_screen};
    let tmp = tempfile::tempdir().expect("tmp");
    let names = [
        "dot-std",
        "saturation",
        "attention-saturation",
        "gradients",
        "training",
        "training-confirm",
        "training-confirm-2",
        "masks",
    ];
    let r = report(&names, false, tmp.path());
    let md = std::fs::read_to_string(tmp.path().join("REPORT.md")).expect("REPORT.md");
    let screen = first_screen(&md);
    assert!(
        words(screen) <= FIRST_SCREEN_WORDS,
        "{} words:\n{screen}",
        words(screen)
    );
    for q in Question::ALL {
        let line = screen
            .lines()
            .find(|l| l.contains(q.text()))
            .unwrap_or_else(|| panic!("no answer to {q:?}:\n{screen}"));
        // One number with its interval: `x [lo, hi]`.
        assert!(
            line.contains('[') && line.contains(", ") && !line.contains("not measured"),
            "{line}"
        );
        assert!(md.contains(&format!("\n## {}\n", q.heading())), "{q:?}");
    }
    // The key figure exists, and the table has a row per decided claim, at most 8.
    let figure = screen
        .lines()
        .find_map(|l| l.strip_prefix("![").and_then(|l| l.split("](").nth(1)))
        .map(|l| l.trim_end_matches(')'))
        .expect("a key figure");
    assert!(tmp.path().join(figure).is_file(), "{figure}");
    let rows = screen.lines().filter(|l| l.starts_with("| ")).count();
    assert!((2..=9).contains(&rows), "{rows} table lines:\n{screen}");
    // Every experiment's section is in the appendix, none on the reader's page.
    let appendix = std::fs::read_to_string(tmp.path().join("APPENDIX.md")).expect("APPENDIX.md");
    for e in &r.experiments {
        assert!(appendix.contains(&format!("## {}:", e.name)), "{}", e.name);
        assert!(!md.contains(&format!("## {}:", e.name)), "{}", e.name);
    }
    assert!(md.contains("(APPENDIX.md)"));
}

/// The confirmatory run at quick sizes: fresh seeds (never an exploratory one), its own budget,
/// the six pre-registered hypotheses decided on its saturated condition.
#[test]
fn training_confirm_runs_its_fixed_design_on_fresh_seeds() {
    use sdpa::lab::experiments::training_confirm::design::CONFIRM_SEED_OFFSET;
    let (_t, e) = run("training-confirm", false);
    assert_eq!(e.claims.len(), 6, "{:?}", e.claims);
    assert_eq!(e.cells, 16, "2 conditions × 2 arms × 4 seeds");
    let runs = e.data["runs"].as_array().expect("runs");
    assert!(runs.iter().all(|r| {
        r["seed"]
            .as_u64()
            .is_some_and(|s| s >= 42 + CONFIRM_SEED_OFFSET)
            && r["budget"].as_u64() == Some(100)
    }));
    assert!(
        e.data["hypotheses"]["outcomes"]
            .as_array()
            .is_some_and(|o| o.len() == 6)
    );
}

#[test]
fn the_second_confirmatory_run_tests_at_the_rates_its_tuning_chose() {
    let (_t, e) = run("training-confirm-2", false);
    let rows = e.data["rows"].as_array().expect("rows");
    let tuning: Vec<&serde_json::Value> = rows.iter().filter(|r| r["tuning"] == true).collect();
    // Quick sizes: 1 condition × 2 arms × 2 rates × 2 tuning seeds.
    assert_eq!(tuning.len(), 8);
    assert!(tuning.iter().all(|r| {
        r["seed"]
            .as_u64()
            .is_some_and(|s| (70_042..70_044).contains(&s))
    }));
    let chosen = &e.data["chosen"][0];
    let (own_scaled, own_unscaled, shared) = (
        num(chosen, "own_scaled"),
        num(chosen, "own_unscaled"),
        num(chosen, "shared"),
    );
    // Every test run is at a rate a scheme chose for its arm, on a test seed.
    let test: Vec<&serde_json::Value> = rows.iter().filter(|r| r["tuning"] == false).collect();
    assert!(!test.is_empty());
    for r in &test {
        let lr = num(r, "lr");
        let own = if r["scaled"] == true {
            own_scaled
        } else {
            own_unscaled
        };
        assert!(lr == own || lr == shared, "{r}");
        assert!(
            r["seed"]
                .as_u64()
                .is_some_and(|s| (80_042..80_045).contains(&s)),
            "{r}"
        );
    }
    // Both schemes decided, with three pairs each.
    let schemes = e.data["schemes"].as_array().expect("schemes");
    assert_eq!(schemes.len(), 2);
    assert!(
        schemes
            .iter()
            .all(|s| s["pairs"].as_array().map(Vec::len) == Some(3))
    );
    assert!(e.claims.iter().any(|c| c.id == "confirm2-sentence"));
}
