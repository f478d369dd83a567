//! Merging partial attentions by their log-sum-exp: the building block of ring and
//! sequence-parallel attention (each device attends over its share of the keys; the partial
//! results merge exactly).

use burn::prelude::*;

/// Merges two attentions of the same queries over disjoint sets of keys, each given as its
/// context `[b, h, n, d_v]` and its log-sum-exp `[b, h, n]` (from
/// [`AttentionInput::need_lse`](crate::AttentionInput::need_lse)), into the attention over both
/// sets: `lse = log(e^lse₁ + e^lse₂)`, `context = e^(lse₁ − lse)·context₁ + e^(lse₂ − lse)·context₂`.
/// A row with no visible key in one part (lse −∞) takes the other part; in neither, it stays zero
/// with lse −∞. This is how ring attention combines the blocks of keys it receives.
///
/// # Shapes
/// - `first`, `second`: (`[b, h, n, d_v]`, `[b, h, n]`)
/// - returns (`[b, h, n, d_v]`, `[b, h, n]`)
///
/// ```
/// # use burn::prelude::*;
/// # use burn::tensor::Distribution;
/// use burn_sdpa::lse::merge_partial;
/// use burn_sdpa::{AttentionInput, ScaledDotProductAttentionConfig};
/// let device = Device::flex();
/// let q = Tensor::<4>::random([1, 2, 3, 4], Distribution::Default, &device);
/// let k = Tensor::<4>::random([1, 2, 6, 4], Distribution::Default, &device);
/// let v = Tensor::<4>::random([1, 2, 6, 4], Distribution::Default, &device);
/// let attn = ScaledDotProductAttentionConfig::new().init();
/// let part = |keys: std::ops::Range<usize>| {
///     let input = AttentionInput::new(
///         q.clone(),
///         k.clone().slice(s![.., .., keys.clone(), ..]),
///         v.clone().slice(s![.., .., keys, ..]),
///     );
///     let out = attn.forward(input.need_lse());
///     (out.context, out.lse.unwrap())
/// };
/// let (merged, _) = merge_partial(part(0..3), part(3..6));
/// let whole = attn.forward(AttentionInput::new(q, k, v)).context;
/// assert!((merged - whole).abs().max().into_scalar::<f32>() < 1e-5);
/// ```
pub fn merge_partial(
    first: (Tensor<4>, Tensor<3>),
    second: (Tensor<4>, Tensor<3>),
) -> (Tensor<4>, Tensor<3>) {
    let ((c1, l1), (c2, l2)) = (first, second);
    let [b, h, n, _] = c1.dims();
    // The larger of the two (finite whenever either is) keeps exp() in range.
    let max = l1.clone().max_pair(l2.clone());
    let none = max.clone().is_inf().bool_and(max.clone().lower_elem(0.0));
    let shift = max.clone().mask_fill(none.clone(), 0.0);
    let (w1, w2) = ((l1 - shift.clone()).exp(), (l2 - shift.clone()).exp());
    let total = w1.clone() + w2.clone();
    let lse = (shift + total.clone().log()).mask_fill(none.clone(), f64::NEG_INFINITY);
    let denominator = total.mask_fill(none, 1.0);
    // [b, h, n] -> [b, h, n, 1]
    let weight = |w: Tensor<3>| (w / denominator.clone()).reshape([b, h, n, 1]);
    let context = c1 * weight(w1) + c2 * weight(w2);
    (context, lse)
}
