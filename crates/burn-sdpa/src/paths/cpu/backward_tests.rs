//! Tests of the backward pass against the f64 reference: block edges, masks, biases, windows,
//! soft-caps, tile sizes and the split of keys across tasks.

use super::*;
use crate::paths::cpu::kernel::try_forward;
use crate::paths::cpu::reference::{self, assert_close, data, shape};

fn run(s: KernelShape, masking: &Masking<'_>, tiles: Tiles, with_scores: bool) {
    let d = s.dims;
    let q = data(d.batch * d.n_heads * d.n * d.d_k, 11);
    let k = data(d.batch * d.n_kv_heads * d.m * d.d_k, 12);
    let v = data(d.batch * d.n_kv_heads * d.m * d.d_v, 13);
    let grad_out = data(d.batch * d.n_heads * d.n * d.d_v, 14);
    let mut out = vec![0.0; grad_out.len()];
    let mut lse = vec![0.0; d.batch * d.n_heads * d.n];
    try_forward(
        &s,
        Tiles::default(),
        masking,
        &q,
        &k,
        &v,
        &mut out,
        Some(&mut lse),
    )
    .unwrap();
    let mut grad_q = vec![f32::NAN; q.len()];
    let mut grad_k = vec![f32::NAN; k.len()];
    let mut grad_v = vec![f32::NAN; v.len()];
    let mut grad_scores = vec![f32::NAN; d.batch * d.n_heads * d.n * d.m];
    try_backward(
        &s,
        tiles,
        masking,
        BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            grad_out: &grad_out,
            lse: &lse,
        },
        BackwardOutputs {
            grad_q: &mut grad_q,
            grad_k: &mut grad_k,
            grad_v: &mut grad_v,
            grad_scores: with_scores.then_some(&mut grad_scores[..]),
        },
    )
    .unwrap();
    let want = reference::backward(&s, masking, &q, &k, &v, &grad_out);
    let what = format!("{s:?} {tiles:?}");
    assert_close(&format!("{what} dq"), &grad_q, &want.q, 2e-5, 2e-4);
    assert_close(&format!("{what} dk"), &grad_k, &want.k, 2e-5, 2e-4);
    assert_close(&format!("{what} dv"), &grad_v, &want.v, 2e-5, 2e-4);
    if with_scores {
        assert_close(
            &format!("{what} dscores"),
            &grad_scores,
            &want.scores,
            2e-5,
            2e-4,
        );
    }
}

#[test]
fn gradients_match_the_reference() {
    for (n, m) in [(1, 1), (5, 300), (70, 40), (130, 260)] {
        for offset in [None, Some(m as i64 - n as i64), Some(0)] {
            for tiles in [
                BACKWARD_TILES,
                Tiles {
                    query_block: 7,
                    key_block: 33,
                },
            ] {
                run(shape(n, m, offset), &Masking::default(), tiles, false);
            }
        }
    }
}

#[test]
fn windowed_and_capped_gradients_match_the_reference() {
    use crate::types::Window;
    for (n, m) in [(5, 300), (70, 40)] {
        let offset = m as i64 - n as i64;
        for (window, causal_offset, softcap) in [
            (Window::new(Some(3), Some(0)), Some(offset), None),
            (Window::new(Some(20), Some(5)), None, Some(1.5)),
            (Window::new(None, Some(1)), Some(offset), Some(0.8)),
        ] {
            let s = KernelShape {
                softcap,
                window: Some((window, offset)),
                ..shape(n, m, causal_offset)
            };
            run(s, &Masking::default(), BACKWARD_TILES, true);
            let small = Tiles {
                query_block: 7,
                key_block: 33,
            };
            run(s, &Masking::default(), small, false);
        }
    }
    // A capped score gradient is the bias's gradient: checked with a bias.
    let s = KernelShape {
        softcap: Some(1.2),
        ..shape(70, 40, Some(0))
    };
    for test_masking in reference::maskings(&s.dims) {
        run(s, &test_masking.masking(), BACKWARD_TILES, true);
    }
}

#[test]
fn masked_and_biased_gradients_match_the_reference() {
    for (n, m) in [(5, 300), (70, 40)] {
        for offset in [None, Some(0)] {
            let s = shape(n, m, offset);
            let maskings = reference::maskings(&s.dims);
            for test_masking in &maskings {
                let masking = test_masking.masking();
                run(s, &masking, BACKWARD_TILES, true);
                run(
                    s,
                    &masking,
                    Tiles {
                        query_block: 7,
                        key_block: 33,
                    },
                    false,
                );
            }
        }
    }
}

#[test]
fn one_kv_head_splits_its_keys_across_tasks() {
    // b·h_kv = 1 and many key blocks: the keys are split into ranges with their own dQ.
    let s = KernelShape {
        dims: AttentionDims {
            batch: 1,
            n_heads: 3,
            n_kv_heads: 1,
            n: 50,
            m: 700,
            d_k: 8,
            d_v: 4,
        },
        scale: 0.3,
        causal_offset: Some(650),
        softcap: None,
        window: None,
    };
    run(
        s,
        &Masking::default(),
        Tiles {
            query_block: 16,
            key_block: 32,
        },
        false,
    );
}

#[test]
fn query_blocks_a_key_range_never_reaches_get_zero_from_it() {
    // One kv head: the keys are split into ranges (at least two whatever the thread count),
    // and a window of 4 keys leaves most query blocks unseen by most ranges, so their dQ rows
    // in the caller's buffer are zeroed by the task before the other ranges' dQ are added.
    let s = KernelShape {
        dims: AttentionDims {
            batch: 1,
            n_heads: 2,
            n_kv_heads: 1,
            n: 300,
            m: 300,
            d_k: 8,
            d_v: 4,
        },
        scale: 0.3,
        causal_offset: Some(0),
        softcap: None,
        window: Some((crate::types::Window::new(Some(4), Some(0)), 0)),
    };
    run(
        s,
        &Masking::default(),
        Tiles {
            query_block: 16,
            key_block: 32,
        },
        false,
    );
}

#[test]
fn segment_and_alibi_gradients_match_the_reference() {
    use crate::paths::cpu::masking::{Alibi, HostSegments};
    let slopes = [0.5f32, 0.25, 0.125, 0.0625];
    for offset in [None, Some(0)] {
        let s = shape(70, 70, offset);
        let ids = reference::segment_ids(70);
        let masking = Masking {
            segments: Some(HostSegments {
                query: &ids,
                key: &ids,
            }),
            alibi: Some(Alibi {
                slopes: &slopes,
                offset: 0,
            }),
            ..Masking::default()
        };
        run(s, &masking, BACKWARD_TILES, true);
        run(
            s,
            &masking,
            Tiles {
                query_block: 7,
                key_block: 9,
            },
            false,
        );
    }
}

#[test]
fn a_value_width_of_zero_has_zero_gradients() {
    // No output to differentiate: every gradient is 0 (it panicked on `chunks_mut(0)`).
    let mut s = shape(6, 9, None);
    s.dims.d_v = 0;
    let d = s.dims;
    let q = data(d.batch * d.n_heads * d.n * d.d_k, 1);
    let k = data(d.batch * d.n_kv_heads * d.m * d.d_k, 2);
    let lse = vec![0.0; d.batch * d.n_heads * d.n];
    let mut grad_q = vec![f32::NAN; q.len()];
    let mut grad_k = vec![f32::NAN; k.len()];
    let mut grad_v: Vec<f32> = Vec::new();
    try_backward(
        &s,
        BACKWARD_TILES,
        &Masking::default(),
        BackwardInputs {
            q: &q,
            k: &k,
            v: &[],
            out: &[],
            grad_out: &[],
            lse: &lse,
        },
        BackwardOutputs {
            grad_q: &mut grad_q,
            grad_k: &mut grad_k,
            grad_v: &mut grad_v,
            grad_scores: None,
        },
    )
    .unwrap();
    assert!(grad_q.iter().chain(&grad_k).all(|g| *g == 0.0));
}
