//! The command line's subcommands, as library functions so that tests can call them. The
//! binary (`src/main.rs`) only parses and maps results to exit codes.

pub mod bench;
pub mod golden;
pub mod report;
pub mod train;
pub mod train_bench;

use std::fmt;

/// A command-line value that is out of range: reported before anything is written, exit 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Opens a backend's device. A backend that is not compiled in (or unknown) is bad usage, and
/// so is one that is compiled in but finds no device on this machine (a GPU backend without its
/// GPU or driver: the error carries the runtime's own reason): exit 2 either way, before anything
/// runs or is written.
pub fn open_device(backend: crate::BackendKind) -> anyhow::Result<burn::prelude::Device> {
    backend
        .device()
        .map_err(|e| UsageError(e.to_string()).into())
}

/// The help of an `--implementation` flag: `what`, then every spelling the flag takes (from
/// [`Implementation::spellings`](crate::Implementation::spellings), so a new path shows up).
pub fn implementation_help(what: &str) -> String {
    format!(
        "{what}: {} (e.g. chunked:2)",
        crate::Implementation::spellings()
    )
}
