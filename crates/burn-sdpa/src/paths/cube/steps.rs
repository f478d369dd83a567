//! The steps the three flash kernels are built from: where a cube sits in the grid, which keys
//! (or queries) a block of rows can see, how rows reach the units (shared tiles or plane
//! broadcasts, see `forward.rs`), and the register loops over d, each accumulating into an
//! array indexed by the unit's rows, d outermost, unrolled when [`FlashConfig::unroll_d`].

use cubecl::prelude::*;

use super::config::{FlashConfig, Scalars};

/// Units per cube.
pub(crate) const UNITS: usize = 32;

/// Lanes of a plane (subgroup) that share one load when the kernel runs with `planes`: lane `t`
/// loads element `t` of each group of `LANES`, and a plane broadcast hands it to the others.
/// Every plane of at least this many lanes works (lavapipe's are 8 wide with AVX2, GPUs' 32 or 64).
pub(crate) const LANES: usize = 8;

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
    /// This unit's index in the cube.
    pub unit: usize,
    /// The block's first row.
    pub start: usize,
    /// This unit's first row: `start + unit`.
    pub first: usize,
}

/// The block of this cube over `batch · n_heads` (batch·head) rows: the row is
/// `CUBE_POS_Y + CUBE_POS_Z · CUBE_COUNT_Y` (the grid's second and third axes together, since
/// Vulkan and Metal bound each to 65 535), the block `CUBE_POS_X`.
#[cube]
pub(crate) fn grid_block(batch: usize, n_heads: usize, #[comptime] rows: usize) -> Block {
    let row = CUBE_POS_Y as usize + CUBE_POS_Z as usize * CUBE_COUNT_Y as usize;
    let unit = UNIT_POS_X as usize;
    let start = CUBE_POS_X as usize * comptime!(UNITS * rows);
    Block {
        row,
        batch_idx: row / n_heads,
        head_idx: row % n_heads,
        in_grid: row < batch * n_heads,
        unit,
        start,
        first: start + unit,
    }
}

/// The length of one shared tile of rows of `d` floats: one element with plane broadcasts (the
/// kernels do not read it, and CubeCL needs a length), else `tile_rows · d`.
pub(crate) fn tile_len(planes: bool, tile_rows: usize, d: usize) -> usize {
    if planes { 1 } else { tile_rows * d }
}

/// Loads rows `start..start + tile_rows` of head row `head` of `src` `[.., len, d]` (keys and
/// values of a kv head, or queries and dO of a query head) into `tile` (zeros past `len`), the
/// cube's units loading consecutive elements (unit `u` loads elements `u`, `u + UNITS`, ...).
/// Needs `start < len` (the callers' tiles start below their range's end, which is at most `len`).
#[cube]
fn load_tile<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    head: usize,
    start: usize,
    len: usize,
    unit: usize,
    #[comptime] d: usize,
    #[comptime] config: FlashConfig,
) {
    let tile_len = comptime!(config.tile_rows * d);
    let base = (head * len + start) * d;
    // Elements of the tile that lie inside `src`'s rows (the rest are zeros).
    let valid = (len - start) * d;
    #[unroll(config.unroll_d)]
    for load in 0..comptime!(tile_len.div_ceil(UNITS)) {
        let idx = load * UNITS + unit;
        if idx < tile_len {
            let mut x = 0.0f32;
            if idx < valid {
                x = f32::cast_from(src[base + idx]);
            }
            tile[idx] = x;
        }
    }
}

/// Loads the tiles of rows from `start` of head row `head` of `a` `[.., len, d_k]` and `b`
/// `[.., len, d_v]` and waits for the cube (nothing with plane broadcasts, which need no tile).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_tiles<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    a_tile: &mut Shared<[f32]>,
    b_tile: &mut Shared<[f32]>,
    head: usize,
    start: usize,
    len: usize,
    unit: usize,
    #[comptime] config: FlashConfig,
) {
    if !config.planes {
        load_tile::<F>(a, a_tile, head, start, len, unit, config.d_k, config);
        load_tile::<F>(b, b_tile, head, start, len, unit, config.d_v, config);
        sync_cube();
    }
}

/// Waits for the cube before the next tiles overwrite these (nothing with plane broadcasts).
#[cube]
pub(crate) fn end_tiles(#[comptime] config: FlashConfig) {
    if !config.planes {
        sync_cube();
    }
}

/// `vals[dd] = src[base + dd]` (in f32) for the `d` elements of a row, every element loaded by
/// one lane of the plane and broadcast to the others (`d` a multiple of [`LANES`]; called by the
/// whole plane, in uniform control flow).
#[cube]
fn broadcast_row<F: Float>(
    src: &Tensor<F>,
    vals: &mut Array<f32>,
    base: usize,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    let lane = UNIT_POS_PLANE as usize % LANES;
    #[unroll(unroll_d)]
    for chunk in 0..comptime!(d / LANES) {
        let x = f32::cast_from(src[base + chunk * LANES + lane]);
        #[unroll]
        for t in 0..LANES {
            vals[chunk * LANES + t] = plane_broadcast(x, t as u32);
        }
    }
}

/// `vals[dd] = tile[row · d + dd]` for the `d` elements of a row of a shared tile.
#[cube]
fn tile_row(
    tile: &Shared<[f32]>,
    vals: &mut Array<f32>,
    row: usize,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    #[unroll(unroll_d)]
    for dd in 0..d {
        vals[dd] = tile[row * d + dd];
    }
}

/// Row `idx` of head row `head` of `a` `[.., len, d_k]` and `b` `[.., len, d_v]` into `a_vals`
/// and `b_vals`: by plane broadcasts, or from row `idx − tile_start` of the tiles
/// [`load_tiles`] filled.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fetch_rows<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    a_tile: &Shared<[f32]>,
    b_tile: &Shared<[f32]>,
    a_vals: &mut Array<f32>,
    b_vals: &mut Array<f32>,
    row_idx: usize,
    tile_row_idx: usize,
    #[comptime] config: FlashConfig,
) {
    let (d_k, d_v) = comptime!((config.d_k, config.d_v));
    if config.planes {
        broadcast_row::<F>(a, a_vals, row_idx * d_k, d_k, config.unroll_d);
        broadcast_row::<F>(b, b_vals, row_idx * d_v, d_v, config.unroll_d);
    } else {
        tile_row(a_tile, a_vals, tile_row_idx, d_k, config.unroll_d);
        tile_row(b_tile, b_vals, tile_row_idx, d_v, config.unroll_d);
    }
}

/// `dst[r · d + dd] = src[row_idx · d + dd] · factor` (in f32) for the `d` elements of the
/// unit's row `r`, and zeros when the row is past the end (`!active`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_row<F: Float>(
    src: &Tensor<F>,
    dst: &mut Array<f32>,
    r: usize,
    row_idx: usize,
    active: bool,
    factor: f32,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    #[unroll(unroll_d)]
    for dd in 0..d {
        let mut x = 0.0f32;
        if active {
            x = f32::cast_from(src[row_idx * d + dd]);
        }
        dst[r * d + dd] = x * factor;
    }
}

/// `dst[r · d + dd] = 0` for the `d` elements of the unit's row `r`.
#[cube]
pub(crate) fn zero_row(
    dst: &mut Array<f32>,
    r: usize,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    #[unroll(unroll_d)]
    for dd in 0..d {
        dst[r * d + dd] = 0.0f32;
    }
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
    for dd in 0..d {
        dst[row_idx * d + dd] = F::cast_from(src[r * d + dd] * factor);
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
    for dd in 0..d {
        let x = vals[dd];
        #[unroll]
        for r in 0..config.rows {
            out[r] += rows_data[r * d + dd] * x;
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
    for dd in 0..d {
        let x = vals[dd];
        #[unroll]
        for r in 0..config.rows {
            acc[r * d + dd] += coeffs[r] * x;
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
