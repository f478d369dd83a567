//! [`AttentionOptions`]: the one home of the options an attention layer fixes when it is built —
//! scale, soft-cap, dropout, causal alignment, implementation, precision and softmax — embedded by
//! [`ScaledDotProductAttentionConfig`](crate::ScaledDotProductAttentionConfig),
//! [`MultiHeadSdpaConfig`](crate::MultiHeadSdpaConfig) and the model's config, and
//! validated here only.

use burn::prelude::*;

use crate::error::AttentionError;
use crate::types::{CausalAlignment, Precision, ScalePolicy, Softmax, validate_softcap};
use crate::vocabulary::Implementation;

/// The options of an attention layer.
///
/// ```
/// use burn_sdpa::{AttentionOptions, ScalePolicy};
/// let options = AttentionOptions::new()
///     .with_scale(ScalePolicy::Unscaled)
///     .with_softcap(Some(30.0));
/// assert!(options.validate().is_ok());
/// assert!(options.with_softcap(Some(-1.0)).validate().is_err());
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct AttentionOptions {
    /// The scale policy; 1/√d_k by default, as in "Attention Is All You Need".
    #[config(default = "ScalePolicy::InvSqrtDk")]
    pub scale: ScalePolicy,
    /// Logit soft-capping (Gemma 2): the scaled scores s become `c · tanh(s / c)` before the bias
    /// is added and any mask takes effect (Burn's `module::attention` order). `None` by default:
    /// the article's attention has no cap.
    #[config(default = "None")]
    pub softcap: Option<f64>,
    /// Dropout on the attention weights, active only in training on autodiff devices. 0 by
    /// default: most modern models train attention without it.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Alignment of the causal mask (and a window's diagonal) when n ≠ m; bottom-right by default,
    /// like Burn and FlashAttention (it is what a KV cache needs).
    #[config(default = "CausalAlignment::BottomRight")]
    pub causal_alignment: CausalAlignment,
    /// The computation path; `Auto` picks the fastest correct one.
    #[config(default = "Implementation::Auto")]
    pub implementation: Implementation,
    /// The dtype the attention computes in: the inputs' own by default, or bf16 around f32
    /// inputs ([`Precision::Bf16`]).
    #[config(default = "Precision::Inputs")]
    pub precision: Precision,
    /// The row normalization: standard softmax by default, or quiet softmax
    /// ([`Softmax::Quiet`], Burn's `quiet_softmax`). A learned logit per head instead is an
    /// input: [`AttentionInput::sinks`](crate::AttentionInput::sinks).
    #[config(default = "Softmax::Standard")]
    pub softmax: Softmax,
}

impl AttentionOptions {
    /// Checks every option: a fixed scale and a soft-cap finite and > 0 (also in the f32 the
    /// kernels use), dropout in [0, 1), a chunked block size > 0.
    pub fn validate(&self) -> Result<(), AttentionError> {
        self.scale.validate()?;
        if let Some(softcap) = self.softcap {
            validate_softcap(softcap)?;
        }
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return Err(AttentionError::InvalidDropout(self.dropout));
        }
        if let Implementation::Chunked { block_size: 0 } = self.implementation {
            return Err(AttentionError::InvalidConfig {
                field: "implementation",
                value: "Chunked { block_size: 0 }".into(),
                reason: "the block size must be > 0".into(),
            });
        }
        Ok(())
    }

    /// The factor that multiplies QKᵀ for `d_k`, checked in the f32 the kernels use.
    pub fn scale_factor(&self, d_k: usize) -> Result<f64, AttentionError> {
        let factor = self.scale.factor(d_k);
        if (factor as f32).is_finite() && (factor as f32) > 0.0 {
            Ok(factor)
        } else {
            Err(AttentionError::InvalidScale(factor))
        }
    }
}

/// The setters of [`AttentionOptions`] on a config that embeds it as its `options` field, so
/// that `Config::new().with_scale(..)` reads as before.
macro_rules! option_setters {
    ($config:ty) => {
        impl $config {
            /// Sets the scale policy (see [`AttentionOptions::scale`](crate::AttentionOptions)).
            pub fn with_scale(mut self, scale: $crate::ScalePolicy) -> Self {
                self.options.scale = scale;
                self
            }

            /// Sets the logit soft-cap (see [`AttentionOptions::softcap`](crate::AttentionOptions)).
            pub fn with_softcap(mut self, softcap: Option<f64>) -> Self {
                self.options.softcap = softcap;
                self
            }

            /// Sets the dropout on the weights (see [`AttentionOptions::dropout`](crate::AttentionOptions)).
            pub fn with_dropout(mut self, dropout: f64) -> Self {
                self.options.dropout = dropout;
                self
            }

            /// Sets the causal alignment (see
            /// [`AttentionOptions::causal_alignment`](crate::AttentionOptions)).
            pub fn with_causal_alignment(mut self, alignment: $crate::CausalAlignment) -> Self {
                self.options.causal_alignment = alignment;
                self
            }

            /// Sets the computation path (see
            /// [`AttentionOptions::implementation`](crate::AttentionOptions)).
            pub fn with_implementation(mut self, implementation: $crate::Implementation) -> Self {
                self.options.implementation = implementation;
                self
            }

            /// Sets the row normalization (see
            /// [`AttentionOptions::softmax`](crate::AttentionOptions)).
            pub fn with_softmax(mut self, softmax: $crate::Softmax) -> Self {
                self.options.softmax = softmax;
                self
            }

            /// Quiet softmax on or off, as burn-nn's `quiet_softmax` flag (see
            /// [`Softmax::Quiet`](crate::Softmax)).
            pub fn with_quiet_softmax(mut self, quiet_softmax: bool) -> Self {
                self.options.softmax = if quiet_softmax {
                    $crate::Softmax::Quiet
                } else {
                    $crate::Softmax::Standard
                };
                self
            }

            /// Sets the dtype the attention computes in (see
            /// [`AttentionOptions::precision`](crate::AttentionOptions)).
            pub fn with_precision(mut self, precision: $crate::Precision) -> Self {
                self.options.precision = precision;
                self
            }
        }
    };
}
pub(crate) use option_setters;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_saved_before_the_precision_field_read_as_the_inputs_dtype_with_the_standard_softmax()
    {
        let saved = r#"{"scale": "InvSqrtDk", "softcap": null, "dropout": 0.0,
            "causal_alignment": "BottomRight", "implementation": "Auto"}"#;
        let options: AttentionOptions = serde_json::from_str(saved).expect("an old config");
        assert_eq!(options.precision, Precision::Inputs);
        assert_eq!(options.softmax, Softmax::Standard);
        let bf16 = AttentionOptions::new()
            .with_precision(Precision::Bf16)
            .with_softmax(Softmax::Quiet);
        let text = serde_json::to_string(&bf16).expect("serialize");
        let back: AttentionOptions = serde_json::from_str(&text).expect("round trip");
        assert_eq!(back, bf16);
        let wrong = saved.replace("\"Auto\"}", "\"Auto\", \"precision\": \"F64\"}");
        assert!(serde_json::from_str::<AttentionOptions>(&wrong).is_err());
    }
}
