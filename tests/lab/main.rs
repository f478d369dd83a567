//! Each experiment of the lab at a small size, checking an invariant that could fail; plus the
//! report's reproducibility.

use sdpa::BackendKind;
use sdpa::lab::{
    Experiment, ExperimentOutput, LabBackend, LabContext, find_experiment, run_report,
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

#[test]
fn dot_std_grows_like_sqrt_d() {
    let (_t, out) = run("dot-std", false);
    for r in rows(&out, "rows") {
        let ratio = num(&r, "std") / num(&r, "sqrt_d");
        assert!(
            (ratio - 1.0).abs() < 0.05,
            "std/√d = {ratio} at d = {}",
            r["d"]
        );
    }
}

#[test]
fn saturation_matches_the_article_table() {
    let (_t, out) = run("saturation", false);
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
}

#[test]
fn attention_saturation_unscaled_collapses_scaled_does_not() {
    let (_t, out) = run("attention-saturation", false);
    let rows = rows(&out, "corrected");
    let get = |d: u64, scaled: bool| {
        rows.iter()
            .find(|r| r["d"] == d && r["scaled"] == scaled)
            .cloned()
            .expect("row")
    };
    for d in [16, 64, 256, 1024] {
        assert!(
            (num(&get(d, true), "logit_std") - 1.0).abs() < 0.15,
            "scaled logit std at d = {d}"
        );
    }
    assert!(num(&get(1024, false), "max_p") > 0.9);
    assert!(num(&get(1024, true), "max_p") < 0.1);
    // The replicated article code reproduces its "entropy" formula −b ln b.
    for r in out.results["replicated_article_code"]
        .as_array()
        .expect("replicated")
    {
        let b = num(r, "max_p_scaled");
        assert!((num(r, "article_entropy_formula") + b * (b + 1e-10).ln()).abs() < 1e-9);
    }
}

#[test]
fn gradients_autodiff_jacobian_equals_analytic_on_every_backend() {
    let (_t, out) = run("gradients", true);
    let rows = rows(&out, "rows");
    assert_eq!(rows.len(), 8 * BackendKind::compiled().len());
    for r in &rows {
        assert!(num(r, "jacobian_max_abs_diff") <= 1e-4, "{r}");
    }
    let pick = |d: u64, scaled: bool| {
        rows.iter()
            .find(|r| r["d"] == d && r["scaled"] == scaled && r["backend"] == "flex")
            .cloned()
            .expect("row")
    };
    // Unscaled, the softmax Jacobian shrinks as d grows and is well below the scaled one at d = 1024.
    assert!(
        num(&pick(1024, false), "jacobian_norm_analytic")
            < 0.5 * num(&pick(16, false), "jacobian_norm_analytic")
    );
    assert!(
        num(&pick(1024, false), "jacobian_norm_analytic")
            < 0.5 * num(&pick(1024, true), "jacobian_norm_analytic")
    );
    assert!(
        num(&pick(1024, false), "share_keys_with_gradient")
            < num(&pick(1024, true), "share_keys_with_gradient")
    );
}

#[test]
fn compare_agrees_and_causality_holds_on_every_backend() {
    let (_t, out) = run("compare", true);
    let rows = rows(&out, "rows");
    assert_eq!(rows.len(), BackendKind::compiled().len());
    for r in rows {
        assert!(
            num(&r, "ours_vs_burn") < 1e-5 && num(&r, "ours_vs_naive") < 1e-5,
            "{r}"
        );
        assert_eq!(num(&r, "causal_early_change"), 0.0, "{r}");
        assert!(num(&r, "causal_late_change") > 1.0, "{r}");
    }
}

#[test]
fn attention_map_trained_model_finds_twins() {
    let (_t, out) = run("attention-map", false);
    let random = &out.results["random"];
    assert!(
        num(random, "share_twin_is_max") < 0.6,
        "random projections should not reliably find twins"
    );
    let trained = &out.results["trained"];
    assert!(num(trained, "accuracy") > 0.9);
    let best = trained["share_twin_is_max"]
        .as_array()
        .expect("shares")
        .iter()
        .filter_map(|v| v.as_f64())
        .fold(0.0, f64::max);
    assert!(best > 0.9, "trained best head finds the twin in {best}");
}

#[test]
fn masks_module_bool_mask_never_nan() {
    let (_t, out) = run("masks", true);
    let rows = rows(&out, "rows");
    assert!(!rows.is_empty());
    for r in &rows {
        let want = if r["fully_masked"] == true {
            "zeros"
        } else {
            "correct"
        };
        assert_eq!(r["module_bool"], want, "{r}");
        assert_ne!(r["module_bias"], "NaN", "{r}");
    }
    // The plain softmax of a fully masked −∞ row is NaN: the failure the module avoids.
    assert!(
        rows.iter()
            .any(|r| r["fill"] == "-inf" && r["fully_masked"] == true && r["softmax"] == "NaN")
    );
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
fn why_softmax_raw_grows_softmax_stays_bounded() {
    let (_t, out) = run("why-softmax", false);
    let rows = rows(&out, "rows");
    let get = |m: &str, n: u64| {
        rows.iter()
            .find(|r| r["method"] == m && r["n"] == n && r["d"] == 64)
            .map(|r| num(r, "output_std"))
            .expect("row")
    };
    assert!(get("raw dot products", 256) > 3.0 * get("raw dot products", 16));
    assert!(get("softmax", 256) <= 1.0 && get("softmax", 16) <= 1.0);
}

#[test]
fn complexity_llama_arithmetic_and_quadratic_memory() {
    let (_t, out) = run("complexity", false);
    let llama = &out.results["llama_7b"];
    assert_eq!(llama["bytes_per_layer"], 2u64 * 32 * 4096 * 4096 * 2);
    assert_eq!(llama["bytes_all_layers"], 2u64 * 32 * 4096 * 4096 * 2 * 32);
    let rows = rows(&out, "rows");
    let t = |n: u64| {
        rows.iter()
            .find(|r| {
                r["n"] == n
                    && r["path"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("materialized"))
            })
            .map(|r| num(r, "time_ms"))
            .expect("row")
    };
    assert!(t(1024) > t(128), "time must grow with n");
}

#[test]
fn training_experiment_runs_and_records_steps_to_target() {
    let (_t, out) = run("training", false);
    let runs = rows(&out, "runs");
    assert_eq!(runs.len(), 2);
    let scaled = runs
        .iter()
        .find(|r| r["scaled"] == true)
        .expect("scaled run");
    assert!(num(scaled, "final_accuracy") > 0.5, "{scaled}");
    assert!(runs.iter().all(|r| num(r, "initial_logit_std") > 0.0));
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
