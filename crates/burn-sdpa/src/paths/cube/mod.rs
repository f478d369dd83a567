//! The flash kernel in CubeCL for Burn's CubeCL backends (wgpu, CUDA, ROCm, Metal), through the
//! backend extension, forward (`kernel.rs`) and backward (`backward.rs`, FlashAttention-2, no
//! atomics), registered for `Cube`, `Fusion` and `Autodiff` over them (`extension.rs`). The
//! module's semantics: scale, soft-cap, causal masking in both alignments, windows, grouped-query
//! heads, padding, masks and biases in any broadcast shape (with the bias's gradient), fully
//! masked rows giving zeros, the NaN policy of the tensor-op paths. Still to come: segments
//! and ALiBi tile by tile (they go in as one dense bias tensor), f16/bf16 (f32 only), tile sizes
//! measured on a GPU (the rows per unit were measured on lavapipe).

mod backward;
mod extension;
pub(crate) mod kernel;

use burn::tensor::DType;

use burn::prelude::*;

use super::call::Call;
use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::mask::{alibi_bias_for_keys, broadcast_or, segment_mask_for_keys, user_mask};
use crate::vocabulary::BackendFamily;

/// Why the CubeCL kernel cannot serve `call`, if it cannot.
pub(crate) fn blocker(call: &Call) -> Option<&'static str> {
    let input = &call.input;
    let f32_data = [&input.query, &input.key, &input.value]
        .iter()
        .all(|t| t.dtype() == DType::F32)
        && input.bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
    if call.family != BackendFamily::CubeCl {
        Some("it runs on the CubeCL backends only")
    } else if input.need_weights || input.need_scores {
        Some("it cannot return the weights or scores")
    } else if call.dropout.is_some() {
        Some("it has no dropout")
    } else if !f32_data {
        Some("it computes on f32 data only so far")
    } else {
        None
    }
}

/// The bias `[b|1, h|1, n|1, m]` the kernel adds to the soft-capped scores, with every key the
/// padding mask, the mask or the segments hide at [`kernel::MASKED`]'s −3e38, and ALiBi added:
/// `None` when there is none of them. (Dense where segments or ALiBi are given: the kernel does
/// not compute them tile by tile yet.)
fn extra(call: &Call) -> Option<Tensor<4>> {
    let input = &call.input;
    let [_, _, n, m] = call.dims.scores_shape();
    let hidden = [
        user_mask(input),
        segment_mask_for_keys(input, &call.dims, 0..m),
    ]
    .into_iter()
    .flatten()
    .reduce(broadcast_or);
    let alibi = input
        .alibi_slopes
        .as_ref()
        .map(|slopes| alibi_bias_for_keys(slopes, n, m, 0..m, call.alignment, DType::F32));
    let bias = match (input.bias.clone(), alibi) {
        (Some(bias), Some(alibi)) => Some(broadcast_add(bias, alibi)),
        (bias, alibi) => bias.or(alibi),
    };
    match (bias, hidden) {
        (None, None) => None,
        (Some(bias), None) => Some(bias),
        (bias, Some(hidden)) => {
            let bias = bias.unwrap_or_else(|| Tensor::zeros([1, 1, 1, m], &hidden.device()));
            let (db, dh) = (bias.dims(), hidden.dims());
            let shape: [usize; 4] = core::array::from_fn(|i| db[i].max(dh[i]));
            Some(bias.expand(shape).mask_fill(hidden.expand(shape), -3.0e38))
        }
    }
}

/// `a + b`, broadcast to their common shape.
fn broadcast_add(a: Tensor<4>, b: Tensor<4>) -> Tensor<4> {
    let (da, db) = (a.dims(), b.dims());
    let shape: [usize; 4] = core::array::from_fn(|i| da[i].max(db[i]));
    a.expand(shape) + b.expand(shape)
}

/// Runs the kernel.
pub(crate) fn run(call: Call) -> Result<AttentionOutput, AttentionError> {
    let [_, _, n, m] = call.dims.scores_shape();
    let offset = call.alignment.offset(n, m);
    let window = call.input.window.and_then(|w| w.within(n, m));
    let to_i32 = |x: i64| i32::try_from(x).unwrap_or(if x < 0 { i32::MIN } else { i32::MAX });
    let cube_call = extension::CubeCall {
        scale: call.scale as f32,
        softcap: call.softcap.map(|c| c as f32),
        causal: call.input.causal,
        offset: to_i32(offset),
        has_extra: false,
        window: window.map_or((None, None), |w| {
            (
                w.left.map(|l| to_i32(l as i64)),
                w.right.map(|r| to_i32(r as i64)),
            )
        }),
    };
    let need_lse = call.input.need_lse;
    let extra = extra(&call);
    let cube_call = extension::CubeCall {
        has_extra: extra.is_some(),
        ..cube_call
    };
    let input = call.input;
    let device = input.query.device();
    let extra = extra.unwrap_or_else(|| Tensor::<4>::zeros([1, 1, 1, 1], &device));
    let (context, lse) = extension::forward(input.query, input.key, input.value, extra, cube_call);
    let mut output = AttentionOutput::from_context(context);
    if need_lse {
        // The kernel's +3e38 for a row with no visible key is the module's −∞.
        let hidden = lse.clone().greater_elem(1.0e38);
        output.lse = Some(lse.mask_fill(hidden, f32::NEG_INFINITY));
    }
    Ok(output)
}
