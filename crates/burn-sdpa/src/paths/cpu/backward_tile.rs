//! One tile of the CPU kernel's backward pass: a key block's prepared operands and its rows of
//! dK and dV ([`KeyTile`]), and the five products of a query block against it
//! ([`QueryTile::products`]).

use super::Scratch;
use crate::paths::cpu::element::Element;
use crate::paths::cpu::kernel::{Inputs, TileKind};
use crate::paths::cpu::simd;
use crate::paths::cpu::tile::View;
use crate::types::AttentionDims;

/// Zeroes the dQ rows `[g·n, d_k]` of the query blocks no product wrote (`written`, per block of
/// `query_block` rows of each of the g heads): those that see none of a task's keys.
pub(super) fn zero_unwritten(
    dq: &mut [f32],
    written: &[bool],
    n: usize,
    d_k: usize,
    query_block: usize,
) {
    let query_blocks = n.div_ceil(query_block);
    for (block_idx, _) in written.iter().enumerate().filter(|(_, written)| !**written) {
        let (group_idx, q_block) = (block_idx / query_blocks, block_idx % query_blocks);
        let q_start = q_block * query_block;
        let rows = query_block.min(n - q_start);
        dq[(group_idx * n + q_start) * d_k..][..rows * d_k].fill(0.0);
    }
}

/// One key block of a task: its operands, prepared once for every query block that sees it,
/// and its rows of dK and dV.
pub(super) struct KeyTile<'r, 'o, T: Element> {
    /// The block's first key.
    pub(super) start: usize,
    /// Its number of keys.
    pub(super) cols: usize,
    /// K_jᵀ, of the scores.
    pub(super) k_t: T::Rhs<'r>,
    /// V_jᵀ, of dP.
    pub(super) v_t: T::Rhs<'r>,
    /// K_j, of dQ.
    pub(super) k_rows: T::Rhs<'r>,
    /// `[cols, d_k]`.
    pub(super) dk: &'o mut [f32],
    /// `[cols, d_v]`.
    pub(super) dv: &'o mut [f32],
    /// Whether a product has written `dk` and `dv` yet (the first overwrites them).
    pub(super) written: bool,
}

/// One block of queries of one head against a key block that it (partly) sees.
pub(super) struct QueryTile<'t, 'r, T: Element> {
    /// How the key block's mask falls on it.
    pub(super) kind: TileKind,
    /// The query head.
    pub(super) head_idx: usize,
    /// The block's first query.
    pub(super) q_start: usize,
    /// Its number of queries.
    pub(super) rows: usize,
    /// Its first row among the group's `[g·n]` rows.
    pub(super) row_in_group: usize,
    /// dO_i `[rows, d_v]`.
    pub(super) do_block: &'t [T],
    /// Q_i, of dK.
    pub(super) q_rhs: &'t T::Rhs<'r>,
    /// dO_i, of dV.
    pub(super) do_rhs: &'t T::Rhs<'r>,
}

impl<T: Element> QueryTile<'_, '_, T> {
    /// The five products of the tile: the recomputed weights P = exp(S − lse), dV += Pᵀ·dO,
    /// dP = dO·Vᵀ, dS = P ∘ (dP − D) (copied into `grad_scores` when asked, then through the
    /// soft-cap), dQ += scale·dS·K and dK += scale·dSᵀ·Q. `row0` is the group's first row of
    /// `[b·h·n]`; `dq_seen`, whether `dq` was written before (the first product overwrites).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn products(
        &self,
        forward: &Inputs<'_, T>,
        lse: &[f32],
        batch_idx: usize,
        row0: usize,
        keys: &mut KeyTile<'_, '_, T>,
        dq: &mut [f32],
        dq_seen: bool,
        grad_scores: Option<&mut [f32]>,
        scratch: &mut Scratch,
    ) {
        let (rows, cols) = (self.rows, keys.cols);
        let AttentionDims { m, d_k, d_v, .. } = forward.shape.dims;
        let scale = forward.shape.scale;
        let p = &mut scratch.p[..rows * cols];
        let dp = &mut scratch.dp[..rows * cols];
        let capped = forward.shape.softcap.is_some();
        forward.scores(
            self.kind,
            batch_idx,
            self.head_idx,
            self.q_start,
            rows,
            keys.start,
            cols,
            &keys.k_t,
            p,
            capped.then_some(&mut scratch.cap[..]),
        );
        // P = exp(S − lse)
        for (row, p_row) in p.chunks_mut(cols).enumerate() {
            simd::exp_sub(p_row, lse[row0 + self.row_in_group + row]);
        }
        // dV_j [cols, d_v] += Pᵀ [cols, rows] · dO_i [rows, d_v]
        T::product_f32_lhs(
            keys.dv,
            d_v,
            View::transposed(p, cols, rows, cols),
            self.do_rhs,
            keys.written,
            1.0,
        );
        // dP [rows, cols] = dO_i [rows, d_v] · V_jᵀ [d_v, cols]
        T::product(
            dp,
            cols,
            View::rows(self.do_block, rows, d_v, d_v),
            &keys.v_t,
            false,
            1.0,
        );
        // dS = P ∘ (dP − D)
        for (row, (p_row, dp_row)) in p.chunks_mut(cols).zip(dp.chunks(cols)).enumerate() {
            simd::softmax_grad(p_row, dp_row, scratch.d[self.row_in_group + row]);
        }
        // The score gradient is the bias's (the bias is added after the cap).
        if let Some(grad_scores) = grad_scores {
            for (row, ds_row) in scratch.p[..rows * cols].chunks(cols).enumerate() {
                let at = (self.row_in_group + row) * m + keys.start;
                grad_scores[at..][..cols].copy_from_slice(ds_row);
            }
        }
        if capped {
            // Through the cap: dS_raw = dS ∘ (1 − tanh²(s / c)).
            simd::mul(&mut scratch.p[..rows * cols], &scratch.cap[..rows * cols]);
        }
        let ds = &scratch.p[..rows * cols];
        // dQ_i [rows, d_k] += scale · dS [rows, cols] · K_j [cols, d_k]
        T::product_f32_lhs(
            dq,
            d_k,
            View::rows(ds, rows, cols, cols),
            &keys.k_rows,
            dq_seen,
            scale,
        );
        // dK_j [cols, d_k] += scale · dSᵀ [cols, rows] · Q_i [rows, d_k]
        T::product_f32_lhs(
            keys.dk,
            d_k,
            View::transposed(ds, cols, rows, cols),
            self.q_rhs,
            keys.written,
            scale,
        );
        keys.written = true;
    }
}
