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
//! The tiles and the products are `mma_tile.rs`'s, the rows' work between them
//! `mma_rows.rs`'s ([`MmaRows`]); the backward pass on the matrix unit is `mma_backward.rs`,
//! from the log-sum-exp this pass writes.

use cubecl::prelude::*;

use super::config::{FlashConfig, Scalars, Terms};
use super::mma_rows::{MmaRows, mma_block};
use super::mma_tile::{MMA_ALIGN, MmaTiling, add_product, load_tile, product_abt, zero_tile};

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
    let block = mma_block::<F>(q, k, &terms, &scalars, config, tiling);
    if !block.in_grid {
        terminate!();
    }
    let size = comptime!(tiling.size);
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    let (dkp, dvp) = comptime!((tiling.d_k_pad, tiling.d_v_pad));
    let (n, m, row, kv) = (block.n, block.m, block.row, block.kv);

    let mut q_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dkp), MMA_ALIGN);
    let mut k_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dkp), MMA_ALIGN);
    let mut v_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * dvp), MMA_ALIGN);
    let mut s_tile = Shared::<[f32]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut p_tile = Shared::<[F]>::new_aligned_slice(comptime!(size * size), MMA_ALIGN);
    let mut o_tile = Shared::<[f32]>::new_aligned_slice(comptime!(size * dvp), MMA_ALIGN);
    load_tile::<F>(&mut q_tile, q, row * n, block.start, n, d_k, dkp, tiling);
    zero_tile(&mut o_tile, dvp, tiling);
    let mut own = MmaRows::new(&terms, bad_queries, &block, config, tiling);
    sync_cube();

    for tile_idx in block.key_lo / size..block.key_hi.div_ceil(size) {
        let key0 = tile_idx * size;
        load_tile::<F>(&mut k_tile, k, kv * m, key0, m, d_k, dkp, tiling);
        load_tile::<F>(&mut v_tile, v, kv * m, key0, m, d_v, dvp, tiling);
        sync_cube();

        // S = Q Kᵀ.
        product_abt::<F>(&mut s_tile, &q_tile, &k_tile, dkp, tiling);
        sync_cube();

        // Each unit's rows: the online softmax over the tile's keys, the weights P, the output
        // rows rescaled.
        own.add_tile::<F>(
            key0,
            &block,
            &mut s_tile,
            &mut p_tile,
            &mut o_tile,
            bad_keys,
            &terms,
            &scalars,
            config,
            tiling,
        );
        sync_cube();

        // O += P V.
        add_product::<F>(&mut o_tile, &p_tile, &v_tile, false, dvp, tiling);
        sync_cube();
    }

    own.write::<F>(context, lse, stats, &o_tile, &block, config, tiling);
}
