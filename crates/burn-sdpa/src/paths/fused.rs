//! The fused path: Burn's own `burn::tensor::module::attention` (Flex's tiled CPU kernel,
//! CubeCL's flash kernel, Burn's fallback elsewhere and under autodiff).
//!
//! Burn's op knows soft-capping but not windows: a window reaches it as an explicit `[n, m]`
//! mask (the CPU kernel and the chunked path skip the hidden keys instead).

use burn::prelude::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::mask::{
    alibi_bias_for_keys, broadcast_or, segment_mask_for_keys, user_mask, window_mask,
};

/// Keys per block of the pass that computes the log-sum-exp when it is asked for.
const LSE_BLOCK: usize = 256;
use crate::paths::call::Call;
use crate::types::CausalAlignment;

/// Why the fused path cannot serve `call`, if it cannot.
pub(crate) fn blocker(call: &Call) -> Option<&'static str> {
    if call.input.need_weights || call.input.need_scores {
        Some("it cannot return the weights or scores")
    } else if call.dropout.is_some() {
        Some("it has no dropout")
    } else if call.input.causal
        && call.alignment == CausalAlignment::TopLeft
        && call.dims.n != call.dims.m
    {
        Some("it only knows bottom-right causal alignment (n != m here)")
    } else {
        None
    }
}

/// Delegates to `burn::tensor::module::attention`, with the key/value heads repeated for
/// grouped-query attention and the padding and user masks or-ed into one mask.
pub(crate) fn run(call: Call) -> Result<AttentionOutput, AttentionError> {
    let [b, h, n, m] = call.dims.scores_shape();
    let (h_kv, d_k, d_v) = (call.dims.n_kv_heads, call.dims.d_k, call.dims.d_v);
    let group = call.dims.group();
    let window = call.input.window.map(|window| {
        let device = call.input.query.device();
        // [n, m] -> [1, 1, n, m]
        window_mask(n, m, window, call.alignment, &device).unsqueeze::<4>()
    });
    let mask = [
        user_mask(&call.input),
        window,
        segment_mask_for_keys(&call.input, &call.dims, 0..m),
    ]
    .into_iter()
    .flatten()
    .reduce(broadcast_or)
    .map(|mask| mask.expand([b, h, n, m]));
    // ALiBi reaches Burn's op as a dense bias, added to the user's.
    let alibi = call.input.alibi_slopes.as_ref().map(|slopes| {
        alibi_bias_for_keys(slopes, n, m, 0..m, call.alignment, call.input.query.dtype())
            .expand([b, h, n, m])
    });
    let bias = match (call.input.bias.clone(), alibi) {
        (Some(bias), Some(alibi)) => Some(bias.expand([b, h, n, m]) + alibi),
        (bias, alibi) => bias.map(|bias| bias.expand([b, h, n, m])).or(alibi),
    };
    // Burn's op returns no log-sum-exp and no row statistics: when asked for, they come from the
    // chunked path's online softmax (a second pass over the keys, O(n · block) memory, without
    // autodiff: it only feeds detached statistics).
    let rows = (call.input.need_lse || call.input.need_row_stats).then(|| {
        let mut stats_call = call.clone();
        stats_call.dropout = None;
        stats_call.input.query = stats_call.input.query.detach();
        stats_call.input.key = stats_call.input.key.detach();
        stats_call.input.value = stats_call.input.value.detach();
        stats_call.input.bias = stats_call.input.bias.map(Tensor::detach);
        stats_call.input.sinks = stats_call.input.sinks.map(Tensor::detach);
        super::chunked::context(&stats_call, LSE_BLOCK).1
    });
    let mut input = call.input;
    let (mut mask, mut bias) = (mask, bias);
    if let Some(sinks) = input.sinks.take() {
        // The sink as one more key in front: a zero key and value, its logit in the bias (Burn's
        // op adds the bias after the soft-cap, and cap(0) = 0), never hidden (a −∞ sink is
        // masked instead). With bottom-right alignment the real keys keep their diagonal.
        let device = input.query.device();
        let dtype = input.query.dtype();
        // [h] -> [1, h, 1, 1] -> [b, h, n, 1]
        let sinks = super::sinks::per_head(&sinks, &call.dims).cast(dtype);
        let absent = sinks.clone().is_inf();
        let column = sinks.mask_fill(absent.clone(), 0.0).expand([b, h, n, 1]);
        let absent = absent.expand([b, h, n, 1]);
        let rest = bias.unwrap_or_else(|| Tensor::zeros([b, h, n, m], (&device, dtype)));
        bias = Some(Tensor::cat(vec![column, rest], 3));
        let open = mask.unwrap_or_else(|| Tensor::full([b, h, n, m], false, &device));
        mask = Some(Tensor::cat(vec![absent, open], 3));
        // [b, h_kv, m, d] -> [b, h_kv, 1 + m, d]
        let zero_row = |t: Tensor<4>| {
            let [tb, th, _, td] = t.dims();
            Tensor::cat(vec![Tensor::zeros([tb, th, 1, td], (&device, dtype)), t], 2)
        };
        input.key = zero_row(input.key);
        input.value = zero_row(input.value);
    }
    // m, or 1 + m with a sink key.
    let m = input.key.dims()[2];
    let expand_heads = |t: Tensor<4>, d: usize| {
        if group == 1 {
            t
        } else {
            // [b, h_kv, m, d] -> [b, h_kv, 1, m, d] -> [b, h_kv, g, m, d] -> [b, h, m, d]
            t.unsqueeze_dim::<5>(2)
                .expand([b, h_kv, group, m, d])
                .reshape([b, h, m, d])
        }
    };
    let options = AttentionModuleOptions {
        // An explicit scale disables CubeCL's flash kernel: pass None for 1/√d_k, which is
        // Burn's default.
        scale: (call.scale != 1.0 / (d_k as f64).sqrt()).then_some(call.scale),
        softcap: call.softcap,
        is_causal: input.causal,
    };
    let context = attention(
        input.query,
        expand_heads(input.key, d_k),
        expand_heads(input.value, d_v),
        mask,
        bias,
        options,
    );
    let mut output = AttentionOutput::from_context(context);
    if let Some(rows) = rows {
        output.lse = rows.lse;
        output.row_stats = rows.stats;
    }
    Ok(output)
}
