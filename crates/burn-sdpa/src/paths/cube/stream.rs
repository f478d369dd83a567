//! How the rows a kernel streams past its own reach the units: the keys and values for a block
//! of queries (forward, dQ), the queries and dO for a block of keys (dK/dV). They come in pairs,
//! `a` `[.., len, d_k]` and `b` `[.., len, d_v]`, tile by tile: loaded once per plane of
//! [`LANES`] lanes and handed to the other lanes by plane broadcasts (`planes`), or loaded by
//! the cube's units together into shared tiles (see `forward.rs`).

use cubecl::prelude::*;

use super::config::FlashConfig;
use super::steps::{UNITS, chunk_of};

/// Lanes of a plane (subgroup) that share one load when the kernel runs with `planes`: lane `t`
/// loads element `t` of each group of `LANES`, and a plane broadcast hands it to the others.
/// Every plane of at least this many lanes works (lavapipe's are 8 wide with AVX2, GPUs' 32 or 64).
pub(crate) const LANES: usize = 8;

/// The length of one shared tile of rows of `d` floats: one element with plane broadcasts (the
/// kernels do not read it, and CubeCL needs a length), else `tile_rows · d`.
pub(crate) fn tile_len(planes: bool, tile_rows: usize, d: usize) -> usize {
    if planes { 1 } else { tile_rows * d }
}

/// The tiles `[first, end)` of `tile_rows` rows that cover the rows `[lo, hi)`.
#[cube]
pub(crate) fn tile_span(lo: usize, hi: usize, #[comptime] config: FlashConfig) -> (usize, usize) {
    (lo / config.tile_rows, hi.div_ceil(config.tile_rows))
}

/// A stream of row pairs: the shared tiles they pass through (unread with plane broadcasts) and
/// the current pair in registers.
#[derive(CubeType)]
pub(crate) struct RowStream {
    a_tile: Shared<[f32]>,
    b_tile: Shared<[f32]>,
    /// The current row of `a` (`d_k` floats).
    pub a_vals: Array<f32>,
    /// The current row of `b` (`d_v` floats).
    pub b_vals: Array<f32>,
}

#[cube]
impl RowStream {
    /// An empty stream.
    pub fn new(#[comptime] config: FlashConfig) -> RowStream {
        let (d_k, d_v) = comptime!((config.d_k, config.d_v));
        RowStream {
            a_tile: Shared::<[f32]>::new_slice(comptime!(tile_len(
                config.planes,
                config.tile_rows,
                d_k
            ))),
            b_tile: Shared::<[f32]>::new_slice(comptime!(tile_len(
                config.planes,
                config.tile_rows,
                d_v
            ))),
            a_vals: Array::<f32>::new(d_k),
            b_vals: Array::<f32>::new(d_v),
        }
    }

    /// Loads tile `tile_idx` of head row `head` of `a` and `b` (rows of `len`) and waits for the
    /// cube (nothing with plane broadcasts, which need no tile); returns the tile's first row.
    pub fn load<F: Float>(
        &mut self,
        a: &Tensor<F>,
        b: &Tensor<F>,
        head: usize,
        tile_idx: usize,
        len: usize,
        #[comptime] config: FlashConfig,
    ) -> usize {
        let start = tile_idx * config.tile_rows;
        if !config.planes {
            load_tile::<F>(a, &mut self.a_tile, head, start, len, config.d_k, config);
            load_tile::<F>(b, &mut self.b_tile, head, start, len, config.d_v, config);
            sync_cube();
        }
        start
    }

    /// Row `row_idx` (of the flattened `[.., d]` tensors) into `a_vals` and `b_vals`: by plane
    /// broadcasts, or from row `tile_row` of the tiles [`RowStream::load`] filled.
    pub fn fetch<F: Float>(
        &mut self,
        a: &Tensor<F>,
        b: &Tensor<F>,
        row_idx: usize,
        tile_row: usize,
        #[comptime] config: FlashConfig,
    ) {
        let (d_k, d_v) = comptime!((config.d_k, config.d_v));
        if config.planes {
            broadcast_row::<F>(a, &mut self.a_vals, row_idx * d_k, d_k, config.unroll_d);
            broadcast_row::<F>(b, &mut self.b_vals, row_idx * d_v, d_v, config.unroll_d);
        } else {
            copy_row(
                &self.a_tile,
                &mut self.a_vals,
                tile_row * d_k,
                d_k,
                config.unroll_d,
            );
            copy_row(
                &self.b_tile,
                &mut self.b_vals,
                tile_row * d_v,
                d_v,
                config.unroll_d,
            );
        }
    }

    /// Waits for the cube before the next tiles overwrite these (nothing with plane broadcasts).
    pub fn end_tile(&self, #[comptime] config: FlashConfig) {
        if !config.planes {
            sync_cube();
        }
    }
}

/// Loads rows `start..start + tile_rows` of head row `head` of `src` `[.., len, d]` into `tile`
/// (zeros past `len`), the cube's units loading consecutive elements (unit `u` loads elements
/// `u`, `u + UNITS`, ...). Needs `start < len` (the callers' tiles start below their range's
/// end, which is at most `len`).
#[cube]
fn load_tile<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    head: usize,
    start: usize,
    len: usize,
    #[comptime] d: usize,
    #[comptime] config: FlashConfig,
) {
    let tile_len = comptime!(config.tile_rows * d);
    let unit = UNIT_POS_X as usize;
    let base = (head * len + start) * d;
    // Elements of the tile that lie inside `src`'s rows (the rest are zeros).
    let valid = (len - start) * d;
    let loads = comptime!(tile_len.div_ceil(UNITS));
    #[unroll(config.unroll_d)]
    for c in 0..comptime!(loads / chunk_of(loads)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(loads)) {
            let idx = (c * comptime!(chunk_of(loads)) + i) * UNITS + unit;
            if idx < tile_len {
                let mut x = 0.0f32;
                if idx < valid {
                    x = f32::cast_from(src[base + idx]);
                }
                tile[idx] = x;
            }
        }
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
    let groups = comptime!(d / LANES);
    #[unroll(unroll_d)]
    for c in 0..comptime!(groups / chunk_of(groups).min(4)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(groups).min(4)) {
            let group = c * comptime!(chunk_of(groups).min(4)) + i;
            let x = f32::cast_from(src[base + group * LANES + lane]);
            #[unroll]
            for t in 0..LANES {
                vals[group * LANES + t] = plane_broadcast(x, t as u32);
            }
        }
    }
}

/// `vals[dd] = tile[base + dd]` for the `d` elements of a row of a shared tile.
#[cube]
fn copy_row(
    tile: &Shared<[f32]>,
    vals: &mut Array<f32>,
    base: usize,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    #[unroll(unroll_d)]
    for c in 0..comptime!(d / chunk_of(d)) {
        #[unroll]
        for i in 0..comptime!(chunk_of(d)) {
            let dd = c * comptime!(chunk_of(d)) + i;
            vals[dd] = tile[base + dd];
        }
    }
}
