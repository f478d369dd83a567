//! # burn-sdpa
//!
//! The reference scaled dot-product attention for [Burn](https://burn.dev) 0.22:
//! softmax(QKᵀ·scale + M)·V as a backend-generic module, with explicit and tested semantics
//! for the things that attention implementations silently disagree on.
//!
//! | question | this crate |
//! |---|---|
//! | boolean mask polarity | **true = masked out** (Burn, the article; PyTorch's bool `attn_mask` is the opposite) |
//! | padding | a `[b, m]` padding mask (true = padding) hides keys from every head and query |
//! | causal alignment when n ≠ m | explicit: [`CausalAlignment::BottomRight`] (default, Burn/FlashAttention) or [`CausalAlignment::TopLeft`] (PyTorch `is_causal`) |
//! | a query with no visible key | zero context, zero weights, zero gradients; never NaN |
//! | additive bias | added to the *scaled* scores; −∞ entries mask |
//! | grouped-query attention | query head i uses kv head `i / (h / h_kv)` (PyTorch `enable_gqa`) |
//! | scale | [`ScalePolicy::InvSqrtDk`] (default), [`ScalePolicy::Unscaled`], [`ScalePolicy::Fixed`] |
//! | logit soft-cap | optional `c · tanh(s / c)` on the scaled scores, before bias and masks (Burn's order) |
//! | local window | [`Window`]: query i sees keys `c − left ..= c + right`, `c = i + (m − n)` by default (FlashAttention's `window_size`) |
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
//!
//! # Layout
//!
//! Each file is one concept, and imports run one way, from the bottom of this list up:
//!
//! | file | what it holds |
//! |---|---|
//! | `vocabulary.rs` | [`Implementation`] (what a user asks for), [`AttentionPath`] (what runs), both printing themselves, and [`BackendFamily`] |
//! | `error.rs` | [`AttentionError`] |
//! | `types.rs` | [`ScalePolicy`], [`CausalAlignment`], [`Window`], [`AttentionDims`] |
//! | `options.rs` | [`AttentionOptions`]: scale, soft-cap, dropout, causal alignment, implementation, validated in one place |
//! | `input.rs` | [`AttentionInput`], [`AttentionOutput`], [`read_back`], and the validation every call goes through |
//! | `mask.rs` | the public [`mask`] helpers and the one mask builder every path uses |
//! | `paths/` | one file per path (`naive.rs`, `chunked.rs`, `fused.rs`, `cpu/`, and `cube/` with the `cube` feature), the validated call with its device facts and the shared score preparation (`call.rs`), the measured `Auto` rule (`auto.rs`), and `mod.rs`, the only place that chooses a path |
//! | `module.rs` | [`ScaledDotProductAttentionConfig`] and [`ScaledDotProductAttention`]: validate, resolve, run |
//! | `qk_norm.rs` | [`QkNorm`] and [`HeadNorm`], the per-head normalization of queries and keys |
//! | `rows.rs` | [`linear_rows`] and [`cross_entropy`], the row-wise layers of a training step, fused on the CPU backends (`paths/cpu/linear.rs`, `cross_entropy.rs`, `row_ops.rs`) |
//! | `mha.rs` | [`MultiHeadAttention`] |
//! | `cache/` | [`MhaCache`] (preallocated slots, ring buffer, per-sequence lengths) and the multi-head layer's cached decoding |
//! | `diagnostics.rs` | [`attention_diagnostics`], [`diagnostics_from_row_stats`] |
//! | `row_stats.rs` | [`RowStats`], the per-row statistics every path returns with [`AttentionInput::need_row_stats`] (the online accumulators of the chunked path in `paths/online_stats.rs`; the kernels carry the same ones) |

mod cache;
mod diagnostics;
mod error;
mod input;
mod lse;
pub mod mask;
mod mha;
mod module;
pub mod nn;
mod options;
mod paths;
mod qk_norm;
mod rope;
mod row_stats;
mod rows;
mod types;
mod vocabulary;

pub use cache::{INITIAL_CAPACITY, MhaCache};
pub use diagnostics::{
    AttentionDiagnostics, DIAGNOSTIC_VALUES, HeadDiagnostics, SATURATION_THRESHOLD,
    attention_diagnostics, diagnostics_from_row_stats, diagnostics_tensor,
};
pub use error::AttentionError;
pub use input::{AttentionInput, AttentionOutput, Segments, read_back};
pub use lse::merge_partial;
pub use mask::most_negative;
pub use mha::{MhaInput, MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig};
pub use module::{ScaledDotProductAttention, ScaledDotProductAttentionConfig};
pub use options::AttentionOptions;
pub use qk_norm::{HeadNorm, QkNorm};
pub use rope::RopeConfig;
pub use row_stats::RowStats;
pub use rows::{
    accuracy, cross_entropy, layer_norm, linear_rows, mean_and_std, try_accuracy, try_cross_entropy,
};
pub use types::{
    AttentionDims, CausalAlignment, Precision, ScalePolicy, Softmax, Window, validate_softcap,
};
pub use vocabulary::{AttentionPath, BackendFamily, DEFAULT_BLOCK_SIZE, Implementation};

/// The CPU flash kernel on host slices (what [`Implementation::CpuKernel`] runs), forward and
/// backward, for callers that hold their data on the host or want to tune its tiles.
pub mod cpu_kernel {
    pub use crate::paths::cpu::backward::{
        BACKWARD_TILES, BackwardInputs, BackwardOutputs, try_backward, try_backward_bf16,
    };
    pub use crate::paths::cpu::features::{cpu_features, softmax_isa};
    pub use crate::paths::cpu::kernel::{
        attention_f32, attention_f32_tiled, try_attention_f32_tiled, try_forward, try_forward_bf16,
    };
    pub use crate::paths::cpu::masking::{Alibi, Broadcast, HostSegments, Masking};
    pub use crate::paths::cpu::runs_in_place;
    pub use crate::paths::cpu::shape::{
        KEY_BLOCK, KernelShape, LONG_KEY_BLOCK, LONG_KEYS, QUERY_BLOCK, Tiles,
    };
    pub use crate::paths::cpu::threads;
    pub use crate::paths::cpu::tile_bf16::bf16_product_isa;
}
