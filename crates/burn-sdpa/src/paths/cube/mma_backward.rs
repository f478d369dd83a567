//! The tensor-core backward pass (FlashAttention-2's, as `backward.rs` runs it on the scalar
//! tiles): its four products, dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q, and the recomputed QKᵀ, on
//! CubeCL's matrix instructions (`mma_tile.rs`: half operands, f32 results), the weights
//! recomputed from the forward's log-sum-exp, nothing of size n × m stored, and no atomics.
//!
//! - `flash_backward_dq_mma`: one cube (one plane) per (batch·head, tile of `size` queries);
//!   per tile of keys in the band: S = Q·Kᵀ and dP = dO·Vᵀ on the matrix unit, then each unit
//!   computes its rows' dS = P ∘ (dP − D) (`score_grads`, with [`read_pair`] for every mask
//!   and term) and writes it in the half type, then dQ += dS·K on the matrix unit.
//! - `flash_backward_dkdv_mma`: one cube per (batch·kv head, tile of `size` keys); for every
//!   query head of the group and every tile of queries in the band: S and dP as above, each
//!   unit computes P and dS of its query rows (and writes the score gradient when the bias
//!   wants it), then dV += Pᵀ·dO and dK += dSᵀ·Q on the matrix unit.
//!
//! dQ, dK and dV stay on the matrix unit (f32 accumulator fragments, `mma_tile::zero_fragments`)
//! until they are written. P and dS enter the products rounded to the half type (as in
//! FlashAttention), everything else is f32: the sums, the weights, D = rowsum(dO ∘ O). The queries
//! are not scaled before the products: S is scaled after, and dQ, dK at the end. Rows past n
//! or m and columns past d_k or d_v are zeros in the tiles and are not written.

use cubecl::prelude::*;

use super::backward::score_grads;
use super::blocks::{key_range, query_range};
use super::config::{FlashConfig, Scalars, Terms};
use super::mma_tile::{
    MMA_ALIGN, MmaTiling, add_product_fragments, load_tile, product_abt, write_fragments,
    zero_fragments,
};
use super::pair::{Pair, bias_row, read_pair, segment_of, slope_of};
use super::steps::grid_row;

/// dQ `[b, h, n, d_k]` as [`flash_backward_dq`](super::backward::flash_backward_dq) writes it,
/// with the products on the matrix unit. `F` is f16 or bf16. Launched with `lanes` units per
/// cube and `(n.div_ceil(size), y, z)` cubes, `y · z ≥ b · h`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dq_mma<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    terms: Terms,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dq: &mut Tensor<F>,
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
    let (size, lanes) = comptime!((tiling.size, tiling.lanes));
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    let unit = UNIT_POS_X as usize;
    let (batch_idx, head_idx) = (row / n_heads, row % n_heads);
    let kv = batch_idx * n_kv_heads + head_idx / (n_heads / n_kv_heads);
    let start = CUBE_POS_X as usize * size;
    let first_centre = start as i32 + scalars.offset;
    let (key_lo, key_hi) = key_range(
        first_centre,
        first_centre + comptime!(size as i32) - 1,
        m,
        &scalars,
        config,
    );
    let slope = slope_of(&terms, head_idx, config);

    let mut q_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dkp), MMA_ALIGN);
    let mut do_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dvp), MMA_ALIGN);
    let mut k_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dkp), MMA_ALIGN);
    let mut v_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dvp), MMA_ALIGN);
    let mut ds_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut s_tile = Shared::<[f32]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut dp_tile = Shared::<[f32]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let dq_acc = zero_fragments(dkp, tiling);
    load_tile::<F>(&mut q_tile, q, row * n, start, n, d_k, dkp, tiling);
    load_tile::<F>(&mut do_tile, d_out, row * n, start, n, d_v, dvp, tiling);

    // The unit's rows of the tile: t = unit + r · lanes, query start + t.
    let mut row_lse = Array::<f32>::new(config.rows);
    let mut row_delta = Array::<f32>::new(config.rows);
    let mut segment = Array::<i32>::new(config.rows);
    #[unroll]
    for r in 0..config.rows {
        let query_idx = start + unit + r * lanes;
        row_lse[r] = 0.0f32;
        row_delta[r] = 0.0f32;
        if query_idx < n && unit + r * lanes < size {
            row_lse[r] = lse[row * n + query_idx];
            row_delta[r] = delta[row * n + query_idx];
        }
        segment[r] = segment_of(&terms.q_segments, batch_idx, query_idx, n, config);
    }
    sync_cube();

    for tile_idx in key_lo / size..key_hi.div_ceil(size) {
        let key0 = tile_idx * size;
        load_tile::<F>(&mut k_tile, k, kv * m, key0, m, d_k, dkp, tiling);
        load_tile::<F>(&mut v_tile, v, kv * m, key0, m, d_v, dvp, tiling);
        sync_cube();
        product_abt::<F>(&mut s_tile, &q_tile, &k_tile, dkp, tiling);
        product_abt::<F>(&mut dp_tile, &do_tile, &v_tile, dvp, tiling);
        sync_cube();

        #[unroll]
        for r in 0..config.rows {
            let t = unit + r * lanes;
            if t < size {
                let query_idx = start + t;
                let (bias_base, _) = bias_row(&terms, batch_idx, head_idx, query_idx, m, config);
                #[unroll]
                for j in 0..size {
                    let key_idx = key0 + j;
                    let pair = Pair {
                        query_idx,
                        key_idx,
                        query_in: query_idx < n,
                        key_in: key_idx < m,
                        query_segment: segment[r],
                        key_segment: segment_of(&terms.k_segments, batch_idx, key_idx, m, config),
                        slope,
                        bad_key: false,
                    };
                    let (visible, added, _) =
                        read_pair(&terms, &scalars, pair, bias_base + key_idx, config);
                    let (_, _, ds) = score_grads(
                        s_tile[t * size + j] * scalars.scale,
                        added,
                        visible,
                        row_lse[r],
                        dp_tile[t * size + j],
                        row_delta[r],
                        &scalars,
                        config,
                    );
                    ds_tile[t * size + j] = F::cast_from(ds);
                }
            }
        }
        sync_cube();

        // dQ += dS K.
        add_product_fragments::<F>(&dq_acc, &ds_tile, &k_tile, false, dkp, tiling);
        sync_cube();
    }

    let scale = scalars.scale;
    write_fragments::<F>(
        dq,
        &dq_acc,
        &mut s_tile,
        row * n,
        start,
        n,
        scale,
        d_k,
        dkp,
        tiling,
    );
}

/// dK `[b, h_kv, m, d_k]` and dV `[b, h_kv, m, d_v]`, summed over the query heads of each
/// group, and with `write_scores` the score gradient into `d_scores` `[b, h, n, m]` (which must
/// hold zeros), as [`flash_backward_dkdv`](super::backward::flash_backward_dkdv) writes them,
/// with the products on the matrix unit. Launched with `lanes` units per cube and
/// `(m.div_ceil(size), y, z)` cubes, `y · z ≥ b · h_kv`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dkdv_mma<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    terms: Terms,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    d_scores: &mut Tensor<f32>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    scalars: Scalars,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
    #[define(F)] _dtype: ElemType,
) {
    let (n, m) = (q.shape(2), k.shape(2));
    let (n_heads, n_kv_heads) = (q.shape(1), k.shape(1));
    let group = n_heads / n_kv_heads;
    // The grid's rows are (batch·kv head) rows, its tiles tiles of keys.
    let kv = grid_row();
    if kv >= q.shape(0) * n_kv_heads {
        terminate!();
    }
    let (size, lanes) = comptime!((tiling.size, tiling.lanes));
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    let unit = UNIT_POS_X as usize;
    let (batch_idx, kv_head_idx) = (kv / n_kv_heads, kv % n_kv_heads);
    let start = CUBE_POS_X as usize * size;
    let (query_lo, query_hi) =
        query_range(start as i32, (start + size) as i32 - 1, n, &scalars, config);

    let mut k_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dkp), MMA_ALIGN);
    let mut v_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dvp), MMA_ALIGN);
    let mut q_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dkp), MMA_ALIGN);
    let mut do_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dvp), MMA_ALIGN);
    let mut p_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut ds_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut s_tile = Shared::<[f32]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut dp_tile = Shared::<[f32]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let dk_acc = zero_fragments(dkp, tiling);
    let dv_acc = zero_fragments(dvp, tiling);
    load_tile::<F>(&mut k_tile, k, kv * m, start, m, d_k, dkp, tiling);
    load_tile::<F>(&mut v_tile, v, kv * m, start, m, d_v, dvp, tiling);
    sync_cube();

    for g in 0..group {
        let head_idx = kv_head_idx * group + g;
        let row = batch_idx * n_heads + head_idx;
        let slope = slope_of(&terms, head_idx, config);
        for tile_idx in query_lo / size..query_hi.div_ceil(size) {
            let query0 = tile_idx * size;
            load_tile::<F>(&mut q_tile, q, row * n, query0, n, d_k, dkp, tiling);
            load_tile::<F>(&mut do_tile, d_out, row * n, query0, n, d_v, dvp, tiling);
            sync_cube();
            // S[t][j] = q_(query0 + t) · k_(start + j), dP likewise with dO and V.
            product_abt::<F>(&mut s_tile, &q_tile, &k_tile, dkp, tiling);
            product_abt::<F>(&mut dp_tile, &do_tile, &v_tile, dvp, tiling);
            sync_cube();

            #[unroll]
            for r in 0..config.rows {
                let t = unit + r * lanes;
                let query_idx = query0 + t;
                if t < size {
                    let query_in = query_idx < n;
                    let row_idx = row * n + query_idx;
                    let mut lse_t = 0.0f32;
                    let mut delta_t = 0.0f32;
                    if query_in {
                        lse_t = lse[row_idx];
                        delta_t = delta[row_idx];
                    }
                    let query_segment =
                        segment_of(&terms.q_segments, batch_idx, query_idx, n, config);
                    let (bias_base, _) =
                        bias_row(&terms, batch_idx, head_idx, query_idx, m, config);
                    #[unroll]
                    for j in 0..size {
                        let key_idx = start + j;
                        let pair = Pair {
                            query_idx,
                            key_idx,
                            query_in,
                            key_in: key_idx < m,
                            query_segment,
                            key_segment: segment_of(
                                &terms.k_segments,
                                batch_idx,
                                key_idx,
                                m,
                                config,
                            ),
                            slope,
                            bad_key: false,
                        };
                        let (visible, added, _) =
                            read_pair(&terms, &scalars, pair, bias_base + key_idx, config);
                        let (p, ds_bias, ds) = score_grads(
                            s_tile[t * size + j] * scalars.scale,
                            added,
                            visible,
                            lse_t,
                            dp_tile[t * size + j],
                            delta_t,
                            &scalars,
                            config,
                        );
                        if config.write_scores && visible {
                            d_scores[row_idx * m + key_idx] = ds_bias;
                        }
                        p_tile[t * size + j] = F::cast_from(p);
                        ds_tile[t * size + j] = F::cast_from(ds);
                    }
                }
            }
            sync_cube();

            // dV += Pᵀ dO, dK += dSᵀ Q.
            add_product_fragments::<F>(&dv_acc, &p_tile, &do_tile, true, dvp, tiling);
            add_product_fragments::<F>(&dk_acc, &ds_tile, &q_tile, true, dkp, tiling);
            sync_cube();
        }
    }

    let scale = scalars.scale;
    write_fragments::<F>(
        dk,
        &dk_acc,
        &mut s_tile,
        kv * m,
        start,
        m,
        scale,
        d_k,
        dkp,
        tiling,
    );
    write_fragments::<F>(
        dv,
        &dv_acc,
        &mut s_tile,
        kv * m,
        start,
        m,
        1.0f32,
        d_v,
        dvp,
        tiling,
    );
}
