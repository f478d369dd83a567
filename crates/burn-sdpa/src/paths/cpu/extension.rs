//! The CPU kernel as a Burn backend extension: one op, `cpu_kernel_attention`, implemented for
//! Flex and NdArray (reading their buffers in place) and for `Autodiff` over them, with a
//! hand-written backward pass that recomputes the weights from the forward's log-sum-exp
//! ([`super::backward`]).

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{
    Autodiff, Backend, Dispatch, ExtensionType, TensorMetadata, backend_extension,
    tensor::FloatTensor,
};
use burn::prelude::*;
use burn::tensor::{DType, bf16, f16};

use super::backward::{BACKWARD_TILES, BackwardInputs, BackwardOutputs};
use super::host::HostFloat;
use super::masking::HostTerms;
use super::masking::Masking;
use super::shape::{KernelShape, Tiles};
use super::storage::Storage;
use crate::types::AttentionDims;

/// A boolean mask on the host, `[b|1, h|1, n|1, m]` row-major (true = masked out).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostMask {
    pub values: Vec<bool>,
    pub shape: [usize; 4],
}

/// What the op needs besides its tensors: the kernel's shape (derived from the module's call)
/// and the padding and user masks, or-ed, on the host.
#[derive(Debug, Clone)]
pub(crate) struct KernelCall {
    /// Sizes, scale, causal and window diagonals, soft-cap.
    pub shape: KernelShape,
    /// The padding and user masks, or-ed.
    pub mask: Option<Arc<HostMask>>,
    /// Segment ids and ALiBi slopes.
    pub terms: Arc<HostTerms>,
    /// Where the forward leaves its log-sum-exp when the caller asked for it (it carries no
    /// gradient).
    pub lse_out: Option<Arc<std::sync::Mutex<Vec<f32>>>>,
    /// Where the forward leaves the row statistics `[ROW_STATS, b, h, n]` when the caller asked
    /// for them (no gradient either).
    pub stats_out: Option<Arc<std::sync::Mutex<Vec<f32>>>>,
}

impl KernelCall {
    /// The kernel's masking for this call with `bias` (the bias's host values and shape).
    fn masking<'a>(&'a self, bias: Option<(&'a [f32], [usize; 4])>) -> Masking<'a> {
        let mask = self.mask.as_ref().map(|m| (&m.values[..], m.shape));
        self.terms.masking(mask, bias)
    }
}

/// An optional additive bias `[b|1, h|1, n|1, m]`, which may carry a gradient.
#[derive(ExtensionType)]
pub(crate) enum MaybeBias<B: Backend> {
    /// A bias.
    Present(FloatTensor<B>),
    /// No bias.
    Absent,
}

impl<B: Backend> MaybeBias<B> {
    /// `Present` for `Some`, `Absent` for `None`.
    pub(crate) fn from_option(bias: Option<FloatTensor<B>>) -> Self {
        bias.map_or(MaybeBias::Absent, MaybeBias::Present)
    }

    /// The bias, if present.
    pub(crate) fn as_option(&self) -> Option<&FloatTensor<B>> {
        match self {
            MaybeBias::Present(b) => Some(b),
            MaybeBias::Absent => None,
        }
    }
}

/// The op. Calling it on a backend that is not listed panics: [`super::blocker`] routes those
/// calls to the host-copy path (inference) or refuses them (training).
#[backend_extension(Flex: cfg(feature = "flex"), NdArray: cfg(feature = "ndarray"), Autodiff)]
pub(crate) trait CpuKernelBackend: Backend {
    /// softmax(q kᵀ · scale + bias, masked) v: `[b, h, n, d_v]`.
    fn cpu_kernel_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        #[extension_type] bias: MaybeBias<Self>,
        call: KernelCall,
    ) -> FloatTensor<Self>;
}

/// Runs the op on tensors of any backend the extension lists.
pub(crate) fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Option<Tensor<4>>,
    call: KernelCall,
) -> Tensor<4> {
    let bias = MaybeBias::from_option(bias.map(Tensor::into_dispatch));
    Tensor::from_dispatch(<Dispatch as CpuKernelBackend>::cpu_kernel_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        bias,
        call,
    ))
}

/// The forward pass on the host: (output `[b, h, n, d_v]`, log-sum-exp `[b, h, n]`), in the
/// inputs' storage type (the query's: bf16, f16 or `f32`).
///
/// # Panics
/// When the kernel refuses the call; [`super::blocker`] and the module's validation have
/// checked everything it checks (dtypes, shapes) before the op is called.
fn forward<B: HostFloat>(
    q: &FloatTensor<B>,
    k: &FloatTensor<B>,
    v: &FloatTensor<B>,
    bias: Option<&FloatTensor<B>>,
    call: &KernelCall,
) -> (FloatTensor<B>, Vec<f32>) {
    match q.dtype() {
        DType::BF16 => forward_as::<B, bf16>(q, k, v, bias, call),
        DType::F16 => forward_as::<B, f16>(q, k, v, bias, call),
        _ => forward_as::<B, f32>(q, k, v, bias, call),
    }
}

/// [`forward`] in storage type `T`.
fn forward_as<B: HostFloat, T: Storage>(
    q: &FloatTensor<B>,
    k: &FloatTensor<B>,
    v: &FloatTensor<B>,
    bias: Option<&FloatTensor<B>>,
    call: &KernelCall,
) -> (FloatTensor<B>, Vec<f32>) {
    let shape = call.shape;
    let dims = shape.dims;
    let mut out = vec![T::zero(); dims.batch * dims.n_heads * dims.n * dims.d_v];
    let mut lse = vec![0.0f32; dims.batch * dims.n_heads * dims.n];
    let mut stats = call
        .stats_out
        .as_ref()
        .map(|_| vec![0.0f32; lse.len() * super::stats_scratch::ROW_STATS]);
    let result = (|| {
        let (qs, ks, vs) = (T::read::<B>(q)?, T::read::<B>(k)?, T::read::<B>(v)?);
        let bias_values = bias.map(|b| B::host_widened(b)).transpose()?;
        let masking = call.masking(
            bias_values
                .as_deref()
                .zip(bias)
                .map(|(values, b)| (values, b.shape().dims::<4>())),
        );
        T::forward(
            &shape,
            Tiles::for_keys(dims.m).fitted_to(masking.segments.map(|seg| seg.shortest_run(dims.m))),
            &masking,
            &qs,
            &ks,
            &vs,
            &mut out,
            &mut lse,
            stats.as_deref_mut(),
        )
    })();
    if let Some(slot) = &call.lse_out {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = lse.clone();
    }
    if let (Some(slot), Some(stats)) = (&call.stats_out, stats) {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = stats;
    }
    if let Err(e) = result {
        panic!("{e}");
    }
    (
        T::tensor::<B>(out, [dims.batch, dims.n_heads, dims.n, dims.d_v], q),
        lse,
    )
}

/// The op on a backend whose buffers the kernel reads in place (the same for Flex and NdArray).
macro_rules! in_place_backend {
    ($backend:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        impl CpuKernelBackend for $backend {
            fn cpu_kernel_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                bias: MaybeBias<Self>,
                call: KernelCall,
            ) -> FloatTensor<Self> {
                forward::<Self>(&q, &k, &v, bias.as_option(), &call).0
            }
        }
    };
}

in_place_backend!(burn::backend::Flex, "flex");
in_place_backend!(burn::backend::NdArray, "ndarray");

/// What the backward pass keeps from the forward.
#[derive(Debug, Clone)]
struct SavedForward<B: Backend> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    out: FloatTensor<B>,
    lse: Arc<Vec<f32>>,
    call: KernelCall,
}

/// The backward step, with N = 3 parents (q, k, v) or 4 (and the bias).
#[derive(Debug)]
struct KernelBackward<const N: usize>;

impl<B: HostFloat, const N: usize> Backward<B, N> for KernelBackward<N> {
    type State = SavedForward<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_out = grads.consume::<B>(&ops.node);
        let saved = ops.state;
        let bias_parent = if N == 4 { ops.parents[3].clone() } else { None };
        let shape = saved.call.shape;
        let dims = shape.dims;
        let AttentionDims {
            batch,
            n_heads,
            n_kv_heads,
            n,
            m,
            d_k,
            d_v,
        } = dims;
        let mut grad_q = vec![0.0f32; batch * n_heads * n * d_k];
        let mut grad_k = vec![0.0f32; batch * n_kv_heads * m * d_k];
        let mut grad_v = vec![0.0f32; batch * n_kv_heads * m * d_v];
        let mut grad_scores = bias_parent
            .as_ref()
            .map(|_| vec![0.0f32; batch * n_heads * n * m]);
        let outputs = BackwardOutputs {
            grad_q: &mut grad_q,
            grad_k: &mut grad_k,
            grad_v: &mut grad_v,
            grad_scores: grad_scores.as_deref_mut(),
        };
        let result = match saved.q.dtype() {
            DType::BF16 => backward_as::<B, bf16>(&saved, &grad_out, outputs),
            DType::F16 => backward_as::<B, f16>(&saved, &grad_out, outputs),
            _ => backward_as::<B, f32>(&saved, &grad_out, outputs),
        };
        if let Err(e) = result {
            panic!("{e}");
        }
        let [node_q, node_k, node_v] = [&ops.parents[0], &ops.parents[1], &ops.parents[2]];
        if let Some(node) = node_q {
            grads.register::<B>(
                node.id,
                B::from_host_as(grad_q, [batch, n_heads, n, d_k], &saved.q),
            );
        }
        if let Some(node) = node_k {
            grads.register::<B>(
                node.id,
                B::from_host_as(grad_k, [batch, n_kv_heads, m, d_k], &saved.k),
            );
        }
        if let Some(node) = node_v {
            grads.register::<B>(
                node.id,
                B::from_host_as(grad_v, [batch, n_kv_heads, m, d_v], &saved.v),
            );
        }
        if let (Some(node), Some(grad_scores), Some(bias)) = (bias_parent, grad_scores, &saved.bias)
        {
            // dL/dbias is the score gradient summed over the bias's broadcast axes, in f32, then
            // stored in the bias's dtype (one rounding for a half-precision bias).
            let bias_shape = bias.shape().dims::<4>();
            let summed = sum_to_shape(&grad_scores, [batch, n_heads, n, m], bias_shape);
            grads.register::<B>(node.id, B::from_host_as(summed, bias_shape, bias));
        }
    }
}

/// `values` `[b, h, n, m]` summed over the axes where `target` is 1 (`target`: `[b|1, h|1, n|1,
/// m]`, the bias's shape), in f32.
fn sum_to_shape(values: &[f32], full: [usize; 4], target: [usize; 4]) -> Vec<f32> {
    let m = full[3];
    let mut out = vec![0.0f32; target.iter().product()];
    let at = |idx: usize, axis: usize| if target[axis] == 1 { 0 } else { idx };
    for (row_idx, row) in values.chunks(m).enumerate() {
        let (bh, n_idx) = (row_idx / full[2], row_idx % full[2]);
        let (b_idx, h_idx) = (bh / full[1], bh % full[1]);
        let target_row = (at(b_idx, 0) * target[1] + at(h_idx, 1)) * target[2] + at(n_idx, 2);
        super::simd::add(&mut out[target_row * m..][..m], row);
    }
    out
}

/// The backward pass of a saved forward in storage type `T`: the gradients in `f32`.
fn backward_as<B: HostFloat, T: Storage>(
    saved: &SavedForward<B>,
    grad_out: &FloatTensor<B>,
    outputs: BackwardOutputs<'_>,
) -> Result<(), crate::error::AttentionError> {
    let (q, k, v) = (
        T::read::<B>(&saved.q)?,
        T::read::<B>(&saved.k)?,
        T::read::<B>(&saved.v)?,
    );
    let (out, grad) = (T::read::<B>(&saved.out)?, T::read::<B>(grad_out)?);
    let bias_values = saved
        .bias
        .as_ref()
        .map(|b| B::host_widened(b))
        .transpose()?;
    let masking = saved.call.masking(
        bias_values
            .as_deref()
            .zip(saved.bias.as_ref())
            .map(|(values, b)| (values, b.shape().dims::<4>())),
    );
    T::backward(
        &saved.call.shape,
        masking.fit(BACKWARD_TILES, saved.call.shape.dims.m),
        &masking,
        BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            grad_out: &grad,
            lse: &saved.lse,
        },
        outputs,
    )
}

impl<B: HostFloat + CpuKernelBackend, C: CheckpointStrategy> CpuKernelBackend for Autodiff<B, C> {
    fn cpu_kernel_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: MaybeBias<Self>,
        call: KernelCall,
    ) -> FloatTensor<Self> {
        let saved = |bias: Option<FloatTensor<B>>| {
            // Heads split by a transpose are strided: one contiguous copy each, read by the
            // forward here and by the backward later.
            let contiguous = |t: &FloatTensor<Self>| {
                B::contiguous(t.primitive().clone()).unwrap_or_else(|e| panic!("{e}"))
            };
            let (qp, kp, vp) = (contiguous(&q), contiguous(&k), contiguous(&v));
            let (out, lse) = forward::<B>(&qp, &kp, &vp, bias.as_ref(), &call);
            let state = SavedForward {
                q: qp,
                k: kp,
                v: vp,
                bias,
                out: out.clone(),
                lse: Arc::new(lse),
                call: call.clone(),
            };
            (state, out)
        };
        let untracked = |bias: Option<FloatTensor<B>>| {
            let bias = MaybeBias::from_option(bias);
            B::cpu_kernel_attention(
                q.primitive().clone(),
                k.primitive().clone(),
                v.primitive().clone(),
                bias,
                call.clone(),
            )
        };
        match bias {
            MaybeBias::Absent => match KernelBackward::<3>
                .prepare::<C>([q.node(), k.node(), v.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (state, out) = saved(None);
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(untracked(None)),
            },
            MaybeBias::Present(bias) => match KernelBackward::<4>
                .prepare::<C>([q.node(), k.node(), v.node(), bias.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (state, out) = saved(Some(bias.primitive().clone()));
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(untracked(Some(bias.primitive().clone()))),
            },
        }
    }
}
