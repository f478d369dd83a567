//! The attention paths.

pub mod auto;
pub mod chunked;
pub mod cpu;
