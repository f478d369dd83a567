//! The tensor-core forward pass: the flash forward with its two products, QKᵀ and P·V, on
//! CubeCL's matrix instructions (`cmma`: tensor cores on CUDA, cooperative matrices on Vulkan),
//! square tiles (16×16×16 where the device lists that shape and the tiles fit its shared memory,
//! else 8×8×8, Mesa lavapipe's) with operands in the inputs' half type (f16 or bf16) and f32
//! accumulators.
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
//! The tiles and the products are `mma_tile.rs`'s; the backward pass on the matrix unit is
//! `mma_backward.rs`, from the log-sum-exp this pass writes.

use cubecl::prelude::*;

use super::blocks::key_range;
use super::config::{FlashConfig, HIDDEN, NO_KEY, POISONED, Scalars, Terms};
use super::forward::sink_start;
use super::mma_tile::{MMA_ALIGN, MmaTiling, add_product, load_tile, product_abt, zero_tile};
use super::pair::{Pair, bias_row, read_pair, segment_of, slope_of};
use super::row_stats::{ROW_STATS, StatsAcc};
use super::steps::{grid_row, soft_cap};

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
    let row = grid_row();
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

    let mut q_tile = Shared::<[F]>::new_aligned_slice(comptime!(tiling.size * dkp), MMA_ALIGN);
    let mut k_tile = Shared::<[F]>::new_aligned_slice(comptime!(tiling.size * dkp), MMA_ALIGN);
    let mut v_tile = Shared::<[F]>::new_aligned_slice(comptime!(tiling.size * dvp), MMA_ALIGN);
    let mut s_tile =
        Shared::<[f32]>::new_aligned_slice(comptime!(tiling.size * tiling.size), MMA_ALIGN);
    let mut p_tile =
        Shared::<[F]>::new_aligned_slice(comptime!(tiling.size * tiling.size), MMA_ALIGN);
    let mut o_tile = Shared::<[f32]>::new_aligned_slice(comptime!(tiling.size * dvp), MMA_ALIGN);
    load_tile::<F>(&mut q_tile, q, row * n, start, n, d_k, dkp, tiling);
    zero_tile(&mut o_tile, dvp, tiling);

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

        // S = Q Kᵀ.
        product_abt::<F>(&mut s_tile, &q_tile, &k_tile, dkp, tiling);
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

        // O += P V.
        add_product::<F>(&mut o_tile, &p_tile, &v_tile, false, dvp, tiling);
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
