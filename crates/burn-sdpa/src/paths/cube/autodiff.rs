//! `Autodiff` over the CubeCL kernel's backend extension: the forward op records q, k, v and
//! `extra` (the bias) as tracked inputs and saves what the backward kernels need; the backward
//! step registers dQ, dK, dV and the bias's gradient (the score gradient summed over the axes
//! the bias broadcasts).

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, TensorMetadata,
    tensor::{FloatTensor, IntTensor},
};

use super::extension::{CubeCall, CubeKernelBackend};

/// What the backward pass keeps from the forward.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    extra: FloatTensor<B>,
    q_segments: IntTensor<B>,
    k_segments: IntTensor<B>,
    slopes: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    call: CubeCall,
}

/// The backward step of q, k, v and `extra` (whose gradient, the score gradient summed over its
/// broadcast axes, flows back through the ops that built it to the bias).
#[derive(Debug)]
struct CubeBackward;

impl<B: CubeKernelBackend> Backward<B, 4> for CubeBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let extra_shape = s.extra.shape();
        let want_scores = ops.parents[3].is_some();
        let (dq, dk, dv, d_scores) = B::cube_kernel_backward(
            s.q,
            s.k,
            s.v,
            s.extra,
            s.q_segments,
            s.k_segments,
            s.slopes,
            s.out,
            s.lse,
            d_out,
            s.call,
            want_scores,
        );
        for (parent, grad) in ops.parents.iter().take(3).zip([dq, dk, dv]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
        if let Some(node) = &ops.parents[3] {
            // [b, h, n, m] summed over the axes `extra` broadcasts.
            let mut grad = d_scores;
            for axis in 0..4 {
                if extra_shape[axis] == 1 {
                    grad = B::float_sum_dim(grad, axis);
                }
            }
            grads.register::<B>(node.id, grad);
        }
    }
}

impl<B: CubeKernelBackend, C: CheckpointStrategy> CubeKernelBackend for Autodiff<B, C> {
    fn cube_kernel_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        q_segments: IntTensor<Self>,
        k_segments: IntTensor<Self>,
        slopes: FloatTensor<Self>,
        bad_keys: FloatTensor<Self>,
        bad_queries: FloatTensor<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (qp, kp, vp, ep) = (
            q.primitive().clone(),
            k.primitive().clone(),
            v.primitive().clone(),
            extra.primitive().clone(),
        );
        // ALiBi's slopes are constants (the module detaches them): not a tracked input.
        let sp = slopes.primitive().clone();
        // So are the non-finite flags (data, not parameters).
        let (bk, bq) = (
            bad_keys.primitive().clone(),
            bad_queries.primitive().clone(),
        );
        match CubeBackward
            .prepare::<C>([q.node(), k.node(), v.node(), extra.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, lse, stats) = B::cube_kernel_forward(
                    qp.clone(),
                    kp.clone(),
                    vp.clone(),
                    ep.clone(),
                    q_segments.clone(),
                    k_segments.clone(),
                    sp.clone(),
                    bk,
                    bq,
                    call,
                );
                let state = Saved {
                    q: qp,
                    k: kp,
                    v: vp,
                    extra: ep,
                    q_segments,
                    k_segments,
                    slopes: sp,
                    out: out.clone(),
                    lse: lse.clone(),
                    call,
                };
                (
                    prep.finish(state, out),
                    <Autodiff<B, C>>::from_inner(lse),
                    <Autodiff<B, C>>::from_inner(stats),
                )
            }
            OpsKind::UnTracked(prep) => {
                let (out, lse, stats) = B::cube_kernel_forward(
                    qp, kp, vp, ep, q_segments, k_segments, sp, bk, bq, call,
                );
                (
                    prep.finish(out),
                    <Autodiff<B, C>>::from_inner(lse),
                    <Autodiff<B, C>>::from_inner(stats),
                )
            }
        }
    }

    fn cube_kernel_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        q_segments: IntTensor<Self>,
        k_segments: IntTensor<Self>,
        slopes: FloatTensor<Self>,
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
        let (dq, dk, dv, d_scores) = B::cube_kernel_backward(
            q.primitive().clone(),
            k.primitive().clone(),
            v.primitive().clone(),
            extra.primitive().clone(),
            q_segments,
            k_segments,
            slopes.primitive().clone(),
            out.primitive().clone(),
            lse.primitive().clone(),
            d_out.primitive().clone(),
            call,
            want_scores,
        );
        (
            <Autodiff<B, C>>::from_inner(dq),
            <Autodiff<B, C>>::from_inner(dk),
            <Autodiff<B, C>>::from_inner(dv),
            <Autodiff<B, C>>::from_inner(d_scores),
        )
    }
}
