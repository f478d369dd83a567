//! The tensor-core kernels' work between their products, row by row: one cube owns a tile of
//! `size` queries (or keys) of one (batch, head), and unit `u` the tile's rows `t = u + r · lanes`.
//!
//! - [`MmaBlock`]: where a cube of the forward or the dQ kernel stands (its (batch, head) row,
//!   its tile of queries, the band of keys they see), the prologue both kernels share.
//! - [`TileRow`]: one query row of a tile, and the step both kernels run per (query, key)
//!   pair: [`TileRow::read`] ([`read_pair`]'s band, window, segments, bias, masks, ALiBi and
//!   non-finite policy), and in the backward [`TileRow::grads`] (P, the bias's score gradient
//!   and dS, as the scalar kernels compute them).
//! - [`MmaRows`]: the forward's rows, their online softmax over a tile of keys (key by key, as
//!   the scalar kernel runs it), and what they write at the end.

use cubecl::prelude::*;

use super::backward::score_grads;
use super::blocks::key_range;
use super::config::{FlashConfig, HIDDEN, NO_KEY, POISONED, Scalars, Terms};
use super::forward::sink_start;
use super::mma_tile::MmaTiling;
use super::pair::{Pair, bias_row, read_pair, segment_of, slope_of};
use super::row_stats::{ROW_STATS, StatsAcc};
use super::steps::{grid_row, soft_cap};

/// A cube of the forward or the dQ kernel: grid row `row` = (batch `batch_idx`, head
/// `head_idx`) reading kv row `kv`, its `size` queries from `start`, the keys
/// `key_lo..key_hi` its band can see, and the head's ALiBi slope.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct MmaBlock {
    /// Whether the cube's grid row is one of the b · h (a cube past them does nothing).
    pub in_grid: bool,
    /// Queries.
    pub n: usize,
    /// Keys.
    pub m: usize,
    /// Query heads.
    pub n_heads: usize,
    /// The (batch, head) row: `batch_idx · n_heads + head_idx`.
    pub row: usize,
    /// The batch.
    pub batch_idx: usize,
    /// The query head.
    pub head_idx: usize,
    /// The (batch, kv head) row the head reads.
    pub kv: usize,
    /// The tile's first query.
    pub start: usize,
    /// The first key any of the tile's queries sees.
    pub key_lo: usize,
    /// One past the last.
    pub key_hi: usize,
    /// The head's ALiBi slope (0 without ALiBi).
    pub slope: f32,
}

/// Where this cube stands (see [`MmaBlock`]).
#[cube]
pub(crate) fn mma_block<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    terms: &Terms,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
    #[comptime] tiling: MmaTiling,
) -> MmaBlock {
    let (n, m) = (q.shape(2), k.shape(2));
    let (n_heads, n_kv_heads) = (q.shape(1), k.shape(1));
    let row = grid_row();
    let (batch_idx, head_idx) = (row / n_heads, row % n_heads);
    let start = CUBE_POS_X as usize * tiling.size;
    let first_centre = start as i32 + scalars.offset;
    let (key_lo, key_hi) = key_range(
        first_centre,
        first_centre + comptime!(tiling.size as i32) - 1,
        m,
        scalars,
        config,
    );
    MmaBlock {
        in_grid: row < q.shape(0) * n_heads,
        n,
        m,
        n_heads,
        row,
        batch_idx,
        head_idx,
        kv: batch_idx * n_kv_heads + head_idx / (n_heads / n_kv_heads),
        start,
        key_lo,
        key_hi,
        slope: slope_of(terms, head_idx, config),
    }
}

#[cube]
impl MmaBlock {
    /// Row `t` of the cube's tile of queries.
    pub fn tile_row(&self, terms: &Terms, t: usize, #[comptime] config: FlashConfig) -> TileRow {
        TileRow::at(
            terms,
            self.batch_idx,
            self.head_idx,
            self.start + t,
            self.n,
            self.m,
            self.slope,
            config,
        )
    }
}

/// One query row of a tile: the query, whether it is one of the `n`, its segment, its row of
/// the bias, and the head's ALiBi slope.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct TileRow {
    /// The batch.
    pub batch_idx: usize,
    /// The query's index.
    pub query_idx: usize,
    /// Whether the query is one of the `n` (a tile's row past the end is not).
    pub query_in: bool,
    /// The query's segment (0 without segments).
    pub segment: i32,
    /// The offset of the query's row in the bias (0 without a bias).
    pub bias_base: usize,
    /// The head's ALiBi slope (0 without ALiBi).
    pub slope: f32,
}

#[cube]
impl TileRow {
    /// Query `query_idx` of (batch `batch_idx`, head `head_idx`), among `n` queries and `m`
    /// keys.
    #[allow(clippy::too_many_arguments)]
    pub fn at(
        terms: &Terms,
        batch_idx: usize,
        head_idx: usize,
        query_idx: usize,
        n: usize,
        m: usize,
        slope: f32,
        #[comptime] config: FlashConfig,
    ) -> TileRow {
        let (bias_base, _) = bias_row(terms, batch_idx, head_idx, query_idx, m, config);
        TileRow {
            batch_idx,
            query_idx,
            query_in: query_idx < n,
            segment: segment_of(&terms.q_segments, batch_idx, query_idx, n, config),
            bias_base,
            slope,
        }
    }

    /// Key `key_idx` (of `m`; `bad_key` when its row held a non-finite value) as the row
    /// reads it: whether it is visible, what the bias and ALiBi add, and whether it poisons
    /// the row ([`read_pair`]).
    pub fn read(
        &self,
        terms: &Terms,
        scalars: &Scalars,
        key_idx: usize,
        m: usize,
        bad_key: bool,
        #[comptime] config: FlashConfig,
    ) -> (bool, f32, bool) {
        let pair = Pair {
            query_idx: self.query_idx,
            key_idx,
            query_in: self.query_in,
            key_in: key_idx < m,
            query_segment: self.segment,
            key_segment: segment_of(&terms.k_segments, self.batch_idx, key_idx, m, config),
            slope: self.slope,
            bad_key,
        };
        read_pair(terms, scalars, pair, self.bias_base + key_idx, config)
    }

    /// The backward's step per (query, key) pair, in both tensor-core kernels: whether key
    /// `key_idx` is visible, its weight P, the bias's score gradient and dS
    /// ([`score_grads`]), from `score` = q·k as the product left it (unscaled), `d_prob` = dO·v,
    /// and the row's log-sum-exp and D = rowsum(dO ∘ O), read at `row_idx` of `lse` and
    /// `delta` (0 for a row past the `n`).
    #[allow(clippy::too_many_arguments)]
    pub fn grads(
        &self,
        terms: &Terms,
        scalars: &Scalars,
        key_idx: usize,
        m: usize,
        score: f32,
        d_prob: f32,
        lse: &Tensor<f32>,
        delta: &Tensor<f32>,
        row_idx: usize,
        #[comptime] config: FlashConfig,
    ) -> (bool, f32, f32, f32) {
        let mut row_lse = 0.0f32;
        let mut row_delta = 0.0f32;
        if self.query_in {
            row_lse = lse[row_idx];
            row_delta = delta[row_idx];
        }
        let (visible, added, _) = self.read(terms, scalars, key_idx, m, false, config);
        let (p, ds_bias, ds) = score_grads(
            score * scalars.scale,
            added,
            visible,
            row_lse,
            d_prob,
            row_delta,
            scalars,
            config,
        );
        (visible, p, ds_bias, ds)
    }
}

/// The forward kernel's rows of one unit: per row the running max and sum, whether it is
/// poisoned (1, by its own query or by a key it sees), and its statistics.
#[derive(CubeType)]
pub(crate) struct MmaRows {
    max: Array<f32>,
    sum: Array<f32>,
    poisoned: Array<f32>,
    stats: StatsAcc,
}

#[cube]
impl MmaRows {
    /// The unit's rows of `block` before any key: the running max and sum at the sink's
    /// ([`sink_start`]), the rows whose query held a non-finite value poisoned.
    pub fn new(
        terms: &Terms,
        bad_queries: &Tensor<f32>,
        block: &MmaBlock,
        #[comptime] config: FlashConfig,
        #[comptime] tiling: MmaTiling,
    ) -> MmaRows {
        let (start_max, start_sum) = sink_start(terms, block.n_heads, block.head_idx, config);
        let mut rows = MmaRows {
            max: Array::<f32>::new(config.rows),
            sum: Array::<f32>::new(config.rows),
            poisoned: Array::<f32>::new(config.rows),
            stats: StatsAcc::new(config),
        };
        let unit = UNIT_POS_X as usize;
        #[unroll]
        for r in 0..config.rows {
            let t = unit + r * tiling.lanes;
            let query_idx = block.start + t;
            rows.max[r] = start_max;
            rows.sum[r] = start_sum;
            let mut bad = 0.0f32;
            if query_idx < block.n && t < tiling.size {
                bad = bad_queries[block.row * block.n + query_idx];
            }
            rows.poisoned[r] = bad;
        }
        rows
    }

    /// The unit's rows over the tile's keys from `key0` ([`MmaRows::add_row`] for each).
    #[allow(clippy::too_many_arguments)]
    pub fn add_tile<F: Float>(
        &mut self,
        key0: usize,
        block: &MmaBlock,
        s_tile: &mut Shared<[f32]>,
        p_tile: &mut Shared<[F]>,
        o_tile: &mut Shared<[f32]>,
        bad_keys: &Tensor<f32>,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
        #[comptime] tiling: MmaTiling,
    ) {
        let unit = UNIT_POS_X as usize;
        #[unroll]
        for r in 0..config.rows {
            let t = unit + r * tiling.lanes;
            if t < tiling.size {
                let at = block.tile_row(terms, t, config);
                self.add_row::<F>(
                    r, t, at, key0, block, s_tile, p_tile, o_tile, bad_keys, terms, scalars,
                    config, tiling,
                );
            }
        }
    }

    /// Row `r` (tile row `t`, query `at`) over the tile's keys from `key0`: its online softmax
    /// key by key, as the scalar kernel runs it, from the scores QKᵀ left in `s_tile`; then its
    /// weights exp(s − max) against the tile's final max into `p_tile` (in the half type), and
    /// its row of the output `o_tile` rescaled to that max.
    #[allow(clippy::too_many_arguments)]
    fn add_row<F: Float>(
        &mut self,
        r: usize,
        t: usize,
        at: TileRow,
        key0: usize,
        block: &MmaBlock,
        s_tile: &mut Shared<[f32]>,
        p_tile: &mut Shared<[F]>,
        o_tile: &mut Shared<[f32]>,
        bad_keys: &Tensor<f32>,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
        #[comptime] tiling: MmaTiling,
    ) {
        let size = comptime!(tiling.size);
        let max_before = self.max[r];
        // Which of the tile's keys the row sees (1) or not (0).
        let mut seen = Array::<f32>::new(size);
        #[unroll]
        for j in 0..size {
            let key_idx = key0 + j;
            let mut bad_key = false;
            if key_idx < block.m {
                bad_key = bad_keys[block.kv * block.m + key_idx] > 0.5f32;
            }
            let (visible, added, poison) =
                at.read(terms, scalars, key_idx, block.m, bad_key, config);
            if poison {
                self.poisoned[r] = 1.0f32;
            }
            let mut s = <f32 as Float>::new(HIDDEN);
            seen[j] = 0.0f32;
            if visible {
                seen[j] = 1.0f32;
                // The bias is added after the soft-cap, as on every path.
                let (capped, _) = soft_cap(s_tile[t * size + j] * scalars.scale, scalars, config);
                s = capped + added;
                let old_max = self.max[r];
                let new_max = f32::max(old_max, s);
                let correction = (old_max - new_max).exp();
                let p = (s - new_max).exp();
                if config.has_stats {
                    self.stats.add(r, s, p, correction, old_max, new_max);
                }
                self.sum[r] = self.sum[r] * correction + p;
                self.max[r] = new_max;
            }
            s_tile[t * size + j] = s;
        }
        let row_max = self.max[r];
        #[unroll]
        for j in 0..size {
            let mut p = 0.0f32;
            if seen[j] > 0.5f32 {
                p = (s_tile[t * size + j] - row_max).exp();
            }
            p_tile[t * size + j] = F::cast_from(p);
        }
        let alpha = (max_before - row_max).exp();
        for dd in 0..tiling.d_v_pad {
            o_tile[t * tiling.d_v_pad + dd] *= alpha;
        }
    }

    /// Writes every row of the unit that is one of the `n`, as the scalar kernel's
    /// `OnlineRows::write` does: its context (`o_tile`'s row over the sum), its log-sum-exp or
    /// [`POISONED`], a zero row and [`NO_KEY`] when it saw no key, and its statistics.
    #[allow(clippy::too_many_arguments)]
    pub fn write<F: Float>(
        &self,
        context: &mut Tensor<F>,
        lse: &mut Tensor<f32>,
        stats: &mut Tensor<f32>,
        o_tile: &Shared<[f32]>,
        block: &MmaBlock,
        #[comptime] config: FlashConfig,
        #[comptime] tiling: MmaTiling,
    ) {
        let unit = UNIT_POS_X as usize;
        let (d_v, dvp) = comptime!((config.d_v, tiling.d_v_pad));
        #[unroll]
        for r in 0..config.rows {
            let t = unit + r * tiling.lanes;
            let query_idx = block.start + t;
            if t < tiling.size && query_idx < block.n {
                let row_idx = block.row * block.n + query_idx;
                let (row_max, row_sum) = (self.max[r], self.sum[r]);
                if config.has_stats {
                    self.stats
                        .write(stats, row_idx * ROW_STATS, r, row_max, row_sum);
                }
                let mut factor = 0.0f32;
                let mut row_lse = <f32 as Float>::new(NO_KEY);
                if row_sum > 0.0f32 {
                    factor = 1.0f32 / row_sum;
                    row_lse = row_max + row_sum.ln();
                    if self.poisoned[r] > 0.5f32 {
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
}
