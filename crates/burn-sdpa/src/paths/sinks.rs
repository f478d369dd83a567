//! Attention sinks and quiet softmax around the paths: a logit per query head that joins every
//! row's softmax denominator and takes no value (quiet softmax is the sink 0 on every head, a
//! constant).
//!
//! Every path computes the sink inside its own softmax (the tensor-op paths with tensor ops, so
//! autodiff differentiates them; the two kernels start each row's running sum with the sink's
//! term). What is shared lives here:
//! - the policy for non-finite sinks: −∞ is no sink, NaN or +∞ make every row of the head NaN
//!   (as a NaN or +∞ bias poisons the rows that see it: every row sees its head's sink);
//! - the sinks' gradient on the kernel paths, whose hand-written backward passes differentiate q,
//!   k and v only: with P_sink = exp(sink_h − lse_i) (lse over the keys and the sink), the
//!   output O_i = Σ_j p_ij v_j has ∂O_i/∂sink_h = −P_sink·O_i, so
//!   `dL/dsink_h = −Σ_i P_sink·(dO_i·O_i)`. [`attach_gradient`] adds a term whose value is
//!   exactly zero and whose gradient is that one, so the kernels' backward passes are unchanged
//!   (their recomputed weights, exp(s − lse), already use the lse with the sink).

use burn::prelude::*;
use burn::tensor::FloatDType;

use crate::input::AttentionOutput;
use crate::mask::most_negative;
use crate::paths::call::Call;
use crate::types::AttentionDims;

/// The heads whose sink is NaN or +∞, `[1, h, 1, 1]`, when a call has sinks.
pub(crate) struct BadSinks(Option<Tensor<4, Bool>>);

/// Replaces NaN and +∞ sinks by 0 (the paths then see finite sinks or −∞) and says which heads
/// the policy makes NaN. Tensor ops only: nothing is read back.
pub(crate) fn sanitize(mut call: Call) -> (Call, BadSinks) {
    let Some(sinks) = call.input.sinks.take() else {
        return (call, BadSinks(None));
    };
    let h = sinks.dims()[0];
    let bad = sinks.clone().is_nan().bool_or(
        sinks
            .clone()
            .is_inf()
            .bool_and(sinks.clone().greater_elem(0.0)),
    );
    call.input.sinks = Some(sinks.mask_fill(bad.clone(), 0.0));
    (call, BadSinks(Some(bad.reshape([1, h, 1, 1]))))
}

impl BadSinks {
    /// Writes NaN into every row of the heads with a bad sink: the context, the weights and the
    /// log-sum-exp (constants: no gradient flows through them).
    pub(crate) fn apply(self, mut out: AttentionOutput) -> AttentionOutput {
        let Some(bad) = self.0 else {
            return out;
        };
        let [b, h, n, d_v] = out.context.dims();
        out.context = out
            .context
            .mask_fill(bad.clone().expand([b, h, n, d_v]), f64::NAN);
        out.weights = out.weights.map(|weights| {
            let shape = weights.dims();
            weights.mask_fill(bad.clone().expand(shape), f64::NAN)
        });
        // [1, h, 1, 1] -> [1, h, 1] -> [b, h, n]
        let rows = bad.reshape([1, h, 1]).expand([b, h, n]);
        out.lse = out.lse.map(|lse| lse.mask_fill(rows.clone(), f64::NAN));
        out.row_stats = out.row_stats.map(|stats| stats.poisoned(rows));
        out
    }
}

/// Whether a kernel path must add the sinks' gradient itself: an autodiff call with the
/// caller's sinks (quiet softmax's constant zeros have none; a sink tensor outside the graph
/// costs a few untracked element-wise ops).
pub(crate) fn tracked(call: &Call) -> bool {
    call.autodiff && call.learned_sinks && call.input.sinks.is_some()
}

/// `context` `[b, h, n, d_v]` with the gradient of `sinks` `[h]` attached (see the module's
/// doc); `lse` `[b, h, n]` is the forward's log-sum-exp over the keys and the sink (−∞ or NaN
/// where a row had no term at all or was poisoned: those rows take no part).
pub(crate) fn attach_gradient(context: Tensor<4>, lse: Tensor<3>, sinks: Tensor<1>) -> Tensor<4> {
    let [b, h, n, _] = context.dims();
    // In f32 whatever the context's dtype (a bf16 lse would cost P_sink percents).
    let lse = lse.detach().cast(FloatDType::F32);
    // [b, h, n] -> [b, h, n, 1]; a row without a finite log-sum-exp gets P_sink = 0.
    let lse = lse
        .clone()
        .mask_fill(lse.is_finite().bool_not(), f64::INFINITY)
        .reshape([b, h, n, 1]);
    // [h] -> [1, h, 1, 1]
    let sinks = sinks.cast(FloatDType::F32).reshape([1, h, 1, 1]);
    // −P_sink = −exp(sink − lse), [b, h, n, 1]: its derivative in the sink is −P_sink.
    let minus_p_sink = (sinks - lse).exp().neg();
    let zero = (minus_p_sink.clone() - minus_p_sink.detach()).cast(context.dtype());
    let out = context.clone().detach();
    let out = out.clone().mask_fill(out.is_finite().bool_not(), 0.0);
    context + out * zero
}

/// The sinks laid out as the rows of the scores `[b, h, n, 1]` (broadcast from `[1, h, 1, 1]`).
pub(crate) fn per_head(sinks: &Tensor<1>, dims: &AttentionDims) -> Tensor<4> {
    sinks.clone().reshape([1, dims.n_heads, 1, 1])
}

/// The sinks laid out as the grouped rows of the tensor-op paths, `[b, h_kv, g·n, 1]` (query
/// head `kv·g + gi`'s row i at `gi·n + i`).
pub(crate) fn per_grouped_row(sinks: &Tensor<1>, dims: &AttentionDims) -> Tensor<4> {
    let AttentionDims {
        batch,
        n_heads,
        n_kv_heads,
        n,
        ..
    } = *dims;
    // [h] -> [1, h, 1] -> [b, h, n] -> [b, h_kv, g·n, 1]
    sinks
        .clone()
        .reshape([1, n_heads, 1])
        .expand([batch, n_heads, n])
        .reshape([batch, n_kv_heads, dims.group() * n, 1])
}

/// A running maximum that starts at the sink: the sink itself (detached), or the dtype's most
/// negative finite value for a sink of −∞ (so that `exp(s − max)` never sees −∞ − −∞).
pub(crate) fn start_max(sinks: Tensor<4>) -> Tensor<4> {
    let fill = most_negative(sinks.dtype());
    sinks.detach().clamp_min(fill)
}
