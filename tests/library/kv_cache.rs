//! The preallocated KV cache (issue 21, item 5): a ragged batch decodes what each sequence
//! decodes alone, its padding is never seen, a full cache refuses or doubles, the ring buffer of
//! a sliding cache equals the windowed forward, and the concatenating baseline agrees.

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::{
    AttentionError, KvCache, MultiHeadSdpa, MultiHeadSdpaConfig, MultiHeadSdpaInput, QkNorm,
    RopeConfig, mask::alibi_slopes,
};

use crate::common::{devices, max_abs_diff, values};

const D_MODEL: usize = 32;

/// A fresh cache of one kind.
type MakeCache = fn() -> KvCache;

fn layer(device: &Device) -> MultiHeadSdpa {
    device.seed(11);
    MultiHeadSdpaConfig::new(D_MODEL, 4)
        .with_n_kv_heads(Some(2))
        .with_qk_norm(QkNorm::RmsNorm)
        .with_rope(Some(RopeConfig::new(64)))
        .init(device)
}

/// The tokens each of 3 sequences adds per call: the first call is the prompts (right-padded to
/// the longest), then single tokens (a row with 0 has finished, for now or for good).
const SCHEDULE: &[[usize; 3]] = &[[5, 2, 7], [1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 1, 1]];
/// With chunks of several tokens after the prompts: t > 1 on sequences of different lengths.
const CHUNKED: &[[usize; 3]] = &[[5, 2, 7], [3, 1, 2], [1, 1, 1], [0, 2, 1]];

/// Sequence r's tokens `[1, len, d_model]`: what `schedule` adds to it.
fn sequences(device: &Device, schedule: &[[usize; 3]]) -> Vec<Tensor<3>> {
    (0..3)
        .map(|r| {
            let len = schedule.iter().map(|s| s[r]).sum::<usize>();
            Tensor::<3>::random([1, len, D_MODEL], Distribution::Normal(0.0, 1.0), device)
        })
        .collect()
}

/// How a decoding runs: the ALiBi of the calls and whether the prompt is causal (a
/// bidirectional prompt, prefix-LM style, sees every key of its sequence, so a slot past a
/// sequence's end would show).
#[derive(Debug, Clone, Copy)]
struct Run {
    alibi: bool,
    causal_prompt: bool,
}

impl Run {
    /// The input of call `call` over `x`.
    fn input(self, x: Tensor<3>, call: usize) -> MultiHeadSdpaInput {
        let device = x.device();
        let input = MultiHeadSdpaInput::self_attn(x);
        let input = if call > 0 || self.causal_prompt {
            input.causal()
        } else {
            input
        };
        if self.alibi {
            input.alibi(Tensor::<1>::from_floats(
                alibi_slopes(4).as_slice(),
                &device,
            ))
        } else {
            input
        }
    }
}

/// Row `r`'s real outputs of every call, `[len_r, d_model]` values, decoding the batch
/// together on `schedule`; `fill` is what the padding holds.
fn decode_together(
    mha: &MultiHeadSdpa,
    seqs: &[Tensor<3>],
    mut cache: KvCache,
    fill: f64,
    run: Run,
    schedule: &[[usize; 3]],
) -> Vec<Vec<f64>> {
    let device = seqs[0].device();
    let mut rows = vec![Vec::new(); 3];
    let mut positions = [0; 3];
    for (call, counts) in schedule.iter().enumerate() {
        let t = counts.iter().copied().max().unwrap();
        // [3, t, d_model]: row r's new tokens, then `fill`
        let mut x = Tensor::<3>::full([3, t, D_MODEL], fill, &device);
        for (r, seq) in seqs.iter().enumerate().filter(|(r, _)| counts[*r] > 0) {
            let tokens = seq
                .clone()
                .slice(s![.., positions[r]..positions[r] + counts[r], ..]);
            x = x.slice_assign(s![r..r + 1, 0..counts[r], ..], tokens);
        }
        let out = values(
            mha.forward_cache_ragged(run.input(x, call), counts, &mut cache)
                .context,
        );
        for r in 0..3 {
            rows[r].extend_from_slice(&out[r * t * D_MODEL..(r * t + counts[r]) * D_MODEL]);
            positions[r] += counts[r];
        }
    }
    assert_eq!(cache.lengths(), positions, "the cache's lengths");
    rows
}

/// Sequence `r` decoded alone on its column of `schedule`.
fn decode_alone(
    mha: &MultiHeadSdpa,
    seq: &Tensor<3>,
    r: usize,
    mut cache: KvCache,
    run: Run,
    schedule: &[[usize; 3]],
) -> Vec<f64> {
    let mut out = Vec::new();
    let mut position = 0;
    for (call, counts) in schedule.iter().enumerate().filter(|(_, c)| c[r] > 0) {
        let x = seq
            .clone()
            .slice(s![.., position..position + counts[r], ..]);
        out.extend(values(
            mha.forward_cache(run.input(x, call), &mut cache).context,
        ));
        position += counts[r];
    }
    out
}

#[test]
fn a_ragged_batch_decodes_what_each_sequence_decodes_alone() {
    for (backend, device) in devices() {
        let mha = layer(&device);
        let kinds: [(&str, MakeCache); 3] = [
            ("growable", KvCache::new),
            ("fixed, small and growable", || {
                KvCache::with_capacity(3).growable()
            }),
            ("sliding 3", || KvCache::sliding(3)),
        ];
        for schedule in [SCHEDULE, CHUNKED] {
            let seqs = sequences(&device, schedule);
            for (kind, cache) in kinds {
                for (alibi, causal_prompt) in
                    [(false, true), (true, true), (false, false), (true, false)]
                {
                    let run = Run {
                        alibi,
                        causal_prompt,
                    };
                    let together = decode_together(&mha, &seqs, cache(), 0.0, run, schedule);
                    for (r, seq) in seqs.iter().enumerate() {
                        let alone = decode_alone(&mha, seq, r, cache(), run, schedule);
                        let diff = max_abs_diff(&together[r], &alone);
                        assert!(
                            diff < 1e-4,
                            "{backend} {kind} {run:?} {schedule:?}: sequence {r} differs by {diff}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_padding_of_a_ragged_batch_is_never_seen() {
    for (backend, device) in devices() {
        let mha = layer(&device);
        let seqs = sequences(&device, CHUNKED);
        let run = Run {
            alibi: false,
            causal_prompt: false,
        };
        for cache in [KvCache::new, || KvCache::sliding(4)] {
            let zeros = decode_together(&mha, &seqs, cache(), 0.0, run, CHUNKED);
            let large = decode_together(&mha, &seqs, cache(), 1e3, run, CHUNKED);
            for r in 0..3 {
                let diff = max_abs_diff(&zeros[r], &large[r]);
                assert!(
                    diff < 1e-5,
                    "{backend}: padding changed sequence {r} by {diff}"
                );
            }
        }
    }
}

#[test]
fn a_finished_sequence_at_the_last_rotary_position_does_not_stop_the_others() {
    let device = Device::flex();
    device.seed(11);
    let mha = MultiHeadSdpaConfig::new(D_MODEL, 4)
        .with_rope(Some(RopeConfig::new(8)))
        .init(&device);
    let x = Tensor::<3>::random([2, 8, D_MODEL], Distribution::Normal(0.0, 1.0), &device);
    let mut cache = KvCache::new();
    // Row 0 fills every position the layer encodes, row 1 has 3 tokens.
    mha.forward_cache_ragged(
        MultiHeadSdpaInput::self_attn(x.clone()).causal(),
        &[8, 3],
        &mut cache,
    );
    let next = x.clone().slice(s![.., 3..4, ..]);
    let together = values(
        mha.try_forward_cache_ragged(
            MultiHeadSdpaInput::self_attn(next.clone()),
            &[0, 1],
            &mut cache,
        )
        .expect("row 0 adds nothing, so its position 8 is never encoded")
        .context
        .slice(s![1..2, .., ..]),
    );
    let mut alone = KvCache::new();
    let row = x.clone().slice(s![1..2, 0..3, ..]);
    mha.forward_cache(MultiHeadSdpaInput::self_attn(row).causal(), &mut alone);
    let expected = values(
        mha.forward_cache(
            MultiHeadSdpaInput::self_attn(next.slice(s![1..2, .., ..])),
            &mut alone,
        )
        .context,
    );
    assert!(max_abs_diff(&together, &expected) < 1e-5);
    // Row 0 adding a token past the table is refused, naming the positions.
    let e = mha
        .try_forward_cache_ragged(
            MultiHeadSdpaInput::self_attn(x.slice(s![.., 0..1, ..])),
            &[1, 1],
            &mut cache,
        )
        .unwrap_err();
    assert!(e.to_string().contains("8..9"), "{e}");
    assert_eq!(cache.lengths(), [8, 4]);
}

#[test]
fn a_call_that_fails_after_writing_leaves_what_later_calls_see() {
    let device = Device::flex();
    let mha = layer(&device);
    let x = Tensor::<3>::random([2, 9, D_MODEL], Distribution::Normal(0.0, 1.0), &device);
    let token =
        |p: usize| MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., p..p + 1, ..])).causal();
    for cache in [KvCache::new, || KvCache::sliding(3)] {
        let (mut clean, mut failed) = (cache(), cache());
        let mut outputs = [Vec::new(), Vec::new()];
        for p in 0..9 {
            if p == 5 {
                // Slopes for 3 heads where there are 4: refused after the token was written.
                let bad = token(p).alibi(Tensor::<1>::from_floats([0.5, 0.25, 0.125], &device));
                assert!(mha.try_forward_cache(bad, &mut failed).is_err());
                assert_eq!(failed.lengths(), [5, 5]);
            }
            for (out, cache) in outputs.iter_mut().zip([&mut clean, &mut failed]) {
                out.extend(values(mha.forward_cache(token(p), cache).context));
            }
        }
        assert!(max_abs_diff(&outputs[0], &outputs[1]) < 1e-6);
    }
}

#[test]
fn a_sliding_cache_takes_a_prompt_longer_than_its_window() {
    for (backend, device) in devices() {
        let mha = layer(&device);
        let x = Tensor::<3>::random([2, 12, D_MODEL], Distribution::Normal(0.0, 1.0), &device);
        let full = values(
            mha.forward(
                MultiHeadSdpaInput::self_attn(x.clone())
                    .causal()
                    .window(3, 0),
            )
            .context,
        );
        let mut cache = KvCache::sliding(4);
        let mut parts = vec![
            mha.forward_cache(
                MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., 0..7, ..])).causal(),
                &mut cache,
            )
            .context,
        ];
        // A chunk of 3 (t > 1 on a ring that has wrapped), then single tokens.
        parts.push(
            mha.forward_cache(
                MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., 7..10, ..])).causal(),
                &mut cache,
            )
            .context,
        );
        for p in 10..12 {
            let token = x.clone().slice(s![.., p..p + 1, ..]);
            parts.push(
                mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache)
                    .context,
            );
        }
        assert_eq!((cache.len(), cache.cached()), (12, 4), "{backend}");
        let diff = max_abs_diff(&full, &values(Tensor::cat(parts, 1)));
        assert!(diff < 1e-4, "{backend}: the ring differs by {diff}");
    }
}

#[test]
fn a_full_cache_refuses_or_doubles() {
    let device = Device::flex();
    let mha = layer(&device);
    let x = Tensor::<3>::random([2, 6, D_MODEL], Distribution::Normal(0.0, 1.0), &device);
    let token =
        |p: usize| MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., p..p + 1, ..])).causal();
    let mut fixed = KvCache::with_capacity(4);
    let mut doubling = KvCache::with_capacity(4).growable();
    let mut concatenating = KvCache::concatenating();
    let prompt = MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., 0..4, ..])).causal();
    mha.forward_cache(prompt.clone(), &mut fixed);
    mha.forward_cache(prompt.clone(), &mut doubling);
    mha.forward_cache(prompt, &mut concatenating);
    let e = mha.try_forward_cache(token(4), &mut fixed).unwrap_err();
    assert!(
        matches!(
            e,
            AttentionError::CacheFull {
                capacity: 4,
                needed: 5
            }
        ),
        "{e}"
    );
    assert_eq!((fixed.lengths(), fixed.capacity()), (&[4, 4][..], Some(4)));
    let grown = values(mha.forward_cache(token(4), &mut doubling).context);
    assert_eq!(doubling.capacity(), Some(8));
    let concatenated = values(mha.forward_cache(token(4), &mut concatenating).context);
    assert!(max_abs_diff(&grown, &concatenated) < 1e-5);
    // The refused cache goes on where it stopped once it has room.
    let mut again = KvCache::with_capacity(5);
    mha.forward_cache(
        MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., 0..4, ..])).causal(),
        &mut again,
    );
    assert!(
        max_abs_diff(
            &values(mha.forward_cache(token(4), &mut again).context),
            &grown
        ) < 1e-5
    );
}

#[test]
fn bad_cached_calls_are_refused_and_leave_the_cache() {
    let device = Device::flex();
    let mha = layer(&device);
    let x = Tensor::<3>::zeros([2, 3, D_MODEL], &device);
    let mut cache = KvCache::new();
    mha.forward_cache(
        MultiHeadSdpaInput::self_attn(x.clone()).causal(),
        &mut cache,
    );
    let token = Tensor::<3>::zeros([2, 1, D_MODEL], &device);
    let cases =
        [
            (
                mha.try_forward_cache_ragged(
                    MultiHeadSdpaInput::self_attn(token.clone()),
                    &[1],
                    &mut cache,
                ),
                "one count per batch row (b = 2)",
            ),
            (
                mha.try_forward_cache_ragged(
                    MultiHeadSdpaInput::self_attn(token.clone()),
                    &[2, 1],
                    &mut cache,
                ),
                "at most the t = 1 tokens",
            ),
            (
                mha.try_forward_cache_ragged(
                    MultiHeadSdpaInput::self_attn(token.clone())
                        .padding_mask(Tensor::<2, Bool>::full([2, 4], false, &device)),
                    &[1, 0],
                    &mut cache,
                ),
                "padding masks and segments are not supported",
            ),
            (
                mha.try_forward_cache(
                    MultiHeadSdpaInput::self_attn(token.clone()).mask(Tensor::<4, Bool>::full(
                        [1, 1, 1, 1],
                        false,
                        &device,
                    )),
                    &mut KvCache::sliding(2),
                ),
                "ring buffer",
            ),
            (
                mha.try_forward_cache_ragged(
                    MultiHeadSdpaInput::self_attn(token.clone()),
                    &[1, 0],
                    &mut KvCache::concatenating(),
                ),
                "sequences of one length",
            ),
        ];
    for (result, expected) in cases {
        let e = result.unwrap_err().to_string();
        assert!(e.contains(expected), "{e:?} should say {expected:?}");
    }
    assert_eq!(cache.lengths(), [3, 3]);
    // A cleared cache, or one whose first call failed, holds no token and takes another batch.
    cache.clear();
    assert!(cache.is_empty());
    let three = Tensor::<3>::zeros([3, 2, D_MODEL], &device);
    mha.forward_cache(
        MultiHeadSdpaInput::self_attn(three.clone()).causal(),
        &mut cache,
    );
    assert_eq!(cache.lengths(), [2, 2, 2]);
    let mut fresh = KvCache::with_capacity(4);
    let wrong_mask = Tensor::<4, Bool>::full([1, 1, 1, 9], false, &device);
    assert!(
        mha.try_forward_cache(
            MultiHeadSdpaInput::self_attn(x).mask(wrong_mask),
            &mut fresh
        )
        .is_err()
    );
    assert!(fresh.is_empty());
    mha.forward_cache(MultiHeadSdpaInput::self_attn(three).causal(), &mut fresh);
    assert_eq!(fresh.lengths(), [2, 2, 2]);
}
