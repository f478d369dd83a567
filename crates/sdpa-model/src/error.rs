//! Errors of the model, the tasks and the training loop.

use std::path::{Path, PathBuf};

use burn_sdpa::AttentionError;
use thiserror::Error;

/// What went wrong.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A configuration value out of range.
    #[error("invalid {field} = {value}: {reason}")]
    InvalidConfig {
        /// The option or field.
        field: String,
        /// Its value.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The attention layer rejected its configuration or input.
    #[error(transparent)]
    Attention(#[from] AttentionError),
    /// Reading or writing a file failed.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause (in the message, not a separate source, so that it is printed once).
        cause: std::io::Error,
    },
    /// A checkpoint is missing, truncated or unreadable.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A run file other than a checkpoint's (`config.json`, `metrics.csv`) is damaged, too
    /// large, or not what this version writes.
    #[error("{path}: {reason}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The output folder could not be created (a path below a file, in a read-only or virtual
    /// file system such as /proc, or without permission): the user's choice of folder.
    #[error("cannot create the folder {path}: {cause} (choose another --out)")]
    CannotCreate {
        /// The folder.
        path: PathBuf,
        /// The operating system's reason.
        cause: std::io::Error,
    },
    /// A resume whose checkpoint and rows are not one run's: another run's checkpoint, config
    /// or `metrics.csv` copied in, or a checkpoint edited and sealed again. Nothing is changed.
    #[error(
        "{path} does not belong to the run of {checkpoint}: {reason}; refusing to resume (nothing was changed: restore the run's own files, or start afresh with --overwrite)"
    )]
    ForeignRun {
        /// The rows' file.
        path: PathBuf,
        /// The checkpoint's state.
        checkpoint: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// A saved run does not match the run it is resumed into.
    #[error(
        "{path} does not match the requested run: {field} is {saved} there but {requested} was asked for (a resume may change only --steps and --implementation)"
    )]
    Mismatch {
        /// The file holding the saved value.
        path: PathBuf,
        /// Which setting differs.
        field: String,
        /// The saved value.
        saved: String,
        /// The requested value.
        requested: String,
    },
    /// The run cannot start on the device it was given: a dtype its backend lacks, an
    /// attention path that cannot serve the model's calls there, a model that cannot be built.
    /// Found before anything is written or removed.
    #[error(
        "the run cannot start on {backend}: {reason} (choose an attention implementation and a dtype that this backend serves)"
    )]
    CannotStart {
        /// The backend's name.
        backend: String,
        /// Why not.
        reason: String,
    },
    /// Something other than a regular file where a run keeps one of its files (a FIFO, a
    /// device, a folder), or other than a folder where it keeps a folder.
    #[error(
        "{0} is not what a training run keeps there (a FIFO, a device, or a folder where a file belongs, or the reverse): refusing to read, replace or remove it (move it away or choose another folder)"
    )]
    NotAFile(PathBuf),
    /// A fresh run's output directory is not empty.
    #[error(
        "{dir} is not empty (it holds {found}): choose another --out, pass --resume to continue the run saved there, or --overwrite to replace a previous run's files (other files are never touched)"
    )]
    RunExists {
        /// The output directory.
        dir: PathBuf,
        /// One thing it holds.
        found: PathBuf,
    },
    /// A file in the run directory that no run wrote, where the run would have to replace it.
    #[error(
        "{0} was not written by a training run: refusing to remove it (move it away or choose another --out)"
    )]
    ForeignFile(PathBuf),
    /// Another process holds the directory.
    #[error(
        "{dir} is in use by another {what} ({holder}): one process at a time may write it (its lock is {lock})"
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// What kind of writer holds it ("training run", "lab run").
        what: String,
        /// Who holds it: pid and host, as the lock file says.
        holder: String,
        /// The lock file.
        lock: PathBuf,
    },
    /// A symbolic link where a run keeps its own file or folder.
    #[error(
        "{0} is a symbolic link where a training run keeps its own file or folder: refusing to follow it (remove the link or choose another --out)"
    )]
    Link(PathBuf),
    /// `metrics.csv` does not hold the rows the checkpoint's step needs.
    #[error(
        "{path} line {line}: {reason}; the checkpoint is at step {checkpoint_step} and every recorded step before it must be there once, in order (restore the file, or start afresh with --overwrite)"
    )]
    DamagedMetrics {
        /// The file.
        path: PathBuf,
        /// The line (1 is the header).
        line: usize,
        /// What is wrong there.
        reason: String,
        /// The checkpoint's step.
        checkpoint_step: usize,
    },
    /// A configuration needs more memory than the machine has.
    #[error(
        "{what} needs about {needed_gib:.2} GiB, more than this machine has available ({available_gib:.2} GiB): choose smaller sizes"
    )]
    TooLarge {
        /// What was estimated (the sizes that drive it).
        what: String,
        /// The estimate, in GiB.
        needed_gib: f64,
        /// The memory available, in GiB.
        available_gib: f64,
    },
    /// The loss or a gradient stopped being finite.
    #[error(
        "training diverged at step {step}: loss {loss}, gradient norm {grad_norm}; the run stopped there, {checkpoint}"
    )]
    Diverged {
        /// The step whose loss or gradient was not finite.
        step: usize,
        /// Its training loss.
        loss: f64,
        /// Its global gradient norm.
        grad_norm: f64,
        /// Where the last good checkpoint is, in words.
        checkpoint: String,
    },
}

impl ModelError {
    /// An [`ModelError::InvalidConfig`].
    pub fn invalid(field: &str, value: impl ToString, reason: &str) -> Self {
        ModelError::InvalidConfig {
            field: field.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Whether this is an I/O error of a folder the user cannot write (permission denied, or a
    /// read-only file system): the user's choice of folder, which the command line answers as
    /// bad usage, not as a failed run.
    pub fn is_unwritable(&self) -> bool {
        use std::io::ErrorKind;
        match self {
            ModelError::CannotCreate { .. } => true,
            ModelError::Io { cause, .. } => matches!(
                cause.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ),
            _ => false,
        }
    }

    /// A [`ModelError::CannotCreate`] of the folder `path`.
    pub fn cannot_create(path: &Path, cause: std::io::Error) -> Self {
        ModelError::CannotCreate {
            path: path.to_path_buf(),
            cause,
        }
    }

    /// An [`ModelError::Io`].
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
    }

    /// A [`ModelError::Damaged`].
    pub fn damaged(path: &Path, reason: impl ToString) -> Self {
        ModelError::Damaged {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }

    /// A [`ModelError::Checkpoint`].
    pub fn checkpoint(path: &Path, reason: impl ToString) -> Self {
        ModelError::Checkpoint {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}
