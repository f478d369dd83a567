//! The backward pass of the CPU kernel (the FlashAttention-2 recurrence): the weights are never
//! stored; each tile recomputes them from the forward's per-row log-sum-exp.
//!
//! With D = rowsum(dO ∘ O), for every query block i and key block j:
//! P = exp(S − lse), dV_j += Pᵀ dO_i, dP = dO_i V_jᵀ, dS = P ∘ (dP − D),
//! dQ_i += scale · dS K_j, dK_j += scale · dSᵀ Q_i. With a soft-cap, dS is first multiplied by
//! the cap's derivative 1 − tanh²(s / c), recomputed with the scores.
//!
//! A task owns one (batch, key/value head, range of keys): it loops over the key blocks of its
//! range and, inside, over every query block of every query head of the group, so dK and dV of
//! its keys are written by it alone (grouped-query heads sum into their kv head without
//! atomics). When there are fewer (batch, kv head) pairs than twice the threads, the keys are
//! split into ranges and each range accumulates dQ into its own buffer, summed at the end.

use core::ops::Range;

use burn::tensor::bf16;
use rayon::prelude::*;

use super::element::Element;
use super::kernel::{Inputs, TileKind};
use super::masking::Masking;
use super::shape::check_len;
use super::shape::{KernelShape, Tiles};
use super::simd;
use super::tile::View;
use crate::error::AttentionError;
use crate::types::AttentionDims;
use tile::{KeyTile, QueryTile, zero_unwritten};

#[path = "backward_tile.rs"]
mod tile;

/// Tile sizes of the backward pass (default), chosen with `cargo run --release --example
/// cpu_kernel_tiles`: five products per tile instead of two, so smaller tiles than the
/// forward's keep the working set (P, dP, and the K, V, dK, dV tiles) in L2.
pub const BACKWARD_TILES: Tiles = Tiles {
    query_block: 128,
    key_block: 128,
};

/// What the backward pass reads: the forward's inputs, its output, the output's gradient and the
/// log-sum-exp of every row, all row-major as in [`KernelShape`] (`lse: [b, h, n]`), stored in
/// `T` (`f32`, or bf16 for [`try_backward_bf16`]); the log-sum-exp is always `f32`.
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs<'a, T = f32> {
    /// `[b, h, n, d_k]`
    pub q: &'a [T],
    /// `[b, h_kv, m, d_k]`
    pub k: &'a [T],
    /// `[b, h_kv, m, d_v]`
    pub v: &'a [T],
    /// `[b, h, n, d_v]`: the forward's output.
    pub out: &'a [T],
    /// `[b, h, n, d_v]`: the gradient of the loss with respect to `out`.
    pub grad_out: &'a [T],
    /// `[b, h, n]`: the forward's log-sum-exp (+∞ for rows with no visible key).
    pub lse: &'a [f32],
}

/// Where the backward pass writes (every slice is overwritten).
#[derive(Debug)]
pub struct BackwardOutputs<'a> {
    /// `[b, h, n, d_k]`
    pub grad_q: &'a mut [f32],
    /// `[b, h_kv, m, d_k]`: summed over the query heads of each group.
    pub grad_k: &'a mut [f32],
    /// `[b, h_kv, m, d_v]`: summed over the query heads of each group.
    pub grad_v: &'a mut [f32],
    /// `[b, h, n, m]`, when asked for: the gradient of the scores after scaling and
    /// soft-capping, which is the gradient of an additive bias before it is summed over the bias's broadcast axes.
    pub grad_scores: Option<&'a mut [f32]>,
}

/// The gradients of q, k, v (and of the scaled scores, when asked for) of the forward pass of
/// [`try_forward`](super::kernel::try_forward) with the same shape and masking, or an
/// [`AttentionError`] naming what does not fit.
pub fn try_backward(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    inputs: BackwardInputs<'_>,
    outputs: BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    backward(shape, tiles, masking, inputs, outputs)
}

/// [`try_backward`] on bf16 inputs: the products read bf16 operands (the weights and their
/// gradient rounded to bf16 where they multiply) and sum in f32; the recomputed softmax and the
/// gradients are f32 (the caller rounds them to its storage type).
pub fn try_backward_bf16(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    inputs: BackwardInputs<'_, bf16>,
    outputs: BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    backward(shape, tiles, masking, inputs, outputs)
}

/// Checks every slice of a backward call against the shape (and the masking against the
/// shape's sizes), naming the first that does not fit.
fn check_lengths<T: Element>(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    inputs: &BackwardInputs<'_, T>,
    outputs: &BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    let AttentionDims {
        batch,
        n_heads,
        n_kv_heads,
        n,
        m,
        d_k,
        d_v,
    } = shape.dims;
    shape.validate(tiles, inputs.q, inputs.k, inputs.v, inputs.out)?;
    masking.validate(&shape.dims)?;
    check_len(
        "output gradient slice",
        inputs.grad_out.len(),
        [batch, n_heads, n, d_v],
    )?;
    check_len(
        "log-sum-exp slice",
        inputs.lse.len(),
        [batch, n_heads, n, 1],
    )?;
    check_len(
        "query gradient slice",
        outputs.grad_q.len(),
        [batch, n_heads, n, d_k],
    )?;
    check_len(
        "key gradient slice",
        outputs.grad_k.len(),
        [batch, n_kv_heads, m, d_k],
    )?;
    check_len(
        "value gradient slice",
        outputs.grad_v.len(),
        [batch, n_kv_heads, m, d_v],
    )?;
    if let Some(grad_scores) = &outputs.grad_scores {
        check_len(
            "score gradient slice",
            grad_scores.len(),
            [batch, n_heads, n, m],
        )?;
    }
    Ok(())
}

/// The backward pass on any element type of the kernel.
fn backward<T: Element>(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    inputs: BackwardInputs<'_, T>,
    outputs: BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    let AttentionDims {
        batch,
        n_heads,
        n_kv_heads,
        n,
        m,
        d_k,
        d_v,
    } = shape.dims;
    check_lengths(shape, tiles, masking, &inputs, &outputs)?;
    let BackwardOutputs {
        grad_q,
        grad_k,
        grad_v,
        mut grad_scores,
    } = outputs;
    if grad_q.is_empty() || grad_k.is_empty() || grad_v.is_empty() {
        // An empty axis (d_v = 0 included: no output, so every gradient is 0).
        grad_q.fill(0.0);
        grad_k.fill(0.0);
        grad_v.fill(0.0);
        if let Some(grad_scores) = grad_scores.as_deref_mut() {
            grad_scores.fill(0.0);
        }
        return Ok(());
    }
    // Each task writes its own slices of the outputs (its first product into a slice overwrites
    // it, what no product reaches it zeroes): the tasks' slices cover every output.
    let group = shape.dims.group();
    let heads = batch * n_kv_heads;
    let key_blocks = m.div_ceil(tiles.key_block);
    // Split the keys when there are too few (batch, kv head) pairs to keep every thread busy;
    // the score gradient is written per (batch, head) row block, so it keeps one range.
    let splits = if grad_scores.is_some() {
        1
    } else {
        (2 * rayon::current_num_threads())
            .div_ceil(heads)
            .clamp(1, key_blocks)
    };
    let blocks_per_split = key_blocks.div_ceil(splits);
    let key_ranges: Vec<Range<usize>> = (0..splits)
        .map(|s| {
            let start = (s * blocks_per_split * tiles.key_block).min(m);
            start..((s + 1) * blocks_per_split * tiles.key_block).min(m)
        })
        .filter(|r| !r.is_empty())
        .collect();
    // One dQ buffer per key range: the caller's for the first, zeroed scratch for the others.
    let mut extra_grad_q = vec![vec![0.0f32; grad_q.len()]; key_ranges.len() - 1];
    let group_q = group * n * d_k;
    let mut grad_q_chunks: Vec<_> = core::iter::once(&mut grad_q[..])
        .chain(extra_grad_q.iter_mut().map(|b| &mut b[..]))
        .map(|buffer| buffer.chunks_mut(group_q))
        .collect();
    let mut grad_scores_chunks = grad_scores.map(|g| g.chunks_mut(group * n * m));

    let mut tasks = Vec::with_capacity(heads * key_ranges.len());
    for (head_idx, (dk_head, dv_head)) in grad_k
        .chunks_mut(m * d_k)
        .zip(grad_v.chunks_mut(m * d_v))
        .enumerate()
    {
        let mut grad_scores = grad_scores_chunks.as_mut().and_then(Iterator::next);
        let (mut dk_rest, mut dv_rest) = (dk_head, dv_head);
        for (range, dq_chunks) in key_ranges.iter().zip(grad_q_chunks.iter_mut()) {
            let (dk, dk_tail) = dk_rest.split_at_mut(range.len() * d_k);
            let (dv, dv_tail) = dv_rest.split_at_mut(range.len() * d_v);
            (dk_rest, dv_rest) = (dk_tail, dv_tail);
            let Some(dq) = dq_chunks.next() else { break };
            tasks.push(Task {
                batch_idx: head_idx / n_kv_heads,
                kv_head_idx: head_idx % n_kv_heads,
                keys: range.clone(),
                dq,
                dk,
                dv,
                grad_scores: grad_scores.take(),
            });
        }
    }
    let forward = Inputs {
        shape,
        tiles,
        masking,
        q: inputs.q,
        k: inputs.k,
        v: inputs.v,
    };
    super::for_each_task(
        tasks,
        // five products per tile
        5 * batch * n_heads * n * m * (d_k + d_v),
        || Scratch::new(shape, tiles),
        |scratch, task| task.run(&forward, &inputs, scratch),
    );
    // Sum the other ranges' dQ into the caller's buffer.
    for extra in &extra_grad_q {
        grad_q
            .par_chunks_mut(1 << 14)
            .zip(extra.par_chunks(1 << 14))
            .for_each(|(dst, src)| simd::add(dst, src));
    }
    Ok(())
}

/// Per-thread buffers.
struct Scratch {
    /// `[query_block, key_block]`: the scores, then P, then dS.
    p: Vec<f32>,
    /// `[query_block, key_block]`: dP.
    dp: Vec<f32>,
    /// `[g·n]`: D = rowsum(dO ∘ O) of the group's rows.
    d: Vec<f32>,
    /// `[query_block, key_block]`: the soft-cap's derivative 1 − tanh², when the call caps.
    cap: Vec<f32>,
}

impl Scratch {
    fn new(shape: &KernelShape, tiles: Tiles) -> Self {
        let tile = tiles.query_block * tiles.key_block;
        Self {
            p: vec![0.0; tile],
            dp: vec![0.0; tile],
            d: vec![0.0; shape.dims.group() * shape.dims.n],
            cap: if shape.softcap.is_some() {
                vec![0.0; tile]
            } else {
                Vec::new()
            },
        }
    }
}

/// One task: the keys `keys` of one (batch, kv head) against every query of its group.
struct Task<'a> {
    batch_idx: usize,
    kv_head_idx: usize,
    keys: Range<usize>,
    /// `[g, n, d_k]`: dQ of the group's query heads (this key range's share).
    dq: &'a mut [f32],
    /// `[keys.len(), d_k]`
    dk: &'a mut [f32],
    /// `[keys.len(), d_v]`
    dv: &'a mut [f32],
    /// `[g, n, m]`: the score gradient of the group's query heads.
    grad_scores: Option<&'a mut [f32]>,
}

impl Task<'_> {
    fn run<T: Element>(
        self,
        forward: &Inputs<'_, T>,
        inputs: &BackwardInputs<'_, T>,
        scratch: &mut Scratch,
    ) {
        let AttentionDims {
            n_heads,
            n_kv_heads,
            n,
            m,
            d_k,
            d_v,
            ..
        } = forward.shape.dims;
        let group = n_heads / n_kv_heads;
        let tiles = forward.tiles;
        let first_head = self.kv_head_idx * group;
        // Rows of the group: [g·n] starting at (batch, first head).
        let row0 = (self.batch_idx * n_heads + first_head) * n;
        let kv = self.batch_idx * n_kv_heads + self.kv_head_idx;
        for (row, d) in scratch.d.iter_mut().enumerate() {
            let at = (row0 + row) * d_v;
            *d = T::dot(&inputs.grad_out[at..][..d_v], &inputs.out[at..][..d_v]);
        }
        let Task {
            keys,
            dq,
            dk,
            dv,
            mut grad_scores,
            ..
        } = self;
        // dK, dV and dQ are overwritten by their first product and accumulated after it (no pass
        // zeroing them first); whatever no product reached (every tile of it hidden) is zeroed
        // at the end. The score gradient is copied tile by tile: zeroed first, for hidden tiles.
        if let Some(grad_scores) = grad_scores.as_deref_mut() {
            grad_scores.fill(0.0);
        }
        // Q_i and dO_i as right operands (of dK and dV), prepared the first time a key block
        // needs them and kept for the others: [g · ⌈n / query_block⌉].
        let query_blocks = n.div_ceil(tiles.query_block);
        let mut query_rhs: Vec<Option<(T::Rhs<'_>, T::Rhs<'_>)>> =
            (0..group * query_blocks).map(|_| None).collect();
        // Whether a query block's dQ rows have been written yet: [g · ⌈n / query_block⌉].
        let mut dq_written = vec![false; group * query_blocks];
        let mut key_start = keys.start;
        while key_start < keys.end {
            let cols = tiles.key_block.min(keys.end - key_start);
            let local = key_start - keys.start;
            let k_tile = &inputs.k[(kv * m + key_start) * d_k..][..cols * d_k];
            let v_tile = &inputs.v[(kv * m + key_start) * d_v..][..cols * d_v];
            let mut key_tile = KeyTile::<T> {
                start: key_start,
                cols,
                k_t: T::prepare(View::transposed(k_tile, d_k, cols, d_k)),
                v_t: T::prepare(View::transposed(v_tile, d_v, cols, d_v)),
                k_rows: T::prepare(View::rows(k_tile, cols, d_k, d_k)),
                dk: &mut dk[local * d_k..][..cols * d_k],
                dv: &mut dv[local * d_v..][..cols * d_v],
                written: false,
            };
            for group_idx in 0..group {
                let head_idx = first_head + group_idx;
                let mut q_start = 0;
                while q_start < n {
                    let rows = tiles.query_block.min(n - q_start);
                    let kind =
                        forward.tile_kind(self.batch_idx, head_idx, q_start, rows, key_start, cols);
                    if kind != TileKind::Hidden {
                        let row_in_group = group_idx * n + q_start;
                        let q_block = &inputs.q[(row0 + row_in_group) * d_k..][..rows * d_k];
                        let do_block =
                            &inputs.grad_out[(row0 + row_in_group) * d_v..][..rows * d_v];
                        let block_idx = group_idx * query_blocks + q_start / tiles.query_block;
                        let (q_rhs, do_rhs) = query_rhs[block_idx].get_or_insert_with(|| {
                            (
                                T::prepare(View::rows(q_block, rows, d_k, d_k)),
                                T::prepare(View::rows(do_block, rows, d_v, d_v)),
                            )
                        });
                        let tile = QueryTile {
                            kind,
                            head_idx,
                            q_start,
                            rows,
                            row_in_group,
                            do_block,
                            q_rhs,
                            do_rhs,
                        };
                        let dq_block = &mut dq[row_in_group * d_k..][..rows * d_k];
                        let dq_seen = dq_written[block_idx];
                        tile.products(
                            forward,
                            inputs.lse,
                            self.batch_idx,
                            row0,
                            &mut key_tile,
                            dq_block,
                            dq_seen,
                            grad_scores.as_deref_mut(),
                            scratch,
                        );
                        dq_written[block_idx] = true;
                    }
                    q_start += rows;
                }
            }
            if !key_tile.written {
                // Every query of the group is hidden from these keys.
                key_tile.dk.fill(0.0);
                key_tile.dv.fill(0.0);
            }
            key_start += cols;
        }
        zero_unwritten(dq, &dq_written, n, d_k, tiles.query_block);
    }
}

#[cfg(test)]
#[path = "backward_tests.rs"]
mod tests;
