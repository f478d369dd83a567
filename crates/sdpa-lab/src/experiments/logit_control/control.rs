//! The ways of keeping attention logits in range that `logit-control` compares.

use burn_sdpa::{QkNorm, ScalePolicy};
use serde::Serialize;

/// One way of controlling the logits' size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Control {
    /// 1/√d_k (the article, Vaswani et al.).
    Scaled,
    /// Nothing.
    Unscaled,
    /// `c · tanh(s / c)` on unscaled scores (Gemma 2's attention soft-cap, without the scale).
    SoftCap(f64),
    /// RMSNorm of every query and key head, unscaled (the norm's gain is learned).
    QkNorm,
    /// RMSNorm of every query and key head, then 1/√d_k (ViT-22B, OLMo 2).
    QkNormScaled,
}

impl Control {
    /// A short label for tables, plots and run folders.
    pub fn label(&self) -> String {
        match self {
            Control::Scaled => "1/√d_k".into(),
            Control::Unscaled => "none".into(),
            Control::SoftCap(c) => format!("cap {c}"),
            Control::QkNorm => "QK-norm".into(),
            Control::QkNormScaled => "QK-norm + 1/√d_k".into(),
        }
    }

    /// A file-name-safe label.
    pub fn slug(&self) -> String {
        match self {
            Control::Scaled => "scaled".into(),
            Control::Unscaled => "unscaled".into(),
            Control::SoftCap(c) => format!("cap{c}"),
            Control::QkNorm => "qknorm".into(),
            Control::QkNormScaled => "qknorm-scaled".into(),
        }
    }

    /// The scale policy.
    pub fn scale(&self) -> ScalePolicy {
        match self {
            Control::Scaled | Control::QkNormScaled => ScalePolicy::InvSqrtDk,
            _ => ScalePolicy::Unscaled,
        }
    }

    /// The soft-cap, if any.
    pub fn softcap(&self) -> Option<f64> {
        match self {
            Control::SoftCap(c) => Some(*c),
            _ => None,
        }
    }

    /// The QK-norm.
    pub fn qk_norm(&self) -> QkNorm {
        match self {
            Control::QkNorm | Control::QkNormScaled => QkNorm::RmsNorm,
            _ => QkNorm::None,
        }
    }
}
