//! A query-blocked flash-attention kernel for CPU inference on `f32` data, behind
//! [`Implementation::CpuKernel`](crate::Implementation::CpuKernel).
//!
//! Burn's Flex kernel runs one `[n, 64]` score tile per step over all n queries of a head and
//! exponentiates with the scalar `f32::exp`. This kernel differs in three ways (how much each
//! gains is measured by `sdpa bench`; the figures are in the README):
//!
//! - **Query blocks.** Each task is one (batch, head, block of [`QUERY_BLOCK`] queries), so the
//!   score tile `[QUERY_BLOCK, KEY_BLOCK]`, the accumulator `[QUERY_BLOCK, d_v]` and the
//!   key/value tiles stay in L2, and there are b·h·⌈n / QUERY_BLOCK⌉ tasks for the thread pool.
//!   ([`attention_f32_tiled`] takes other tile sizes.)
//! - **A vectorized softmax.** The running max, `exp`, row sum and rescale are branch-free loops
//!   over the tile, compiled for AVX-512 and AVX2+FMA and chosen at run time (a portable build
//!   otherwise); `exp` is a degree-6 polynomial after range reduction (relative error < 5e-7, tested).
//! - **Causal tiles skipped.** Key tiles entirely above the diagonal are never computed, tiles
//!   entirely below it are never masked.
//!
//! The two tile products go through the `gemm` crate (the one Flex uses), single-threaded
//! inside a task. The kernel reads the tensors' data on the host, so it only makes sense on CPU
//! backends, and it has no backward pass: [`auto_path`](crate::paths::auto::auto_path) takes it for
//! inference on Flex and NdArray only.
//!
//! # Semantics
//! Those of the naive path for the requests it accepts: scale applied to QKᵀ, causal masking
//! with an explicit offset (key `j` is visible to query `i` when `j <= i + offset`), grouped-query
//! heads (query head `i` reads kv head `i / (h / h_kv)`), and a zero output row for a query
//! with no visible key.

use rayon::prelude::*;

use super::simd;
use crate::error::AttentionError;
use crate::types::AttentionDims;

/// Queries per task (default), chosen with `cargo run --release --example cpu_kernel_tiles`
/// (the sweep is in the README). At 128 × 256 the score tile (128 KiB), the accumulator and
/// the key/value tiles fit in L2.
pub const QUERY_BLOCK: usize = 128;
/// Keys per tile (default).
pub const KEY_BLOCK: usize = 256;

/// Sizes and options of one kernel call; the slices are contiguous row-major
/// `q: [batch, n_heads, n, d_k]`, `k: [batch, n_kv_heads, m, d_k]`,
/// `v: [batch, n_kv_heads, m, d_v]`, `out: [batch, n_heads, n, d_v]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelShape {
    /// The sizes (h_kv must divide h).
    pub dims: AttentionDims,
    /// Factor applied to QKᵀ.
    pub scale: f32,
    /// `Some(offset)`: key `j` is visible to query `i` only when `j <= i + offset`.
    pub causal_offset: Option<i64>,
}

impl KernelShape {
    /// Checks the slice lengths, the head grouping and the tile sizes against this shape.
    pub fn validate(
        &self,
        tiles: Tiles,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &[f32],
    ) -> Result<(), AttentionError> {
        let s = &self.dims;
        if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
            return Err(AttentionError::HeadGrouping {
                n_heads: s.n_heads,
                n_kv_heads: s.n_kv_heads,
            });
        }
        if tiles.query_block == 0 || tiles.key_block == 0 {
            return Err(AttentionError::InvalidConfig {
                field: "tiles",
                value: format!("{tiles:?}"),
                reason: "tile sizes must be > 0".into(),
            });
        }
        let lengths = [
            ("query slice", q.len(), [s.batch, s.n_heads, s.n, s.d_k]),
            ("key slice", k.len(), [s.batch, s.n_kv_heads, s.m, s.d_k]),
            ("value slice", v.len(), [s.batch, s.n_kv_heads, s.m, s.d_v]),
            ("output slice", out.len(), [s.batch, s.n_heads, s.n, s.d_v]),
        ];
        for (what, len, shape) in lengths {
            if len != shape.iter().product::<usize>() {
                return Err(AttentionError::Shape {
                    what,
                    expected: format!(
                        "{} values for the shape {shape:?}",
                        shape.iter().product::<usize>()
                    ),
                    got: vec![len],
                });
            }
        }
        Ok(())
    }

    /// Keys visible to query `query_idx`: `0..visible_keys(query_idx)`.
    fn visible_keys(&self, query_idx: usize) -> usize {
        match self.causal_offset {
            None => self.dims.m,
            Some(offset) => (query_idx as i64 + offset + 1).clamp(0, self.dims.m as i64) as usize,
        }
    }
}

/// Tile sizes of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    /// Queries per task.
    pub query_block: usize,
    /// Keys per tile.
    pub key_block: usize,
}

impl Default for Tiles {
    /// [`QUERY_BLOCK`] × [`KEY_BLOCK`].
    fn default() -> Self {
        Self {
            query_block: QUERY_BLOCK,
            key_block: KEY_BLOCK,
        }
    }
}

/// Computes `out = softmax(q kᵀ · scale + causal) v` (see the module docs) with the default
/// [`Tiles`].
///
/// # Panics
/// When the slice lengths do not match `shape` or `n_heads` is not a multiple of `n_kv_heads`
/// (see [`try_attention_f32_tiled`] for the typed error).
pub fn attention_f32(shape: &KernelShape, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    attention_f32_tiled(shape, Tiles::default(), q, k, v, out)
}

/// [`attention_f32`] with explicit tile sizes (for tuning: `cargo run --release --example
/// cpu_kernel_tiles`).
///
/// # Panics
/// With the message of [`try_attention_f32_tiled`]'s error.
pub fn attention_f32_tiled(
    shape: &KernelShape,
    tiles: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) {
    try_attention_f32_tiled(shape, tiles, q, k, v, out).unwrap_or_else(|e| panic!("{e}"))
}

/// [`attention_f32_tiled`], or an [`AttentionError`] naming the slice, head grouping or tile size
/// that does not fit `shape` (nothing is written then).
pub fn try_attention_f32_tiled(
    shape: &KernelShape,
    tiles: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<(), AttentionError> {
    shape.validate(tiles, q, k, v, out)?;
    let AttentionDims { n, d_v, .. } = shape.dims;
    if out.is_empty() {
        return Ok(());
    }
    // out: [b·h, n, d_v] -> tasks of [query_block, d_v] rows, each with its (b·h, first query).
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (bh_idx, head_out) in out.chunks_mut(n * d_v).enumerate() {
        for (block_idx, block_out) in head_out.chunks_mut(tiles.query_block * d_v).enumerate() {
            tasks.push((bh_idx, block_idx * tiles.query_block, block_out));
        }
    }
    tasks.into_par_iter().for_each_init(
        || Scratch::new(shape, tiles),
        |scratch, (bh_idx, q_start, block_out)| {
            query_block(shape, tiles, q, k, v, bh_idx, q_start, block_out, scratch)
        },
    );
    Ok(())
}

/// Per-thread buffers of one query block.
struct Scratch {
    /// `[query_block, key_block]` scores, then probabilities.
    scores: Vec<f32>,
    /// `[query_block, d_v]` unnormalized output.
    acc: Vec<f32>,
    /// Running max per query.
    row_max: Vec<f32>,
    /// Running sum of exponentials per query.
    row_sum: Vec<f32>,
}

impl Scratch {
    fn new(shape: &KernelShape, tiles: Tiles) -> Self {
        Self {
            scores: vec![0.0; tiles.query_block * tiles.key_block],
            acc: vec![0.0; tiles.query_block * shape.dims.d_v],
            row_max: vec![f32::NEG_INFINITY; tiles.query_block],
            row_sum: vec![0.0; tiles.query_block],
        }
    }
}

/// One task: queries `q_start .. q_start + rows` of flattened head `bh_idx`.
#[allow(clippy::too_many_arguments)]
fn query_block(
    shape: &KernelShape,
    tiles: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bh_idx: usize,
    q_start: usize,
    block_out: &mut [f32],
    scratch: &mut Scratch,
) {
    let AttentionDims {
        n_heads,
        n_kv_heads,
        n,
        d_k,
        d_v,
        ..
    } = shape.dims;
    let scale = shape.scale;
    let rows = block_out.len() / d_v;
    let (b_idx, head_idx) = (bh_idx / n_heads, bh_idx % n_heads);
    let kv_head_idx = head_idx / (n_heads / n_kv_heads);
    let kv_idx = b_idx * n_kv_heads + kv_head_idx;
    // q block: [rows, d_k]; k, v of the kv head: [m, d_k], [m, d_v].
    let q_block = &q[(bh_idx * n + q_start) * d_k..][..rows * d_k];
    let k_head = &k[kv_idx * shape.dims.m * d_k..][..shape.dims.m * d_k];
    let v_head = &v[kv_idx * shape.dims.m * d_v..][..shape.dims.m * d_v];

    let acc = &mut scratch.acc[..rows * d_v];
    acc.fill(0.0);
    scratch.row_max[..rows].fill(f32::NEG_INFINITY);
    scratch.row_sum[..rows].fill(0.0);

    // Keys any query of the block sees, and those every query sees (no masking needed).
    let keys_needed = shape.visible_keys(q_start + rows - 1);
    let keys_unmasked = shape.visible_keys(q_start);

    let mut key_start = 0;
    while key_start < keys_needed {
        let cols = tiles.key_block.min(keys_needed - key_start);
        let scores = &mut scratch.scores[..rows * cols];
        // scores [rows, cols] = scale · q_block [rows, d_k] · k_tileᵀ [d_k, cols]
        // SAFETY: every pointer/stride pair addresses memory inside the slices it comes from:
        // q_block is [rows, d_k] row-major, k_head rows key_start..key_start+cols are [cols, d_k]
        // row-major read transposed, scores is [rows, cols] row-major.
        unsafe {
            gemm::gemm(
                rows,
                cols,
                d_k,
                scores.as_mut_ptr(),
                1,
                cols as isize,
                false,
                q_block.as_ptr(),
                1,
                d_k as isize,
                k_head[key_start * d_k..][..cols * d_k].as_ptr(),
                d_k as isize,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        let masked = key_start + cols > keys_unmasked;
        for row in 0..rows {
            let row_scores = &mut scores[row * cols..][..cols];
            if masked {
                let visible = shape
                    .visible_keys(q_start + row)
                    .saturating_sub(key_start)
                    .min(cols);
                row_scores[visible..].fill(f32::NEG_INFINITY);
            }
            let old_max = scratch.row_max[row];
            let new_max = old_max.max(simd::max(row_scores));
            if new_max == f32::NEG_INFINITY {
                // No visible key yet: this tile adds nothing.
                row_scores.fill(0.0);
                continue;
            }
            let tile_sum = simd::exp_sub_sum(row_scores, new_max);
            let correction = (old_max - new_max).exp(); // exp(-inf) = 0 on the first tile
            if correction != 1.0 {
                simd::scale(&mut acc[row * d_v..][..d_v], correction);
            }
            scratch.row_sum[row] = scratch.row_sum[row] * correction + tile_sum;
            scratch.row_max[row] = new_max;
        }
        // acc [rows, d_v] += p [rows, cols] · v_tile [cols, d_v]
        // SAFETY: as above; v_head rows key_start..key_start+cols are [cols, d_v] row-major,
        // acc is [rows, d_v] row-major.
        unsafe {
            gemm::gemm(
                rows,
                d_v,
                cols,
                acc.as_mut_ptr(),
                1,
                d_v as isize,
                true,
                scores.as_ptr(),
                1,
                cols as isize,
                v_head[key_start * d_v..][..cols * d_v].as_ptr(),
                1,
                d_v as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        key_start += cols;
    }
    for row in 0..rows {
        let sum = scratch.row_sum[row];
        // A query that saw no key keeps a zero row (the naive path's masked-row rule).
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        let out_row = &mut block_out[row * d_v..][..d_v];
        for (o, a) in out_row.iter_mut().zip(&acc[row * d_v..][..d_v]) {
            *o = a * inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook computation in f64, for parity.
    fn reference(shape: &KernelShape, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let AttentionDims {
            batch,
            n_heads,
            n_kv_heads,
            n,
            m,
            d_k,
            d_v,
        } = shape.dims;
        let mut out = vec![0.0f32; batch * n_heads * n * d_v];
        for bh in 0..batch * n_heads {
            let kv = (bh / n_heads) * n_kv_heads + (bh % n_heads) / (n_heads / n_kv_heads);
            for i in 0..n {
                let visible = shape.visible_keys(i);
                let scores: Vec<f64> = (0..visible)
                    .map(|j| {
                        (0..d_k)
                            .map(|c| {
                                q[(bh * n + i) * d_k + c] as f64 * k[(kv * m + j) * d_k + c] as f64
                            })
                            .sum::<f64>()
                            * shape.scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for c in 0..d_v {
                    let acc: f64 = (0..visible)
                        .map(|j| weights[j] * v[(kv * m + j) * d_v + c] as f64)
                        .sum();
                    out[(bh * n + i) * d_v + c] = if visible == 0 {
                        0.0
                    } else {
                        (acc / sum) as f32
                    };
                }
            }
        }
        out
    }

    fn data(len: usize, seed: u64) -> Vec<f32> {
        // A small LCG: deterministic, no dependency.
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Compares with the f64 reference: `|got − want| ≤ atol + 1e-4·|want|`.
    fn check_within(shape: KernelShape, atol: f32) {
        let q = data(
            shape.dims.batch * shape.dims.n_heads * shape.dims.n * shape.dims.d_k,
            1,
        );
        let k = data(
            shape.dims.batch * shape.dims.n_kv_heads * shape.dims.m * shape.dims.d_k,
            2,
        );
        let v = data(
            shape.dims.batch * shape.dims.n_kv_heads * shape.dims.m * shape.dims.d_v,
            3,
        );
        let mut out =
            vec![f32::NAN; shape.dims.batch * shape.dims.n_heads * shape.dims.n * shape.dims.d_v];
        attention_f32(&shape, &q, &k, &v, &mut out);
        let want = reference(&shape, &q, &k, &v);
        for (idx, (got, want)) in out.iter().zip(&want).enumerate() {
            assert!(
                got.is_finite() && (got - want).abs() <= atol + 1e-4 * want.abs(),
                "{shape:?}: element {idx}: {got} vs {want}"
            );
        }
    }

    fn check(shape: KernelShape) {
        check_within(shape, 1e-5);
    }

    fn shape(n: usize, m: usize, causal_offset: Option<i64>) -> KernelShape {
        KernelShape {
            dims: AttentionDims {
                batch: 2,
                n_heads: 4,
                n_kv_heads: 2,
                n,
                m,
                d_k: 16,
                d_v: 8,
            },
            scale: 0.25,
            causal_offset,
        }
    }

    #[test]
    fn matches_the_reference_across_block_edges() {
        // Query and key counts below, at and across the block sizes, with GQA.
        for (n, m) in [(1, 1), (5, 300), (64, 256), (130, 513), (70, 40)] {
            check(shape(n, m, None));
            // Bottom-right and top-left causal (offsets m − n and 0); rows with no visible key
            // when n > m bottom-right.
            check(shape(n, m, Some(m as i64 - n as i64)));
            check(shape(n, m, Some(0)));
        }
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
    fn bad_slices_and_tiles_are_typed_errors() {
        let s = shape(4, 6, None);
        let q = vec![0.0; s.dims.batch * s.dims.n_heads * s.dims.n * s.dims.d_k];
        let k = vec![0.0; s.dims.batch * s.dims.n_kv_heads * s.dims.m * s.dims.d_k];
        let v = vec![0.0; s.dims.batch * s.dims.n_kv_heads * s.dims.m * s.dims.d_v];
        let mut out = vec![0.0; s.dims.batch * s.dims.n_heads * s.dims.n * s.dims.d_v];
        let e =
            try_attention_f32_tiled(&s, Tiles::default(), &q[1..], &k, &v, &mut out).unwrap_err();
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
    }

    #[test]
    fn large_scores_do_not_overflow() {
        let mut s = shape(65, 300, None);
        s.scale = 40.0;
        // Scores reach ~10³, where one f32 ulp is 6e-5: the f32 scores themselves carry ~1e-4
        // relative error into the weights, so the bound is 1e-3 (outputs are O(1)).
        check_within(s, 1e-3);
    }
}
