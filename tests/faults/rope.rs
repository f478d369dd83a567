//! Rotary positions where the queries are not the keys (issue 31): a query's position follows
//! the causal alignment as the mask and ALiBi do, and a one-row ragged call behaves as a
//! two-row one.

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::{CausalAlignment, KvCache, MultiHeadSdpaConfig, MultiHeadSdpaInput, RopeConfig};

fn values(t: Tensor<3>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn rope_places_queries_where_the_causal_mask_does() {
    let device = Device::flex();
    for alignment in [CausalAlignment::BottomRight, CausalAlignment::TopLeft] {
        device.seed(5);
        let mut config = MultiHeadSdpaConfig::new(32, 4).with_rope(Some(RopeConfig::new(64)));
        config.options.causal_alignment = alignment;
        let mha = config.init(&device);
        let x = Tensor::<3>::random([2, 9, 32], Distribution::Normal(0.0, 1.0), &device);
        let full = mha
            .forward(MultiHeadSdpaInput::self_attn(x.clone()).causal())
            .context;
        // The query that the alignment puts against every key: the last one bottom-right (it
        // sits at position m − 1), the first one top-left (position 0).
        let row = match alignment {
            CausalAlignment::BottomRight => 8,
            CausalAlignment::TopLeft => 0,
        };
        let alone = mha
            .forward(
                MultiHeadSdpaInput::new(
                    x.clone().slice(s![.., row..row + 1, ..]),
                    x.clone(),
                    x.clone(),
                )
                .causal(),
            )
            .context;
        let want = values(full.slice(s![.., row..row + 1, ..]));
        let diff = max_diff(&values(alone), &want);
        assert!(diff < 1e-5, "{alignment:?}: {diff}");
    }
}

#[test]
fn a_one_row_ragged_call_at_the_last_rotary_position_adds_nothing() {
    let device = Device::flex();
    device.seed(11);
    let mha = MultiHeadSdpaConfig::new(16, 2)
        .with_rope(Some(RopeConfig::new(8)))
        .init(&device);
    let x = Tensor::<3>::random([1, 8, 16], Distribution::Normal(0.0, 1.0), &device);
    let mut cache = KvCache::new();
    mha.forward_cache_ragged(
        MultiHeadSdpaInput::self_attn(x.clone()).causal(),
        &[8],
        &mut cache,
    );
    // As with two rows: a call that adds no token to a full sequence is no error.
    let next = x.clone().slice(s![.., 0..1, ..]);
    mha.try_forward_cache_ragged(
        MultiHeadSdpaInput::self_attn(next.clone()),
        &[0],
        &mut cache,
    )
    .expect("nothing is added, so position 8 is never encoded");
    assert_eq!(cache.lengths(), [8]);
    // Adding one is refused, naming the positions.
    let e = mha
        .try_forward_cache_ragged(MultiHeadSdpaInput::self_attn(next), &[1], &mut cache)
        .unwrap_err();
    assert!(e.to_string().contains("8..9"), "{e}");
}
