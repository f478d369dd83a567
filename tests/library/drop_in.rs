//! The drop-in layers of `burn_sdpa::nn` against burn-nn's own: a record saved from one loads
//! unchanged into the other (Burn's `.bpk` files, both ways), and the two give the same outputs
//! (|Δ| ≤ 1e-5 · max(1, |value|) at f32) and the same gradients on the same inputs (parameters
//! jittered away from their initial values, so that every parameter matters), masks (a fully masked row
//! included), quiet softmax and both layer-norm placements included, on every backend.

use burn::module::Module;
use burn::nn::attention as burn_attention;
use burn::nn::transformer as burn_transformer;
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use sdpa::nn::{attention, transformer};

use crate::common::{devices, values};

/// A file path in a fresh temporary folder (removed with the returned guard).
pub(crate) fn temp_file(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join(name);
    (dir, path)
}

/// Adds noise to every float parameter (fresh layer norms are all γ = 1, β = 0, so a swapped norm
/// would go unseen), through a record so that the parameters stay leaves with their gradients.
pub(crate) fn jittered<M: Module>(module: M) -> M {
    struct Jitter;
    impl burn::module::ModuleMapper for Jitter {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<Tensor<D>>,
        ) -> burn::module::Param<Tensor<D>> {
            param.map(|t| {
                let noise = Tensor::random(t.shape(), Distribution::Normal(0.0, 0.05), &t.device());
                t.detach() + noise
            })
        }
    }
    let record = module.clone().map(&mut Jitter).into_record();
    module.load_record(record)
}

/// Largest |got − want| / max(1, |want|): f32's absolute error for values up to 1, its relative
/// error above (the jittered layer norms' outputs reach a few units).
pub(crate) fn max_scaled_diff(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max)
}

/// The largest scaled difference between the first `end` rows of every sequence of `got`
/// (`[b, end, d_model]`, row-major) and of `full` (`[b, total, d_model]`): a cached call's rows
/// against the full forward's.
pub(crate) fn prefix_diff(got: &[f64], full: &[f64], [b, end, total, d_model]: [usize; 4]) -> f64 {
    fn rows(v: &[f64], batch_idx: usize, len: usize, end: usize, d_model: usize) -> &[f64] {
        &v[batch_idx * len * d_model..][..end * d_model]
    }
    (0..b)
        .map(|batch_idx| {
            max_scaled_diff(
                rows(got, batch_idx, end, end, d_model),
                rows(full, batch_idx, total, end, d_model),
            )
        })
        .fold(0.0, f64::max)
}

/// `[b, s]` padding: batch row 1 hides its last 2 keys.
pub(crate) fn mask_pad(b: usize, s: usize, device: &Device) -> Tensor<2, Bool> {
    let hidden: Vec<bool> = (0..b * s).map(|i| i / s == 1 && i % s >= s - 2).collect();
    Tensor::from_data(TensorData::new(hidden, [b, s]), device)
}

/// `[b, n, m]` causal mask with every key of query 0 of batch row 0 hidden too (a row that sees
/// nothing: burn-nn averages the values uniformly there).
fn mask_attn(b: usize, n: usize, m: usize, device: &Device) -> Tensor<3, Bool> {
    let hidden: Vec<bool> = (0..b * n * m)
        .map(|idx| {
            let (row, j) = (idx / m, idx % m);
            let (batch_idx, i) = (row / n, row % n);
            j > i || (batch_idx == 0 && i == 0)
        })
        .collect();
    Tensor::from_data(TensorData::new(hidden, [b, n, m]), device)
}

#[test]
fn a_burn_nn_attention_record_loads_into_the_drop_in_layer_and_gives_the_same_outputs() {
    let (b, s, d_model, h) = (2, 6, 16, 4);
    for (backend, device) in devices() {
        let training = device.clone().autodiff();
        training.seed(3);
        for quiet in [false, true] {
            let theirs = burn_attention::MultiHeadAttentionConfig::new(d_model, h)
                .with_dropout(0.0)
                .with_quiet_softmax(quiet)
                .init(&training);
            let theirs = jittered(theirs);
            let (_dir, path) = temp_file("mha");
            theirs
                .clone()
                .save_file(&path)
                .expect("burn-nn's record saved");
            // A fresh drop-in layer (its own random parameters) loads burn-nn's record.
            let ours = attention::MultiHeadAttentionConfig::new(d_model, h)
                .with_dropout(0.0)
                .with_quiet_softmax(quiet)
                .init(&training)
                .load_file(&path);
            let x = Tensor::<3>::random([b, s, d_model], Distribution::Normal(0.0, 1.0), &training)
                .require_grad();
            let (pad, attn) = (mask_pad(b, s, &training), mask_attn(b, s, s, &training));
            let want = theirs.forward(
                burn_attention::MhaInput::self_attn(x.clone())
                    .mask_pad(pad.clone())
                    .mask_attn(attn.clone()),
            );
            let got = ours.forward(
                attention::MhaInput::self_attn(x.clone())
                    .mask_pad(pad.clone())
                    .mask_attn(attn.clone())
                    .need_weights(),
            );
            let label = format!("{backend}, quiet {quiet}");
            let diff = max_scaled_diff(&values(got.context.clone()), &values(want.context.clone()));
            assert!(diff <= 1e-5, "{label}: context differs by {diff}");
            let weights = got.weights.expect("asked for");
            let diff = max_scaled_diff(&values(weights), &values(want.weights));
            assert!(diff <= 1e-5, "{label}: weights differ by {diff}");
            // Without the weights the layer takes a fused path: the same context.
            let fused = ours.forward(
                attention::MhaInput::self_attn(x.clone())
                    .mask_pad(pad)
                    .mask_attn(attn),
            );
            assert!(fused.weights.is_none());
            let diff = max_scaled_diff(
                &values(fused.context.clone()),
                &values(want.context.clone()),
            );
            assert!(diff <= 1e-5, "{label}: fused context differs by {diff}");
            // The same gradients, for the input and for a parameter.
            let g_theirs = (want.context * 1.5).sum().backward();
            let g_ours = (fused.context * 1.5).sum().backward();
            let dx = |g| values(x.grad(g).expect("input gradient"));
            let diff = max_scaled_diff(&dx(&g_ours), &dx(&g_theirs));
            assert!(diff <= 1e-5, "{label}: input gradients differ by {diff}");
            let dq_ours = values(ours.query.weight.grad(&g_ours).expect("dW_q"));
            let dq_theirs = values(theirs.query.weight.grad(&g_theirs).expect("dW_q"));
            let diff = max_scaled_diff(&dq_ours, &dq_theirs);
            assert!(
                diff <= 1e-5,
                "{label}: query weight gradients differ by {diff}"
            );
        }
    }
}

#[test]
fn a_drop_in_record_loads_back_into_burn_nn() {
    let device = Device::flex();
    device.seed(4);
    let config = transformer::TransformerEncoderConfig::new(16, 32, 4, 2).with_dropout(0.0);
    let ours = jittered(config.init(&device));
    let (_dir, path) = temp_file("encoder");
    ours.clone()
        .save_file(&path)
        .expect("the drop-in record saved");
    let theirs = burn_transformer::TransformerEncoderConfig::new(16, 32, 4, 2)
        .with_dropout(0.0)
        .init(&device)
        .load_file(&path);
    let x = Tensor::<3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &device);
    let want = theirs.forward(burn_transformer::TransformerEncoderInput::new(x.clone()));
    let got = ours.forward(transformer::TransformerEncoderInput::new(x));
    let diff = max_scaled_diff(&values(got), &values(want));
    assert!(diff <= 1e-5, "encoder outputs differ by {diff}");
}

#[test]
fn a_burn_nn_encoder_record_gives_the_same_outputs_and_gradients_in_the_drop_in_encoder() {
    let (b, s, d_model) = (2, 7, 16);
    for (backend, device) in devices() {
        let training = device.clone().autodiff();
        training.seed(5);
        for norm_first in [false, true] {
            let theirs = burn_transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
                .with_dropout(0.0)
                .with_norm_first(norm_first)
                .init(&training);
            let theirs = jittered(theirs);
            let (_dir, path) = temp_file("encoder");
            theirs
                .clone()
                .save_file(&path)
                .expect("burn-nn's record saved");
            let ours = transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
                .with_dropout(0.0)
                .with_norm_first(norm_first)
                .init(&training)
                .load_file(&path);
            let x = Tensor::<3>::random([b, s, d_model], Distribution::Normal(0.0, 1.0), &training)
                .require_grad();
            let (pad, attn) = (mask_pad(b, s, &training), mask_attn(b, s, s, &training));
            let want = theirs.forward(
                burn_transformer::TransformerEncoderInput::new(x.clone())
                    .mask_pad(pad.clone())
                    .mask_attn(attn.clone()),
            );
            let got = ours.forward(
                transformer::TransformerEncoderInput::new(x.clone())
                    .mask_pad(pad)
                    .mask_attn(attn),
            );
            let label = format!("{backend}, norm_first {norm_first}");
            let diff = max_scaled_diff(&values(got.clone()), &values(want.clone()));
            assert!(diff <= 1e-5, "{label}: outputs differ by {diff}");
            let g_theirs = want.powi_scalar(2).sum().backward();
            let g_ours = got.powi_scalar(2).sum().backward();
            let diff = max_scaled_diff(
                &values(x.grad(&g_ours).expect("dx")),
                &values(x.grad(&g_theirs).expect("dx")),
            );
            assert!(diff <= 1e-4, "{label}: input gradients differ by {diff}");
            let gamma = |layers: &burn::nn::LayerNorm, g| values(layers.gamma.grad(g).expect("dγ"));
            let diff = max_scaled_diff(
                &gamma(&ours.layers[1].norm_2, &g_ours),
                &gamma(&theirs.layers[1].norm_2, &g_theirs),
            );
            assert!(
                diff <= 1e-4,
                "{label}: layer-norm gradients differ by {diff}"
            );
        }
    }
}

#[test]
fn a_causal_flag_equals_burn_nn_with_its_autoregressive_mask() {
    let device = Device::flex();
    device.seed(6);
    let theirs = burn_transformer::TransformerEncoderConfig::new(16, 32, 4, 1)
        .with_dropout(0.0)
        .init(&device);
    let ours = transformer::TransformerEncoderConfig::new(16, 32, 4, 1)
        .with_dropout(0.0)
        .init(&device)
        .load_record(theirs.clone().into_record());
    let x = Tensor::<3>::random([2, 9, 16], Distribution::Normal(0.0, 1.0), &device);
    let mask = burn_attention::generate_autoregressive_mask(2, 9, &device);
    let want =
        theirs.forward(burn_transformer::TransformerEncoderInput::new(x.clone()).mask_attn(mask));
    let got = ours.forward(transformer::TransformerEncoderInput::new(x).causal());
    let diff = max_scaled_diff(&values(got), &values(want));
    assert!(diff <= 1e-5, "causal outputs differ by {diff}");
}

#[test]
fn autoregressive_inference_with_the_cache_equals_the_full_causal_forward_and_burn_nn() {
    let (b, s, d_model) = (2, 6, 16);
    for (backend, device) in devices() {
        device.seed(8);
        let theirs = burn_transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
            .with_dropout(0.0)
            .with_norm_first(true)
            .init(&device);
        let theirs = jittered(theirs);
        let ours = transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
            .with_dropout(0.0)
            .with_norm_first(true)
            .init(&device)
            .load_record(theirs.clone().into_record());
        let x = Tensor::<3>::random([b, s, d_model], Distribution::Normal(0.0, 1.0), &device);
        let full =
            values(ours.forward(transformer::TransformerEncoderInput::new(x.clone()).causal()));
        let (mut cache, mut burn_cache) = (
            ours.new_autoregressive_cache(),
            theirs.new_autoregressive_cache(),
        );
        // One token at a time (burn-nn's cache takes one new row per call), the whole sequence
        // so far each call.
        for end in 1..=s {
            let prefix = x.clone().slice(s![.., 0..end, ..]);
            let mask = burn_attention::generate_autoregressive_mask(b, end, &device);
            let got = ours.forward_autoregressive_inference(
                transformer::TransformerEncoderInput::new(prefix.clone()).mask_attn(mask.clone()),
                &mut cache,
            );
            assert_eq!(got.dims(), [b, end, d_model], "{backend}");
            let want = theirs.forward_autoregressive_inference(
                burn_transformer::TransformerEncoderInput::new(prefix).mask_attn(mask),
                &mut burn_cache,
            );
            let diff = max_scaled_diff(&values(got.clone()), &values(want));
            assert!(
                diff <= 1e-5,
                "{backend}, {end} rows: burn-nn's cached output differs by {diff}"
            );
            // The rows so far equal the full causal forward's.
            let got = values(got);
            let diff = prefix_diff(&got, &full, [b, end, s, d_model]);
            assert!(
                diff <= 1e-5,
                "{backend}, {end} rows: differs from the full forward by {diff}"
            );
        }
        // Several rows per call (the drop-in cache takes any number).
        let mut cache = ours.new_autoregressive_cache();
        for end in [2, 5, 6] {
            let prefix = x.clone().slice(s![.., 0..end, ..]);
            let got = values(ours.forward_autoregressive_inference(
                transformer::TransformerEncoderInput::new(prefix).causal(),
                &mut cache,
            ));
            let diff = prefix_diff(&got, &full, [b, end, s, d_model]);
            assert!(
                diff <= 1e-5,
                "{backend}, {end} rows at once: differs by {diff}"
            );
        }
        // A shorter sequence than the cache holds is refused by name.
        let e = ours
            .try_forward_autoregressive_inference(
                transformer::TransformerEncoderInput::new(x.slice(s![.., 0..2, ..])),
                &mut cache,
            )
            .unwrap_err();
        assert!(e.to_string().contains("cached encoder input"), "{e}");
    }
}

/// A whole encoder–decoder of burn-nn's layers, and the same with the drop-in layers.
#[derive(Module, Debug)]
struct BurnSeq2Seq {
    encoder: burn_transformer::TransformerEncoder,
    decoder: burn_transformer::TransformerDecoder,
}

#[derive(Module, Debug)]
struct DropInSeq2Seq {
    encoder: transformer::TransformerEncoder,
    decoder: transformer::TransformerDecoder,
}

#[test]
fn a_burn_nn_encoder_decoder_record_loads_both_ways_with_the_same_outputs_and_gradients() {
    let (b, n, m, d_model) = (2, 5, 7, 16);
    for (backend, device) in devices() {
        let training = device.clone().autodiff();
        training.seed(9);
        for norm_first in [false, true] {
            let theirs = BurnSeq2Seq {
                encoder: burn_transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
                    .with_dropout(0.0)
                    .with_norm_first(norm_first)
                    .init(&training),
                decoder: burn_transformer::TransformerDecoderConfig::new(d_model, 32, 4, 2)
                    .with_dropout(0.0)
                    .with_norm_first(norm_first)
                    .init(&training),
            };
            let fresh = || DropInSeq2Seq {
                encoder: transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
                    .with_dropout(0.0)
                    .with_norm_first(norm_first)
                    .init(&training),
                decoder: transformer::TransformerDecoderConfig::new(d_model, 32, 4, 2)
                    .with_dropout(0.0)
                    .with_norm_first(norm_first)
                    .init(&training),
            };
            let theirs = jittered(theirs);
            let (_dir, path) = temp_file("seq2seq");
            theirs
                .clone()
                .save_file(&path)
                .expect("burn-nn's record saved");
            let ours = fresh().load_file(&path);
            let source =
                Tensor::<3>::random([b, m, d_model], Distribution::Normal(0.0, 1.0), &training);
            let target =
                Tensor::<3>::random([b, n, d_model], Distribution::Normal(0.0, 1.0), &training)
                    .require_grad();
            let pad = mask_pad(b, m, &training);
            let causal = burn_attention::generate_autoregressive_mask(b, n, &training);
            let want = {
                let memory = theirs.encoder.forward(
                    burn_transformer::TransformerEncoderInput::new(source.clone())
                        .mask_pad(pad.clone()),
                );
                theirs.decoder.forward(
                    burn_transformer::TransformerDecoderInput::new(target.clone(), memory)
                        .memory_mask_pad(pad.clone())
                        .target_mask_attn(causal.clone()),
                )
            };
            let got = {
                let memory = ours.encoder.forward(
                    transformer::TransformerEncoderInput::new(source.clone()).mask_pad(pad.clone()),
                );
                ours.decoder.forward(
                    transformer::TransformerDecoderInput::new(target.clone(), memory)
                        .memory_mask_pad(pad.clone())
                        .target_mask_attn(causal.clone()),
                )
            };
            let label = format!("{backend}, norm_first {norm_first}");
            let got_values = values(got.clone());
            let diff = max_scaled_diff(&got_values, &values(want.clone()));
            assert!(diff <= 1e-5, "{label}: outputs differ by {diff}");
            let g_theirs = want.powi_scalar(2).sum().backward();
            let g_ours = got.powi_scalar(2).sum().backward();
            let diff = max_scaled_diff(
                &values(target.grad(&g_ours).expect("d target")),
                &values(target.grad(&g_theirs).expect("d target")),
            );
            assert!(diff <= 1e-4, "{label}: target gradients differ by {diff}");
            let cross = |w: &burn::nn::Linear, g| values(w.weight.grad(g).expect("dW"));
            let diff = max_scaled_diff(
                &cross(&ours.decoder.layers[0].cross_attn.key, &g_ours),
                &cross(&theirs.decoder.layers[0].cross_attn.key, &g_theirs),
            );
            assert!(
                diff <= 1e-4,
                "{label}: cross-attention gradients differ by {diff}"
            );
            // And back: the drop-in record into burn-nn's layers.
            let (_dir, back) = temp_file("seq2seq-back");
            ours.clone()
                .save_file(&back)
                .expect("the drop-in record saved");
            let reloaded = BurnSeq2Seq {
                encoder: theirs.encoder.clone(),
                decoder: theirs.decoder.clone(),
            }
            .load_file(&back);
            let memory = reloaded.encoder.forward(
                burn_transformer::TransformerEncoderInput::new(source).mask_pad(pad.clone()),
            );
            let again = reloaded.decoder.forward(
                burn_transformer::TransformerDecoderInput::new(target, memory)
                    .memory_mask_pad(pad)
                    .target_mask_attn(causal),
            );
            let diff = max_scaled_diff(&values(again), &got_values);
            assert!(diff <= 1e-5, "{label}: reloaded burn-nn differs by {diff}");
        }
    }
}

#[test]
fn the_decoders_cache_equals_its_full_causal_forward_and_burn_nn() {
    let (b, n, m, d_model) = (2, 5, 7, 16);
    for (backend, device) in devices() {
        device.seed(10);
        let theirs = burn_transformer::TransformerDecoderConfig::new(d_model, 32, 4, 2)
            .with_dropout(0.0)
            .init(&device);
        let theirs = jittered(theirs);
        let ours = transformer::TransformerDecoderConfig::new(d_model, 32, 4, 2)
            .with_dropout(0.0)
            .init(&device)
            .load_record(theirs.clone().into_record());
        let memory = Tensor::<3>::random([b, m, d_model], Distribution::Normal(0.0, 1.0), &device);
        let target = Tensor::<3>::random([b, n, d_model], Distribution::Normal(0.0, 1.0), &device);
        let pad = mask_pad(b, m, &device);
        let full = values(
            ours.forward(
                transformer::TransformerDecoderInput::new(target.clone(), memory.clone())
                    .memory_mask_pad(pad.clone())
                    .causal(),
            ),
        );
        let (mut cache, mut burn_cache) = (
            ours.new_autoregressive_cache(),
            theirs.new_autoregressive_cache(),
        );
        for end in 1..=n {
            let prefix = target.clone().slice(s![.., 0..end, ..]);
            let mask = burn_attention::generate_autoregressive_mask(b, end, &device);
            let got = values(
                ours.forward_autoregressive_inference(
                    transformer::TransformerDecoderInput::new(prefix.clone(), memory.clone())
                        .memory_mask_pad(pad.clone())
                        .target_mask_attn(mask.clone()),
                    &mut cache,
                ),
            );
            let want = values(
                theirs.forward_autoregressive_inference(
                    burn_transformer::TransformerDecoderInput::new(prefix, memory.clone())
                        .memory_mask_pad(pad.clone())
                        .target_mask_attn(mask),
                    &mut burn_cache,
                ),
            );
            let diff = max_scaled_diff(&got, &want);
            assert!(
                diff <= 1e-5,
                "{backend}, {end} rows: burn-nn's cached output differs by {diff}"
            );
            let diff = prefix_diff(&got, &full, [b, end, n, d_model]);
            assert!(
                diff <= 1e-5,
                "{backend}, {end} rows: differs from the full forward by {diff}"
            );
        }
    }
}
