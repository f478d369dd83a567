//! The drop-in layers where a burn-nn user's code touches them beyond the whole-model forward:
//! left padding with the causal flag, quiet softmax in the encoder, the layer-level API, and
//! inputs that do not fit (a typed error, and a cache left as it was).

use burn::module::Module;
use burn::nn::attention as burn_attention;
use burn::nn::transformer as burn_transformer;
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use sdpa::nn::{attention, transformer};

use crate::common::{devices, values};
use crate::drop_in::{jittered, mask_pad, max_scaled_diff, prefix_diff};

/// `[b, s]` left padding: batch row 0 hides its first 3 keys (with a causal mask, its first 3
/// queries see nothing: burn-nn averages every value there).
fn left_padding(b: usize, s: usize, device: &Device) -> Tensor<2, Bool> {
    let hidden: Vec<bool> = (0..b * s).map(|i| i / s == 0 && i % s < 3).collect();
    Tensor::from_data(TensorData::new(hidden, [b, s]), device)
}

#[test]
fn the_causal_flag_with_left_padding_and_quiet_softmax_equal_burn_nn() {
    let (b, s, d_model) = (2, 6, 16);
    for (backend, device) in devices() {
        device.seed(12);
        for quiet in [false, true] {
            let theirs = jittered(
                burn_transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
                    .with_dropout(0.0)
                    .with_quiet_softmax(quiet)
                    .init(&device),
            );
            let ours = transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
                .with_dropout(0.0)
                .with_quiet_softmax(quiet)
                .init(&device)
                .load_record(theirs.clone().into_record());
            let x = Tensor::<3>::random([b, s, d_model], Distribution::Normal(0.0, 1.0), &device);
            let pad = left_padding(b, s, &device);
            let want = values(
                theirs.forward(
                    burn_transformer::TransformerEncoderInput::new(x.clone())
                        .mask_pad(pad.clone())
                        .mask_attn(burn_attention::generate_autoregressive_mask(b, s, &device)),
                ),
            );
            let got = values(
                ours.forward(
                    transformer::TransformerEncoderInput::new(x)
                        .mask_pad(pad)
                        .causal(),
                ),
            );
            let diff = max_scaled_diff(&got, &want);
            assert!(diff <= 1e-5, "{backend}, quiet {quiet}: differs by {diff}");
        }
    }
}

#[test]
fn the_layer_level_api_is_burn_nns() {
    let device = Device::flex();
    device.seed(13);
    let config = burn_transformer::TransformerEncoderConfig::new(16, 32, 4, 1).with_dropout(0.0);
    let theirs = jittered(burn_transformer::TransformerEncoderLayer::new(
        &config, &device,
    ));
    let ours_config = transformer::TransformerEncoderConfig::new(16, 32, 4, 1).with_dropout(0.0);
    let ours = transformer::TransformerEncoderLayer::new(&ours_config, &device)
        .load_record(theirs.clone().into_record());
    let x = Tensor::<3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &device);
    let pad = mask_pad(2, 5, &device);
    let want = values(theirs.forward(x.clone(), Some(pad.clone()), None));
    let got = values(ours.forward(x.clone(), Some(pad), None));
    let diff = max_scaled_diff(&got, &want);
    assert!(diff <= 1e-5, "encoder layer differs by {diff}");

    // burn-nn's decoder input hides its fields: its layer is compared inside a one-layer decoder.
    let theirs = jittered(
        burn_transformer::TransformerDecoderConfig::new(16, 32, 4, 1)
            .with_dropout(0.0)
            .init(&device),
    );
    let ours_config = transformer::TransformerDecoderConfig::new(16, 32, 4, 1).with_dropout(0.0);
    let layer = transformer::TransformerDecoderLayer::new(&ours_config, &device)
        .load_record(theirs.layers[0].clone().into_record());
    let memory = Tensor::<3>::random([2, 7, 16], Distribution::Normal(0.0, 1.0), &device);
    let want = values(
        theirs.forward(burn_transformer::TransformerDecoderInput::new(
            x.clone(),
            memory.clone(),
        )),
    );
    let out = layer.forward(transformer::TransformerDecoderInput::new(x, memory));
    let diff = max_scaled_diff(&values(out.target().clone()), &want);
    assert!(diff <= 1e-5, "decoder layer differs by {diff}");
}

#[test]
fn inputs_that_do_not_fit_are_typed_errors_and_leave_the_cache_as_it_was() {
    let device = Device::flex();
    device.seed(14);
    let encoder = transformer::TransformerEncoderConfig::new(16, 32, 4, 2)
        .with_dropout(0.0)
        .init(&device);
    let x = Tensor::<3>::random([2, 6, 16], Distribution::Normal(0.0, 1.0), &device);
    // A padding mask of the wrong shape: an error, not a panic.
    let e =
        encoder
            .try_forward(
                transformer::TransformerEncoderInput::new(x.clone())
                    .mask_pad(Tensor::<2, Bool>::full([2, 5], false, &device)),
            )
            .unwrap_err();
    assert!(
        e.to_string().contains("mask_pad") || e.to_string().contains("padding"),
        "{e}"
    );
    // A cached call with a wrong mask fails without advancing any layer's cache: the retry
    // equals a fresh cache's result.
    let prefix = |end: usize| x.clone().slice(s![.., 0..end, ..]);
    let mut cache = encoder.new_autoregressive_cache();
    encoder.forward_autoregressive_inference(
        transformer::TransformerEncoderInput::new(prefix(3)).causal(),
        &mut cache,
    );
    let wrong = Tensor::<3, Bool>::full([2, 5, 4], false, &device);
    let e = encoder
        .try_forward_autoregressive_inference(
            transformer::TransformerEncoderInput::new(prefix(5)).mask_attn(wrong),
            &mut cache,
        )
        .unwrap_err();
    assert!(e.to_string().contains("mask_attn"), "{e}");
    let retried = values(encoder.forward_autoregressive_inference(
        transformer::TransformerEncoderInput::new(prefix(5)).causal(),
        &mut cache,
    ));
    let full =
        values(encoder.forward(transformer::TransformerEncoderInput::new(prefix(5)).causal()));
    let diff = max_scaled_diff(&retried, &full);
    assert!(diff <= 1e-5, "the retried call differs by {diff}");
    // Another batch size than the cache's: a typed error.
    let other = Tensor::<3>::random([3, 6, 16], Distribution::Normal(0.0, 1.0), &device);
    let e = encoder
        .try_forward_autoregressive_inference(
            transformer::TransformerEncoderInput::new(other).causal(),
            &mut cache,
        )
        .unwrap_err();
    assert!(e.to_string().contains("cached encoder input"), "{e}");
    // burn-nn's name of the memory cache.
    let mha = attention::MultiHeadAttentionConfig::new(16, 4)
        .with_dropout(0.0)
        .init(&device);
    let mut memory_cache = attention::MhaCache::autoregressive_cross_attention();
    let memory = Tensor::<3>::random([2, 7, 16], Distribution::Normal(0.0, 1.0), &device);
    let full = values(
        mha.forward(attention::MhaInput::new(
            x.clone(),
            memory.clone(),
            memory.clone(),
        ))
        .context,
    );
    let cached = values(
        mha.forward_cache(
            attention::MhaInput::new(x, memory.clone(), memory),
            &mut memory_cache,
        )
        .context,
    );
    assert!(max_scaled_diff(&cached, &full) <= 1e-5);
}

#[test]
fn rotary_positions_in_the_drop_in_encoder_keep_burn_nn_records_and_cached_inference_exact() {
    let (b, s, d_model) = (2, 6, 16);
    let device = Device::flex();
    device.seed(11);
    let theirs = jittered(
        burn_transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2)
            .with_dropout(0.0)
            .init(&device),
    );
    let config = transformer::TransformerEncoderConfig::new(d_model, 32, 4, 2).with_dropout(0.0);
    let plain = config
        .init(&device)
        .load_record(theirs.clone().into_record());
    let rotary = config
        .with_rope(Some(sdpa::RopeConfig::new(64)))
        .init(&device)
        .load_record(theirs.into_record());
    let x = Tensor::<3>::random([b, s, d_model], Distribution::Normal(0.0, 1.0), &device);
    let input = || transformer::TransformerEncoderInput::new(x.clone()).causal();
    let full = values(rotary.forward(input()));
    // The rotation is on: it changes the output.
    assert!(max_scaled_diff(&full, &values(plain.forward(input()))) > 1e-3);
    let mut cache = rotary.new_autoregressive_cache();
    for end in [1, 2, 4, 6] {
        let prefix = x.clone().slice(s![.., 0..end, ..]);
        let got = values(rotary.forward_autoregressive_inference(
            transformer::TransformerEncoderInput::new(prefix).causal(),
            &mut cache,
        ));
        let diff = prefix_diff(&got, &full, [b, end, s, d_model]);
        assert!(
            diff <= 1e-5,
            "{end} rows: cached rotary output differs by {diff}"
        );
    }
}

#[test]
fn the_drop_in_configs_refuse_what_they_cannot_match_by_name() {
    let device = Device::flex();
    let e = attention::MultiHeadAttentionConfig::new(16, 3)
        .try_init(&device)
        .unwrap_err();
    assert!(e.to_string().contains("n_heads"), "{e}");
    let e = attention::MultiHeadAttentionConfig::new(16, 4)
        .with_min_float(-1.0)
        .try_init(&device)
        .unwrap_err();
    assert!(e.to_string().contains("min_float"), "{e}");
    let e = attention::MultiHeadAttentionConfig::new(16, 4)
        .with_attention(Some(sdpa::AttentionOptions::new().with_dropout(0.2)))
        .try_init(&device)
        .unwrap_err();
    assert!(e.to_string().contains("`dropout`"), "{e}");
}
