//! # sdpa
//!
//! The root package of the reference scaled dot-product attention for Burn. It re-exports the
//! backend-free library [`burn_sdpa`] (the module, masks, multi-head layer, diagnostics), and
//! adds what needs a backend: run-time backend selection ([`backend`]) and the golden-case
//! runner ([`golden`]). Backends are cargo features: `ndarray`, `flex` (both on by default),
//! `wgpu` and `cuda`.

pub use burn_sdpa::*;

mod allocator;
pub mod backend;
pub mod cli;
pub mod golden;

pub use sdpa_lab as lab;
pub use sdpa_model as model;

pub use allocator::tune_allocator;
pub use backend::{BackendError, BackendKind};
