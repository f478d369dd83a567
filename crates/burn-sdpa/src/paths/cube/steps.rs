//! The steps the three flash kernels are built from: where a cube sits in the grid and which
//! rows its unit owns, and the register loops over d, each accumulating into an array indexed by
//! the unit's rows, d outermost, unrolled when [`FlashConfig::unroll_d`] (how the streamed rows
//! reach the units: `stream.rs`).

use cubecl::prelude::*;

use super::config::{FlashConfig, Scalars};

/// Units per cube.
pub(crate) const UNITS: usize = 32;

/// The most elements one iteration of a loop over d handles when the loop is not unrolled whole
/// (its iterations are unrolled): Mesa's llvmpipe (lavapipe) ends every loop of a shader
/// invocation silently after 65 535 iterations in all (`LP_MAX_TGSI_LOOP_ITERATIONS`, shared by
/// every loop), so a loop per element of d made a unit stop early, and write stale memory, past
/// about 65 535 / (2 · (d_k + d_v)) keys (`tile.rs` bounds what is left).
pub(crate) const CHUNK: usize = 32;

/// The elements one iteration of a loop over `len` elements handles: the largest power of two up
/// to [`CHUNK`] that divides `len` (so no iteration runs past the end).
pub(crate) const fn chunk_of(len: usize) -> usize {
    let zeros = len.trailing_zeros();
    if zeros < CHUNK.trailing_zeros() {
        1 << zeros
    } else {
        CHUNK
    }
}

/// Where one cube sits: its (batch, head) row of the grid and its block of `UNITS · rows` rows
/// (queries, or keys for dK/dV), of which this unit owns `first`, `first + UNITS`, ...
#[derive(CubeType, Clone, Copy)]
pub(crate) struct Block {
    /// The (batch·head) row: `batch_idx · n_heads + head_idx`.
    pub row: usize,
    /// The batch.
    pub batch_idx: usize,
    /// The head, among the `n_heads` the grid was launched over.
    pub head_idx: usize,
    /// Whether the row is one of the grid's (the last layer of the grid may be partly empty).
    pub in_grid: bool,
    /// The block's first row.
    pub start: usize,
    /// This unit's first row: `start + unit`.
    pub first: usize,
}

/// This cube's (batch·head) row: `CUBE_POS_Y + CUBE_POS_Z · CUBE_COUNT_Y` (the grid's second
/// and third axes together, since Vulkan and Metal bound each to 65 535).
#[cube]
pub(crate) fn grid_row() -> usize {
    CUBE_POS_Y as usize + CUBE_POS_Z as usize * CUBE_COUNT_Y as usize
}

/// The block of this cube over `batch · n_heads` (batch·head) rows: the row is [`grid_row`],
/// the block `CUBE_POS_X`.
#[cube]
pub(crate) fn grid_block(batch: usize, n_heads: usize, #[comptime] rows: usize) -> Block {
    let row = grid_row();
    let unit = UNIT_POS_X as usize;
    let start = CUBE_POS_X as usize * comptime!(UNITS * rows);
    Block {
        row,
        batch_idx: row / n_heads,
        head_idx: row % n_heads,
        in_grid: row < batch * n_heads,
        start,
        first: start + unit,
    }
}

#[cube]
impl Block {
    /// The unit's row `r` of rows of `len` per (batch·head) row: its index `first + r · UNITS`,
    /// its row in the flattened `[.., len]` tensors, and whether it is one of the `len`.
    pub fn own(&self, r: usize, len: usize) -> (usize, usize, bool) {
        let idx = self.first + r * UNITS;
        (idx, self.row * len + idx, idx < len)
    }
}

/// The unit's rows of `src` `[.., len, d]` (see [`Block::own`]) times `factor`, in f32:
/// `[r · d + dd]`, zeros for a row past the end.
#[cube]
pub(crate) fn load_rows<F: Float>(
    src: &Tensor<F>,
    block: &Block,
    len: usize,
    factor: f32,
    #[comptime] d: usize,
    #[comptime] config: FlashConfig,
) -> Array<f32> {
    let mut rows = Array::<f32>::new(comptime!(config.rows * d));
    #[unroll]
    for r in 0..config.rows {
        let (_, row_idx, active) = block.own(r, len);
        #[unroll(config.unroll_d)]
        for c in 0..comptime!(d / chunk_of(d)) {
            #[unroll]
            for i in 0..comptime!(chunk_of(d)) {
                let dd = c * comptime!(chunk_of(d)) + i;
                let mut x = 0.0f32;
                if active {
                    x = f32::cast_from(src[row_idx * d + dd]);
                }
                rows[r * d + dd] = x * factor;
            }
        }
    }
    rows
}

/// The value of each of the unit's rows in `src` `[.., len]` (0 for a row past the end).
#[cube]
pub(crate) fn load_values(
    src: &Tensor<f32>,
    block: &Block,
    len: usize,
    #[comptime] config: FlashConfig,
) -> Array<f32> {
    let mut values = Array::<f32>::new(config.rows);
    #[unroll]
    for r in 0..config.rows {
        let (_, row_idx, active) = block.own(r, len);
        let mut x = 0.0f32;
        if active {
            x = src[row_idx];
        }
        values[r] = x;
    }
    values
}

/// Accumulators for the unit's rows of `d` floats (`[r · d + dd]`), all `value`.
#[cube]
pub(crate) fn filled_rows(
    value: f32,
    #[comptime] d: usize,
    #[comptime] config: FlashConfig,
) -> Array<f32> {
    let mut rows = Array::<f32>::new(comptime!(config.rows * d));
    #[unroll(config.unroll_d)]
    for c in 0..comptime!(config.rows * d / chunk_of(config.rows * d)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(config.rows * d)) {
            rows[c * comptime!(chunk_of(config.rows * d)) + i] = value;
        }
    }
    rows
}

/// One f32 per row of the unit, unset (a step's scratch).
#[cube]
pub(crate) fn per_row(#[comptime] config: FlashConfig) -> Array<f32> {
    Array::<f32>::new(config.rows)
}

/// `dst[row_idx · d + dd] = src[r · d + dd] · factor` (rounded to `F`) for the unit's row `r`.
#[cube]
pub(crate) fn store_row<F: Float>(
    dst: &mut Tensor<F>,
    src: &Array<f32>,
    r: usize,
    row_idx: usize,
    factor: f32,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    #[unroll(unroll_d)]
    for c in 0..comptime!(d / chunk_of(d)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(d)) {
            let dd = c * comptime!(chunk_of(d)) + i;
            dst[row_idx * d + dd] = F::cast_from(src[r * d + dd] * factor);
        }
    }
}

/// `out[r] = Σ_dd rows[r · d + dd] · vals[dd]` for the unit's rows: one read of `vals` per
/// element, `rows` multiply-adds.
#[cube]
pub(crate) fn dot_rows(
    out: &mut Array<f32>,
    rows_data: &Array<f32>,
    vals: &Array<f32>,
    #[comptime] d: usize,
    #[comptime] config: FlashConfig,
) {
    #[unroll]
    for r in 0..config.rows {
        out[r] = 0.0f32;
    }
    #[unroll(config.unroll_d)]
    for c in 0..comptime!(d / chunk_of(d)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(d)) {
            let dd = c * comptime!(chunk_of(d)) + i;
            let x = vals[dd];
            #[unroll]
            for r in 0..config.rows {
                out[r] += rows_data[r * d + dd] * x;
            }
        }
    }
}

/// `acc[r · d + dd] += coeffs[r] · vals[dd]` for the unit's rows.
#[cube]
pub(crate) fn add_outer(
    acc: &mut Array<f32>,
    coeffs: &Array<f32>,
    vals: &Array<f32>,
    #[comptime] d: usize,
    #[comptime] config: FlashConfig,
) {
    #[unroll(config.unroll_d)]
    for c in 0..comptime!(d / chunk_of(d)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(d)) {
            let dd = c * comptime!(chunk_of(d)) + i;
            let x = vals[dd];
            #[unroll]
            for r in 0..config.rows {
                acc[r * d + dd] += coeffs[r] * x;
            }
        }
    }
}

/// The soft-capped score `c · tanh(s / c)` and its derivative in `s` (`s` and 1 uncapped).
#[cube]
pub(crate) fn soft_cap(s: f32, scalars: &Scalars, #[comptime] config: FlashConfig) -> (f32, f32) {
    let mut capped = s;
    let mut grad = 1.0f32;
    if config.capped {
        let t = (s / scalars.softcap).tanh();
        capped = scalars.softcap * t;
        grad = 1.0f32 - t * t;
    }
    (capped, grad)
}
