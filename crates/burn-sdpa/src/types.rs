//! The vocabulary of an attention call: how scores are scaled and capped, how a causal mask and
//! a local window are aligned, and the validated sizes every path works with.

use core::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::AttentionError;

/// How the scores QKᵀ are scaled before the softmax.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub enum ScalePolicy {
    /// Multiply by 1/√d_k (Vaswani et al.): keeps the logits' standard deviation near 1 when the
    /// query and key components have unit variance.
    #[default]
    InvSqrtDk,
    /// No scaling (the factor is 1): the logits' standard deviation grows like √d_k.
    Unscaled,
    /// Multiply by this factor; it must be finite and positive.
    Fixed(f64),
}

impl ScalePolicy {
    /// The factor that multiplies QKᵀ for a given d_k.
    pub fn factor(&self, d_k: usize) -> f64 {
        match self {
            ScalePolicy::InvSqrtDk => 1.0 / (d_k as f64).sqrt(),
            ScalePolicy::Unscaled => 1.0,
            ScalePolicy::Fixed(s) => *s,
        }
    }

    /// Checks that a fixed scale is finite and positive, also in f32 (the kernels compute in
    /// f32: 1e300 would be +∞ there, 1e-50 zero).
    pub fn validate(&self) -> Result<(), AttentionError> {
        match self {
            ScalePolicy::Fixed(s)
                if !(s.is_finite() && (*s as f32).is_finite() && (*s as f32) > 0.0) =>
            {
                Err(AttentionError::InvalidScale(*s))
            }
            _ => Ok(()),
        }
    }
}

/// The normalization of each row of scores.
///
/// A config saved before this option existed has no `softmax` field: it reads as
/// [`Softmax::Standard`], what those versions computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub enum Softmax {
    /// softmax(s): the weights of a row with a visible key sum to 1.
    #[default]
    Standard,
    /// Quiet softmax ("softmax₁", Miller 2023; Burn's `quiet_softmax`): a constant zero logit
    /// joins every row's denominator, `p_ij = exp(s_ij) / (1 + Σ_j' exp(s_ij'))`, so that a
    /// head can attend to nothing (a sink of 0 on every head, without a gradient).
    Quiet,
}

impl<'de> Deserialize<'de> for Softmax {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The serialized variants.
        #[derive(Deserialize)]
        enum Saved {
            Standard,
            Quiet,
        }
        // Through `Option`: serde reads a missing field (and null) as `None` only for options.
        Ok(match Option::<Saved>::deserialize(deserializer)? {
            None | Some(Saved::Standard) => Softmax::Standard,
            Some(Saved::Quiet) => Softmax::Quiet,
        })
    }
}

/// The dtype the attention computes in.
///
/// A config saved before this option existed has no `precision` field: it reads as
/// [`Precision::Inputs`], what those versions computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub enum Precision {
    /// The inputs' own dtype.
    #[default]
    Inputs,
    /// bf16 ("autocast"): query, key, value and bias are cast to bf16 for the attention and its
    /// outputs back to the inputs' dtype, so a model keeps f32 parameters and activations around
    /// a bf16 attention (whose fused kernels still take the softmax and every sum in f32);
    /// through autodiff the gradients come back in the inputs' dtype.
    Bf16,
}

impl<'de> Deserialize<'de> for Precision {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The serialized variants.
        #[derive(Deserialize)]
        enum Saved {
            Inputs,
            Bf16,
        }
        // Through `Option`: serde reads a missing field (and null) as `None` only for options.
        Ok(match Option::<Saved>::deserialize(deserializer)? {
            None | Some(Saved::Inputs) => Precision::Inputs,
            Some(Saved::Bf16) => Precision::Bf16,
        })
    }
}

impl Precision {
    /// Whether `device` can compute in this precision: an error naming the device when it has no
    /// bf16 tensors (NdArray; wgpu on some drivers).
    pub fn check_device(self, device: &burn::prelude::Device) -> Result<(), AttentionError> {
        if self == Precision::Bf16 && !device.supports_dtype(burn::tensor::FloatDType::BF16) {
            return Err(AttentionError::InvalidConfig {
                field: "precision",
                value: "Bf16".into(),
                reason: format!("this device ({device:?}) has no bf16 tensors"),
            });
        }
        Ok(())
    }

    /// The name the CLI and reports use: `inputs` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Inputs => "inputs",
            Precision::Bf16 => "bf16",
        }
    }
}

/// Which keys a causal query may see when the number of queries n differs from the number of
/// keys m. For n = m both alignments are the usual lower-triangular mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CausalAlignment {
    /// Key j is hidden from query i when j > i + (m − n): the last query sees every key.
    /// This is what Burn's `attention`, FlashAttention and KV-cache decoding use.
    #[default]
    BottomRight,
    /// Key j is hidden from query i when j > i: the first query sees the first key.
    /// This is PyTorch's `is_causal=True`.
    TopLeft,
}

impl CausalAlignment {
    /// The diagonal offset: key j is hidden from query i when j > i + offset.
    pub fn offset(&self, n: usize, m: usize) -> i64 {
        match self {
            CausalAlignment::BottomRight => m as i64 - n as i64,
            CausalAlignment::TopLeft => 0,
        }
    }
}

/// Checks a logit soft-cap `c` (scores become `c · tanh(s / c)`): finite and positive, also in
/// the f32 the kernels compute in.
pub fn validate_softcap(softcap: f64) -> Result<(), AttentionError> {
    let reason = if softcap.is_finite() && !(softcap as f32).is_finite() {
        // Finite in f64, but the kernels compute in f32 (or a half type) at most.
        Some(format!(
            "the soft-cap overflows f32 (its largest value is {:e}), the precision the kernels \
             compute in: give a soft-cap below it",
            f32::MAX
        ))
    } else if !(softcap.is_finite() && (softcap as f32) > 0.0) {
        Some("the soft-cap must be finite and > 0 (it divides the scores)".to_string())
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(AttentionError::InvalidConfig {
            field: "softcap",
            // The shortest text of the number (`1e300`, not three hundred digits).
            value: format!("{softcap:?}"),
            reason,
        }),
    }
}

/// A local (sliding-window) attention band: query i sees key j only when
/// `c − left ≤ j ≤ c + right`, where `c = i + offset` is the query's position on the diagonal of
/// the module's [`CausalAlignment`] (`offset = m − n` for bottom-right, the default and
/// FlashAttention's `window_size`; 0 for top-left). `None` leaves that side unbounded.
///
/// It combines with causal masking, masks and padding by union of what is hidden; a query left
/// with no visible key follows the zero-row rule.
///
/// ```
/// use burn_sdpa::Window;
/// // Mistral-style: each query sees itself and the 3 keys before it (with causal masking).
/// let window = Window::new(Some(3), Some(0));
/// assert_eq!(window.keys(5, 0, 8), 2..6);
/// assert!(window.hides(5, 1, 0) && !window.hides(5, 2, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Window {
    /// Keys before the diagonal a query sees (`None`: all of them).
    pub left: Option<usize>,
    /// Keys after the diagonal a query sees (`None`: all of them).
    pub right: Option<usize>,
}

impl Window {
    /// The band `left` keys before and `right` keys after the diagonal.
    pub fn new(left: Option<usize>, right: Option<usize>) -> Self {
        Self { left, right }
    }

    /// The same band for `n` queries and `m` keys with every side that reaches past all the
    /// keys left unbounded (no query's diagonal is more than `n + m` from any key, so such a
    /// side hides nothing); `None` when neither side bounds anything.
    ///
    /// ```
    /// use burn_sdpa::Window;
    /// assert_eq!(Window::new(Some(usize::MAX), Some(0)).within(4, 4), Some(Window::new(None, Some(0))));
    /// assert_eq!(Window::new(Some(8), None).within(4, 4), None);
    /// ```
    pub fn within(self, n: usize, m: usize) -> Option<Self> {
        let reach = n.saturating_add(m);
        let bound = |side: Option<usize>| side.filter(|&w| w < reach);
        let window = Self::new(bound(self.left), bound(self.right));
        (window != Self::default()).then_some(window)
    }

    /// The keys query `query_idx` sees among `0..m`, for the diagonal offset `offset`
    /// (empty when the band lies outside the keys).
    pub fn keys(&self, query_idx: usize, offset: i64, m: usize) -> Range<usize> {
        let centre = to_i64(query_idx).saturating_add(offset);
        let clamp = |x: i64| x.clamp(0, to_i64(m)) as usize;
        let start = self
            .left
            .map_or(0, |left| clamp(centre.saturating_sub(to_i64(left))));
        let end = self.right.map_or(m, |right| {
            clamp(centre.saturating_add(to_i64(right)).saturating_add(1))
        });
        start..end.max(start)
    }

    /// Whether key `key_idx` lies outside the band of query `query_idx`.
    pub fn hides(&self, query_idx: usize, key_idx: usize, offset: i64) -> bool {
        let (centre, j) = (to_i64(query_idx).saturating_add(offset), to_i64(key_idx));
        self.left
            .is_some_and(|left| j < centre.saturating_sub(to_i64(left)))
            || self
                .right
                .is_some_and(|right| j > centre.saturating_add(to_i64(right)))
    }
}

/// A size as `i64`, saturating (sizes beyond `i64::MAX` only arise as "unbounded" windows).
fn to_i64(x: usize) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// Checks that a mask or bias of `shape` broadcasts to the scores' shape `scores`.
pub(crate) fn check_broadcast(
    tensor: &'static str,
    shape: [usize; 4],
    scores: [usize; 4],
) -> Result<(), AttentionError> {
    let leading_ok = (0..3).all(|i| shape[i] == 1 || shape[i] == scores[i]);
    if leading_ok && shape[3] == scores[3] {
        Ok(())
    } else {
        Err(AttentionError::NotBroadcastable {
            tensor,
            shape,
            scores,
        })
    }
}

/// The validated sizes of an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Number of queries.
    pub n: usize,
    /// Number of keys.
    pub m: usize,
    /// Query/key feature size.
    pub d_k: usize,
    /// Value feature size.
    pub d_v: usize,
}

impl AttentionDims {
    /// The sizes of a call with query `[b, h, n, d_k]`, key `[b, h_kv, m, d_k]` and value
    /// `[b, h_kv, m, d_v]`, or why these shapes make none (an empty axis, different batches, key
    /// and value rows that differ, d_k that differs, or h not a multiple of h_kv): the shape
    /// checks every call goes through, usable before any tensor is allocated.
    ///
    /// ```
    /// use burn_sdpa::cpu_kernel::AttentionDims;
    /// let dims = AttentionDims::from_shapes([2, 8, 5, 16], [2, 2, 7, 16], [2, 2, 7, 32]).unwrap();
    /// assert_eq!((dims.group(), dims.scores_shape()), (4, [2, 8, 5, 7]));
    /// assert!(AttentionDims::from_shapes([2, 6, 5, 16], [2, 4, 7, 16], [2, 4, 7, 32]).is_err());
    /// ```
    pub fn from_shapes(
        query: [usize; 4],
        key: [usize; 4],
        value: [usize; 4],
    ) -> Result<Self, AttentionError> {
        let (q, k, v) = (query, key, value);
        for (tensor, shape) in [("query", q), ("key", k), ("value", v)] {
            if shape.contains(&0) {
                return Err(AttentionError::EmptyAxis {
                    tensor,
                    shape: shape.to_vec(),
                });
            }
        }
        if q[0] != k[0] || q[0] != v[0] {
            return Err(AttentionError::BatchMismatch {
                query: q,
                key: k,
                value: v,
            });
        }
        if k[1] != v[1] || k[2] != v[2] {
            return Err(AttentionError::KeyValueMismatch { key: k, value: v });
        }
        if q[3] != k[3] {
            return Err(AttentionError::DkMismatch { query: q, key: k });
        }
        if !q[1].is_multiple_of(k[1]) {
            return Err(AttentionError::HeadGrouping {
                n_heads: q[1],
                n_kv_heads: k[1],
            });
        }
        Ok(AttentionDims {
            batch: q[0],
            n_heads: q[1],
            n_kv_heads: k[1],
            n: q[2],
            m: k[2],
            d_k: q[3],
            d_v: v[3],
        })
    }

    /// Checks that a mask or bias (`tensor` names it) of `shape` broadcasts to the scores
    /// `[b, h, n, m]`: each leading axis 1 or the scores', the last m.
    pub fn check_broadcast(
        &self,
        tensor: &'static str,
        shape: [usize; 4],
    ) -> Result<(), AttentionError> {
        check_broadcast(tensor, shape, self.scores_shape())
    }

    /// Checks the shapes of the segment ids: `[b, n]` for the queries', `[b, m]` for the keys'.
    pub fn check_segments(&self, query: &[usize], key: &[usize]) -> Result<(), AttentionError> {
        for (what, axis, shape, len) in [
            ("query segment ids", "n", query, self.n),
            ("key segment ids", "m", key, self.m),
        ] {
            if shape != [self.batch, len] {
                return Err(AttentionError::Shape {
                    what,
                    expected: format!("[b, {axis}] = [{}, {len}]", self.batch),
                    got: shape.to_vec(),
                });
            }
        }
        Ok(())
    }

    /// Checks the shape of a tensor of one value per query head (`what`: the ALiBi slopes, the
    /// attention sinks): `[h]`.
    pub fn check_per_head(
        &self,
        what: &'static str,
        shape: &[usize],
    ) -> Result<(), AttentionError> {
        if shape == [self.n_heads] {
            Ok(())
        } else {
            Err(AttentionError::Shape {
                what,
                expected: format!("[h] = [{}]", self.n_heads),
                got: shape.to_vec(),
            })
        }
    }

    /// The shape of the scores and weights, `[b, h, n, m]`.
    pub fn scores_shape(&self) -> [usize; 4] {
        [self.batch, self.n_heads, self.n, self.m]
    }

    /// Query heads per key/value head (h / h_kv).
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_policies_and_alignments() {
        assert_eq!(ScalePolicy::InvSqrtDk.factor(64), 0.125);
        assert_eq!(ScalePolicy::Unscaled.factor(64), 1.0);
        assert_eq!(ScalePolicy::Fixed(0.3).factor(64), 0.3);
        assert!(ScalePolicy::Fixed(0.0).validate().is_err());
        assert!(ScalePolicy::Fixed(f64::NAN).validate().is_err());
        assert!(ScalePolicy::Fixed(1e300).validate().is_err());
        assert!(ScalePolicy::Fixed(1e-50).validate().is_err());
        assert!(ScalePolicy::Fixed(1e-3).validate().is_ok());
        assert_eq!(CausalAlignment::BottomRight.offset(2, 5), 3);
        assert_eq!(CausalAlignment::TopLeft.offset(2, 5), 0);
        assert!(validate_softcap(30.0).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300, 1e-50] {
            assert!(validate_softcap(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_window_keys_range_agrees_with_hides() {
        let windows = [
            Window::new(Some(2), Some(0)),
            Window::new(Some(0), Some(3)),
            Window::new(None, Some(1)),
            Window::new(Some(4), None),
            Window::new(None, None),
        ];
        for window in windows {
            for offset in [-3i64, 0, 4] {
                for query_idx in 0..6 {
                    let keys = window.keys(query_idx, offset, 7);
                    for key_idx in 0..7 {
                        assert_eq!(
                            keys.contains(&key_idx),
                            !window.hides(query_idx, key_idx, offset),
                            "{window:?} offset {offset} query {query_idx} key {key_idx}"
                        );
                    }
                }
            }
        }
    }
}
