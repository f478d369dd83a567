//! # burn-sdpa
//!
//! The reference scaled dot-product attention for [Burn](https://burn.dev) 0.22:
//! softmax(QKᵀ·scale + M)·V as a backend-generic module, with explicit and tested semantics
//! for the things that attention implementations silently disagree on.
//!
//! | question | this crate |
//! |---|---|
//! | boolean mask polarity | **true = masked out** (Burn, the article; PyTorch's bool `attn_mask` is the opposite) |
//! | causal alignment when n ≠ m | explicit: [`CausalAlignment::BottomRight`] (default, Burn/FlashAttention) or [`CausalAlignment::TopLeft`] (PyTorch `is_causal`) |
//! | a query with no visible key | zero context, zero weights, zero gradients; never NaN |
//! | additive bias | added to the *scaled* scores; −∞ entries mask |
//! | grouped-query attention | query head i uses kv head `i / (h / h_kv)` (PyTorch `enable_gqa`) |
//! | scale | [`ScalePolicy::InvSqrtDk`] (default), [`ScalePolicy::Unscaled`], [`ScalePolicy::Fixed`] |
//!
//! ```
//! use burn::prelude::*;
//! use burn_sdpa::{AttentionInput, ScaledDotProductAttentionConfig};
//!
//! let device = Device::flex();
//! let attn = ScaledDotProductAttentionConfig::new().init();
//! let q = Tensor::<4>::random([2, 4, 8, 16], burn::tensor::Distribution::Default, &device);
//! let k = Tensor::<4>::random([2, 4, 8, 16], burn::tensor::Distribution::Default, &device);
//! let v = Tensor::<4>::random([2, 4, 8, 32], burn::tensor::Distribution::Default, &device);
//! let out = attn.forward(AttentionInput::new(q, k, v).causal().need_weights());
//! assert_eq!(out.context.dims(), [2, 4, 8, 32]);
//! assert_eq!(out.weights.unwrap().dims(), [2, 4, 8, 8]);
//! ```
#![warn(missing_docs)]

pub mod diagnostics;
pub mod error;
pub mod mask;
pub mod mha;
pub mod module;
pub mod paths;

pub use module as sdpa;
pub use paths::cpu::kernel as cpu_kernel;
pub use paths::{auto, chunked};

pub use diagnostics::{AttentionDiagnostics, HeadDiagnostics, attention_diagnostics};
pub use error::AttentionError;
pub use mha::{MhaInput, MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig};
pub use module::{
    AttentionDims, AttentionInput, AttentionOutput, CausalAlignment, Implementation, Path,
    ScalePolicy, ScaledDotProductAttention, ScaledDotProductAttentionConfig,
};
