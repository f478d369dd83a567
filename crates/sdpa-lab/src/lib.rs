//! # sdpa-lab
//!
//! Every experiment of the article *Attention 的数学推导* ("the mathematical derivation of
//! attention"), reproduced with `burn-sdpa` on any Burn backend and, where the article is wrong
//! or its code does not measure what its text says, corrected.
//!
//! Every experiment has one shape ([`experiment`]): a *plan* of independent cells, a *measure*
//! of one cell, a pure *analyze* that turns all cells into tables and [`Claim`]s, and a
//! *render* from the saved numbers. The [`runner`] owns the output folder, the cell cache
//! (resumable, re-renderable, shardable across machines), progress and parallelism.
//!
//! | layer | modules |
//! |---|---|
//! | runner and report | [`runner`], [`report`], `record`, `registry` |
//! | experiments | [`experiments`] (one folder each) |
//! | what experiments share | [`experiment`], [`measures`], [`claims`], `article` |
//! | tools | [`stats`], `plot`, `markdown`, [`memory`], `parallel`, `context`, `files` |

pub mod answers;
mod article;
pub mod bench;
pub mod claims;
mod context;
pub mod experiment;
pub mod experiments;
mod files;
mod markdown;
pub mod measures;
pub mod memory;
mod parallel;
mod plot;
mod record;
mod registry;
pub mod report;
pub mod runner;
pub mod stats;

pub use claims::{Claim, Outcome, Verdict};
pub use context::{Env, LabBackend, LabError};
pub use experiment::{Experiment, Plan, Stages};
pub use registry::{all_experiments, find_experiment};
pub use report::Report;
pub use runner::{RunOptions, RunOutcome, Shard};
