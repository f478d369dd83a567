//! End-to-end tests of the trainable model and its training loop (flex backend).

mod recorded_stats;

use std::path::Path;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::DType;
use sdpa::model::{
    ModelError, ProgressMode, QkInit, RunOptions, TaskConfig, TaskKind, TrainConfig, TrainResult,
    init_model, train,
};
use sdpa::{Precision, ScalePolicy};

fn device() -> Device {
    Device::flex()
}

fn small_config(steps: usize, seed: u64) -> TrainConfig {
    let mut c = TrainConfig::for_task(TaskConfig::new().with_k(4).with_vocab(16));
    c.steps = steps;
    c.seed = seed;
    c.batch_size = 16;
    c.log_every = 1;
    c.eval_every = 5;
    c.eval_batches = 2;
    c.stop_at_target = false;
    c
}

fn run(config: &TrainConfig, dir: &Path, resume: bool) -> Result<TrainResult, ModelError> {
    train(
        config,
        &device(),
        &RunOptions {
            out_dir: dir.to_path_buf(),
            resume,
            backend: "flex".into(),
            progress: ProgressMode::Quiet,
            overwrite: false,
        },
    )
}

/// Every file under a directory with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.display().to_string(),
                    std::fs::read(&p).expect("read file"),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn overfitting_one_fixed_batch_drives_the_loss_near_zero() {
    let device = device().autodiff();
    let task = TaskConfig::new().with_k(4).with_vocab(16);
    let config = small_config(1, 3);
    let mut model = init_model(&config.model, 3, &device).expect("model");
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    let batch = task.batch(&mut rng, 8, &device);
    let mut optim = AdamConfig::new().init();
    let first = model.forward_batch(&batch, false).loss.into_scalar::<f32>();
    let mut last = first;
    for _ in 0..300 {
        let out = model.forward_batch(&batch, false);
        last = out.loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(out.loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    println!("loss {first} -> {last}");
    assert!(last < 0.05, "loss only went from {first} to {last}");
}

/// Mixed precision (`--dtype bf16`): the attention computes in bf16 between f32 projections, the
/// parameters and their gradients stay f32, the first loss is the f32 model's within bf16's
/// precision (not bit for bit: bf16 is really used), and the model still fits a batch.
#[test]
fn bf16_attention_trains_with_f32_parameters_and_gradients() {
    let device = device().autodiff();
    let task = TaskConfig::new().with_k(4).with_vocab(16);
    let mut config = small_config(1, 3);
    config.model.attention.precision = Precision::Bf16;
    let mut model = init_model(&config.model, 3, &device).expect("model");
    let reference = init_model(&small_config(1, 3).model, 3, &device).expect("model");
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    let batch = task.batch(&mut rng, 8, &device);
    let out = model.forward_batch(&batch, false);
    let first = out.loss.clone().into_scalar::<f32>();
    let f32_first = reference
        .forward_batch(&batch, false)
        .loss
        .into_scalar::<f32>();
    assert!(
        (first - f32_first).abs() <= 0.02 * f32_first.abs() && first != f32_first,
        "bf16 loss {first} vs f32 {f32_first}"
    );
    let grads = out.loss.backward();
    let query = &model.blocks[0].attention.query.weight;
    assert_eq!(query.val().dtype(), DType::F32);
    assert_eq!(query.grad(&grads).expect("a gradient").dtype(), DType::F32);
    let mut optim = AdamConfig::new().init();
    let mut last = first;
    for _ in 0..300 {
        let out = model.forward_batch(&batch, false);
        last = out.loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(out.loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    println!("bf16 loss {first} -> {last}");
    assert!(last < 0.05, "loss only went from {first} to {last}");
}

#[test]
fn same_seed_same_metrics_different_seed_different_metrics() {
    let tmp = tempfile::tempdir().expect("tmp");
    let a = run(&small_config(12, 7), &tmp.path().join("a"), false).expect("run a");
    let b = run(&small_config(12, 7), &tmp.path().join("b"), false).expect("run b");
    let c = run(&small_config(12, 8), &tmp.path().join("c"), false).expect("run c");
    let losses = |r: &TrainResult| r.metrics.iter().map(|m| m.loss).collect::<Vec<_>>();
    assert_eq!(losses(&a).len(), 12);
    assert_eq!(losses(&a), losses(&b), "same seed, same backend");
    assert_eq!(
        a.metrics
            .iter()
            .map(|m| m.grad_norm_query)
            .collect::<Vec<_>>(),
        b.metrics
            .iter()
            .map(|m| m.grad_norm_query)
            .collect::<Vec<_>>()
    );
    assert_ne!(losses(&a), losses(&c), "different seeds");
}

#[test]
fn resumed_run_ends_like_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().expect("tmp");
    let full = run(&small_config(20, 11), &tmp.path().join("full"), false).expect("full run");
    let dir = tmp.path().join("split");
    run(&small_config(10, 11), &dir, false).expect("first half");
    let resumed = run(&small_config(20, 11), &dir, true).expect("resumed");
    assert_eq!(resumed.summary.resumed_from, Some(10));
    assert_eq!(resumed.summary.steps_run, 20);
    let last = |r: &TrainResult| {
        r.metrics
            .iter()
            .find(|m| m.step == 19)
            .map(|m| m.loss)
            .expect("step 19")
    };
    let (a, b) = (last(&full), last(&resumed));
    println!("final loss uninterrupted {a}, resumed {b}");
    assert!((a - b).abs() < 1e-5, "final losses differ: {a} vs {b}");
    assert!((full.summary.final_eval_loss - resumed.summary.final_eval_loss).abs() < 1e-5);
    // The resumed metrics.csv holds every step once.
    let steps: Vec<usize> = resumed.metrics.iter().map(|m| m.step).collect();
    assert_eq!(steps.iter().filter(|&&s| s == 10).count(), 1, "{steps:?}");
}

#[test]
fn a_run_recorded_before_max_logit_resumes_and_is_rewritten_in_the_new_format() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("old");
    run(&small_config(6, 4), &dir, false).expect("first half");
    // Rewrite metrics.csv as a version without the max_logit columns wrote it.
    let path = dir.join("metrics.csv");
    let text = std::fs::read_to_string(&path).expect("metrics");
    let header: Vec<&str> = text.lines().next().expect("header").split(',').collect();
    let keep: Vec<bool> = header
        .iter()
        .map(|h| !h.starts_with("max_logit_l"))
        .collect();
    assert!(
        keep.iter().any(|k| !k),
        "the new format has max_logit columns"
    );
    let old: String = text
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line
                .split(',')
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(f, _)| f)
                .collect();
            fields.join(",") + "\n"
        })
        .collect();
    std::fs::write(&path, old).expect("old format");
    let resumed = run(&small_config(10, 4), &dir, true).expect("resumes");
    assert_eq!(resumed.summary.resumed_from, Some(6));
    let rewritten = std::fs::read_to_string(&path).expect("metrics");
    assert_eq!(
        rewritten.lines().next(),
        text.lines().next(),
        "the new header"
    );
    let (before, after): (Vec<_>, Vec<_>) = resumed.metrics.iter().partition(|m| m.step < 6);
    assert!(before.iter().all(|m| m.layers[0].max_logit.is_nan()));
    assert!(after.iter().all(|m| m.layers[0].max_logit.is_finite()));
}

#[test]
fn corrupt_missing_or_mismatched_checkpoints_are_errors_and_change_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("run");
    run(&small_config(5, 2), &dir, false).expect("run");

    // Truncated model file.
    let model_path = dir.join("checkpoint/model.bpk");
    let bytes = std::fs::read(&model_path).expect("model file");
    std::fs::write(&model_path, &bytes[..bytes.len() / 2]).expect("truncate");
    let before = snapshot(&dir);
    let e = run(&small_config(10, 2), &dir, true).expect_err("truncated model");
    assert!(e.to_string().contains("model.bpk"), "{e}");
    assert_eq!(
        snapshot(&dir),
        before,
        "a failed start changed the run directory"
    );
    std::fs::write(&model_path, &bytes).expect("restore");

    // Missing optimizer file.
    let optim_path = dir.join("checkpoint/optim.bpk");
    let optim_bytes = std::fs::read(&optim_path).expect("optim file");
    std::fs::remove_file(&optim_path).expect("remove");
    let before = snapshot(&dir);
    let e = run(&small_config(10, 2), &dir, true).expect_err("missing optimizer");
    assert!(
        e.to_string().contains("optim.bpk") && e.to_string().contains("missing"),
        "{e}"
    );
    assert_eq!(snapshot(&dir), before);
    std::fs::write(&optim_path, optim_bytes).expect("restore");

    // Truncated state.
    let state_path = dir.join("checkpoint/state.json");
    let state = std::fs::read_to_string(&state_path).expect("state");
    std::fs::write(&state_path, &state[..state.len() / 3]).expect("truncate");
    let before = snapshot(&dir);
    let e = run(&small_config(10, 2), &dir, true).expect_err("truncated state");
    assert!(e.to_string().contains("state.json"), "{e}");
    assert_eq!(snapshot(&dir), before);
    std::fs::write(&state_path, state).expect("restore");

    // Mismatched configuration.
    let mut other = small_config(10, 2);
    other.model.d_k = Some(8);
    let before = snapshot(&dir);
    let e = run(&other, &dir, true).expect_err("mismatch");
    assert!(e.to_string().contains("model.d_k"), "{e}");
    assert_eq!(snapshot(&dir), before);

    // A fresh start into an existing run directory is refused.
    let e = run(&small_config(5, 2), &dir, false).expect_err("exists");
    assert!(matches!(e, ModelError::RunExists { .. }), "{e}");
    assert_eq!(snapshot(&dir), before);

    // And the intact checkpoint resumes.
    run(&small_config(10, 2), &dir, true).expect("resume");
}

#[test]
fn recall_task_trains_with_two_layers_and_sgd() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut c = TrainConfig::for_task(
        TaskConfig::new()
            .with_kind(TaskKind::Recall)
            .with_k(3)
            .with_vocab(12),
    );
    c.model.n_layers = 2;
    c.model.qk_init = QkInit::Unit;
    c.model.attention.scale = ScalePolicy::Unscaled;
    c.optimizer = sdpa::model::OptimizerKind::Sgd;
    c.momentum = Some(0.9);
    c.lr = 0.05;
    c.steps = 6;
    c.log_every = 2;
    let r = run(&c, &tmp.path().join("recall"), false).expect("recall run");
    // Every second step, and the last one.
    assert_eq!(
        r.metrics.iter().map(|m| m.step).collect::<Vec<_>>(),
        vec![0, 2, 4, 5]
    );
    assert!(
        r.metrics
            .iter()
            .all(|m| m.loss.is_finite() && m.layers.len() == 2)
    );
    let csv = std::fs::read_to_string(tmp.path().join("recall/metrics.csv")).expect("csv");
    assert!(csv.lines().next().expect("header").contains("logit_std_l1"));
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("recall/summary.json")).expect("summary"),
    )
    .expect("json");
    assert_eq!(summary["backend"], "flex");
    assert_eq!(summary["seed"], 42);
    assert_eq!(summary["versions"]["burn"], "0.22.1");
}

#[test]
fn cli_rejects_invalid_values_before_writing_anything() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("never");
    let bin = env!("CARGO_BIN_EXE_sdpa");
    for args in [
        vec!["--task", "sort"],
        vec!["--d-k", "0"],
        vec!["--steps", "0"],
        vec!["--lr", "-0.1"],
        vec!["--scale", "-1"],
        vec!["--init", "xavier"],
        vec!["--optimizer", "lbfgs"],
        vec!["--backend", "cuda"],
        vec!["--k", "1"],
    ] {
        let o = std::process::Command::new(bin)
            .arg("train")
            .args(&args)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run sdpa");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: exit {:?}, stderr {stderr}",
            o.status.code()
        );
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
}

#[test]
fn model_save_and_load_round_trip() {
    let tmp = tempfile::tempdir().expect("tmp");
    let device = device();
    let config = small_config(1, 1);
    let model = init_model(&config.model, 1, &device).expect("model");
    let path = tmp.path().join("m.bpk");
    model.clone().save_file(&path).expect("save");
    let loaded = config.model.init(&device).load_file(&path);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
    let batch = config.task.batch(&mut rng, 4, &device);
    let a = model.forward_batch(&batch, false).loss.into_scalar::<f32>();
    let b = loaded
        .forward_batch(&batch, false)
        .loss
        .into_scalar::<f32>();
    assert_eq!(a, b);
}

#[test]
fn the_qk_rate_factor_scales_the_step_of_w_q_and_w_k_alone() {
    use sdpa::model::{OptimizerKind, train_in_memory};
    // One plain SGD step (no momentum): a parameter moves by −rate · gradient, and the first
    // step's gradient is the same in every run (same seed, same batch).
    let after_one_step = |factor: f64| {
        let mut c = small_config(1, 5);
        c.optimizer = OptimizerKind::Sgd;
        c.momentum = None;
        // Large, so that the step dwarfs the f32 rounding of the weights it moves.
        c.lr = 1000.0;
        c.qk_lr_factor = factor;
        let m = train_in_memory(&c, &device(), "flex").expect("train").model;
        let block = &m.blocks[0];
        let values =
            |l: &burn::nn::Linear| l.weight.val().into_data().try_to_vec::<f32>().expect("f32");
        (
            values(&block.attention.query),
            values(&block.attention.key),
            values(&block.attention.value),
        )
    };
    let (q1, k1, v1) = after_one_step(1.0);
    let (q_half, k_half, v_half) = after_one_step(0.5);
    let (q_quarter, k_quarter, _) = after_one_step(0.25);
    // W_V takes the base rate whatever the factor.
    assert_eq!(v1, v_half);
    // W_Q, W_K: W(1) − W(½) = −½·rate·g and W(½) − W(¼) = −¼·rate·g, a ratio of 2 wherever the
    // gradient is not negligible.
    for (a, (b, c)) in q1.iter().chain(&k1).zip(
        q_half
            .iter()
            .chain(&k_half)
            .zip(q_quarter.iter().chain(&k_quarter)),
    ) {
        let (d1, d2) = (a - b, b - c);
        if d2.abs() > 1e-6 {
            assert!((d1 / d2 - 2.0).abs() < 1e-2, "{d1} / {d2}");
        }
    }
    assert!(q1 != q_half && k1 != k_half, "the factor changed nothing");
    // A factor that makes the rate non-positive is refused before training.
    let mut c = small_config(1, 5);
    c.qk_lr_factor = 0.0;
    assert!(c.validate().is_err());
}
