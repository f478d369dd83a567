//! Rotary positions in the multi-head layer (issue 21): the cached decode equals the full causal
//! forward, scores depend only on relative positions, positions beyond the table are an error.

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::{AttentionError, KvCache, MultiHeadSdpaConfig, MultiHeadSdpaInput, QkNorm, RopeConfig};

use crate::common::{cpu_devices, max_abs_diff, values};

fn layer(device: &Device) -> sdpa::MultiHeadSdpa {
    device.seed(3);
    MultiHeadSdpaConfig::new(32, 4)
        .with_n_kv_heads(Some(2))
        .with_qk_norm(QkNorm::RmsNorm)
        .with_rope(Some(RopeConfig::new(64)))
        .init(device)
}

#[test]
fn a_cached_decode_with_rope_equals_the_full_causal_forward() {
    for (backend, device) in cpu_devices() {
        let mha = layer(&device);
        let x = Tensor::<3>::random([2, 9, 32], Distribution::Normal(0.0, 1.0), &device);
        let full = values(
            mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).causal())
                .context,
        );
        // A prefill of 4 tokens, then one token at a time.
        let mut cache = KvCache::new();
        let mut parts = vec![
            mha.forward_cache(
                MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., 0..4, ..])).causal(),
                &mut cache,
            )
            .context,
        ];
        for t in 4..9 {
            let token = x.clone().slice(s![.., t..t + 1, ..]);
            parts.push(
                mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache)
                    .context,
            );
        }
        let cached = values(Tensor::cat(parts, 1));
        let err = max_abs_diff(&cached, &full);
        assert!(err < 1e-5, "{backend}: {err}");
        // Without rotary positions the layer would not tell the order apart: with them, a
        // reversed prefix changes the last token's output.
        let reversed = x.clone().flip([1]);
        let last = |x: Tensor<3>| {
            values(
                mha.forward(MultiHeadSdpaInput::self_attn(x).causal())
                    .context
                    .slice(s![.., 8..9, ..]),
            )
        };
        let mut swapped = x.clone();
        swapped = swapped.slice_assign(s![.., 0..8, ..], reversed.slice(s![.., 1..9, ..]));
        assert!(max_abs_diff(&last(swapped), &last(x)) > 1e-4, "{backend}");
    }
}

#[test]
fn scores_depend_only_on_relative_positions() {
    for (backend, device) in cpu_devices() {
        let mha = layer(&device);
        let x = Tensor::<3>::random([1, 6, 32], Distribution::Normal(0.0, 1.0), &device);
        let input = MultiHeadSdpaInput::self_attn(x);
        let scores = |start: usize| {
            let (q, k, _) = mha.project_heads_at(&input, start).expect("heads");
            // [b, h, n, d_k] · [b, h_kv, d_k, m] with h = 2·h_kv: compare head 0 with kv head 0
            let q0 = q.clone().slice(s![.., 0..1, .., ..]);
            let k0 = k.clone().slice(s![.., 0..1, .., ..]);
            (values(q0.clone()), values(q0.matmul(k0.swap_dims(2, 3))))
        };
        let (q_at_0, s_at_0) = scores(0);
        let (q_at_7, s_at_7) = scores(7);
        assert!(
            max_abs_diff(&q_at_0, &q_at_7) > 1e-3,
            "{backend}: the queries rotate"
        );
        let err = max_abs_diff(&s_at_0, &s_at_7);
        assert!(err < 1e-4, "{backend}: shifted scores differ by {err}");
    }
}

#[test]
fn positions_beyond_the_table_and_odd_heads_are_typed_errors() {
    let device = Device::flex();
    let mha = layer(&device);
    let x = Tensor::<3>::zeros([1, 65, 32], &device);
    let e = mha
        .try_forward(MultiHeadSdpaInput::self_attn(x))
        .unwrap_err();
    assert!(matches!(e, AttentionError::InvalidConfig { .. }), "{e:?}");
    assert!(e.to_string().contains("64"), "{e}");
    let odd = MultiHeadSdpaConfig::new(12, 4)
        .with_rope(Some(RopeConfig::new(8)))
        .try_init(&device);
    assert!(odd.is_err());
}
