//! # burn-sdpa
//!
//! Scaled dot-product attention for [Burn](https://burn.dev) 0.22: softmax(QKᵀ·scale + M)·V as a
//! backend-generic module, with fused CPU and CubeCL kernels (forward and backward) and explicit,
//! tested semantics for the things attention implementations silently disagree on. The user
//! guide (`docs/guide/` in the repository) has the chapters; this page is the API.
//!
//! # Quick start
//!
//! A training-sized call on Flex takes the fused CPU kernel; `path` says which path a call
//! takes (the README's example):
//!
//! ```
//! use burn::prelude::*;
//! use burn::tensor::Distribution;
//! use burn_sdpa::{AttentionInput, ScaledDotProductAttentionConfig};
//!
//! let device = Device::flex().autodiff();
//! let attn = ScaledDotProductAttentionConfig::new().init(); // scale 1/√d_k, path: Auto
//! let x = |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Default, &device);
//! let q = x([2, 8, 256, 64]).require_grad(); // [b, h, n, d_k]
//! let (k, v) = (x([2, 8, 256, 64]), x([2, 8, 256, 64]));
//! let input = AttentionInput::new(q.clone(), k, v).causal();
//! println!("path: {}", attn.path(&input).unwrap()); // cpu_kernel, with the `flex` feature
//! let out = attn.forward(input);
//! let grads = out.context.sum().backward(); // the kernel's own backward
//! assert!(q.grad(&grads).is_some());
//! ```
//!
//! A burn-nn model switches to this crate's layers with its `use` line, and the module takes its
//! main options from its config (the README's example):
//!
//! ```
//! use burn::prelude::*;
//! use burn::tensor::Distribution;
//! // A burn-nn model switches with its `use` line; its records load unchanged:
//! // use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
//! use burn_sdpa::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
//! use burn_sdpa::{AttentionInput, CausalAlignment, ScalePolicy, ScaledDotProductAttentionConfig};
//!
//! let device = Device::flex();
//! let encoder = TransformerEncoderConfig::new(64, 256, 4, 2).init(&device); // width, d_ff, h, layers
//! let x = Tensor::<3>::random([2, 10, 64], Distribution::Default, &device);
//! let y = encoder.forward(TransformerEncoderInput::new(x));
//!
//! // The module itself, with its main options (each has a default):
//! let attn = ScaledDotProductAttentionConfig::new()
//!     .with_scale(ScalePolicy::InvSqrtDk)                  // | Unscaled | Fixed(f64)
//!     .with_causal_alignment(CausalAlignment::BottomRight) // | TopLeft (PyTorch's is_causal)
//!     .with_softcap(Some(50.0))                            // c·tanh(s/c) on the scores (Gemma 2)
//!     .init();
//! let q = Tensor::<4>::random([2, 8, 10, 16], Distribution::Default, &device); // [b, h, n, d]
//! let padding = Tensor::<2, Bool>::full([2, 10], false, &device);              // [b, m], true = pad
//! let input = AttentionInput::new(q.clone(), q.clone(), q).padding_mask(padding).causal();
//! let out = attn.forward(input.need_weights());
//! assert_eq!(out.context.dims(), [2, 8, 10, 16]); // weights: Some([b, h, n, m]), asked for
//! ```
//!
//! # Which type to use
//!
//! | you have | use |
//! |---|---|
//! | q, k, v tensors `[b, h, n, d]` | [`ScaledDotProductAttention`] (from [`ScaledDotProductAttentionConfig`]), called with an [`AttentionInput`] |
//! | activations `[b, n, d_model]` | [`MultiHeadSdpa`]: projections, grouped-query heads, rotary positions ([`RopeConfig`]), [`QkNorm`], sinks |
//! | a model built from burn-nn's layers | the drop-in layers of [`nn`]: the same configs, inputs and records |
//! | token-by-token generation | [`KvCache`] with [`MultiHeadSdpa::forward_cache`] (and `forward_cache_ragged` for prompts of different lengths) |
//! | masks to build | the [`mask`] helpers (padding, causal, windows, segment ids, ALiBi slopes) |
//! | attention statistics without the weights | [`AttentionInput::need_row_stats`], [`diagnostics::diagnostics_from_row_stats`] |
//! | data on the host, or tile tuning | [`cpu_kernel`] |
//! | a model's linear layers, layer norm and loss, fused on the CPU backends | [`rows`] ([`rows::linear_rows`], [`rows::cross_entropy`], ...): only worth it on Flex and NdArray, Burn's own layers elsewhere |
//!
//! Every option in one call:
//!
//! ```
//! use burn::prelude::*;
//! use burn_sdpa::{AttentionInput, CausalAlignment, Precision, ScalePolicy};
//! use burn_sdpa::ScaledDotProductAttentionConfig;
//! fn main() -> Result<(), burn_sdpa::AttentionError> {
//! let device = Device::flex();
//! let [b, h, n, m, d] = [2, 4, 8, 8, 16];
//! let x = |s: [usize; 4]| Tensor::<4>::random(s, burn::tensor::Distribution::Default, &device);
//! let (query, key, value) = (x([b, h, n, d]), x([b, h, m, d]), x([b, h, m, d]));
//! let padding = Tensor::<2, Bool>::full([b, m], false, &device); // true = padding
//! let mask = Tensor::<4, Bool>::full([1, 1, n, m], false, &device);
//! let bias = Tensor::<4>::zeros([1, h, n, m], &device);
//! let sink_logits = Tensor::<1>::zeros([h], &device);
//! let attn = ScaledDotProductAttentionConfig::new()
//!     .with_scale(ScalePolicy::InvSqrtDk)            // | Unscaled | Fixed(f64)
//!     .with_softcap(Some(50.0))                      // optional: c·tanh(s/c) on the scaled scores (Gemma 2)
//!     .with_dropout(0.0)                             // on the weights, training on autodiff devices only
//!     .with_causal_alignment(CausalAlignment::BottomRight) // | TopLeft
//!     .with_precision(Precision::Inputs)             // | Bf16: f32 inputs computed in bf16 (autocast)
//!     .with_quiet_softmax(false)                     // true: a zero logit in every denominator (softmax₁)
//!     .init();
//! let input = AttentionInput::new(query, key, value) // [b, h, n, d_k], [b, h_kv, m, d_k], [b, h_kv, m, d_v]
//!     .padding_mask(padding)                         // Tensor<2, Bool>, [b, m], true = padding
//!     .mask(mask)                                    // Tensor<4, Bool>, true = masked out, [b|1, h|1, n|1, m]
//!     .bias(bias)                                    // Tensor<4>, added to the scaled scores
//!     .causal()
//!     .window(4095, 0)                               // optional: sliding window, 4095 keys back (Mistral)
//!     .sinks(sink_logits)                            // optional: attention sinks, [h], learned (gpt-oss)
//!     .need_weights();
//! println!("{}", attn.path(&input)?);                // the path this call takes (it prints itself)
//! let out = attn.try_forward(input)?;                // a typed AttentionError instead of a panic
//! let context = out.context;                         // [b, h, n, d_v]
//! let weights = out.weights;                         // Option<[b, h, n, m]>, before dropout
//! assert_eq!(context.dims(), [b, h, n, d]);
//! assert_eq!(weights.unwrap().dims(), [b, h, n, m]);
//! Ok(())
//! }
//! ```
//!
//! # Feature flags
//!
//! The crate depends on `burn` without a backend: your project picks the backend. The features
//! only add fused kernels; without them every backend still runs the module through Burn's
//! tensor ops.
//!
//! | feature | what it adds |
//! |---|---|
//! | `flex` | the CPU kernel's fused forward and backward on Burn's Flex backend, reading its buffers in place (a backend extension) |
//! | `ndarray` | the same on Burn's NdArray backend |
//! | `cube` | the CubeCL flash kernel, forward and backward, on Burn's CubeCL backends (wgpu, CUDA, ROCm, Metal), through `Cube`, `Fusion` and `Autodiff`; turns on Burn's `fusion` |
//!
//! [`Implementation`] says what a call may run; `Auto` (the default) takes the fastest path that
//! can serve it.
//!
//! # Semantics
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
//! The full table, against PyTorch, Burn, burn-nn and FlashAttention, with NaN, sinks, ALiBi,
//! packed sequences and the rest, is the guide's semantics chapter (`docs/guide/semantics.md`).
//!
//! # Layout
//!
//! Each file is one concept, and imports run one way, from the bottom of this list up:
//!
//! | file | what it holds |
//! |---|---|
//! | `vocabulary.rs` | [`Implementation`] (what a user asks for), [`AttentionPath`] (what runs), both printing themselves, and [`BackendFamily`] |
//! | `error.rs` | [`AttentionError`] |
//! | `types.rs` | [`ScalePolicy`], [`CausalAlignment`], [`Window`], [`AttentionDims`](cpu_kernel::AttentionDims) |
//! | `options.rs` | [`AttentionOptions`]: scale, soft-cap, dropout, causal alignment, implementation, validated in one place |
//! | `input.rs` | [`AttentionInput`], [`AttentionOutput`], [`read_back`](util::read_back), and the validation every call goes through |
//! | `mask.rs` | the public [`mask`] helpers and the one mask builder every path uses |
//! | `paths/` | one file per path (`naive.rs`, `chunked.rs`, `fused.rs`, `cpu/`, and `cube/` with the `cube` feature), the validated call with its device facts and the shared score preparation (`call.rs`), the measured `Auto` rule (`auto.rs`), and `mod.rs`, the only place that chooses a path |
//! | `module.rs` | [`ScaledDotProductAttentionConfig`] and [`ScaledDotProductAttention`]: validate, resolve, run |
//! | `qk_norm.rs` | [`QkNorm`] and [`HeadNorm`], the per-head normalization of queries and keys |
//! | `rows.rs` | [`rows`]: [`rows::linear_rows`], [`rows::layer_norm`], [`rows::cross_entropy`] and the model's metrics, the row-wise layers of a training step, fused on the CPU backends (`paths/cpu/linear.rs`, `cross_entropy.rs`, `row_ops.rs`) |
//! | `mha.rs` | [`MultiHeadSdpa`] |
//! | `cache/` | [`KvCache`] (preallocated slots, ring buffer, per-sequence lengths) and the multi-head layer's cached decoding |
//! | `diagnostics.rs` | [`diagnostics::attention_diagnostics`], [`diagnostics::diagnostics_from_row_stats`] |
//! | `row_stats.rs` | [`RowStats`], the per-row statistics every path returns with [`AttentionInput::need_row_stats`] (the online accumulators of the chunked path in `paths/online_stats.rs`; the kernels carry the same ones) |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod cache;
pub mod diagnostics;
mod error;
mod input;
pub mod lse;
pub mod mask;
mod mha;
mod module;
pub mod nn;
mod options;
mod paths;
mod qk_norm;
mod rope;
mod row_stats;
pub mod rows;
mod types;
pub mod util;
mod vocabulary;

// The crate root holds what a user calls (`tests/library/root_names.rs` lists it, so that a new
// name here is a decision): the module, its config, input and output, the multi-head layer and
// its cache, the error type, and what chooses or shows a path. Everything else lives in a module.
pub use cache::KvCache;
pub use error::AttentionError;
pub use input::{AttentionInput, AttentionOutput, Segments};
pub use mha::{MultiHeadSdpa, MultiHeadSdpaConfig, MultiHeadSdpaInput, MultiHeadSdpaOutput};
pub use module::{ScaledDotProductAttention, ScaledDotProductAttentionConfig};
pub use options::AttentionOptions;
pub use paths::has_tensor_cores;
pub use qk_norm::{HeadNorm, QkNorm};
pub use rope::RopeConfig;
pub use row_stats::RowStats;
pub use types::{CausalAlignment, Precision, ScalePolicy, Softmax, Window};
pub use vocabulary::{AttentionPath, BackendFamily, Implementation};

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
    pub use crate::types::AttentionDims;
}
