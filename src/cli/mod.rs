//! The command line's subcommands, as library functions so that tests can call them. The
//! binary (`src/main.rs`) only parses and maps results to exit codes.

pub mod golden;
pub mod report;
pub mod train;

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
