//! The policy for NaN and infinite inputs, applied around the tensor-op paths (the CPU kernel
//! applies the same rule on its host data, in `cpu/nonfinite.rs`).
//!
//! **A query row's output is NaN exactly when it sees a key and something it reads is not
//! finite**: its own query, the key or value of a key it sees, or its bias at a key it sees
//! when that bias is NaN or +∞. A key it sees is one not hidden by the padding mask, the mask,
//! the causal mask, the window, another segment or a −∞ bias. Keys a row does not see never affect it, and a row that sees no
//! key keeps its zero output. The NaN rows are constants: gradients do not flow through them,
//! and the other rows' gradients are those of the same call with the non-finite values replaced
//! by zeros.
//!
//! Without this, the paths disagreed: a NaN query row gave a NaN row on the naive path and a zero
//! row through Flex's kernel, and a NaN value of a masked key leaked into every row through
//! `0 · NaN` in the weights-times-values product.

use burn::prelude::*;
use burn::tensor::TensorData;

use crate::input::AttentionOutput;
use crate::mask::{broadcast_or, segment_mask_for_keys, user_mask};
use crate::paths::call::Call;

/// The rows a call must output as NaN, `[b, h, n, 1]`.
pub(crate) struct Poisoned(Tensor<4, Bool>);

/// Replaces non-finite values of q, k, v by 0 and NaN or +∞ bias entries by 0, and says which
/// rows the policy makes NaN. Every step is a tensor op: nothing is read back.
pub(crate) fn sanitize(mut call: Call) -> (Call, Poisoned) {
    let [b, h, n, m] = call.dims.scores_shape();
    let (h_kv, group) = (call.dims.n_kv_heads, call.dims.group());
    let not_finite = |t: &Tensor<4>| t.clone().is_finite().bool_not();
    // [b, h, n, d_k] -> [b, h, n, 1]
    let bad_query = not_finite(&call.input.query).any_dim(3);
    // [b, h_kv, m, d] -> [b, h_kv, m, 1] -> [b, h_kv, 1, m] -> [b, h_kv, g, 1, m] -> [b, h, 1, m]
    let bad_key = not_finite(&call.input.key)
        .any_dim(3)
        .bool_or(not_finite(&call.input.value).any_dim(3))
        .swap_dims(2, 3)
        .unsqueeze_dim::<5>(2)
        .expand([b, h_kv, group, 1, m])
        .reshape([b, h, 1, m]);
    // Bias entries: −∞ hides the key, NaN and +∞ poison the rows that see it.
    let (hidden_by_bias, bad_bias) = match &call.input.bias {
        Some(bias) => (
            Some(bias.clone().is_inf().bool_and(bias.clone().lower_elem(0.0))),
            Some(
                bias.clone().is_nan().bool_or(
                    bias.clone()
                        .is_inf()
                        .bool_and(bias.clone().greater_elem(0.0)),
                ),
            ),
        ),
        None => (None, None),
    };
    // [b|1, h|1, n|1, m]: keys hidden from a row by something other than causality and the
    // window (the mask, a −∞ bias, another segment).
    let hidden = [
        user_mask(&call.input),
        hidden_by_bias,
        segment_mask_for_keys(&call.input, &call.dims, 0..m),
    ]
    .into_iter()
    .flatten()
    .reduce(broadcast_or);
    let bad = match bad_bias {
        Some(bad_bias) => broadcast_or(bad_key, bad_bias),
        None => bad_key,
    };
    let visible = hidden.map(Tensor::bool_not);
    let bad_visible = match &visible {
        Some(visible) => broadcast_or_and(bad, visible.clone()),
        None => bad,
    };
    let bands = visible_bands(&call);
    // [b, h, n, 1]: a visible bad key, and any visible key at all.
    let sees_bad = sees_any(bad_visible, bands.as_ref(), [b, h, n, m]);
    let sees_key = match visible {
        Some(visible) => sees_any(visible, bands.as_ref(), [b, h, n, m]),
        None => sees_any(
            Tensor::<4, Bool>::full([1, 1, 1, m], true, &call.input.query.device()),
            bands.as_ref(),
            [b, h, n, m],
        ),
    };
    let poisoned = sees_bad.bool_or(bad_query.bool_and(sees_key.clone()));

    let zero_bad = |t: Tensor<4>| {
        let bad = t.clone().is_finite().bool_not();
        t.mask_fill(bad, 0.0)
    };
    call.input.query = zero_bad(call.input.query);
    call.input.key = zero_bad(call.input.key);
    call.input.value = zero_bad(call.input.value);
    call.input.bias = call.input.bias.map(|bias| {
        let bad = bias.clone().is_nan().bool_or(
            bias.clone()
                .is_inf()
                .bool_and(bias.clone().greater_elem(0.0)),
        );
        bias.mask_fill(bad, 0.0)
    });
    (call, Poisoned(poisoned))
}

/// `a & b`, broadcasting size-1 axes.
fn broadcast_or_and(a: Tensor<4, Bool>, b: Tensor<4, Bool>) -> Tensor<4, Bool> {
    let (da, db) = (a.dims(), b.dims());
    let target: [usize; 4] = core::array::from_fn(|i| da[i].max(db[i]));
    a.expand(target).bool_and(b.expand(target))
}

/// The keys each query row may see under the causal mask and the window, `lo_i..hi_i` for
/// every row i, or `None` when neither restricts the keys.
fn visible_bands(call: &Call) -> Option<(Vec<i64>, Vec<i64>)> {
    let (n, m) = (call.dims.n, call.dims.m);
    let offset = call.alignment.offset(n, m);
    if !call.input.causal && call.input.window.is_none() {
        return None;
    }
    (0..n)
        .map(|i| {
            let mut keys = call
                .input
                .window
                .map_or(0..m, |window| window.keys(i, offset, m));
            if call.input.causal {
                keys.end = keys
                    .end
                    .min((i as i64 + offset + 1).clamp(0, m as i64) as usize);
            }
            (keys.start as i64, keys.end.max(keys.start) as i64)
        })
        .unzip::<_, _, Vec<_>, Vec<_>>()
        .into()
}

/// For each query row, whether some key j with `keys[.., j]` true lies in the row's band
/// `lo_i..hi_i` (all keys without `bands`): `[b|1, h|1, n|1, m]` -> `[b, h, n, 1]`.
///
/// With bands it takes, for every position p, the first true key at or after p (a reversed
/// running minimum) and compares the one at `lo_i` with `hi_i`; a row-independent `keys` stays
/// `[.., 1, m]`, so no `[n, m]` tensor is built unless `keys` has one already.
fn sees_any(
    keys: Tensor<4, Bool>,
    bands: Option<&(Vec<i64>, Vec<i64>)>,
    shape: [usize; 4],
) -> Tensor<4, Bool> {
    let [b, h, n, m] = shape;
    let device = keys.device();
    let Some((lo, hi)) = bands else {
        return keys.any_dim(3).expand([b, h, n, 1]);
    };
    let [kb, kh, kn, _] = keys.dims();
    // [n] -> [1, 1, n, 1]
    let hi = Tensor::<1, Int>::from_data(TensorData::new(hi.clone(), [n]), &device)
        .float()
        .reshape([1, 1, n, 1]);
    let lo = Tensor::<1, Int>::from_data(TensorData::new(lo.clone(), [n]), &device);
    // The position of each true key, m for a false one, and a last column m:
    // [kb, kh, kn, m] -> [kb, kh, kn, m + 1]
    let positions = Tensor::<1, Int>::arange(0..m as i64, &device)
        .float()
        .reshape([1, 1, 1, m])
        .expand([kb, kh, kn, m])
        .mask_fill(keys.bool_not(), m as f64);
    let end = Tensor::<4>::full([kb, kh, kn, 1], m as f64, (&device, positions.dtype()));
    // next[.., p] = the first true key at or after p (m when none).
    let next = Tensor::cat(vec![positions, end], 3)
        .flip([3])
        .cummin(3)
        .flip([3]);
    let first_from_lo = if kn == 1 {
        // [kb, kh, 1, m + 1] -> [kb, kh, 1, n] -> [kb, kh, n, 1]
        next.select(3, lo).swap_dims(2, 3)
    } else {
        // [n] -> [1, 1, n, 1] -> [kb, kh, n, 1]
        next.gather(3, lo.reshape([1, 1, n, 1]).expand([kb, kh, n, 1]))
    };
    first_from_lo
        .expand([b, h, n, 1])
        .lower(hi.expand([b, h, n, 1]))
}

impl Poisoned {
    /// Writes NaN into the poisoned rows of the context (and of the weights, when asked for).
    pub(crate) fn apply(self, mut out: AttentionOutput) -> AttentionOutput {
        let rows = self.0;
        let [b, h, n, d_v] = out.context.dims();
        out.context = out
            .context
            .mask_fill(rows.clone().expand([b, h, n, d_v]), f64::NAN);
        out.weights = out.weights.map(|weights| {
            let shape = weights.dims();
            weights.mask_fill(rows.clone().expand(shape), f64::NAN)
        });
        // [b, h, n, 1] -> [b, h, n]
        out.row_stats = out
            .row_stats
            .map(|stats| stats.poisoned(rows.reshape([b, h, n])));
        out
    }
}
