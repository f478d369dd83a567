//! The CPU flash kernel.

pub mod kernel;
