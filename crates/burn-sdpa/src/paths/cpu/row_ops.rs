//! The row-wise ops of a training step on the CPU backends as a Burn backend extension: the
//! row-parallel linear layer ([`super::linear`], `cpu_linear`), the layer norm
//! ([`super::layer_norm`], `cpu_layer_norm`) and the mean cross-entropy
//! ([`super::cross_entropy`], `cpu_cross_entropy`), for Flex and NdArray (reading their buffers
//! in place) and for `Autodiff` over them, each with its own backward pass.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{
    Autodiff, Backend, Dispatch, TensorMetadata, backend_extension, tensor::FloatTensor,
};
use burn::prelude::*;

use std::sync::Arc;

use super::extension::MaybeBias;
use super::host::HostFloat;
use super::{cross_entropy, layer_norm, linear};

/// The class of every row, checked against the number of classes.
#[derive(Debug, Clone)]
pub(crate) struct Targets(pub Arc<Vec<usize>>);

/// The ε of a layer norm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Epsilon(pub f64);

/// The ops. Calling one on a backend that is not listed panics: their callers check the device
/// first.
#[backend_extension(Flex: cfg(feature = "flex"), NdArray: cfg(feature = "ndarray"), Autodiff)]
pub(crate) trait CpuRowOps: Backend {
    /// `x W (+ b)`: x `[rows, d_in]`, W `[d_in, d_out]`, b `[d_out]` → `[rows, d_out]`.
    fn cpu_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        #[extension_type] bias: MaybeBias<Self>,
    ) -> FloatTensor<Self>;

    /// The mean cross-entropy `[1]` of logits `[rows, classes]` against `targets`.
    fn cpu_cross_entropy(logits: FloatTensor<Self>, targets: Targets) -> FloatTensor<Self>;

    /// The layer norm of every row of x `[rows, d]` with γ `[d]` (and β `[d]`) → `[rows, d]`.
    fn cpu_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        #[extension_type] beta: MaybeBias<Self>,
        epsilon: Epsilon,
    ) -> FloatTensor<Self>;
}

/// The layer norm of every row of `x` on tensors of a backend the extension lists.
///
/// # Shapes
/// - x: `[rows, d]`; gamma, beta: `[d]`
/// - returns `[rows, d]`
pub(crate) fn cpu_layer_norm(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    epsilon: f64,
) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as CpuRowOps>::cpu_layer_norm(
        x.into_dispatch(),
        gamma.into_dispatch(),
        MaybeBias::from_option(beta.map(Tensor::into_dispatch)),
        Epsilon(epsilon),
    ))
}

/// The layer norm's forward on the host: y and the rows' statistics.
fn layer_norm_forward<B: HostFloat>(
    x: &FloatTensor<B>,
    gamma: &FloatTensor<B>,
    beta: Option<&FloatTensor<B>>,
    epsilon: Epsilon,
) -> (FloatTensor<B>, layer_norm::RowStats) {
    let [rows, d] = x.shape().dims::<2>();
    let read = |t| B::host(t).unwrap_or_else(|e| panic!("{e}"));
    let (xs, gs) = (read(x), read(gamma));
    let bs = beta.map(read);
    let (y, stats) = layer_norm::forward(&xs, &gs, bs.as_deref(), d, epsilon.0);
    (B::from_host(y, [rows, d], x), stats)
}

/// The mean cross-entropy of `logits` against `targets` (each below the number of classes) on
/// tensors of a backend the extension lists.
///
/// # Shapes
/// - logits: `[rows, classes]`; targets: `rows` class ids
/// - returns `[1]`
pub(crate) fn cpu_cross_entropy(logits: Tensor<2>, targets: Vec<usize>) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as CpuRowOps>::cpu_cross_entropy(
        logits.into_dispatch(),
        Targets(Arc::new(targets)),
    ))
}

/// `x W (+ b)` on tensors of a backend the extension lists.
///
/// # Shapes
/// - x: `[rows, d_in]`; weight: `[d_in, d_out]`; bias: `[d_out]`
/// - returns `[rows, d_out]`
pub(crate) fn cpu_linear(x: Tensor<2>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as CpuRowOps>::cpu_linear(
        x.into_dispatch(),
        weight.into_dispatch(),
        MaybeBias::from_option(bias.map(Tensor::into_dispatch)),
    ))
}

/// The forward pass on the host.
///
/// # Panics
/// When a tensor is not `f32` (`linear_rows` checks the dtypes before calling the op).
fn forward<B: HostFloat>(
    x: &FloatTensor<B>,
    weight: &FloatTensor<B>,
    bias: Option<&FloatTensor<B>>,
) -> FloatTensor<B> {
    let [rows, d_in] = x.shape().dims::<2>();
    let [_, d_out] = weight.shape().dims::<2>();
    let read = |t| B::host(t).unwrap_or_else(|e| panic!("{e}"));
    let (xs, ws) = (read(x), read(weight));
    let bs = bias.map(read);
    let y = linear::forward(&xs, &ws, bs.as_deref(), d_in, d_out);
    B::from_host(y, [rows, d_out], x)
}

/// The cross-entropy's forward on the host: (loss `[1]`, each row's log-sum-exp).
fn cross_entropy_forward<B: HostFloat>(
    logits: &FloatTensor<B>,
    targets: &Targets,
) -> (FloatTensor<B>, Vec<f32>) {
    let [_, classes] = logits.shape().dims::<2>();
    let values = B::host(logits).unwrap_or_else(|e| panic!("{e}"));
    let (loss, lse) = cross_entropy::forward(&values, &targets.0, classes);
    (B::from_host(vec![loss], [1], logits), lse)
}

macro_rules! in_place_backend {
    ($backend:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        impl CpuRowOps for $backend {
            fn cpu_linear(
                x: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                bias: MaybeBias<Self>,
            ) -> FloatTensor<Self> {
                forward::<Self>(&x, &weight, bias.as_option())
            }

            fn cpu_cross_entropy(logits: FloatTensor<Self>, targets: Targets) -> FloatTensor<Self> {
                cross_entropy_forward::<Self>(&logits, &targets).0
            }

            fn cpu_layer_norm(
                x: FloatTensor<Self>,
                gamma: FloatTensor<Self>,
                beta: MaybeBias<Self>,
                epsilon: Epsilon,
            ) -> FloatTensor<Self> {
                layer_norm_forward::<Self>(&x, &gamma, beta.as_option(), epsilon).0
            }
        }
    };
}

in_place_backend!(burn::backend::Flex, "flex");
in_place_backend!(burn::backend::NdArray, "ndarray");

/// What the backward pass keeps: the input and the weight.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
}

/// The backward step, with N = 2 parents (x, weight) or 3 (and the bias).
#[derive(Debug)]
struct LinearBackward<const N: usize>;

impl<B: HostFloat, const N: usize> Backward<B, N> for LinearBackward<N> {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_out = grads.consume::<B>(&ops.node);
        let Saved { x, weight } = ops.state;
        let [rows, d_in] = x.shape().dims::<2>();
        let [_, d_out] = weight.shape().dims::<2>();
        let bias_node = if N == 3 { ops.parents[2].clone() } else { None };
        let want = [
            ops.parents[0].is_some(),
            ops.parents[1].is_some(),
            bias_node.is_some(),
        ];
        let read = |t| B::host(t).unwrap_or_else(|e| panic!("{e}"));
        let (xs, ws, gs) = (read(&x), read(&weight), read(&grad_out));
        let linear::LinearGrads {
            x: dx,
            weight: dw,
            bias: db,
        } = linear::backward(&xs, &ws, &gs, d_in, d_out, want);
        if let (Some(node), Some(dx)) = (&ops.parents[0], dx) {
            grads.register::<B>(node.id, B::from_host(dx, [rows, d_in], &x));
        }
        if let (Some(node), Some(dw)) = (&ops.parents[1], dw) {
            grads.register::<B>(node.id, B::from_host(dw, [d_in, d_out], &x));
        }
        if let (Some(node), Some(db)) = (bias_node, db) {
            grads.register::<B>(node.id, B::from_host(db, [d_out], &x));
        }
    }
}

/// What the cross-entropy's backward keeps.
#[derive(Debug, Clone)]
struct SavedLoss<B: Backend> {
    logits: FloatTensor<B>,
    targets: Targets,
    lse: Arc<Vec<f32>>,
}

/// The cross-entropy's backward step (one parent: the logits).
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: HostFloat> Backward<B, 1> for CrossEntropyBackward {
    type State = SavedLoss<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_out = grads.consume::<B>(&ops.node);
        let SavedLoss {
            logits,
            targets,
            lse,
        } = ops.state;
        let [rows, classes] = logits.shape().dims::<2>();
        let read = |t| B::host(t).unwrap_or_else(|e| panic!("{e}"));
        let grad = read(&grad_out)[0];
        let values = read(&logits);
        let dx = cross_entropy::backward(&values, &targets.0, &lse, classes, grad);
        if let Some(node) = &ops.parents[0] {
            grads.register::<B>(node.id, B::from_host(dx, [rows, classes], &logits));
        }
    }
}

/// What the layer norm's backward keeps.
#[derive(Debug, Clone)]
struct SavedNorm<B: Backend> {
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    stats: Arc<layer_norm::RowStats>,
}

/// The layer norm's backward step, with N = 2 parents (x, γ) or 3 (and β).
#[derive(Debug)]
struct LayerNormBackward<const N: usize>;

impl<B: HostFloat, const N: usize> Backward<B, N> for LayerNormBackward<N> {
    type State = SavedNorm<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_out = grads.consume::<B>(&ops.node);
        let SavedNorm { x, gamma, stats } = ops.state;
        let [rows, d] = x.shape().dims::<2>();
        let beta_node = if N == 3 { ops.parents[2].clone() } else { None };
        let want = [
            ops.parents[0].is_some(),
            ops.parents[1].is_some(),
            beta_node.is_some(),
        ];
        let read = |t| B::host(t).unwrap_or_else(|e| panic!("{e}"));
        let (xs, gs, dys) = (read(&x), read(&gamma), read(&grad_out));
        let layer_norm::LayerNormGrads {
            x: dx,
            gamma: dgamma,
            beta: dbeta,
        } = layer_norm::backward(&xs, &gs, &stats, &dys, d, want);
        if let (Some(node), Some(dx)) = (&ops.parents[0], dx) {
            grads.register::<B>(node.id, B::from_host(dx, [rows, d], &x));
        }
        if let (Some(node), Some(dgamma)) = (&ops.parents[1], dgamma) {
            grads.register::<B>(node.id, B::from_host(dgamma, [d], &x));
        }
        if let (Some(node), Some(dbeta)) = (beta_node, dbeta) {
            grads.register::<B>(node.id, B::from_host(dbeta, [d], &x));
        }
    }
}

impl<B: HostFloat + CpuRowOps, C: CheckpointStrategy> CpuRowOps for Autodiff<B, C> {
    fn cpu_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: MaybeBias<Self>,
        epsilon: Epsilon,
    ) -> FloatTensor<Self> {
        let (xp, gp) = (x.primitive().clone(), gamma.primitive().clone());
        let saved = |stats| SavedNorm {
            x: xp.clone(),
            gamma: gp.clone(),
            stats: Arc::new(stats),
        };
        match beta {
            MaybeBias::Absent => match LayerNormBackward::<2>
                .prepare::<C>([x.node(), gamma.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, stats) = layer_norm_forward::<B>(&xp, &gp, None, epsilon);
                    prep.finish(saved(stats), y)
                }
                OpsKind::UnTracked(prep) => {
                    prep.finish(layer_norm_forward::<B>(&xp, &gp, None, epsilon).0)
                }
            },
            MaybeBias::Present(beta) => {
                let bp = beta.primitive().clone();
                match LayerNormBackward::<3>
                    .prepare::<C>([x.node(), gamma.node(), beta.node()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        let (y, stats) = layer_norm_forward::<B>(&xp, &gp, Some(&bp), epsilon);
                        prep.finish(saved(stats), y)
                    }
                    OpsKind::UnTracked(prep) => {
                        prep.finish(layer_norm_forward::<B>(&xp, &gp, Some(&bp), epsilon).0)
                    }
                }
            }
        }
    }

    fn cpu_cross_entropy(logits: FloatTensor<Self>, targets: Targets) -> FloatTensor<Self> {
        let lp = logits.primitive().clone();
        match CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (loss, lse) = cross_entropy_forward::<B>(&lp, &targets);
                let state = SavedLoss {
                    logits: lp,
                    targets,
                    lse: Arc::new(lse),
                };
                prep.finish(state, loss)
            }
            OpsKind::UnTracked(prep) => prep.finish(cross_entropy_forward::<B>(&lp, &targets).0),
        }
    }

    fn cpu_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: MaybeBias<Self>,
    ) -> FloatTensor<Self> {
        let (xp, wp) = (x.primitive().clone(), weight.primitive().clone());
        let saved = || Saved {
            x: xp.clone(),
            weight: wp.clone(),
        };
        match bias {
            MaybeBias::Absent => match LinearBackward::<2>
                .prepare::<C>([x.node(), weight.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(saved(), forward::<B>(&xp, &wp, None)),
                OpsKind::UnTracked(prep) => prep.finish(forward::<B>(&xp, &wp, None)),
            },
            MaybeBias::Present(bias) => {
                let bp = bias.primitive().clone();
                match LinearBackward::<3>
                    .prepare::<C>([x.node(), weight.node(), bias.node()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        prep.finish(saved(), forward::<B>(&xp, &wp, Some(&bp)))
                    }
                    OpsKind::UnTracked(prep) => prep.finish(forward::<B>(&xp, &wp, Some(&bp))),
                }
            }
        }
    }
}
