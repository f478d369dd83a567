//! `Autodiff` over the CubeCL kernel's backend extension: the forward op records q, k, v and the
//! bias as tracked inputs and saves what the backward kernels need; the backward step registers
//! dQ, dK, dV and the bias's gradient (the score gradient summed over the axes the bias
//! broadcasts).

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, AutodiffBackend, Backend, TensorMetadata, tensor::FloatTensor};

use super::extension::{CubeCall, CubeKernelBackend, FlashInputs};

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
        let want_scores = ops.parents[3].is_some();
        let (dq, dk, dv, d_scores) =
            B::cube_kernel_backward(inputs, out, lse, d_out, call, want_scores);
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

impl<B: Backend, C: CheckpointStrategy> FlashInputs<Autodiff<B, C>> {
    /// The inner backend's inputs (the segment ids, slopes and sinks are constants: the module
    /// detaches them, and the sinks' gradient is attached by `paths::run`).
    fn inner(&self) -> FlashInputs<B> {
        FlashInputs {
            q: self.q.primitive().clone(),
            k: self.k.primitive().clone(),
            v: self.v.primitive().clone(),
            bias: self.bias.primitive().clone(),
            q_segments: self.q_segments.clone(),
            k_segments: self.k_segments.clone(),
            per_head: self.per_head.primitive().clone(),
        }
    }
}

impl<B: CubeKernelBackend, C: CheckpointStrategy> CubeKernelBackend for Autodiff<B, C> {
    fn cube_kernel_forward(
        inputs: FlashInputs<Self>,
        bad_keys: FloatTensor<Self>,
        bad_queries: FloatTensor<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let inner = inputs.inner();
        let nodes = [&inputs.q, &inputs.k, &inputs.v, &inputs.bias].map(|t| t.node());
        let prep = CubeBackward.prepare::<C>(nodes).compute_bound().stateful();
        // The non-finite flags are data, not parameters: constants.
        let (out, lse, stats) = B::cube_kernel_forward(
            inner.clone(),
            bad_keys.primitive().clone(),
            bad_queries.primitive().clone(),
            call,
        );
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
        (
            out,
            <Autodiff<B, C>>::from_inner(lse),
            <Autodiff<B, C>>::from_inner(stats),
        )
    }

    fn cube_kernel_backward(
        inputs: FlashInputs<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        call: CubeCall,
        want_scores: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        // The backward pass's own gradient is not tracked (no double backward).
        let grads = B::cube_kernel_backward(
            inputs.inner(),
            out.primitive().clone(),
            lse.primitive().clone(),
            d_out.primitive().clone(),
            call,
            want_scores,
        );
        let wrap = <Autodiff<B, C>>::from_inner;
        (wrap(grads.0), wrap(grads.1), wrap(grads.2), wrap(grads.3))
    }
}
