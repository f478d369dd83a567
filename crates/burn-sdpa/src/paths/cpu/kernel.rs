//! A query-blocked flash-attention kernel on `f32` host slices: the forward pass of
//! [`Implementation::CpuKernel`](crate::Implementation::CpuKernel), which also writes the per-row
//! log-sum-exp that its backward pass (`backward.rs`) recomputes the weights from.
//!
//! Burn's Flex kernel runs one `[n, 64]` score tile per step over all n queries of a head and
//! exponentiates with the scalar `f32::exp`. This kernel differs in three ways (how much each
//! gains is measured by `sdpa bench`; the figures are in the README):
//!
//! - **Query blocks.** Each task is one (batch, head, block of [`QUERY_BLOCK`] queries), so the
//!   score tile `[QUERY_BLOCK, KEY_BLOCK]`, the accumulator `[QUERY_BLOCK, d_v]` and the
//!   key/value tiles stay in L2, and there are b·h·⌈n / QUERY_BLOCK⌉ tasks for the thread pool.
//!   ([`attention_f32_tiled`] takes other tile sizes.)
//! - **A vectorized softmax.** The running max, `exp`, row sum and rescale are branch-free loops
//!   over the tile, compiled for AVX-512 and AVX2+FMA and chosen at run time (a portable build
//!   otherwise); `exp` is a degree-6 polynomial after range reduction (relative error < 5e-7, tested).
//! - **Tiles skipped.** Key tiles entirely above the causal diagonal, outside the window or
//!   entirely masked (a padded tail) are never computed; tiles with nothing masked are never
//!   masked.
//!
//! # Semantics
//! Those of the naive path: scale applied to QKᵀ, then the soft-cap `c · tanh(s / c)` when set,
//! then the bias added, then the mask (a `true` or a −∞ bias hides a key), causal masking with an
//! explicit offset (key `j` is visible to query `i` when `j <= i + offset`), a local window, grouped-query heads (query head `i` reads kv head `i / (h / h_kv)`),
//! and a zero output row (log-sum-exp +∞) for a query with no visible key.

use std::ops::Range;

use burn::tensor::bf16;

use super::element::Element;
use super::masking::Masking;
use super::scratch::Scratch;
use super::shape::check_len;
use super::shape::{KernelShape, Tiles};
use super::simd;
use super::stats_scratch::{Hidden, ROW_STATS, finish_rows, update_row};
use super::tile::View;
use crate::error::AttentionError;
use crate::types::AttentionDims;

/// Computes `out = softmax(q kᵀ · scale + causal) v` (see the module docs) with the tiles of
/// [`Tiles::for_keys`] and no mask or bias.
///
/// # Panics
/// When the slice lengths do not match `shape` or `n_heads` is not a multiple of `n_kv_heads`
/// (see [`try_attention_f32_tiled`] for the typed error).
pub fn attention_f32(shape: &KernelShape, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    attention_f32_tiled(shape, Tiles::for_keys(shape.dims.m), q, k, v, out)
}

/// [`attention_f32`] with explicit tile sizes (for tuning: `cargo run --release --example
/// cpu_kernel_tiles`).
///
/// # Panics
/// With the message of [`try_attention_f32_tiled`]'s error.
pub fn attention_f32_tiled(
    shape: &KernelShape,
    tiles: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) {
    try_attention_f32_tiled(shape, tiles, q, k, v, out).unwrap_or_else(|e| panic!("{e}"))
}

/// [`attention_f32_tiled`], or an [`AttentionError`] naming the slice, head grouping or tile size
/// that does not fit `shape` (nothing is written then).
pub fn try_attention_f32_tiled(
    shape: &KernelShape,
    tiles: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<(), AttentionError> {
    try_forward(shape, tiles, &Masking::default(), q, k, v, out, None)
}

/// The forward pass with a mask and bias: writes `out` and, when given, the log-sum-exp of every
/// query row `lse: [batch, n_heads, n]` (+∞ for a row with no visible key), or returns an
/// [`AttentionError`] naming what does not fit (nothing is written then).
#[allow(clippy::too_many_arguments)]
pub fn try_forward(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    lse: Option<&mut [f32]>,
) -> Result<(), AttentionError> {
    forward(shape, tiles, masking, q, k, v, out, lse, None)
}

/// [`try_forward`] on bf16 data: q, k, v and the output stored in bf16; the products read bf16
/// operands (the weights rounded to bf16 before they multiply v) and sum in f32 (on AMX tiles
/// where the CPU has them, see `bf16_product_isa`), the softmax and the log-sum-exp are f32.
#[allow(clippy::too_many_arguments)]
pub fn try_forward_bf16(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    out: &mut [bf16],
    lse: Option<&mut [f32]>,
) -> Result<(), AttentionError> {
    forward(shape, tiles, masking, q, k, v, out, lse, None)
}

/// The forward pass on any element type of the kernel, with the row statistics when `stats` is
/// given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<T: Element>(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    lse: Option<&mut [f32]>,
    stats: Option<&mut [f32]>,
) -> Result<(), AttentionError> {
    shape.validate(tiles, q, k, v, out)?;
    masking.validate(&shape.dims)?;
    let AttentionDims {
        batch,
        n_heads,
        n,
        m,
        d_k,
        d_v,
        ..
    } = shape.dims;
    if let Some(lse) = &lse {
        check_len("log-sum-exp slice", lse.len(), [batch, n_heads, n, 1])?;
    }
    if let Some(stats) = &stats {
        check_len(
            "row statistics slice",
            stats.len(),
            [ROW_STATS, batch, n_heads, n],
        )?;
    }
    if out.is_empty() {
        return Ok(());
    }
    let mut lse_store;
    let lse = match lse {
        Some(lse) => lse,
        None => {
            lse_store = vec![0.0; batch * n_heads * n];
            &mut lse_store[..]
        }
    };
    // out: [b·h, n, d_v] -> tasks of [query_block, d_v] rows, each with its (b·h, first query),
    // its [query_block] log-sum-exp entries and its [query_block] entries of each statistic.
    let mut tasks: Vec<Task<'_, T>> = Vec::new();
    let mut stats_blocks = stats.map(|stats| {
        // [ROW_STATS, b·h·n] -> per statistic, blocks of [query_block] in the tasks' order.
        let rows = batch * n_heads * n;
        stats
            .chunks_mut(rows.max(1))
            .map(|column| {
                column
                    .chunks_mut(n)
                    .flat_map(|head| head.chunks_mut(tiles.query_block))
            })
            .collect::<Vec<_>>()
    });
    for (bh_idx, (head_out, head_lse)) in out.chunks_mut(n * d_v).zip(lse.chunks_mut(n)).enumerate()
    {
        let blocks = head_out
            .chunks_mut(tiles.query_block * d_v)
            .zip(head_lse.chunks_mut(tiles.query_block));
        for (block_idx, (block_out, block_lse)) in blocks.enumerate() {
            // Every column has this block (their lengths were checked above); an exhausted one
            // would give an empty slice, which the block's first write would refuse loudly.
            let block_stats = stats_blocks.as_mut().map(|columns| -> StatsColumns<'_> {
                std::array::from_fn(|idx| {
                    columns
                        .get_mut(idx)
                        .and_then(Iterator::next)
                        .unwrap_or_default()
                })
            });
            tasks.push((
                bh_idx,
                block_idx * tiles.query_block,
                block_out,
                block_lse,
                block_stats,
            ));
        }
    }
    let inputs = Inputs {
        shape,
        tiles,
        masking,
        q,
        k,
        v,
    };
    // Without a window every query block's key tiles start at 0 and follow one grid, so each
    // (kv head, key tile)'s prepared operands (packed ones for bf16) are made once, by the first
    // task that needs them, and shared by the head's query blocks.
    let shared = shape.window.is_none().then(|| {
        let tiles_per_head = m.div_ceil(tiles.key_block);
        (0..batch * shape.dims.n_kv_heads * tiles_per_head)
            .map(|_| std::sync::OnceLock::new())
            .collect::<Vec<_>>()
    });
    super::for_each_task(
        tasks,
        2 * batch * n_heads * n * m * (d_k + d_v),
        || Scratch::new(shape, tiles),
        |scratch, (bh_idx, q_start, block_out, block_lse, block_stats)| {
            inputs.query_block(
                bh_idx,
                q_start,
                Rows {
                    out: block_out,
                    lse: block_lse,
                    stats: block_stats,
                },
                scratch,
                shared.as_deref(),
            )
        },
    );
    Ok(())
}

/// One task: (flattened head, first query, its output rows, log-sum-exp and statistics).
type Task<'a, T> = (
    usize,
    usize,
    &'a mut [T],
    &'a mut [f32],
    Option<StatsColumns<'a>>,
);

/// A block's entries of each row statistic (see [`ROW_STATS`]).
type StatsColumns<'a> = [&'a mut [f32]; ROW_STATS];

/// What a task writes: `[rows, d_v]` outputs, `[rows]` log-sum-exps and, when asked,
/// `[rows]` entries of each of the [`ROW_STATS`] statistics.
struct Rows<'a, T> {
    out: &'a mut [T],
    lse: &'a mut [f32],
    stats: Option<StatsColumns<'a>>,
}

/// A key tile's prepared right operands: `K_jᵀ` (of the scores) and `V_j` (of the output).
type KeyTile<'a, T> = (<T as Element>::Rhs<'a>, <T as Element>::Rhs<'a>);

/// Everything a task reads.
pub(crate) struct Inputs<'a, T = f32> {
    pub shape: &'a KernelShape,
    pub tiles: Tiles,
    pub masking: &'a Masking<'a>,
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
}

/// Where a tile stands against the causal diagonal and the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileKind {
    /// Nothing in it is visible: skip it.
    Hidden,
    /// Every score in it is visible and unbiased: no per-row masking.
    Plain,
    /// Unbiased, and only the causal diagonal or the window cuts it: each row sees one
    /// contiguous run of its keys ([`Inputs::band`]), the rest is −∞.
    Band,
    /// Some rows need the bias or the mask (and perhaps the causal cut).
    Masked,
}

impl<'a, T: Element> Inputs<'a, T> {
    /// Which kind the tile (queries `q_start..q_start + rows` of head (`batch_idx`,
    /// `head_idx`), keys `key_start..key_start + cols`) is.
    pub fn tile_kind(
        &self,
        batch_idx: usize,
        head_idx: usize,
        q_start: usize,
        rows: usize,
        key_start: usize,
        cols: usize,
    ) -> TileKind {
        let shape = self.shape;
        let queries = q_start..q_start + rows;
        let keys = key_start..key_start + cols;
        // The bands' starts and ends never decrease with the query: the first row has the
        // lowest, the last row the highest.
        let (first, last) = (
            shape.visible_keys(q_start),
            shape.visible_keys(q_start + rows - 1),
        );
        let (all_masked, any_masked) =
            self.masking
                .mask_coverage(&shape.dims, batch_idx, head_idx, queries, keys);
        if key_start >= last.end || key_start + cols <= first.start || all_masked {
            TileKind::Hidden
        } else if any_masked || self.masking.shifts_scores() {
            TileKind::Masked
        } else if key_start + cols > first.end || key_start < last.start {
            TileKind::Band
        } else {
            TileKind::Plain
        }
    }

    /// The run `start..end` of a tile's `cols` keys from `key_start` that query `query_idx`
    /// sees under the causal mask and the window (relative to the tile; empty when none).
    pub fn band(&self, query_idx: usize, key_start: usize, cols: usize) -> Range<usize> {
        let visible = self.shape.visible_keys(query_idx);
        let start = visible.start.saturating_sub(key_start).min(cols);
        let end = visible.end.saturating_sub(key_start).clamp(start, cols);
        start..end
    }

    /// `k_tileᵀ` `[d_k, cols]`: the keys `key_start..key_start + cols` of kv head
    /// `kv_idx` (flattened over the batch), transposed, as the scores' right operand.
    pub fn keys_transposed(&self, kv_idx: usize, key_start: usize, cols: usize) -> View<'a, T> {
        let AttentionDims { m, d_k, .. } = self.shape.dims;
        let k_tile = &self.k[(kv_idx * m + key_start) * d_k..][..cols * d_k];
        View::transposed(k_tile, d_k, cols, d_k)
    }

    /// The scores of a tile, `scores[rows, cols] = scale · q_block · k_tileᵀ` (`k_tile_t`: the
    /// prepared [`Inputs::keys_transposed`] of the tile's keys), soft-capped when the call caps
    /// (writing the cap's derivative `1 − tanh²` into `cap_grad` when given), plus the bias, with
    /// −∞ where the mask, the causal diagonal or the window hides a key (when `kind` is `Masked`).
    #[allow(clippy::too_many_arguments)]
    pub fn scores(
        &self,
        kind: TileKind,
        batch_idx: usize,
        head_idx: usize,
        q_start: usize,
        rows: usize,
        key_start: usize,
        cols: usize,
        k_tile_t: &T::Rhs<'_>,
        scores: &mut [f32],
        cap_grad: Option<&mut [f32]>,
    ) {
        let AttentionDims {
            n_heads, n, d_k, ..
        } = self.shape.dims;
        let q_block =
            &self.q[((batch_idx * n_heads + head_idx) * n + q_start) * d_k..][..rows * d_k];
        T::product(
            scores,
            cols,
            View::rows(q_block, rows, d_k, d_k),
            k_tile_t,
            false,
            self.shape.scale,
        );
        if let Some(cap) = self.shape.softcap {
            match cap_grad {
                Some(grad) => simd::softcap_with_grad(scores, cap, &mut grad[..rows * cols]),
                None => simd::softcap(scores, cap),
            }
        }
        if !matches!(kind, TileKind::Masked | TileKind::Band) {
            return;
        }
        for (row, row_scores) in scores.chunks_mut(cols).take(rows).enumerate() {
            let query_idx = q_start + row;
            if kind == TileKind::Masked {
                self.masking.apply(
                    &self.shape.dims,
                    row_scores,
                    batch_idx,
                    head_idx,
                    query_idx,
                    key_start,
                );
            }
            let band = self.band(query_idx, key_start, cols);
            row_scores[..band.start].fill(f32::NEG_INFINITY);
            row_scores[band.end..].fill(f32::NEG_INFINITY);
        }
    }

    /// `K_jᵀ` and `V_j` of the `cols` keys from `key_start` of kv head `kv_idx`, prepared.
    fn key_tile(&self, kv_idx: usize, key_start: usize, cols: usize) -> KeyTile<'a, T> {
        let d_v = self.shape.dims.d_v;
        let v_tile = &self.v[(kv_idx * self.shape.dims.m + key_start) * d_v..][..cols * d_v];
        (
            T::prepare(self.keys_transposed(kv_idx, key_start, cols)),
            T::prepare(View::rows(v_tile, cols, d_v, d_v)),
        )
    }

    /// The part of a tile's row that query `query_idx` computes and where its hidden keys lie:
    /// a band tile's row is the keys it sees, widened to whole vectors (their −∞ in the first
    /// and last, where the statistics take selects; the rest of the row weighs 0); a masked
    /// tile's row is whole with hidden keys anywhere; a full tile's row is whole.
    #[inline]
    fn row_run(
        &self,
        kind: TileKind,
        query_idx: usize,
        key_start: usize,
        cols: usize,
    ) -> (Range<usize>, Hidden) {
        match kind {
            TileKind::Band => {
                let band = self.band(query_idx, key_start, cols);
                let lanes = simd::LANES;
                let start = band.start / lanes * lanes;
                let end = (band.end.div_ceil(lanes) * lanes).min(cols);
                (
                    start..end,
                    Hidden::AtEnds(start < band.start, end > band.end),
                )
            }
            TileKind::Masked => (0..cols, Hidden::Anywhere),
            _ => (0..cols, Hidden::AtEnds(false, false)),
        }
    }

    /// One task: queries `q_start .. q_start + rows` of flattened head `bh_idx`; `shared`, when
    /// given, holds every (kv head, key tile)'s prepared operands on the grid of
    /// `tiles.key_block` (see `forward`).
    fn query_block(
        &self,
        bh_idx: usize,
        q_start: usize,
        block: Rows<'_, T>,
        scratch: &mut Scratch,
        shared: Option<&[std::sync::OnceLock<KeyTile<'a, T>>]>,
    ) {
        let AttentionDims {
            n_heads,
            n_kv_heads,
            m,
            d_v,
            ..
        } = self.shape.dims;
        let Rows {
            out: block_out,
            lse: block_lse,
            stats: mut block_stats,
        } = block;
        let rows = block_lse.len();
        let with_stats = block_stats.is_some();
        if with_stats {
            scratch.stats.reset();
        }
        let (batch_idx, head_idx) = (bh_idx / n_heads, bh_idx % n_heads);
        let kv_idx = batch_idx * n_kv_heads + head_idx / (n_heads / n_kv_heads);
        let tiles_per_head = m.div_ceil(self.tiles.key_block);

        let acc = &mut scratch.acc[..rows * d_v];
        acc.fill(0.0);
        let row_max = &mut scratch.row_max[..rows];
        let row_sum = &mut scratch.row_sum[..rows];
        // A sink starts every row of its head with one term e^(sink − max) = 1 at max = sink (no
        // term for a sink of −∞, which is no sink).
        let sink = self
            .masking
            .sinks
            .map_or(f32::NEG_INFINITY, |s| s[head_idx]);
        row_max.fill(sink);
        row_sum.fill(if sink == f32::NEG_INFINITY { 0.0 } else { 1.0 });

        // Keys some query of the block sees under the causal mask and the window: from the
        // first row's start to the last row's end.
        let keys_start = self.shape.visible_keys(q_start).start;
        let keys_end = self.shape.visible_keys(q_start + rows - 1).end;
        let mut key_start = keys_start;
        while key_start < keys_end {
            let cols = self.tiles.key_block.min(keys_end - key_start);
            let kind = self.tile_kind(batch_idx, head_idx, q_start, rows, key_start, cols);
            if kind == TileKind::Hidden {
                key_start += cols;
                continue;
            }
            let scores = &mut scratch.scores[..rows * cols];
            let own;
            let (k_tile_t, v_tile) = match shared {
                // On the grid (no window), key_start is a multiple of key_block; a tile the
                // causal diagonal cuts short for this block is its own.
                Some(shared) if cols == self.tiles.key_block.min(m - key_start) => shared
                    [kv_idx * tiles_per_head + key_start / self.tiles.key_block]
                    .get_or_init(|| self.key_tile(kv_idx, key_start, cols)),
                _ => {
                    own = self.key_tile(kv_idx, key_start, cols);
                    &own
                }
            };
            self.scores(
                kind, batch_idx, head_idx, q_start, rows, key_start, cols, k_tile_t, scores, None,
            );
            for (row, row_scores) in scores.chunks_mut(cols).enumerate() {
                let (run, hidden) = self.row_run(kind, q_start + row, key_start, cols);
                row_scores[..run.start].fill(0.0);
                row_scores[run.end..].fill(0.0);
                let row_scores = &mut row_scores[run];
                let stats = with_stats.then_some(&mut scratch.stats);
                let running = (&mut row_max[row], &mut row_sum[row]);
                let acc_row = &mut acc[row * d_v..][..d_v];
                update_row(
                    row_scores,
                    running,
                    acc_row,
                    stats.map(|s| (s, row)),
                    hidden,
                );
            }
            // acc [rows, d_v] += p [rows, cols] · v_tile [cols, d_v]
            T::product_f32_lhs(
                acc,
                d_v,
                View::rows(scores, rows, cols, cols),
                v_tile,
                true,
                1.0,
            );
            key_start += cols;
        }
        finish_rows::<T>(acc, row_max, row_sum, block_lse, block_out);
        if let Some(columns) = block_stats.as_mut() {
            scratch
                .stats
                .finish_block(row_max, row_sum, block_lse, columns);
        }
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
