//! Tests of the forward kernel against the f64 reference: block edges, masks, biases, windows,
//! soft-caps, tile sizes and typed errors.

use super::*;
use crate::paths::cpu::masking::Broadcast;
use crate::paths::cpu::reference::{self, assert_close, data, shape};
use crate::types::AttentionDims;

fn check(s: KernelShape, masking: &Masking<'_>, tiles: Tiles, atol: f64) {
    let d = s.dims;
    let q = data(d.batch * d.n_heads * d.n * d.d_k, 1);
    let k = data(d.batch * d.n_kv_heads * d.m * d.d_k, 2);
    let v = data(d.batch * d.n_kv_heads * d.m * d.d_v, 3);
    let mut out = vec![f32::NAN; d.batch * d.n_heads * d.n * d.d_v];
    let mut lse = vec![f32::NAN; d.batch * d.n_heads * d.n];
    try_forward(&s, tiles, masking, &q, &k, &v, &mut out, Some(&mut lse)).unwrap();
    let (want_out, want_lse, _) = reference::forward(&s, masking, &q, &k, &v);
    assert_close(&format!("{s:?} out"), &out, &want_out, atol, 1e-4);
    for (idx, (g, w)) in lse.iter().zip(&want_lse).enumerate() {
        let ok = if w.is_infinite() {
            *g == f32::INFINITY
        } else {
            ((*g as f64) - w).abs() <= 1e-4 * (1.0 + w.abs())
        };
        assert!(ok, "{s:?} lse {idx}: {g} vs {w}");
    }
}

#[test]
fn matches_the_reference_across_block_edges() {
    // Query and key counts below, at and across the block sizes, with GQA; bottom-right and
    // top-left causal (offsets m − n and 0); rows with no visible key when n > m.
    for (n, m) in [
        (1, 1),
        (5, 300),
        (64, 256),
        (130, 513),
        (300, 800),
        (70, 40),
    ] {
        for offset in [None, Some(m as i64 - n as i64), Some(0)] {
            let small = Tiles {
                query_block: 64,
                key_block: 128,
            };
            for tiles in [Tiles::for_keys(m), small] {
                check(shape(n, m, offset), &Masking::default(), tiles, 1e-5);
            }
        }
    }
}

#[test]
fn masks_and_biases_match_the_reference() {
    for (n, m) in [(5, 300), (70, 40), (130, 260)] {
        for offset in [None, Some(m as i64 - n as i64), Some(0)] {
            let s = shape(n, m, offset);
            for test_masking in reference::maskings(&s.dims) {
                let masking = test_masking.masking();
                for tiles in [
                    Tiles::default(),
                    Tiles {
                        query_block: 7,
                        key_block: 33,
                    },
                ] {
                    check(s, &masking, tiles, 1e-5);
                }
            }
        }
    }
}

#[test]
fn windows_and_soft_caps_match_the_reference() {
    use crate::types::Window;
    // Narrow and wide bands, one-sided and two-sided, with and without causal masking, some
    // tiles wholly outside every band (skipped) and rows outside all keys (n > m).
    for (n, m) in [(5, 300), (70, 40), (130, 260)] {
        let offset = m as i64 - n as i64;
        for window in [
            Window::new(Some(3), Some(0)),
            Window::new(Some(40), Some(7)),
            Window::new(None, Some(2)),
            Window::new(Some(100), None),
        ] {
            for (causal_offset, softcap) in [(None, None), (Some(offset), Some(1.5))] {
                let s = KernelShape {
                    softcap,
                    window: Some((window, offset)),
                    ..shape(n, m, causal_offset)
                };
                for tiles in [
                    Tiles::default(),
                    Tiles {
                        query_block: 7,
                        key_block: 33,
                    },
                ] {
                    check(s, &Masking::default(), tiles, 1e-5);
                }
            }
        }
    }
    for test_masking in reference::maskings(&shape(70, 40, None).dims) {
        let s = KernelShape {
            softcap: Some(0.7),
            ..shape(70, 40, Some(0))
        };
        check(s, &test_masking.masking(), Tiles::default(), 1e-5);
    }
    let bad = KernelShape {
        softcap: Some(0.0),
        ..shape(4, 6, None)
    };
    let d = bad.dims;
    let e = try_attention_f32_tiled(
        &bad,
        Tiles::default(),
        &vec![0.0; d.batch * d.n_heads * d.n * d.d_k],
        &vec![0.0; d.batch * d.n_kv_heads * d.m * d.d_k],
        &vec![0.0; d.batch * d.n_kv_heads * d.m * d.d_v],
        &mut vec![0.0; d.batch * d.n_heads * d.n * d.d_v],
    )
    .unwrap_err();
    assert!(e.to_string().contains("soft-cap"), "{e}");
}

#[test]
fn other_tile_sizes_give_the_same_result() {
    let s = shape(130, 513, Some(513 - 130));
    let q = data(s.dims.batch * s.dims.n_heads * s.dims.n * s.dims.d_k, 4);
    let k = data(s.dims.batch * s.dims.n_kv_heads * s.dims.m * s.dims.d_k, 5);
    let v = data(s.dims.batch * s.dims.n_kv_heads * s.dims.m * s.dims.d_v, 6);
    let mut want = vec![0.0; s.dims.batch * s.dims.n_heads * s.dims.n * s.dims.d_v];
    attention_f32(&s, &q, &k, &v, &mut want);
    for (query_block, key_block) in [(1, 1), (7, 33), (256, 1024)] {
        let mut got = vec![f32::NAN; want.len()];
        let tiles = Tiles {
            query_block,
            key_block,
        };
        attention_f32_tiled(&s, tiles, &q, &k, &v, &mut got);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                "{tiles:?}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn bad_slices_tiles_and_masks_are_typed_errors() {
    let s = shape(4, 6, None);
    let q = vec![0.0; s.dims.batch * s.dims.n_heads * s.dims.n * s.dims.d_k];
    let k = vec![0.0; s.dims.batch * s.dims.n_kv_heads * s.dims.m * s.dims.d_k];
    let v = vec![0.0; s.dims.batch * s.dims.n_kv_heads * s.dims.m * s.dims.d_v];
    let mut out = vec![0.0; s.dims.batch * s.dims.n_heads * s.dims.n * s.dims.d_v];
    let e = try_attention_f32_tiled(&s, Tiles::default(), &q[1..], &k, &v, &mut out).unwrap_err();
    assert!(e.to_string().contains("query slice"), "{e}");
    let zero = Tiles {
        query_block: 0,
        key_block: 8,
    };
    let e = try_attention_f32_tiled(&s, zero, &q, &k, &v, &mut out).unwrap_err();
    assert!(e.to_string().contains("tile sizes"), "{e}");
    let odd = KernelShape {
        dims: AttentionDims {
            n_kv_heads: 3,
            ..s.dims
        },
        ..s
    };
    assert!(matches!(
        try_attention_f32_tiled(&odd, Tiles::default(), &q, &k, &v, &mut out),
        Err(AttentionError::HeadGrouping { .. })
    ));
    let mask = vec![false; 5];
    let bad = Masking {
        mask: Some(Broadcast::new(&mask, [1, 1, 1, 5])),
        ..Masking::default()
    };
    let e = try_forward(&s, Tiles::default(), &bad, &q, &k, &v, &mut out, None).unwrap_err();
    assert!(
        matches!(e, AttentionError::NotBroadcastable { tensor: "mask", .. }),
        "{e:?}"
    );
}

#[test]
fn large_scores_do_not_overflow() {
    let mut s = shape(65, 300, None);
    s.scale = 40.0;
    // Scores reach ~10³, where one f32 ulp is 6e-5: the f32 scores themselves carry ~1e-4
    // relative error into the weights, so the bound is 1e-3 (outputs are O(1)).
    check(s, &Masking::default(), Tiles::default(), 1e-3);
}

#[test]
fn segments_and_alibi_match_the_reference() {
    use crate::paths::cpu::masking::{Alibi, HostSegments};
    let slopes = [0.5f32, 0.25, 0.125, 0.0625];
    for offset in [None, Some(0)] {
        let s = shape(70, 70, offset);
        let ids = reference::segment_ids(70);
        for (with_segments, with_alibi) in [(true, false), (false, true), (true, true)] {
            let masking = Masking {
                segments: with_segments.then_some(HostSegments {
                    query: &ids,
                    key: &ids,
                }),
                alibi: with_alibi.then_some(Alibi {
                    slopes: &slopes,
                    offset: 0,
                }),
                ..Masking::default()
            };
            for tiles in [
                Tiles::default(),
                Tiles {
                    query_block: 7,
                    key_block: 9,
                },
            ] {
                check(s, &masking, tiles, 1e-5);
            }
        }
    }
}
