//! What the three flash kernels take besides their tensors of rows: one compile-time
//! configuration ([`FlashConfig`], one compiled kernel per value), the call's runtime scalars
//! ([`Scalars`]) and the tensors that add to or hide scores ([`Terms`]), each one launch
//! argument (cubek's blueprint shape); and the sentinel values the kernels write and read.

use cubecl::prelude::*;

/// A score that stands for −∞ (WGSL has no −∞ literal): far below any finite scaled score a
/// visible key gives, and its exponential underflows to 0. The masks reach the kernels as bias
/// entries of this value.
pub(crate) const HIDDEN: f32 = -3.0e38;

/// A bias entry at or below this hides its key: the masks come in as [`HIDDEN`], a −∞ bias
/// entry as itself.
pub(crate) const MASKED: f32 = -1.0e38;

/// The log-sum-exp the forward pass writes for a row with no visible key (the module's −∞; the
/// backward pass's weights `exp(s − lse)` are 0 for it).
pub(crate) const NO_KEY: f32 = 3.0e38;

/// The log-sum-exp the forward pass writes for a row the non-finite policy makes NaN (it sees a
/// key whose key or value row holds a NaN or ±∞, or a NaN or +∞ bias entry, or its own query
/// does and it sees a key): the module then writes NaN into its context, and the backward
/// pass's weights are 0 for it (the row is a constant).
pub(crate) const POISONED: f32 = 2.0e38;

/// Every log-sum-exp above this is one of the two sentinels ([`POISONED`], [`NO_KEY`]); a
/// finite row's is far below it.
pub(crate) const SENTINEL_FLOOR: f32 = 1.0e38;

/// The value between the two sentinels: a log-sum-exp above it is [`NO_KEY`], one between
/// [`SENTINEL_FLOOR`] and it is [`POISONED`].
pub(crate) const SENTINEL_SPLIT: f32 = POISONED / 2.0 + NO_KEY / 2.0;

/// One call's compile-time configuration, shared by the three kernels: the head sizes, the
/// tiling (`tile.rs`), which masks and terms the call has, and which optional outputs it
/// writes. A field a kernel does not read is `false` in its launches, so that it compiles once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FlashConfig {
    /// The query and key head size.
    pub d_k: usize,
    /// The value head size.
    pub d_v: usize,
    /// Rows per unit (the unit owns rows `u`, `u + UNITS`, ...).
    pub rows: usize,
    /// Rows per shared tile.
    pub tile_rows: usize,
    /// Whether rows reach the units by plane broadcasts rather than shared tiles.
    pub planes: bool,
    /// Whether the loops over d are unrolled.
    pub unroll_d: bool,
    /// Causal masking on the diagonal `i + offset`.
    pub causal: bool,
    /// Whether the window bounds the keys before the diagonal ([`Scalars::left`]).
    pub has_left: bool,
    /// Whether the window bounds the keys after the diagonal ([`Scalars::right`]).
    pub has_right: bool,
    /// Whether the scores are soft-capped ([`Scalars::softcap`]).
    pub capped: bool,
    /// Whether [`Terms::bias`] holds a bias or masks.
    pub has_bias: bool,
    /// Whether the segment ids are given.
    pub has_segments: bool,
    /// Whether ALiBi's slopes are given.
    pub has_alibi: bool,
    /// Whether the sinks are given (the forward kernel reads them).
    pub has_sinks: bool,
    /// Whether the forward kernel writes the row statistics.
    pub has_stats: bool,
    /// Whether the dK/dV kernel writes the score gradient.
    pub write_scores: bool,
}

/// One call's runtime scalars (one launch argument).
#[derive(CubeLaunch, CubeType, Clone)]
pub(crate) struct Scalars {
    /// The factor that multiplies QKᵀ.
    pub scale: f32,
    /// The soft-cap (read when [`FlashConfig::capped`]).
    pub softcap: f32,
    /// The diagonal's offset: query i's diagonal is `i + offset`.
    pub offset: i32,
    /// Keys before the diagonal a query sees (read when [`FlashConfig::has_left`]).
    pub left: i32,
    /// Keys after the diagonal a query sees (read when [`FlashConfig::has_right`]).
    pub right: i32,
}

/// The tensors that add to or hide scores (one launch argument), each a placeholder the kernels
/// do not read when the call has none (see [`FlashConfig`]). Every one is contiguous row-major.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Terms {
    /// `[b|1, h|1, n|1, m]`: the bias, with the masked keys at [`HIDDEN`] (or −∞).
    pub bias: OwnedTensor<f32>,
    /// `[b, n]`: the queries' segment ids.
    pub q_segments: OwnedTensor<i32>,
    /// `[b, m]`: the keys' segment ids.
    pub k_segments: OwnedTensor<i32>,
    /// `[2·h]`: ALiBi's slopes, then the attention sinks (finite or −∞).
    pub per_head: OwnedTensor<f32>,
}
