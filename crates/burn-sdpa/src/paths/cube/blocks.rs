//! The two kinds of blocks a cube owns: a block of queries (the forward and dQ kernels), which
//! streams the keys its band can see, and a block of keys (the dK/dV kernel), which streams the
//! queries that can see it.

use cubecl::prelude::*;

use super::config::{FlashConfig, Scalars, Terms};
use super::pair::{Pair, bias_row, read_pair, slope_of};
use super::steps::{Block, UNITS, grid_block};
use super::stream::{RowStream, tile_span};

/// A block of `UNITS · rows` queries of one (batch, head) and what every one of its keys needs.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct QueryBlock {
    /// The grid's block (its row is the (batch·head) row, its rows are queries).
    pub grid: Block,
    /// Queries per head.
    pub n: usize,
    /// Keys per head.
    pub m: usize,
    /// The (batch·kv head) row of the keys and values.
    pub kv: usize,
    /// The head's ALiBi slope (0 without ALiBi).
    pub slope: f32,
    /// The offset of this unit's first row in the bias.
    pub bias_base: usize,
    /// The step in the bias from one of this unit's rows to the next.
    pub bias_step: usize,
    /// The first key a query of the block may see.
    pub key_lo: usize,
    /// One past the last key a query of the block may see.
    pub key_hi: usize,
}

/// The keys `[lo, hi)` that some query with a diagonal in `[first_centre, last_centre]` may see
/// under the causal mask and the window (the tiles outside are skipped).
#[cube]
pub(crate) fn key_range(
    first_centre: i32,
    last_centre: i32,
    m: usize,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
) -> (usize, usize) {
    let mut hi = m as i32;
    if config.causal {
        hi = min(hi, last_centre + 1);
    }
    if config.has_right {
        hi = min(hi, last_centre + scalars.right + 1);
    }
    let mut lo = 0i32;
    if config.has_left {
        lo = max(lo, first_centre - scalars.left);
    }
    hi = max(hi, 0i32);
    lo = min(lo, hi);
    (lo as usize, hi as usize)
}

/// This cube's block of queries of `q` `[b, h, n, d_k]` against `k` `[b, h_kv, m, d_k]` (query
/// head i reads kv head i / group).
#[cube]
pub(crate) fn query_block<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    terms: &Terms,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
) -> QueryBlock {
    let n = q.shape(2);
    let m = k.shape(2);
    let n_heads = q.shape(1);
    let n_kv_heads = k.shape(1);
    let grid = grid_block(q.shape(0), n_heads, config.rows);
    let kv = grid.batch_idx * n_kv_heads + grid.head_idx / (n_heads / n_kv_heads);
    let (bias_base, bias_step) =
        bias_row(terms, grid.batch_idx, grid.head_idx, grid.first, m, config);
    let first_centre = grid.start as i32 + scalars.offset;
    let last_centre = first_centre + comptime!((UNITS * config.rows) as i32) - 1;
    let (key_lo, key_hi) = key_range(first_centre, last_centre, m, scalars, config);
    let slope = slope_of(terms, grid.head_idx, config);
    QueryBlock {
        grid,
        n,
        m,
        kv,
        slope,
        bias_base,
        bias_step: bias_step * UNITS,
        key_lo,
        key_hi,
    }
}

#[cube]
impl QueryBlock {
    /// The query of the unit's row `r`.
    pub fn query(&self, r: usize) -> usize {
        self.grid.first + r * UNITS
    }

    /// Whether the unit's row `r` sees key `key_idx`, what the key adds to its score and whether
    /// it poisons the row (see [`read_pair`]).
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        terms: &Terms,
        scalars: &Scalars,
        r: usize,
        key_idx: usize,
        query_segment: i32,
        key_segment: i32,
        bad_key: bool,
        #[comptime] config: FlashConfig,
    ) -> (bool, f32, bool) {
        let query_idx = self.query(r);
        let pair = Pair {
            query_idx,
            key_idx,
            query_in: query_idx < self.n,
            key_in: true,
            query_segment,
            key_segment,
            slope: self.slope,
            bad_key,
        };
        read_pair(
            terms,
            scalars,
            pair,
            self.bias_base + r * self.bias_step + key_idx,
            config,
        )
    }
}

/// What a kernel over a block of queries does with each key its band lets through: the
/// forward's online softmax, dQ's sums.
#[cube]
pub(crate) trait KeyStep {
    /// Adds key `key_idx`, whose key and value rows are in `keys` (its non-finite flag in
    /// `bad_keys` `[b, h_kv, m]`), to the unit's rows of `block`.
    #[allow(clippy::too_many_arguments)]
    fn add_key(
        &mut self,
        keys: &RowStream,
        key_idx: usize,
        bad_keys: &Tensor<f32>,
        block: &QueryBlock,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
    );
}

/// Streams the keys of `block`'s band through `step`, tile by tile (see `stream.rs`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stream_keys<F: Float, S: KeyStep>(
    step: &mut S,
    k: &Tensor<F>,
    v: &Tensor<F>,
    bad_keys: &Tensor<f32>,
    block: &QueryBlock,
    terms: &Terms,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
) {
    let mut keys = RowStream::new(config);
    let (first_tile, end_tile) = tile_span(block.key_lo, block.key_hi, config);
    for tile_idx in first_tile..end_tile {
        let key_start = keys.load::<F>(k, v, block.kv, tile_idx, block.m, config);
        for key_idx in key_start..min(key_start + config.tile_rows, block.key_hi) {
            let tile_row = key_idx - key_start;
            keys.fetch::<F>(k, v, block.kv * block.m + key_idx, tile_row, config);
            step.add_key(&keys, key_idx, bad_keys, block, terms, scalars, config);
        }
        keys.end_tile(config);
    }
}

/// The queries `[lo, hi)` that may see some key in `[first_key, last_key]` under the causal mask
/// and the window (query i's diagonal is i + `offset`).
#[cube]
pub(crate) fn query_range(
    first_key: i32,
    last_key: i32,
    n: usize,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
) -> (usize, usize) {
    // Key j is visible to query i when j ≤ i + offset (causal), j ≤ i + offset + right and
    // j ≥ i + offset − left.
    let offset = scalars.offset;
    let mut lo = 0i32;
    if config.causal {
        lo = max(lo, first_key - offset);
    }
    if config.has_right {
        lo = max(lo, first_key - offset - scalars.right);
    }
    let mut hi = n as i32;
    if config.has_left {
        hi = min(hi, last_key - offset + scalars.left + 1);
    }
    lo = min(lo, n as i32);
    hi = max(hi, lo);
    (lo as usize, hi as usize)
}
