//! The policy for NaN and infinite inputs, applied around the tensor-op paths (the CPU kernel
//! applies the same rule on its host data, in `cpu/nonfinite.rs`).
//!
//! **A query row's output is NaN exactly when it sees a key and something it reads is not
//! finite**: its own query, the key or value of a key it sees, or its bias at a key it sees
//! when that bias is NaN or +∞. A key it sees is one not hidden by the padding mask, the mask,
//! the causal mask or a −∞ bias. Keys a row does not see never affect it, and a row that sees no
//! key keeps its zero output. The NaN rows are constants: gradients do not flow through them,
//! and the other rows' gradients are those of the same call with the non-finite values replaced
//! by zeros.
//!
//! Without this, the paths disagreed: a NaN query row gave a NaN row on the naive path and a zero
//! row through Flex's kernel, and a NaN value of a masked key leaked into every row through
//! `0 · NaN` in the weights-times-values product.

use burn::prelude::*;

use crate::input::AttentionOutput;
use crate::mask::{broadcast_or, user_mask};
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
    // [b|1, h|1, n|1, m]: keys hidden from a row by something other than causality.
    let hidden = match (user_mask(&call.input), hidden_by_bias) {
        (Some(a), Some(b)) => Some(broadcast_or(a, b)),
        (a, b) => a.or(b),
    };
    let bad = match bad_bias {
        Some(bad_bias) => broadcast_or(bad_key, bad_bias),
        None => bad_key,
    };
    let visible = hidden.map(Tensor::bool_not);
    let bad_visible = match &visible {
        Some(visible) => broadcast_or_and(bad, visible.clone()),
        None => bad,
    };
    let offset = call.input.causal.then(|| call.alignment.offset(n, m));
    // [b, h, n, 1]: a visible bad key, and any visible key at all.
    let sees_bad = sees_any(bad_visible, offset, [b, h, n, m]);
    let sees_key = match visible {
        Some(visible) => sees_any(visible, offset, [b, h, n, m]),
        None => sees_any(
            Tensor::<4, Bool>::full([1, 1, 1, m], true, &call.input.query.device()),
            offset,
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

/// For each query row, whether some key j with `keys[.., j]` true is causally visible to it:
/// `[b|1, h|1, n|1, m]` -> `[b, h, n, 1]`. Without a causal offset it is an `any` over the keys;
/// with one, a row-independent `keys` gives its first true key and compares it with each row's
/// causal limit, so that no `[n, m]` tensor is built unless `keys` has one already.
fn sees_any(keys: Tensor<4, Bool>, offset: Option<i64>, shape: [usize; 4]) -> Tensor<4, Bool> {
    let [b, h, n, m] = shape;
    let device = keys.device();
    let Some(offset) = offset else {
        return keys.any_dim(3).expand([b, h, n, 1]);
    };
    // Row i sees keys j < limit_i = clamp(i + offset + 1, 0, m): [n] -> [1, 1, n, 1]
    let limits = Tensor::<1, Int>::arange(0..n as i64, &device)
        .add_scalar(offset + 1)
        .clamp(0, m as i64)
        .float()
        .reshape([1, 1, n, 1]);
    // The index of the first true key (m when none): [.., 1]
    let positions = Tensor::<1, Int>::arange(0..m as i64, &device)
        .float()
        .reshape([1, 1, 1, m]);
    let [kb, kh, kn, _] = keys.dims();
    let first = positions
        .expand([kb, kh, kn, m])
        .mask_fill(keys.bool_not(), m as f64)
        .min_dim(3);
    first
        .expand([b, h, n, 1])
        .lower(limits.expand([b, h, n, 1]))
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
            weights.mask_fill(rows.expand(shape), f64::NAN)
        });
        out
    }
}
