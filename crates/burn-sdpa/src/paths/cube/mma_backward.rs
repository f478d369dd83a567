//! The tensor-core backward pass (FlashAttention-2's, as `backward.rs` runs it on the scalar
//! tiles): its four products, dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q, and the recomputed QKᵀ, on
//! CubeCL's matrix instructions (`mma_tile.rs`: half operands, f32 results), the weights
//! recomputed from the forward's log-sum-exp, nothing of size n × m stored, and no atomics.
//!
//! - `flash_backward_dq_mma`: one cube (one plane) per (batch·head, tile of `size` queries);
//!   per tile of keys in the band: S = Q·Kᵀ and dP = dO·Vᵀ on the matrix unit, then each unit
//!   computes its rows' dS = P ∘ (dP − D) (`dq_rows`: [`TileRow::grads`] per pair, the step
//!   both kernels share, with `read_pair` for every mask and term) and writes it in the half
//!   type, then dQ += dS·K on the matrix unit.
//! - `flash_backward_dkdv_mma`: one cube per (batch·kv head, tile of `size` keys); for every
//!   query head of the group and every tile of queries in the band: S and dP as above, each
//!   unit computes P and dS of its query rows (`dkdv_rows`, with the same step per pair; and
//!   the score gradient when the bias wants it), then dV += Pᵀ·dO and dK += dSᵀ·Q on the
//!   matrix unit.
//!
//! dQ, dK and dV stay on the matrix unit (f32 accumulator fragments, `mma_tile::zero_fragments`)
//! until they are written. P and dS enter the products rounded to the half type (as in
//! FlashAttention), everything else is f32: the sums, the weights, D = rowsum(dO ∘ O). The queries
//! are not scaled before the products: S is scaled after, and dQ, dK at the end. Rows past n
//! or m and columns past d_k or d_v are zeros in the tiles and are not written.

use cubecl::prelude::*;

use super::blocks::query_range;
use super::config::{FlashConfig, Scalars, Terms};
use super::mma_rows::{MmaBlock, TileRow, mma_block};
use super::mma_tile::{
    MMA_ALIGN, MmaTiling, add_product_fragments, load_tile, product_abt, write_fragments,
    zero_fragments,
};
use super::pair::slope_of;
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
    let block = mma_block::<F>(q, k, &terms, &scalars, config, tiling);
    if !block.in_grid {
        terminate!();
    }
    let size = comptime!(tiling.size);
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    let (n, m, row, kv, start) = (block.n, block.m, block.row, block.kv, block.start);

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
    sync_cube();

    for tile_idx in block.key_lo / size..block.key_hi.div_ceil(size) {
        let key0 = tile_idx * size;
        load_tile::<F>(&mut k_tile, k, kv * m, key0, m, d_k, dkp, tiling);
        load_tile::<F>(&mut v_tile, v, kv * m, key0, m, d_v, dvp, tiling);
        sync_cube();
        product_abt::<F>(&mut s_tile, &q_tile, &k_tile, dkp, tiling);
        product_abt::<F>(&mut dp_tile, &do_tile, &v_tile, dvp, tiling);
        sync_cube();

        // Each unit's rows: dS of every (query, key) pair of the tile.
        let tiles = (&s_tile, &dp_tile, &mut ds_tile);
        dq_rows::<F>(
            &block, key0, tiles, lse, delta, &terms, &scalars, config, tiling,
        );
        sync_cube();

        // dQ += dS K.
        add_product_fragments::<F>(&dq_acc, &ds_tile, &k_tile, false, dkp, tiling);
        sync_cube();
    }

    let (base, scale) = (row * n, scalars.scale);
    write_fragments::<F>(
        dq,
        &dq_acc,
        &mut s_tile,
        base,
        start,
        n,
        scale,
        d_k,
        dkp,
        tiling,
    );
}

/// dS of the unit's rows of the dQ kernel's tile against the keys from `key0`, from S and dP,
/// into the dS tile in the half type ([`TileRow::grads`] per pair). `tiles`: S, dP, dS.
#[cube]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn dq_rows<F: Float>(
    block: &MmaBlock,
    key0: usize,
    tiles: (&Shared<[f32]>, &Shared<[f32]>, &mut Shared<[F]>),
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    terms: &Terms,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
) {
    let (s_tile, dp_tile, ds_tile) = tiles;
    let size = comptime!(tiling.size);
    let unit = UNIT_POS_X as usize;
    #[unroll]
    for r in 0..config.rows {
        let t = unit + r * tiling.lanes;
        if t < size {
            let at = block.tile_row(terms, t, config);
            let row_idx = block.row * block.n + block.start + t;
            #[unroll]
            for j in 0..size {
                let (s, dp) = (s_tile[t * size + j], dp_tile[t * size + j]);
                let key_idx = key0 + j;
                let (_, _, _, ds) = at.grads(
                    terms, scalars, key_idx, block.m, s, dp, lse, delta, row_idx, config,
                );
                ds_tile[t * size + j] = F::cast_from(ds);
            }
        }
    }
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
    let block = kv_block::<F>(q, k, &scalars, config, tiling);
    if !block.in_grid {
        terminate!();
    }
    let size = comptime!(tiling.size);
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    let (n, m, kv, start) = (block.n, block.m, block.kv, block.start);

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

    for g in 0..block.group {
        let head_idx = block.kv_head_idx * block.group + g;
        let row = block.batch_idx * block.n_heads + head_idx;
        for tile_idx in block.query_lo / size..block.query_hi.div_ceil(size) {
            let query0 = tile_idx * size;
            load_tile::<F>(&mut q_tile, q, row * n, query0, n, d_k, dkp, tiling);
            load_tile::<F>(&mut do_tile, d_out, row * n, query0, n, d_v, dvp, tiling);
            sync_cube();
            // S[t][j] = q_(query0 + t) · k_(start + j), dP likewise with dO and V.
            product_abt::<F>(&mut s_tile, &q_tile, &k_tile, dkp, tiling);
            product_abt::<F>(&mut dp_tile, &do_tile, &v_tile, dvp, tiling);
            sync_cube();

            // Each unit's rows: P and dS of every (query, key) pair of the tile, and the score
            // gradient where the bias wants it.
            let tiles = (&s_tile, &dp_tile, &mut p_tile, &mut ds_tile);
            let at = (head_idx, query0);
            dkdv_rows::<F>(
                &block, at, tiles, d_scores, lse, delta, &terms, &scalars, config, tiling,
            );
            sync_cube();

            // dV += Pᵀ dO, dK += dSᵀ Q.
            add_product_fragments::<F>(&dv_acc, &p_tile, &do_tile, true, dvp, tiling);
            add_product_fragments::<F>(&dk_acc, &ds_tile, &q_tile, true, dkp, tiling);
            sync_cube();
        }
    }

    let accs = (&dk_acc, &dv_acc);
    write_dkdv::<F>(
        dk,
        dv,
        accs,
        &mut s_tile,
        &block,
        scalars.scale,
        config,
        tiling,
    );
}

/// A cube of the dK/dV kernel: grid row `kv` = (batch `batch_idx`, kv head `kv_head_idx`),
/// whose `group` query heads read it, its `size` keys from `start`, and the queries
/// `query_lo..query_hi` that can see any of them.
#[derive(CubeType, Clone, Copy)]
struct KvBlock {
    in_grid: bool,
    n: usize,
    m: usize,
    n_heads: usize,
    group: usize,
    kv: usize,
    batch_idx: usize,
    kv_head_idx: usize,
    start: usize,
    query_lo: usize,
    query_hi: usize,
}

/// Where this cube of the dK/dV kernel stands (see [`KvBlock`]).
#[cube]
fn kv_block<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
) -> KvBlock {
    let (n, m) = (q.shape(2), k.shape(2));
    let (n_heads, n_kv_heads) = (q.shape(1), k.shape(1));
    // The grid's rows are (batch·kv head) rows, its tiles tiles of keys.
    let kv = grid_row();
    let start = CUBE_POS_X as usize * tiling.size;
    let last = (start + tiling.size) as i32 - 1;
    let (query_lo, query_hi) = query_range(start as i32, last, n, scalars, config);
    KvBlock {
        in_grid: kv < q.shape(0) * n_kv_heads,
        n,
        m,
        n_heads,
        group: n_heads / n_kv_heads,
        kv,
        batch_idx: kv / n_kv_heads,
        kv_head_idx: kv % n_kv_heads,
        start,
        query_lo,
        query_hi,
    }
}

/// P and dS of the unit's rows of the dK/dV kernel's tile of queries from `query0` of head
/// `head_idx` (`at`) against the cube's keys, from S and dP, into the P and dS tiles in the
/// half type ([`TileRow::grads`] per pair), and with `write_scores` the score gradient of every
/// visible pair into `d_scores`. `tiles`: S, dP, P, dS.
#[cube]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn dkdv_rows<F: Float>(
    block: &KvBlock,
    at: (usize, usize),
    tiles: (
        &Shared<[f32]>,
        &Shared<[f32]>,
        &mut Shared<[F]>,
        &mut Shared<[F]>,
    ),
    d_scores: &mut Tensor<f32>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    terms: &Terms,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
) {
    let (head_idx, query0) = at;
    let (s_tile, dp_tile, p_tile, ds_tile) = tiles;
    let size = comptime!(tiling.size);
    let (n, m, batch_idx) = (block.n, block.m, block.batch_idx);
    let unit = UNIT_POS_X as usize;
    let row = batch_idx * block.n_heads + head_idx;
    let slope = slope_of(terms, head_idx, config);
    #[unroll]
    for r in 0..config.rows {
        let t = unit + r * tiling.lanes;
        if t < size {
            let query = TileRow::at(terms, batch_idx, head_idx, query0 + t, n, m, slope, config);
            let row_idx = row * n + query0 + t;
            #[unroll]
            for j in 0..size {
                let key_idx = block.start + j;
                let (s, dp) = (s_tile[t * size + j], dp_tile[t * size + j]);
                let (visible, p, ds_bias, ds) = query.grads(
                    terms, scalars, key_idx, m, s, dp, lse, delta, row_idx, config,
                );
                if config.write_scores && visible {
                    d_scores[row_idx * m + key_idx] = ds_bias;
                }
                p_tile[t * size + j] = F::cast_from(p);
                ds_tile[t * size + j] = F::cast_from(ds);
            }
        }
    }
}

/// dK (times `scale`) and dV of the cube's keys from their accumulators, staged through
/// `stage` ([`write_fragments`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_dkdv<F: Float>(
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    accs: (&Sequence<cmma::Matrix<f32>>, &Sequence<cmma::Matrix<f32>>),
    stage: &mut Shared<[f32]>,
    block: &KvBlock,
    scale: f32,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
) {
    let (dk_acc, dv_acc) = accs;
    let (base, start, m) = (block.kv * block.m, block.start, block.m);
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    write_fragments::<F>(dk, dk_acc, stage, base, start, m, scale, d_k, dkp, tiling);
    write_fragments::<F>(dv, dv_acc, stage, base, start, m, 1.0f32, d_v, dvp, tiling);
}
