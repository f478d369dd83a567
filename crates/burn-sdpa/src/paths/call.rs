//! One validated attention call as every path receives it, and the score preparation that the
//! tensor-op paths (naive, chunked) share.

use core::ops::Range;

use burn::nn::Dropout;
use burn::prelude::*;

use crate::input::AttentionInput;
use crate::mask::{alibi_bias_for_keys, mask_for_keys};
use crate::types::{AttentionDims, CausalAlignment};
use crate::vocabulary::BackendFamily;

/// A call whose shapes have been checked, with the module's settings and the device's facts
/// resolved for it (once per call: every path and the `Auto` rule read them from here).
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// The tensors, masks and options.
    pub input: AttentionInput,
    /// The validated sizes.
    pub dims: AttentionDims,
    /// The factor that multiplies QKᵀ.
    pub scale: f64,
    /// The causal alignment, used when `input.causal` and to centre `input.window`.
    pub alignment: CausalAlignment,
    /// The logit soft-cap, applied to the scaled scores before the bias.
    pub softcap: Option<f64>,
    /// Dropout on the weights, when it is active for this call (training flag on, p > 0,
    /// autodiff device).
    pub dropout: Option<Dropout>,
    /// The backend the call runs on.
    pub family: BackendFamily,
    /// Whether the call runs on an autodiff device (training).
    pub autodiff: bool,
    /// Whether the CPU kernel runs in place on this backend (its backend extension).
    pub kernel_in_place: bool,
    /// Whether the device offers matrix instructions ([`super::has_tensor_cores`]).
    pub tensor_cores: bool,
    /// Whether `input.sinks` are the caller's (which may carry a gradient), not quiet softmax's
    /// constant zeros.
    pub learned_sinks: bool,
}

impl Call {
    /// The query, scaled and regrouped so that the query heads of a key/value group form one
    /// batch of rows: `[b, h, n, d_k] -> [b, h_kv, g·n, d_k]`. Scaling Q (n·d_k elements) is
    /// cheaper than scaling the scores (n·m elements).
    pub fn grouped_query(&self) -> Tensor<4> {
        let AttentionDims {
            batch,
            n_kv_heads,
            n,
            d_k,
            ..
        } = self.dims;
        let mut query = self.input.query.clone();
        if self.scale != 1.0 {
            query = query.mul_scalar(self.scale);
        }
        // Query heads g·i .. g·(i+1) share kv head i, so grouping them is a reshape.
        query.reshape([batch, n_kv_heads, self.dims.group() * n, d_k])
    }

    /// The scaled (and soft-capped) scores plus bias of the keys `keys`, `[b, h, n, len]`, and
    /// the mask of those
    /// keys expanded to the same shape (`None` when nothing there is masked).
    ///
    /// `grouped_query` is [`grouped_query`](Self::grouped_query)'s result, computed once per
    /// call.
    pub fn scores(
        &self,
        grouped_query: &Tensor<4>,
        keys: Range<usize>,
    ) -> (Tensor<4>, Option<Tensor<4, Bool>>) {
        let [b, h, n, m] = self.dims.scores_shape();
        let len = keys.len();
        let all_keys = len == m;
        let key = if all_keys {
            self.input.key.clone()
        } else {
            self.input.key.clone().slice(s![.., .., keys.clone(), ..])
        };
        // [b, h_kv, g·n, d_k] @ [b, h_kv, d_k, len] -> [b, h_kv, g·n, len] -> [b, h, n, len]
        let mut scores = grouped_query
            .clone()
            .matmul(key.transpose())
            .reshape([b, h, n, len]);
        if let Some(cap) = self.softcap {
            // c · tanh(s / c): before the bias, as Burn's `module::attention` does.
            scores = scores.div_scalar(cap).tanh().mul_scalar(cap);
        }
        if let Some(slopes) = &self.input.alibi_slopes {
            // [1, h, n, len], added with the bias.
            scores = scores.clone()
                + alibi_bias_for_keys(slopes, n, m, keys.clone(), self.alignment, scores.dtype());
        }
        let bias = self.input.bias.as_ref().map(|bias| {
            if all_keys {
                bias.clone()
            } else {
                bias.clone().slice(s![.., .., .., keys.clone()])
            }
        });
        if let Some(bias) = &bias {
            scores = scores + bias.clone();
        }
        // [b|1, h|1, n|1, len] -> [b, h, n, len]
        let mask = mask_for_keys(&self.input, &self.dims, self.alignment, keys, bias.as_ref())
            .map(|mask| mask.expand([b, h, n, len]));
        (scores, mask)
    }

    /// The keys some query may see under the causal mask and the window: keys outside this
    /// range are hidden from every query, so the chunked path never computes them.
    pub fn reachable_keys(&self) -> Range<usize> {
        let AttentionDims { n, m, .. } = self.dims;
        let offset = self.alignment.offset(n, m);
        let mut keys = 0..m;
        if self.input.causal {
            // The last query sees the most keys: 0..=n − 1 + offset.
            keys.end = (n as i64 + offset).clamp(0, m as i64) as usize;
        }
        if let Some(window) = self.input.window {
            // The band's start grows with the query and its end too: the first query has the
            // lowest start, the last the highest end.
            let (first, last) = (window.keys(0, offset, m), window.keys(n - 1, offset, m));
            keys.start = keys.start.max(first.start);
            keys.end = keys.end.min(last.end);
        }
        keys.start..keys.end.max(keys.start)
    }

    /// The values of the keys `keys`, `[b, h_kv, len, d_v]`.
    pub fn values(&self, keys: Range<usize>) -> Tensor<4> {
        if keys.len() == self.dims.m {
            self.input.value.clone()
        } else {
            self.input.value.clone().slice(s![.., .., keys, ..])
        }
    }
}
