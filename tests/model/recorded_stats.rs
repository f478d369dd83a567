//! The attention metrics a training run records come from the training forward's row
//! statistics (no second pass): the same numbers as the separate naive probe that recorded them
//! before (issue 35).

use std::path::PathBuf;

use burn::prelude::*;
use sdpa::diagnostics::{attention_diagnostics, diagnostics_from_row_stats};
use sdpa::model::{ModelConfig, QkInit, TaskConfig, TaskKind};
use sdpa::{AttentionOptions, Implementation, MultiHeadSdpaInput, ScalePolicy};

/// The metric columns a training run records per layer, compared with the probe's file.
const LAYER_COLUMNS: [&str; 7] = [
    "entropy",
    "normalized_entropy",
    "max_prob",
    "saturated_fraction",
    "logit_std",
    "query_std",
    "key_std",
];

#[test]
fn the_training_forward_records_what_a_naive_probe_of_each_layer_gives() {
    let device = Device::flex().autodiff();
    device.seed(3);
    let task = TaskConfig::new()
        .with_kind(TaskKind::Recall)
        .with_k(8)
        .with_vocab(32);
    // Unscaled unit-variance logits: many saturated rows, so the threshold is exercised.
    let model = ModelConfig::for_task(&task)
        .with_n_layers(2)
        .with_qk_init(QkInit::Unit)
        .with_attention(AttentionOptions::new().with_scale(ScalePolicy::Unscaled))
        .init(&device);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    let batch = task.batch(&mut rng, 16, &device);
    let (_, recorded) = model.encode(batch.tokens.clone(), true);
    assert_eq!(recorded.len(), 2);
    // The probe: each layer's input recomputed outside autodiff, its weights and scores from
    // the naive path, reduced by the weights' entry point.
    let inner = model.valid();
    let tokens = batch.tokens.clone().inner();
    let [b, s] = tokens.dims();
    let positions = Tensor::<1, Int>::arange(0..s as i64, &tokens.device())
        .unsqueeze::<2>()
        .expand([b, s]);
    let mut x = inner.token_embedding.forward(tokens) + inner.position_embedding.forward(positions);
    let mut saturated_rows = 0.0;
    for (block, layer) in inner.blocks.iter().zip(&recorded) {
        let h = match &block.norm_attn {
            Some(norm) => norm.forward(x.clone()),
            None => x.clone(),
        };
        let mut probe = block.attention.clone();
        probe.attention.implementation = Implementation::Naive;
        let out = probe.forward(
            MultiHeadSdpaInput::self_attn(h.clone())
                .need_weights()
                .need_scores(),
        );
        let want = attention_diagnostics(
            out.weights.expect("weights"),
            None,
            Some(out.scores.expect("scores")),
        )
        .expect("diagnostics")
        .mean();
        let got = diagnostics_from_row_stats(&layer.stats)
            .expect("diagnostics")
            .mean();
        for (name, g, w) in [
            ("entropy", got.entropy, want.entropy),
            (
                "normalized_entropy",
                got.normalized_entropy,
                want.normalized_entropy,
            ),
            ("max_prob", got.max_prob, want.max_prob),
            ("effective_keys", got.effective_keys, want.effective_keys),
            (
                "saturated_fraction",
                got.saturated_fraction,
                want.saturated_fraction,
            ),
            (
                "logit_std",
                got.logit_std.unwrap_or(f64::NAN),
                want.logit_std.unwrap_or(f64::NAN),
            ),
            (
                "max_logit",
                got.max_logit.unwrap_or(f64::NAN),
                want.max_logit.unwrap_or(f64::NAN),
            ),
        ] {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{name}: {g} vs {w}"
            );
        }
        saturated_rows += got.saturated_fraction;
        x = x + out.context;
        if let Some(mlp) = &block.mlp {
            let h = match &block.norm_mlp {
                Some(norm) => norm.forward(x.clone()),
                None => x.clone(),
            };
            x = x + mlp.down.forward(mlp.activation.forward(mlp.up.forward(h)));
        }
    }
    assert!(saturated_rows > 0.0, "the case must have saturated rows");
}

#[test]
fn sdpa_train_records_the_numbers_the_probe_pass_recorded() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let want = std::fs::read_to_string(root.join("tests/data/train-probe/metrics.csv"))
        .expect("the probe's metrics");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_sdpa"))
        .args([
            "train",
            "--task",
            "recall",
            "--k",
            "8",
            "--vocab",
            "32",
            "--steps",
            "40",
            "--batch-size",
            "16",
            "--layers",
            "2",
            "--heads",
            "2",
            "--scale",
            "none",
            "--init",
            "unit",
            "--d-k",
            "64",
            "--log-every",
            "4",
            "--eval-every",
            "20",
            "--seed",
            "7",
            "--no-early-stop",
            "--backend",
            "flex",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("sdpa train runs");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let got = std::fs::read_to_string(out.join("metrics.csv")).expect("metrics written");
    let table = |text: &str| -> (Vec<String>, Vec<Vec<f64>>) {
        let mut lines = text.lines();
        let header = lines
            .next()
            .expect("a header")
            .split(',')
            .map(String::from)
            .collect();
        let rows = lines
            .map(|l| {
                l.split(',')
                    .map(|x| x.parse().unwrap_or(f64::NAN))
                    .collect()
            })
            .collect();
        (header, rows)
    };
    let (want_header, want_rows) = table(&want);
    let (got_header, got_rows) = table(&got);
    assert_eq!(got_rows.len(), want_rows.len(), "recorded steps");
    let mut compared = 0;
    for (col, name) in want_header.iter().enumerate() {
        if name == "elapsed_s" {
            continue;
        }
        let layer_metric = LAYER_COLUMNS
            .iter()
            .any(|c| name.starts_with(&format!("{c}_l")));
        let step_metric = !name.contains("_l") || name.starts_with("eval_l");
        if !(layer_metric || step_metric) {
            continue;
        }
        let got_col = got_header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("column {name} is gone"));
        for (step, (g, w)) in got_rows.iter().zip(&want_rows).enumerate() {
            let (g, w) = (g[got_col], w[col]);
            let same = (g.is_nan() && w.is_nan()) || (g - w).abs() <= 2e-4 * w.abs().max(1.0);
            // The saturated share may move by one row in a thousand where a row's largest
            // weight sits at the threshold.
            let close = name.starts_with("saturated_fraction") && (g - w).abs() <= 2e-3;
            assert!(
                same || close,
                "{name} at record {step}: {g} vs the probe's {w}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 11 * 20, "compared {compared} numbers");
}
