//! The tensor-core forward pass: the flash forward with its two products, QKᵀ and P·V, on
//! CubeCL's matrix instructions (`cmma`: tensor cores on CUDA, cooperative matrices on Vulkan),
//! square tiles (16×16×16 where the device lists that shape, else 8×8×8, Mesa lavapipe's) with
//! operands in the inputs' half type (f16 or bf16) and f32 accumulators.
//! Everything between the products is the scalar kernel's, per (query, key) pair:
//! [`read_pair`] for the band, window, segments, bias, masks, ALiBi and the non-finite policy,
//! the soft-cap, the online softmax key by key, the sinks and the row statistics.
//!
//! One cube is one plane (`lanes` units) and owns `size` queries of one (batch, head). The
//! queries' tile is loaded once into shared memory; then for each tile of `size` keys in the
//! block's band: the keys and values are loaded into shared memory, S = Q·Kᵀ is computed on the
//! matrix unit and stored as f32, each unit runs the online softmax of its rows (rows `u`,
//! `u + lanes`, ...) over the tile's keys, writes their weights exp(s − max) in the half type
//! and rescales its rows of the output, and O += P·V runs on the matrix unit, the output kept
//! as f32 in shared memory between tiles (an accumulator's rows cannot be rescaled in place).
//! Head sizes are padded with zeros to multiples of `size`, and the rows past n or m too.
//!
//! The backward pass is the scalar kernel's (`backward.rs`), from the log-sum-exp this pass
//! writes.

use cubecl::prelude::*;

use super::blocks::key_range;
use super::config::{FlashConfig, HIDDEN, NO_KEY, POISONED, Scalars, Terms};
use super::forward::sink_start;
use super::pair::{Pair, bias_row, read_pair, segment_of, slope_of};
use super::row_stats::{ROW_STATS, StatsAcc};
use super::steps::soft_cap;

/// The square tile shapes the kernel runs, in order of preference: 16×16×16 (tensor cores on
/// CUDA list it for f16 and bf16 with an f32 accumulator), 8×8×8 (Mesa 26's lavapipe lists it
/// for f16 with an f32 accumulator, and no other float shape).
pub(crate) const MMA_SIZES: [usize; 2] = [16, 8];

/// The tensor-core kernel's compile-time tiling (beside [`FlashConfig`], whose `rows` is the
/// rows of a query tile each unit owns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MmaTiling {
    /// The tile: M = N = K = `size` (one of [`MMA_SIZES`]).
    pub size: usize,
    /// Units per cube: one plane.
    pub lanes: usize,
    /// d_k rounded up to a multiple of `size`.
    pub d_k_pad: usize,
    /// d_v rounded up to a multiple of `size`.
    pub d_v_pad: usize,
}

impl MmaTiling {
    /// The tiling for head sizes `d_k`, `d_v` in tiles of `size` on a device whose planes have
    /// `lanes` units.
    pub(crate) fn new(size: usize, lanes: usize, d_k: usize, d_v: usize) -> MmaTiling {
        MmaTiling {
            size,
            lanes,
            d_k_pad: d_k.div_ceil(size) * size,
            d_v_pad: d_v.div_ceil(size) * size,
        }
    }

    /// Rows of a query tile per unit.
    pub(crate) fn rows(&self) -> usize {
        self.size.div_ceil(self.lanes)
    }

    /// Bytes of shared memory per cube for half operands of `half_bytes` bytes.
    pub(crate) fn shared_bytes(&self, half_bytes: usize) -> usize {
        let operands = self.size * (2 * self.d_k_pad + self.d_v_pad) + self.size * self.size;
        let accumulators = self.size * self.size + self.size * self.d_v_pad;
        operands * half_bytes + accumulators * 4
    }

    /// The loop iterations one unit runs in all for `n_key_tiles` tiles of keys (see
    /// `tile::LLVMPIPE_LOOP_LIMIT`), counted from the kernel's loops that are not unrolled: per
    /// tile, loading the key and value tiles, rescaling its output rows and the tile loop's own
    /// step (2, with a margin); outside, loading the query tile, zeroing the output tile and
    /// writing its rows.
    pub(crate) fn loop_iterations(&self, n_key_tiles: usize, d_v: usize) -> usize {
        let per_tile = (self.size * self.d_k_pad).div_ceil(self.lanes)
            + (self.size * self.d_v_pad).div_ceil(self.lanes)
            + self.rows() * self.d_v_pad
            + 2;
        let outside = (self.size * self.d_k_pad).div_ceil(self.lanes)
            + (self.size * self.d_v_pad).div_ceil(self.lanes)
            + self.rows() * d_v;
        n_key_tiles * per_tile + outside
    }
}

/// `dst[i]` = row `base_row + row0 + i / d_pad`, element `i % d_pad` of `src` (rows of `d`
/// elements) for the `size × d_pad` tile, zeros past `len` rows (counted from `row0`) and past `d`
/// elements; loaded by the cube's `lanes` units together.
#[cube]
fn load_tile<F: Float>(
    dst: &mut Shared<[F]>,
    src: &Tensor<F>,
    base_row: usize,
    row0: usize,
    len: usize,
    #[comptime] d: usize,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let unit = UNIT_POS_X as usize;
    let lanes = tiling.lanes;
    for step in 0..comptime!((tiling.size * d_pad).div_ceil(tiling.lanes)) {
        let i = step * lanes + unit;
        if i < comptime!(tiling.size * d_pad) {
            let (r, dd) = (i / d_pad, i % d_pad);
            let mut x = F::from_int(0);
            if row0 + r < len && dd < d {
                x = src[(base_row + row0 + r) * d + dd];
            }
            dst[i] = x;
        }
    }
}

/// `context [b, h, n, d_v]` and `lse [b, h, n]` (and `stats` when `has_stats`) as
/// [`flash_forward`](super::forward::flash_forward) writes them, with the products on the
/// matrix unit (see the module's docs). `F` is f16 or bf16. Launched with `lanes` units per
/// cube and `(n.div_ceil(size), y, z)` cubes, `y · z ≥ b · h`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_forward_mma<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    terms: Terms,
    bad_keys: &Tensor<f32>,
    bad_queries: &Tensor<f32>,
    context: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    stats: &mut Tensor<f32>,
    scalars: Scalars,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
    #[define(F)] _dtype: ElemType,
) {
    let (n, m) = (q.shape(2), k.shape(2));
    let (n_heads, n_kv_heads) = (q.shape(1), k.shape(1));
    let row = CUBE_POS_Y as usize + CUBE_POS_Z as usize * CUBE_COUNT_Y as usize;
    if row >= q.shape(0) * n_heads {
        terminate!();
    }
    let lanes = comptime!(tiling.lanes);
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    let unit = UNIT_POS_X as usize;
    let (batch_idx, head_idx) = (row / n_heads, row % n_heads);
    let kv = batch_idx * n_kv_heads + head_idx / (n_heads / n_kv_heads);
    let start = CUBE_POS_X as usize * tiling.size;
    let first_centre = start as i32 + scalars.offset;
    let (key_lo, key_hi) = key_range(
        first_centre,
        first_centre + comptime!(tiling.size as i32) - 1,
        m,
        &scalars,
        config,
    );
    let slope = slope_of(&terms, head_idx, config);
    let (start_max, start_sum) = sink_start(&terms, n_heads, head_idx, config);

    let mut q_tile = Shared::<[F]>::new_slice(comptime!(tiling.size * dkp));
    let mut k_tile = Shared::<[F]>::new_slice(comptime!(tiling.size * dkp));
    let mut v_tile = Shared::<[F]>::new_slice(comptime!(tiling.size * dvp));
    let mut s_tile = Shared::<[f32]>::new_slice(comptime!(tiling.size * tiling.size));
    let mut p_tile = Shared::<[F]>::new_slice(comptime!(tiling.size * tiling.size));
    let mut o_tile = Shared::<[f32]>::new_slice(comptime!(tiling.size * dvp));
    load_tile::<F>(&mut q_tile, q, row * n, start, n, d_k, dkp, tiling);
    for step in 0..comptime!((tiling.size * dvp).div_ceil(lanes)) {
        let i = step * lanes + unit;
        if i < comptime!(tiling.size * dvp) {
            o_tile[i] = 0.0f32;
        }
    }

    // The unit's rows of the tile: t = unit + r · lanes, query start + t.
    let mut max = Array::<f32>::new(config.rows);
    let mut sum = Array::<f32>::new(config.rows);
    let mut poisoned = Array::<f32>::new(config.rows);
    let mut segment = Array::<i32>::new(config.rows);
    let mut acc_stats = StatsAcc::new(config);
    #[unroll]
    for r in 0..config.rows {
        let query_idx = start + unit + r * lanes;
        max[r] = start_max;
        sum[r] = start_sum;
        let mut bad = 0.0f32;
        if query_idx < n && unit + r * lanes < tiling.size {
            bad = bad_queries[row * n + query_idx];
        }
        poisoned[r] = bad;
        segment[r] = segment_of(&terms.q_segments, batch_idx, query_idx, n, config);
    }
    sync_cube();

    let first_tile = key_lo / tiling.size;
    let end_tile = key_hi.div_ceil(tiling.size);
    for tile_idx in first_tile..end_tile {
        let key0 = tile_idx * tiling.size;
        load_tile::<F>(&mut k_tile, k, kv * m, key0, m, d_k, dkp, tiling);
        load_tile::<F>(&mut v_tile, v, kv * m, key0, m, d_v, dvp, tiling);
        sync_cube();

        // S = Q Kᵀ: B(kk, j) = K[key0 + j][c·size + kk], column-major with stride d_k_pad.
        let scores = cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            tiling.size,
            tiling.size,
            tiling.size,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        );
        #[unroll]
        for c in 0..comptime!(dkp / tiling.size) {
            let a = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::A,
                tiling.size,
                tiling.size,
                tiling.size,
                cmma::MatrixLayout::RowMajor,
                &q_tile[c * tiling.size..comptime!(tiling.size * dkp)],
                comptime!(dkp as u32),
            );
            let b = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::B,
                tiling.size,
                tiling.size,
                tiling.size,
                cmma::MatrixLayout::ColMajor,
                &k_tile[c * tiling.size..comptime!(tiling.size * dkp)],
                comptime!(dkp as u32),
            );
            cmma::execute(&a, &b, &scores, &scores);
        }
        cmma::store(
            &mut s_tile,
            &scores,
            comptime!(tiling.size as u32),
            cmma::MatrixLayout::RowMajor,
        );
        sync_cube();

        // The online softmax of the unit's rows over the tile's keys, key by key as the scalar
        // kernel runs it; then the weights against the tile's final max, and the output rows
        // rescaled to it.
        #[unroll]
        for r in 0..config.rows {
            let t = unit + r * lanes;
            if t < tiling.size {
                let query_idx = start + t;
                let (bias_base, _) = bias_row(&terms, batch_idx, head_idx, query_idx, m, config);
                let max_before = max[r];
                // Which of the tile's keys the row sees (1) or not (0).
                let mut seen = Array::<f32>::new(tiling.size);
                #[unroll]
                for j in 0..tiling.size {
                    let key_idx = key0 + j;
                    let key_in = key_idx < m;
                    let mut bad_key = false;
                    if key_in {
                        bad_key = bad_keys[kv * m + key_idx] > 0.5f32;
                    }
                    let pair = Pair {
                        query_idx,
                        key_idx,
                        query_in: query_idx < n,
                        key_in,
                        query_segment: segment[r],
                        key_segment: segment_of(&terms.k_segments, batch_idx, key_idx, m, config),
                        slope,
                        bad_key,
                    };
                    let (visible, added, poison) =
                        read_pair(&terms, &scalars, pair, bias_base + key_idx, config);
                    if poison {
                        poisoned[r] = 1.0f32;
                    }
                    let mut s = <f32 as Float>::new(HIDDEN);
                    seen[j] = 0.0f32;
                    if visible {
                        seen[j] = 1.0f32;
                        let (capped, _) = soft_cap(
                            s_tile[t * tiling.size + j] * scalars.scale,
                            &scalars,
                            config,
                        );
                        s = capped + added;
                        let old_max = max[r];
                        let new_max = f32::max(old_max, s);
                        let correction = (old_max - new_max).exp();
                        let p = (s - new_max).exp();
                        if config.has_stats {
                            acc_stats.add(r, s, p, correction, old_max, new_max);
                        }
                        sum[r] = sum[r] * correction + p;
                        max[r] = new_max;
                    }
                    s_tile[t * tiling.size + j] = s;
                }
                let row_max = max[r];
                #[unroll]
                for j in 0..tiling.size {
                    let mut p = 0.0f32;
                    if seen[j] > 0.5f32 {
                        p = (s_tile[t * tiling.size + j] - row_max).exp();
                    }
                    p_tile[t * tiling.size + j] = F::cast_from(p);
                }
                let alpha = (max_before - row_max).exp();
                for dd in 0..dvp {
                    o_tile[t * dvp + dd] *= alpha;
                }
            }
        }
        sync_cube();

        // O += P V: B(kk, j) = V[key0 + kk][c·size + j], row-major with stride d_v_pad.
        let a = cmma::Matrix::<F>::from_slice(
            cmma::MatrixIdent::A,
            tiling.size,
            tiling.size,
            tiling.size,
            cmma::MatrixLayout::RowMajor,
            &p_tile[0..comptime!(tiling.size * tiling.size)],
            comptime!(tiling.size as u32),
        );
        #[unroll]
        for c in 0..comptime!(dvp / tiling.size) {
            let out = cmma::Matrix::<f32>::from_slice(
                cmma::MatrixIdent::Accumulator,
                tiling.size,
                tiling.size,
                tiling.size,
                cmma::MatrixLayout::RowMajor,
                &o_tile[c * tiling.size..comptime!(tiling.size * dvp)],
                comptime!(dvp as u32),
            );
            let b = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::B,
                tiling.size,
                tiling.size,
                tiling.size,
                cmma::MatrixLayout::RowMajor,
                &v_tile[c * tiling.size..comptime!(tiling.size * dvp)],
                comptime!(dvp as u32),
            );
            cmma::execute(&a, &b, &out, &out);
            cmma::store(
                &mut o_tile[c * tiling.size..comptime!(tiling.size * dvp)],
                &out,
                comptime!(dvp as u32),
                cmma::MatrixLayout::RowMajor,
            );
        }
        sync_cube();
    }

    // Every row of the unit that is one of the n: as `OnlineRows::write` writes it.
    #[unroll]
    for r in 0..config.rows {
        let t = unit + r * lanes;
        let query_idx = start + t;
        if t < tiling.size && query_idx < n {
            let row_idx = row * n + query_idx;
            let (row_max, row_sum) = (max[r], sum[r]);
            if config.has_stats {
                acc_stats.write(stats, row_idx * ROW_STATS, r, row_max, row_sum);
            }
            let mut factor = 0.0f32;
            let mut row_lse = <f32 as Float>::new(NO_KEY);
            if row_sum > 0.0f32 {
                factor = 1.0f32 / row_sum;
                row_lse = row_max + row_sum.ln();
                if poisoned[r] > 0.5f32 {
                    row_lse = POISONED;
                }
            }
            for dd in 0..d_v {
                context[row_idx * d_v + dd] = F::cast_from(o_tile[t * dvp + dd] * factor);
            }
            lse[row_idx] = row_lse;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_sizes_pad_to_whole_tiles() {
        let t = MmaTiling::new(16, 32, 64, 64);
        assert_eq!((t.d_k_pad, t.d_v_pad), (64, 64));
        let t = MmaTiling::new(16, 8, 8, 20);
        assert_eq!((t.d_k_pad, t.d_v_pad), (16, 32));
        let t = MmaTiling::new(16, 32, 96, 320);
        assert_eq!((t.d_k_pad, t.d_v_pad), (96, 320));
        let t = MmaTiling::new(8, 8, 20, 4);
        assert_eq!((t.d_k_pad, t.d_v_pad), (24, 8));
    }

    #[test]
    fn every_row_of_a_tile_has_one_unit() {
        for size in MMA_SIZES {
            for lanes in [4, 8, 16, 32, 64] {
                let t = MmaTiling::new(size, lanes, 64, 64);
                // Rows t = unit + r · lanes for r < rows(): each of 0..size exactly once.
                let mut seen = vec![0; size];
                for unit in 0..lanes {
                    for r in 0..t.rows() {
                        let row = unit + r * lanes;
                        if row < size {
                            seen[row] += 1;
                        }
                    }
                }
                assert_eq!(seen, vec![1; size], "size {size}, lanes {lanes}");
            }
        }
    }

    #[test]
    fn shared_memory_counts_every_tile() {
        // d = 64, f16: q, k (16 × 64), v (16 × 64), p (16 × 16) in 2 bytes; s (16 × 16) and
        // o (16 × 64) in 4.
        let t = MmaTiling::new(16, 32, 64, 64);
        let halves = 16 * 64 * 3 + 16 * 16;
        let floats = 16 * 16 + 16 * 64;
        assert_eq!(t.shared_bytes(2), halves * 2 + floats * 4);
        // d = 256 fits a GPU's 48 KiB; d = 512 does not.
        assert!(MmaTiling::new(16, 32, 256, 256).shared_bytes(2) <= 48 << 10);
        assert!(MmaTiling::new(16, 32, 512, 512).shared_bytes(2) > 48 << 10);
    }

    #[test]
    fn loop_iterations_grow_with_the_key_tiles() {
        let t = MmaTiling::new(16, 8, 64, 64);
        let one = t.loop_iterations(1, 64);
        let two = t.loop_iterations(2, 64);
        // Per tile: k and v tiles (128 + 128 per unit), 2 rows × 64 rescaled, 2 for the loop.
        assert_eq!(two - one, 128 + 128 + 2 * 64 + 2);
        assert_eq!(one, (two - one) + 128 + 128 + 2 * 64);
    }
}
