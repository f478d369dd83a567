//! Scores that overflow the dtype on finite inputs (issue 51, item 6): one rule on every path.
//!
//! **The rule.** Scores are computed in the inputs' dtype, so finite inputs can give a score of
//! ±∞ (q = [3e38, 0] and k = [2, 0] at d_k = 2: 3e38 · 2 / √2 > `f32::MAX`). Where the exact
//! answer has a limit, a row gets it; where it has none, the row is NaN:
//! - the scores of a row that overflowed to +∞ share its weight evenly and its other keys get 0
//!   (the limit of the exact softmax as those scores grow together): each +∞ score becomes the
//!   dtype's largest finite value, a constant, so no gradient flows through it to q and k, and
//!   the values that got the weight get their share of the gradient;
//! - a score that overflowed to −∞ gets weight 0, as a very negative score would;
//! - a row that sees a key but whose every visible score overflowed to −∞, with no finite sink,
//!   has no limit (the ratios of its terms are lost): its context, weights, log-sum-exp and row
//!   statistics are NaN, constants (no gradient flows through them);
//! - a row with no visible key stays zero, as always;
//! - the log-sum-exp and row statistics of a row with a visible +∞ score are NaN (the
//!   log-sum-exp and the largest logit are infinite, the rest undefined), its visible-key count
//!   aside.
//!
//! The tensor-op paths (`Naive`, `Chunked`) apply it themselves. The kernels (`CpuKernel`,
//! `CubeKernel`, and Burn's op behind `Fused`) compute the scores inside their tiles and never
//! see them whole, so a call whose scores may overflow ([`may_overflow`], one small read-back per
//! call) takes the chunked path instead (`paths::resolve`), and the kernels only ever see
//! scores that cannot overflow.

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use crate::error::AttentionError;
use crate::input::read_back;
use crate::mask::most_negative;
use crate::paths::call::Call;

/// The largest finite value of `dtype` (`f32::MAX` for f32, 65504 for f16).
pub(crate) fn most_positive(dtype: DType) -> f64 {
    -most_negative(dtype)
}

/// `scores` with every +∞ replaced by the dtype's largest finite value, a constant: the +∞
/// scores of a row then share its weight evenly (each `exp(0)` after the row's maximum is
/// subtracted) and its finite scores get `exp(s − max)`, 0 in the dtype (a finite value below
/// the largest is at least one unit in the last place below it: 2·10³¹ in f32, 32 in f16, whose
/// `exp(−32)` rounds to 0 in f16); no gradient flows through the replaced entries.
pub(crate) fn cap_positive(scores: Tensor<4>) -> Tensor<4> {
    let top = most_positive(scores.dtype());
    scores.clamp_max(top)
}

/// For each row of `scores` `[b, h, rows, len]` (before [`cap_positive`]; `hidden` true = the
/// key is hidden from the row): whether it sees a key, `[b, h, rows, 1]`, and, when `above` is
/// asked, whether one of its visible scores is +∞.
pub(crate) fn seen_and_above(
    scores: &Tensor<4>,
    hidden: Option<&Tensor<4, Bool>>,
    above: bool,
) -> (Tensor<4, Bool>, Option<Tensor<4, Bool>>) {
    let [b, h, rows, _] = scores.dims();
    let seen = match hidden {
        Some(hidden) => hidden.clone().bool_not().any_dim(3),
        None => Tensor::<4, Bool>::full([b, h, rows, 1], true, &scores.device()),
    };
    let above = above.then(|| {
        // Above the largest finite value: +∞ (a finite comparison on every backend).
        let infinite = scores
            .clone()
            .detach()
            .greater_elem(most_positive(scores.dtype()));
        match hidden {
            Some(hidden) => infinite.bool_and(hidden.clone().bool_not()),
            None => infinite,
        }
        .any_dim(3)
    });
    (seen, above)
}

/// The magnitude from which a sum rounds to ±∞ in `dtype` (round to nearest): halfway between its
/// largest finite value and the next power of two (2¹²⁸ − 2¹⁰³ in f32, 65520 in f16).
pub(crate) fn overflows_from(dtype: DType) -> f64 {
    let top = most_positive(dtype);
    (top + 2f64.powi(top.log2().floor() as i32 + 1)) / 2.0
}

/// Whether some score of `call` may overflow its dtype. From the largest magnitudes of the
/// inputs: the dot products before and after scaling (a kernel may scale its sums at the end) are
/// bounded by `P = max(1, scale) · d_k · max|q| · max|k|`, the final score by `S + A + B`, with
/// `S` the scaled bound (or the soft-cap `c`, which bounds the capped score), `A = max|slope| ·
/// (n + m)` for ALiBi and `B` the largest finite |bias|. The call is safe when `2·P` and
/// `2·(S + A) + B` stay below [`overflows_from`] (the factor 2 covers the roundings of the
/// products and sums): a bias at the dtype's most negative value (a common additive mask) is no
/// risk by itself, as long as the scores stay below half a unit in its last place (5·10³⁰ in
/// f32, 8 in f16).
///
/// The maxima and minima of q, k and the bias (and the slopes' largest magnitude) are reduced on
/// the device and read back together: one read-back of a few values per call, and no
/// element-wise pass. A non-finite extreme (the non-finite policy's inputs, or a bias of −∞ that
/// masks keys) counts as the dtype's largest value, an upper bound of the finite ones; only when
/// that bound makes the call risky are the finite entries of those tensors reduced, in a second
/// read-back (NaN inputs, or a −∞-masking bias in f16), so that the kernels keep the calls whose
/// non-finite inputs the policy handles.
pub(crate) fn may_overflow(call: &Call) -> Result<bool, AttentionError> {
    let input = &call.input;
    let dtype = input.query.dtype();
    let top = most_positive(dtype);
    // [max, min] of a tensor, in f32.
    fn extremes<const D: usize>(t: &Tensor<D>) -> [Tensor<1>; 2] {
        let t = t.clone().detach();
        [t.clone().max(), t.min()].map(|x| x.cast(FloatDType::F32))
    }
    // The largest finite |x| of a tensor, [1] in f32 (0 when it has none).
    fn finite_max<const D: usize>(t: &Tensor<D>) -> Tensor<1> {
        let magnitude = t.clone().detach().abs();
        let not_finite = magnitude.clone().is_finite().bool_not();
        magnitude
            .mask_fill(not_finite, 0.0)
            .max()
            .cast(FloatDType::F32)
    }
    let mut parts: Vec<Tensor<1>> = Vec::with_capacity(7);
    parts.extend(extremes(&input.query));
    parts.extend(extremes(&input.key));
    if let Some(bias) = &input.bias {
        parts.extend(extremes(bias));
    }
    if let Some(slopes) = &input.alibi_slopes {
        parts.push(slopes.clone().detach().max_abs().cast(FloatDType::F32));
    }
    let read: Vec<f64> = read_back("the inputs' largest magnitudes", Tensor::cat(parts, 0))?;
    // q, k and the bias: the largest magnitude when both extremes are finite; else the dtype's
    // largest value, an upper bound of the finite entries (`None`: not exact).
    let magnitude = |i: usize| {
        let (hi, lo) = (read[2 * i], read[2 * i + 1]);
        (hi.is_finite() && lo.is_finite()).then(|| hi.abs().max(lo.abs()))
    };
    let mut maxima = [
        magnitude(0),
        magnitude(1),
        input.bias.as_ref().and_then(|_| magnitude(2)),
    ];
    let max_slope = if input.alibi_slopes.is_some() {
        read[read.len() - 1]
    } else {
        0.0
    };
    let dims = &call.dims;
    let limit = overflows_from(dtype);
    // Whether the call is safe with these magnitudes of q, k and the bias.
    let safe = |[max_q, max_k, max_bias]: [f64; 3]| {
        let dot = dims.d_k as f64 * max_q * max_k;
        let scaled = call.scale.abs() * dot;
        let score = call.softcap.map_or(scaled, f64::abs);
        let alibi = max_slope * (dims.n + dims.m) as f64;
        // A NaN bound (a NaN slope: refused before) counts as a risk.
        2.0 * dot.max(scaled) < limit && 2.0 * (score + alibi) + max_bias < limit
    };
    let bias_or_zero = |x: Option<f64>| {
        if input.bias.is_some() {
            x.unwrap_or(top)
        } else {
            0.0
        }
    };
    let bound = [
        maxima[0].unwrap_or(top),
        maxima[1].unwrap_or(top),
        bias_or_zero(maxima[2]),
    ];
    if safe(bound) {
        return Ok(false);
    }
    let tensors = [Some(&input.query), Some(&input.key), input.bias.as_ref()];
    let inexact: Vec<usize> = (0..3)
        .filter(|&i| tensors[i].is_some() && maxima[i].is_none())
        .collect();
    if inexact.is_empty() {
        return Ok(true);
    }
    let finite = inexact
        .iter()
        .filter_map(|&i| tensors[i].map(finite_max))
        .collect();
    let read: Vec<f64> = read_back(
        "the inputs' largest finite magnitudes",
        Tensor::cat(finite, 0),
    )?;
    for (&i, value) in inexact.iter().zip(read) {
        maxima[i] = Some(value);
    }
    Ok(!safe([
        maxima[0].unwrap_or(top),
        maxima[1].unwrap_or(top),
        bias_or_zero(maxima[2]),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_dtype_s_largest_finite_value() {
        assert_eq!(most_positive(DType::F32), f32::MAX as f64);
        assert_eq!(most_positive(DType::F16), 65504.0);
        assert_eq!(overflows_from(DType::F32), 2f64.powi(128) - 2f64.powi(103));
        assert_eq!(overflows_from(DType::F16), 65520.0);
        // `most_negative` spells bf16's largest value in 8 digits: the threshold within them.
        let bf16 = 2f64.powi(128) - 2f64.powi(119);
        assert!((overflows_from(DType::BF16) / bf16 - 1.0).abs() < 1e-7);
        // Just below the threshold a sum rounds to the largest value, at it to +∞.
        let below = overflows_from(DType::F32) - 2f64.powi(80);
        assert_eq!(below as f32, f32::MAX);
        assert_eq!(overflows_from(DType::F32) as f32, f32::INFINITY);
        let device = Device::flex();
        let scores = Tensor::<1>::from_floats([f32::INFINITY, f32::NEG_INFINITY, 1.0], &device)
            .reshape([1, 1, 1, 3]);
        let capped: Vec<f32> = read_back("capped", cap_positive(scores)).unwrap();
        assert_eq!(capped, [f32::MAX, f32::NEG_INFINITY, 1.0]);
    }
}
