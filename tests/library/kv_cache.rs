//! The preallocated KV cache (issue 21, item 5): a ragged batch decodes what each sequence
//! decodes alone, its padding is never seen, a full cache refuses or doubles, the ring buffer of
//! a sliding cache equals the windowed forward, and the concatenating baseline agrees.

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::{
    AttentionError, MhaCache, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, QkNorm,
    RopeConfig, mask::alibi_slopes,
};

use crate::common::{devices, max_abs_diff, values};

const D_MODEL: usize = 32;

/// A fresh cache of one kind.
type MakeCache = fn() -> MhaCache;

fn layer(device: &Device) -> MultiHeadAttention {
    device.seed(11);
    MultiHeadAttentionConfig::new(D_MODEL, 4)
        .with_n_kv_heads(Some(2))
        .with_qk_norm(QkNorm::RmsNorm)
        .with_rope(Some(RopeConfig::new(64)))
        .init(device)
}

/// Prompt lengths of the ragged batch, and tokens generated after them (a row with 0 new tokens
/// in a step has finished).
const PROMPTS: [usize; 3] = [5, 2, 7];
const STEPS: [[usize; 3]; 4] = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 1, 1]];

/// Sequence r's tokens `[1, len, d_model]`: enough for its prompt and every step.
fn sequences(device: &Device) -> Vec<Tensor<3>> {
    (0..PROMPTS.len())
        .map(|r| {
            let len = PROMPTS[r] + STEPS.iter().map(|s| s[r]).sum::<usize>();
            Tensor::<3>::random([1, len, D_MODEL], Distribution::Normal(0.0, 1.0), device)
        })
        .collect()
}

/// Row `r`'s real outputs of every call, `[len_r, d_model]` values, decoding the batch
/// together; `fill` is what the padding holds.
fn decode_together(
    mha: &MultiHeadAttention,
    seqs: &[Tensor<3>],
    mut cache: MhaCache,
    fill: f64,
    alibi: bool,
    causal_prompt: bool,
) -> Vec<Vec<f64>> {
    let device = seqs[0].device();
    let slopes = || Tensor::<1>::from_floats(alibi_slopes(4).as_slice(), &device);
    let with_alibi = |input: MhaInput| if alibi { input.alibi(slopes()) } else { input };
    let t = PROMPTS.iter().copied().max().unwrap();
    // [b, t, d_model], row r's prompt then `fill`
    let mut prompts = Tensor::<3>::full([PROMPTS.len(), t, D_MODEL], fill, &device);
    for (r, seq) in seqs.iter().enumerate() {
        let prompt = seq.clone().slice(s![.., 0..PROMPTS[r], ..]);
        prompts = prompts.slice_assign(s![r..r + 1, 0..PROMPTS[r], ..], prompt);
    }
    let prompts = MhaInput::self_attn(prompts);
    let input = with_alibi(if causal_prompt {
        prompts.causal()
    } else {
        prompts
    });
    let out = values(
        mha.forward_cache_ragged(input, &PROMPTS, &mut cache)
            .context,
    );
    let mut rows: Vec<Vec<f64>> = (0..PROMPTS.len())
        .map(|r| out[r * t * D_MODEL..(r * t + PROMPTS[r]) * D_MODEL].to_vec())
        .collect();
    let mut positions = PROMPTS;
    for counts in STEPS {
        let mut tokens = Tensor::<3>::full([PROMPTS.len(), 1, D_MODEL], fill, &device);
        for (r, seq) in seqs.iter().enumerate().filter(|(r, _)| counts[*r] == 1) {
            let token = seq
                .clone()
                .slice(s![.., positions[r]..positions[r] + 1, ..]);
            tokens = tokens.slice_assign(s![r..r + 1, .., ..], token);
        }
        let input = with_alibi(MhaInput::self_attn(tokens).causal());
        let out = values(mha.forward_cache_ragged(input, &counts, &mut cache).context);
        for r in 0..PROMPTS.len() {
            if counts[r] == 1 {
                rows[r].extend_from_slice(&out[r * D_MODEL..(r + 1) * D_MODEL]);
                positions[r] += 1;
            }
        }
    }
    assert_eq!(cache.lengths(), positions, "the cache's lengths");
    rows
}

/// Sequence `seq` decoded alone: its prompt at once, then one token per step.
fn decode_alone(
    mha: &MultiHeadAttention,
    seq: &Tensor<3>,
    prompt: usize,
    mut cache: MhaCache,
    alibi: bool,
    causal_prompt: bool,
) -> Vec<f64> {
    let device = seq.device();
    let slopes = || Tensor::<1>::from_floats(alibi_slopes(4).as_slice(), &device);
    let with_alibi = |input: MhaInput| if alibi { input.alibi(slopes()) } else { input };
    let len = seq.dims()[1];
    let prompt_input = MhaInput::self_attn(seq.clone().slice(s![.., 0..prompt, ..]));
    let input = with_alibi(if causal_prompt {
        prompt_input.causal()
    } else {
        prompt_input
    });
    let mut out = values(mha.forward_cache(input, &mut cache).context);
    for p in prompt..len {
        let input =
            with_alibi(MhaInput::self_attn(seq.clone().slice(s![.., p..p + 1, ..])).causal());
        out.extend(values(mha.forward_cache(input, &mut cache).context));
    }
    out
}

#[test]
fn a_ragged_batch_decodes_what_each_sequence_decodes_alone() {
    for (backend, device) in devices() {
        let mha = layer(&device);
        let seqs = sequences(&device);
        let kinds: [(&str, MakeCache); 3] = [
            ("growable", MhaCache::new),
            ("fixed, small and growable", || {
                MhaCache::with_capacity(3).growable()
            }),
            ("sliding 3", || MhaCache::sliding(3)),
        ];
        for (kind, cache) in kinds {
            // A causal prompt, or a bidirectional one (prefix-LM): the latter sees every
            // visible key of its sequence, so a slot past a sequence's end would show.
            for (alibi, causal) in [(false, true), (true, true), (false, false), (true, false)] {
                let together = decode_together(&mha, &seqs, cache(), 0.0, alibi, causal);
                for (r, seq) in seqs.iter().enumerate() {
                    let alone = decode_alone(&mha, seq, PROMPTS[r], cache(), alibi, causal);
                    let diff = max_abs_diff(&together[r], &alone);
                    assert!(
                        diff < 1e-4,
                        "{backend} {kind} alibi {alibi} causal {causal}: sequence {r} differs by {diff}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_padding_of_a_ragged_batch_is_never_seen() {
    for (backend, device) in devices() {
        let mha = layer(&device);
        let seqs = sequences(&device);
        for cache in [MhaCache::new, || MhaCache::sliding(4)] {
            let zeros = decode_together(&mha, &seqs, cache(), 0.0, false, false);
            let large = decode_together(&mha, &seqs, cache(), 1e3, false, false);
            for r in 0..PROMPTS.len() {
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
fn a_sliding_cache_takes_a_prompt_longer_than_its_window() {
    for (backend, device) in devices() {
        let mha = layer(&device);
        let x = Tensor::<3>::random([2, 12, D_MODEL], Distribution::Normal(0.0, 1.0), &device);
        let full = values(
            mha.forward(MhaInput::self_attn(x.clone()).causal().window(3, 0))
                .context,
        );
        let mut cache = MhaCache::sliding(4);
        let mut parts = vec![
            mha.forward_cache(
                MhaInput::self_attn(x.clone().slice(s![.., 0..7, ..])).causal(),
                &mut cache,
            )
            .context,
        ];
        // A chunk of 3 (t > 1 on a ring that has wrapped), then single tokens.
        parts.push(
            mha.forward_cache(
                MhaInput::self_attn(x.clone().slice(s![.., 7..10, ..])).causal(),
                &mut cache,
            )
            .context,
        );
        for p in 10..12 {
            let token = x.clone().slice(s![.., p..p + 1, ..]);
            parts.push(
                mha.forward_cache(MhaInput::self_attn(token).causal(), &mut cache)
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
    let token = |p: usize| MhaInput::self_attn(x.clone().slice(s![.., p..p + 1, ..])).causal();
    let mut fixed = MhaCache::with_capacity(4);
    let mut doubling = MhaCache::with_capacity(4).growable();
    let mut concatenating = MhaCache::concatenating();
    let prompt = MhaInput::self_attn(x.clone().slice(s![.., 0..4, ..])).causal();
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
    let mut again = MhaCache::with_capacity(5);
    mha.forward_cache(
        MhaInput::self_attn(x.clone().slice(s![.., 0..4, ..])).causal(),
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
    let mut cache = MhaCache::new();
    mha.forward_cache(MhaInput::self_attn(x.clone()).causal(), &mut cache);
    let token = Tensor::<3>::zeros([2, 1, D_MODEL], &device);
    let cases = [
        (
            mha.try_forward_cache_ragged(MhaInput::self_attn(token.clone()), &[1], &mut cache),
            "one count per batch row (b = 2)",
        ),
        (
            mha.try_forward_cache_ragged(MhaInput::self_attn(token.clone()), &[2, 1], &mut cache),
            "at most the t = 1 tokens",
        ),
        (
            mha.try_forward_cache_ragged(
                MhaInput::self_attn(token.clone()).padding_mask(Tensor::<2, Bool>::full(
                    [2, 4],
                    false,
                    &device,
                )),
                &[1, 0],
                &mut cache,
            ),
            "padding masks and segments are not supported",
        ),
        (
            mha.try_forward_cache(
                MhaInput::self_attn(token.clone()).mask(Tensor::<4, Bool>::full(
                    [1, 1, 1, 1],
                    false,
                    &device,
                )),
                &mut MhaCache::sliding(2),
            ),
            "ring buffer",
        ),
        (
            mha.try_forward_cache_ragged(
                MhaInput::self_attn(token.clone()),
                &[1, 0],
                &mut MhaCache::concatenating(),
            ),
            "sequences of one length",
        ),
    ];
    for (result, expected) in cases {
        let e = result.unwrap_err().to_string();
        assert!(e.contains(expected), "{e:?} should say {expected:?}");
    }
    assert_eq!(cache.lengths(), [3, 3]);
}
