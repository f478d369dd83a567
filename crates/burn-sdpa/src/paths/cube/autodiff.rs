//! `Autodiff` over the CubeCL kernel's backend extension: the forward op records q, k, v and the
//! bias as tracked inputs and saves what the backward kernels need; the backward step registers
//! dQ, dK, dV and the bias's gradient (the score gradient summed over the axes the bias
//! broadcasts).

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, AutodiffBackend, Backend, TensorMetadata, tensor::FloatTensor};

use super::extension::{CubeCall, CubeKernelBackend, FlashInputs, Grads, OutputGrad, Outputs};

/// What the backward pass keeps from the forward.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    inputs: FlashInputs<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    call: CubeCall,
}

/// The backward step of q, k, v and the bias (whose gradient, the score gradient summed over its
/// broadcast axes, flows back through the ops that built it to the user's bias).
#[derive(Debug)]
struct CubeBackward;

impl<B: CubeKernelBackend> Backward<B, 4> for CubeBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let Saved {
            inputs,
            out,
            lse,
            call,
        } = ops.state;
        let bias_shape = inputs.bias.shape();
        let call = CubeCall {
            score_grads: ops.parents[3].is_some(),
            ..call
        };
        let grad = OutputGrad { out, lse, d_out };
        let (dq, dk, dv, d_scores) = B::cube_kernel_backward(inputs, grad, call);
        for (parent, grad) in ops.parents.iter().take(3).zip([dq, dk, dv]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
        if let Some(node) = &ops.parents[3] {
            // [b, h, n, m] summed over the axes the bias broadcasts.
            let mut grad = d_scores;
            for axis in 0..4 {
                if bias_shape[axis] == 1 {
                    grad = B::float_sum_dim(grad, axis);
                }
            }
            grads.register::<B>(node.id, grad);
        }
    }
}

/// The inner backend's inputs: every tensor a constant there (the segment ids, slopes, sinks and
/// flags are constants anyway: the module detaches them, and the sinks' gradient is attached by
/// `paths::run`).
fn inner<B: Backend, C: CheckpointStrategy>(
    inputs: &FlashInputs<Autodiff<B, C>>,
) -> FlashInputs<B> {
    inputs.clone().map(|t| t.primitive().clone(), |t| t)
}

impl<B: CubeKernelBackend, C: CheckpointStrategy> CubeKernelBackend for Autodiff<B, C> {
    fn cube_kernel_forward(inputs: FlashInputs<Self>, call: CubeCall) -> Outputs<Self> {
        let inner = inner(&inputs);
        let nodes = [&inputs.q, &inputs.k, &inputs.v, &inputs.bias].map(|t| t.node());
        let prep = CubeBackward.prepare::<C>(nodes).compute_bound().stateful();
        let (out, lse, stats) = B::cube_kernel_forward(inner.clone(), call);
        let out = match prep {
            OpsKind::Tracked(prep) => {
                let state = Saved {
                    inputs: inner,
                    out: out.clone(),
                    lse: lse.clone(),
                    call,
                };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        let wrap = <Autodiff<B, C>>::from_inner;
        (out, wrap(lse), wrap(stats))
    }

    fn cube_kernel_backward(
        inputs: FlashInputs<Self>,
        grad: OutputGrad<Self>,
        call: CubeCall,
    ) -> Grads<Self> {
        // The backward pass's own gradient is not tracked (no double backward).
        let inner_grad = OutputGrad {
            out: grad.out.primitive().clone(),
            lse: grad.lse.primitive().clone(),
            d_out: grad.d_out.primitive().clone(),
        };
        let grads = B::cube_kernel_backward(inner(&inputs), inner_grad, call);
        let wrap = <Autodiff<B, C>>::from_inner;
        (wrap(grads.0), wrap(grads.1), wrap(grads.2), wrap(grads.3))
    }
}
