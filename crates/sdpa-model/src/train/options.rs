//! Where and how a run writes ([`RunOptions`]).

use std::path::PathBuf;

use crate::progress::ProgressMode;

/// Where and how a run writes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run directory.
    pub out_dir: PathBuf,
    /// Continue the run saved in `out_dir`.
    pub resume: bool,
    /// Backend name, recorded in the summary.
    pub backend: String,
    /// How progress is shown.
    pub progress: ProgressMode,
    /// For a fresh run into a directory that holds an earlier run: replace that run's files
    /// (any other file there still refuses the run).
    pub overwrite: bool,
}

impl RunOptions {
    /// A fresh run into `out_dir` on `backend`, with automatic progress display.
    pub fn new(out_dir: impl Into<PathBuf>, backend: impl Into<String>) -> Self {
        Self {
            out_dir: out_dir.into(),
            resume: false,
            backend: backend.into(),
            progress: ProgressMode::Auto,
            overwrite: false,
        }
    }
}
