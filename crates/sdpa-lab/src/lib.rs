//! # sdpa-lab
//!
//! Every experiment of the article *Attention 的数学推导* ("the mathematical derivation of
//! attention"), reproduced with `burn-sdpa` on any Burn backend and, where the article is wrong
//! or its code does not measure what its text says, corrected. Each experiment is one file in
//! [`experiments`]: a config, `run` on a [`LabContext`], a serializable result, a Markdown table
//! with the article's figures beside ours and a verdict, and PNG plots drawn from the saved
//! numbers.
#![warn(missing_docs)]

pub mod bench;
pub mod claims;
pub mod context;
pub mod experiments;
pub mod markdown;
pub mod memory;
pub mod parallel;
pub mod plot;
pub mod report;
pub mod stats;

pub use claims::{Claim, Outcome, Verdict};
pub use context::{LabBackend, LabContext, LabError};
pub use experiments::{Experiment, ExperimentOutput, all_experiments, find_experiment};
pub use report::{Report, run_report};
