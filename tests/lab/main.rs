//! Each experiment of the lab at a small size, checking an invariant that could fail; plus the
//! report's reproducibility.

use sdpa::BackendKind;
mod claims;

use sdpa::lab::{
    Experiment, ExperimentOutput, LabBackend, LabContext, Outcome, Verdict, find_experiment,
    run_report,
};
use sdpa::model::ProgressMode;

fn ctx(dir: &std::path::Path, all_backends: bool) -> LabContext {
    let kinds = if all_backends {
        BackendKind::compiled()
    } else {
        vec![BackendKind::Flex]
    };
    LabContext {
        backends: kinds
            .into_iter()
            .map(|k| LabBackend {
                name: k.name().into(),
                device: k.device().unwrap_or_else(|e| panic!("{e}")),
            })
            .collect(),
        seed: 42,
        quick: true,
        out_dir: dir.to_path_buf(),
        progress: ProgressMode::Quiet,
        skipped_backends: Vec::new(),
    }
}

fn run(name: &str, all_backends: bool) -> (tempfile::TempDir, ExperimentOutput) {
    let tmp = tempfile::tempdir().expect("tmp");
    let e: Box<dyn Experiment> =
        find_experiment(name).unwrap_or_else(|| panic!("no experiment {name}"));
    let out = e
        .run(&ctx(tmp.path(), all_backends))
        .unwrap_or_else(|err| panic!("{name}: {err}"));
    for p in out.plots.iter().chain(&out.csv) {
        let path = tmp.path().join(p);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(len > 100, "{name}: {p} missing or empty");
    }
    assert!(!out.markdown.is_empty() && !out.summary.is_empty());
    (tmp, out)
}

fn rows(out: &ExperimentOutput, key: &str) -> Vec<serde_json::Value> {
    out.results[key]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no `{key}` in results"))
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number `{key}` in {v}"))
}

/// The outcome of one claim of an output.
fn outcome(out: &ExperimentOutput, id: &str) -> Outcome {
    out.claims
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("{}: no claim {id}", out.name))
        .outcome
}

/// Every output has claims, a verdict that follows from them, and a claims table.
fn check_claims(out: &ExperimentOutput) {
    assert!(!out.claims.is_empty(), "{}: no claims", out.name);
    assert_eq!(
        out.verdict,
        Verdict::from_claims(&out.claims),
        "{}",
        out.name
    );
    assert!(out.markdown.contains("**Claims.**"), "{}", out.name);
    for c in &out.claims {
        assert!(
            !c.check.is_empty() && !c.measured.is_empty(),
            "{}: {c:?}",
            out.name
        );
    }
}

#[test]
fn dot_std_grows_like_sqrt_d() {
    let (_t, out) = run("dot-std", false);
    check_claims(&out);
    for r in rows(&out, "rows") {
        let ratio = num(&r, "std") / num(&r, "sqrt_d");
        assert!(
            (ratio - 1.0).abs() < 0.05,
            "std/√d = {ratio} at d = {}",
            r["d"]
        );
    }
    assert_eq!(outcome(&out, "std-grows-as-sqrt-d"), Outcome::Holds);
}

#[test]
fn saturation_matches_the_article_table() {
    let (_t, out) = run("saturation", false);
    check_claims(&out);
    let rows = rows(&out, "rows");
    assert_eq!(rows.len(), 12);
    for r in rows {
        assert!(
            (num(&r, "max_p") - num(&r, "article_max_p")).abs() <= 0.03,
            "{r}"
        );
        assert!(
            (num(&r, "entropy") - num(&r, "article_entropy")).abs() <= 0.08,
            "{r}"
        );
    }
    assert_eq!(outcome(&out, "larger-logits-saturate"), Outcome::Holds);
}

#[test]
fn attention_saturation_unscaled_collapses_scaled_does_not() {
    let (_t, out) = run("attention-saturation", true);
    check_claims(&out);
    let rows = rows(&out, "corrected");
    let get = |d: u64, scaled: bool| {
        rows.iter()
            .find(|r| r["d"] == d && r["scaled"] == scaled)
            .cloned()
            .expect("row")
    };
    for d in [16, 64, 256, 1024] {
        assert!(
            (num(&get(d, true)["logit_std"], "value") - 1.0).abs() < 0.15,
            "scaled logit std at d = {d}"
        );
    }
    assert!(num(&get(1024, false)["max_p"], "value") > 0.9);
    assert!(num(&get(1024, true)["max_p"], "value") < 0.1);
    assert_eq!(outcome(&out, "unscaled-collapses"), Outcome::Holds);
    // The replicated article code reproduces its "entropy" formula −b ln b.
    for r in out.results["replicated_article_code"]
        .as_array()
        .expect("replicated")
    {
        let b = num(r, "max_p_scaled");
        assert!((num(r, "article_entropy_formula") + b * (b + 1e-10).ln()).abs() < 1e-9);
    }
    // Measured on every backend: a cross-backend entry per cell.
    assert_eq!(out.backends.len(), BackendKind::compiled().len());
    assert!(
        out.per_backend
            .iter()
            .all(|b| b.values.len() == out.backends.len())
    );
}

#[test]
fn gradients_autodiff_jacobian_equals_analytic_on_every_backend() {
    let (_t, out) = run("gradients", true);
    check_claims(&out);
    let rows = rows(&out, "rows");
    assert_eq!(rows.len(), 8 * BackendKind::compiled().len());
    for r in &rows {
        assert!(num(r, "jacobian_autodiff_max_diff") <= 1e-4, "{r}");
    }
    assert_eq!(outcome(&out, "autodiff-equals-analytic"), Outcome::Holds);
    assert_eq!(outcome(&out, "jacobian-vanishes"), Outcome::Holds);
    if BackendKind::compiled().len() > 1 {
        assert_eq!(outcome(&out, "backends-agree"), Outcome::Holds);
    }
}

#[test]
fn compare_agrees_and_causality_holds_on_every_backend() {
    let (_t, out) = run("compare", true);
    check_claims(&out);
    let rows = rows(&out, "rows");
    assert_eq!(rows.len(), BackendKind::compiled().len());
    assert_eq!(out.verdict, Verdict::Reproduced);
}

#[test]
fn attention_map_trained_model_finds_twins() {
    let (_t, out) = run("attention-map", false);
    check_claims(&out);
    let trained = &out.results["trained"];
    assert!(num(trained, "accuracy") > 0.9);
    assert_eq!(outcome(&out, "training-learns-matching"), Outcome::Holds);
    assert_eq!(outcome(&out, "copies-attend-to-twins"), Outcome::Fails);
}

#[test]
fn masks_module_bool_mask_never_nan() {
    let (_t, out) = run("masks", true);
    check_claims(&out);
    let rows = rows(&out, "rows");
    assert!(!rows.is_empty());
    assert_eq!(outcome(&out, "module-bool-mask-is-exact"), Outcome::Holds);
    assert_eq!(outcome(&out, "module-never-nan"), Outcome::Holds);
    assert_eq!(outcome(&out, "minus-inf-is-safe"), Outcome::Fails);
    // ndarray has no half precision: reported as skipped, not dropped.
    if BackendKind::Ndarray.is_compiled() {
        assert!(
            out.skipped.iter().any(|s| s.contains("ndarray")),
            "{:?}",
            out.skipped
        );
    }
}

#[test]
fn why_softmax_softmax_decays_in_n_and_selects() {
    let (_t, out) = run("why-softmax", false);
    check_claims(&out);
    assert_eq!(outcome(&out, "raw-explodes"), Outcome::Holds);
    // softmax's output is NOT bounded in n with std-1 logits: that claim of the article fails.
    assert_eq!(outcome(&out, "softmax-bounded-in-n"), Outcome::Fails);
    assert!(!out.markdown.contains("bounded by the values' whatever n"));
}

#[test]
fn complexity_llama_arithmetic_and_quadratic_memory() {
    let (_t, out) = run("complexity", false);
    check_claims(&out);
    let llama = &out.results["llama_7b"];
    assert_eq!(llama["bytes_per_layer"], 2u64 * 32 * 4096 * 4096 * 2);
    assert_eq!(llama["bytes_all_layers"], 2u64 * 32 * 4096 * 4096 * 2 * 32);
    assert_eq!(outcome(&out, "llama-per-layer"), Outcome::Holds);
    assert!(
        !out.markdown.contains("NaN"),
        "no NaN exponent in the report"
    );
    // The fastest path has no weights tensor to report.
    for r in rows(&out, "rows") {
        let fastest = r["path"].as_str().is_some_and(|p| p.starts_with("fastest"));
        assert_eq!(r["weights_mib"].is_null(), fastest, "{r}");
    }
}

#[test]
fn training_experiment_runs_ten_seed_cells_in_both_directions() {
    let (_t, out) = run("training", false);
    check_claims(&out);
    let cells = rows(&out, "cells");
    assert!(!cells.is_empty());
    for c in &cells {
        let success = &c["success"];
        assert!(
            num(success, "lo") <= num(success, "value")
                && num(success, "value") <= num(success, "hi")
        );
    }
    let runs = rows(&out, "runs");
    assert!(runs.iter().all(|r| num(r, "initial_logit_std") > 0.0));
}

#[test]
fn logit_control_compares_every_control_at_init_and_in_training() {
    let (_t, out) = run("logit-control", false);
    check_claims(&out);
    let init = rows(&out, "init");
    // 4 d_k × 7 controls, each with its draws.
    assert_eq!(init.len(), 28);
    let cell = |d_k: u64, control: &str| {
        init.iter()
            .find(|r| r["d_k"] == d_k && r["control"].to_string().contains(control))
            .unwrap_or_else(|| panic!("no init row {d_k} {control}"))
            .clone()
    };
    // The measured logit stds follow their definitions: ≈ 1 scaled, ≈ √d_k unscaled, < c capped.
    let std_of = |r: &serde_json::Value| num(&r["logit_std"], "value");
    assert!((std_of(&cell(1024, "\"Scaled\"")) - 1.0).abs() < 0.1);
    assert!((std_of(&cell(1024, "\"Unscaled\"")) - 32.0).abs() < 3.0);
    assert!(std_of(&cell(1024, "SoftCap")) < 5.0);
    let cells = rows(&out, "cells");
    assert_eq!(cells.len(), 5, "quick: one d_k × 5 controls");
    assert!(
        rows(&out, "runs")
            .iter()
            .all(|r| !r["diverged_at"].is_null() || num(r, "final_accuracy") >= 0.0)
    );
}

#[test]
fn a_diverging_lab_run_is_a_result_not_an_error() {
    use sdpa::lab::experiments::training;
    let tmp = tempfile::tempdir().expect("tmp");
    let ctx = ctx(tmp.path(), false);
    let mut config = training::match_config(64, 1, 60, 10);
    config.optimizer = sdpa::model::OptimizerKind::Sgd;
    config.lr = 1e6;
    config.model.scale = sdpa::ScalePolicy::Unscaled;
    let summary = training::lab_run(&config, ctx.primary(), tmp.path().join("run"))
        .expect("a diverged run is a result");
    assert!(summary.diverged_at.is_some(), "{summary:?}");
    assert!(summary.steps_to_target.is_none());
}

#[test]
fn report_is_reproducible_and_complete() {
    let names = ["dot-std", "saturation", "why-softmax"];
    let experiments = || {
        names
            .iter()
            .map(|n| find_experiment(n).expect("exists"))
            .collect::<Vec<_>>()
    };
    let a = tempfile::tempdir().expect("tmp");
    let b = tempfile::tempdir().expect("tmp");
    let ra = run_report(&ctx(a.path(), false), &experiments()).expect("report a");
    let rb = run_report(&ctx(b.path(), false), &experiments()).expect("report b");
    assert!(ra.failures.is_empty());
    for (x, y) in ra.experiments.iter().zip(&rb.experiments) {
        assert_eq!(
            x.results, y.results,
            "{}: same seed and backend must give the same numbers",
            x.name
        );
    }
    let md = std::fs::read_to_string(a.path().join("REPORT.md")).expect("REPORT.md");
    for n in names {
        assert!(md.contains(&format!("## {n}:")), "REPORT.md lacks {n}");
    }
    // The ledger of the article's claims comes first, each with its outcome.
    assert!(md.find("## The article's claims") < md.find("## dot-std:"));
    assert!(md.contains("| §3.1 |"), "{md}");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.path().join("results.json")).expect("json"),
    )
    .expect("parse");
    assert_eq!(json["backends"][0], "flex");
    assert_eq!(json["seed"], 42);
    assert!(json["experiments"][0]["seconds"].is_number());
}

#[test]
fn bench_smoke_run_times_every_path_and_writes_its_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ctx = ctx(tmp.path(), false);
    let config = sdpa::lab::bench::BenchConfig::new(true);
    let report = sdpa::lab::bench::run_bench(ctx.primary(), &config, &ctx).expect("bench");
    // (6 paths forward and forward+backward, 5 in the padded modes, where the baseline takes no
    // mask) × 2 sizes.
    assert_eq!(report.rows.len(), 44);
    // The CPU kernel runs every mode, and Auto takes it on the CPU backend.
    assert_eq!(
        report
            .rows
            .iter()
            .filter(|r| r.path == "cpu_kernel")
            .count(),
        8
    );
    assert!(
        report
            .rows
            .iter()
            .filter(|r| r.path == "auto")
            .all(|r| r.takes.as_deref() == Some("cpu_kernel")),
        "{:?}",
        report
            .rows
            .iter()
            .map(|r| (&r.path, &r.takes))
            .collect::<Vec<_>>()
    );
    assert!(
        report
            .rows
            .iter()
            .all(|r| r.median_ms > 0.0 && r.gflops > 0.0 && r.times_ms.len() == config.reps)
    );
    assert_eq!(report.auto_ratio.len(), 8);
    assert_eq!(report.auto_ratio_paired.len(), 8);
    assert!(
        report
            .auto_ratio_paired
            .iter()
            .all(|(_, _, r)| r.is_finite() && *r > 0.0)
    );
    assert!(
        report
            .memory
            .iter()
            .any(|m| m.path == "chunked" && m.seconds.is_some())
    );
    assert!(
        report
            .training_memory
            .iter()
            .any(|m| m.path == "auto" && m.peak_mib.is_some())
    );
    let files = sdpa::lab::bench::write(&report, &ctx).expect("write");
    for f in files {
        assert!(
            std::fs::metadata(&f)
                .map(|m| m.len() > 100)
                .unwrap_or(false),
            "{f}"
        );
    }
}
