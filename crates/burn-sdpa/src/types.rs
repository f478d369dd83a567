//! The vocabulary of an attention call: how scores are scaled, how a causal mask is aligned, and
//! the validated sizes every path works with.

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
    }
}
