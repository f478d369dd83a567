//! The run directory's files: which ones a run writes (everything else there is the user's and
//! is never touched), writes that survive a crash (write, fsync, rename, fsync the directory),
//! the checkpoint swap, and the recovery of a swap that a crash interrupted.
//!
//! A checkpoint is written whole into `checkpoint.tmp/`; then `checkpoint/` is renamed to
//! `checkpoint.old/`, `checkpoint.tmp/` to `checkpoint/`, and `checkpoint.old/` is removed. A
//! crash leaves at most one of these moments half done, and [`recover_checkpoint`] finishes or
//! undoes it.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// The files a run writes at the top of its directory.
pub(crate) const RUN_FILES: [&str; 3] = ["config.json", "metrics.csv", "summary.json"];
/// The files of a checkpoint directory.
pub(crate) const CHECKPOINT_FILES: [&str; 3] = ["model.bpk", "optim.bpk", "state.json"];
/// The checkpoint directory, the one being written, and the one being replaced.
pub(crate) const CHECKPOINT_DIRS: [&str; 3] = ["checkpoint", "checkpoint.tmp", "checkpoint.old"];

/// The temporary name a file is written under before its rename.
fn temp_name(name: &str) -> String {
    format!("{name}.tmp")
}

/// Whether `name` is a file a run writes in a directory holding `files`.
fn is_own_file(name: &str, files: &[&str]) -> bool {
    files.iter().any(|f| name == *f || name == temp_name(f))
}

/// Syncs a file or directory to disk.
fn sync(path: &Path) -> Result<(), ModelError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| ModelError::io(path, e))
}

/// Writes `text` to `path` so that a crash leaves either the old file or the new one: the text
/// goes to a temporary file, which is synced, renamed over `path`, and the directory synced.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<(), ModelError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(temp_name(&name));
    let mut file = File::create(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| ModelError::io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))?;
    sync_parent(path)
}

/// Syncs the directory holding `path`, so that a rename in it is on disk.
pub(crate) fn sync_parent(path: &Path) -> Result<(), ModelError> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync(parent),
        _ => Ok(()),
    }
}

/// The first entry of `dir` that a run did not write, if any (`dir/checkpoint*` directories are
/// looked into).
pub(crate) fn foreign_entry(dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(None);
    };
    for entry in entries {
        let entry = entry.map_err(|e| ModelError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if CHECKPOINT_DIRS.contains(&name.as_str()) && path.is_dir() {
            for inner in fs::read_dir(&path).map_err(|e| ModelError::io(&path, e))? {
                let inner = inner.map_err(|e| ModelError::io(&path, e))?;
                let inner_name = inner.file_name().to_string_lossy().into_owned();
                if !is_own_file(&inner_name, &CHECKPOINT_FILES) || inner.path().is_dir() {
                    return Ok(Some(inner.path()));
                }
            }
        } else if !is_own_file(&name, &RUN_FILES) || path.is_dir() {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Removes the files a run writes in `dir` (its checkpoint directories included), and only those:
/// `dir` must hold nothing else (see [`foreign_entry`]).
pub(crate) fn remove_run_files(dir: &Path) -> Result<(), ModelError> {
    for name in CHECKPOINT_DIRS {
        remove_checkpoint_dir(&dir.join(name))?;
    }
    for name in RUN_FILES {
        for file in [dir.join(name), dir.join(temp_name(name))] {
            if file.is_file() {
                fs::remove_file(&file).map_err(|e| ModelError::io(&file, e))?;
            }
        }
    }
    Ok(())
}

/// Removes a checkpoint directory and the checkpoint files in it; a file it does not know stops
/// the removal with an error naming it.
fn remove_checkpoint_dir(path: &Path) -> Result<(), ModelError> {
    if !path.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(path).map_err(|e| ModelError::io(path, e))? {
        let entry = entry.map_err(|e| ModelError::io(path, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_own_file(&name, &CHECKPOINT_FILES) || entry.path().is_dir() {
            return Err(ModelError::ForeignFile(entry.path()));
        }
        fs::remove_file(entry.path()).map_err(|e| ModelError::io(&entry.path(), e))?;
    }
    fs::remove_dir(path).map_err(|e| ModelError::io(path, e))
}

/// Writes a checkpoint: `write` fills the fresh directory `dir/checkpoint.tmp`, whose files are
/// then synced, and the swap described in the module docs replaces `dir/checkpoint`.
pub(crate) fn swap_checkpoint(
    dir: &Path,
    write: impl FnOnce(&Path) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let [current, tmp, old] = CHECKPOINT_DIRS.map(|name| dir.join(name));
    remove_checkpoint_dir(&tmp)?;
    fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    write(&tmp)?;
    for name in CHECKPOINT_FILES {
        sync(&tmp.join(name))?;
    }
    sync(&tmp)?;
    if current.is_dir() {
        remove_checkpoint_dir(&old)?;
        fs::rename(&current, &old).map_err(|e| ModelError::io(&current, e))?;
    }
    fs::rename(&tmp, &current).map_err(|e| ModelError::io(&current, e))?;
    sync(dir)?;
    remove_checkpoint_dir(&old)?;
    sync(dir)
}

/// Finishes or undoes a checkpoint swap that a crash interrupted, so that `dir/checkpoint` is
/// the newest complete checkpoint; returns what it did, for the user. `complete` says whether a
/// checkpoint directory is whole (its state loads and its files are there).
pub(crate) fn recover_checkpoint(
    dir: &Path,
    complete: impl Fn(&Path) -> bool,
) -> Result<Vec<String>, ModelError> {
    let [current, tmp, old] = CHECKPOINT_DIRS.map(|name| dir.join(name));
    let mut notes = Vec::new();
    if !complete(&current) {
        // The newest complete one wins: a finished checkpoint.tmp, else the checkpoint.old that
        // was being replaced.
        for candidate in [&tmp, &old] {
            if candidate.is_dir() && complete(candidate) {
                remove_checkpoint_dir(&current)?;
                fs::rename(candidate, &current).map_err(|e| ModelError::io(candidate, e))?;
                sync(dir)?;
                notes.push(format!(
                    "recovered the checkpoint in {} (a crash interrupted the swap of {})",
                    candidate.display(),
                    current.display()
                ));
                break;
            }
        }
    }
    for leftover in [&tmp, &old] {
        if leftover.is_dir() {
            remove_checkpoint_dir(leftover)?;
            notes.push(format!(
                "removed {}, left by an interrupted checkpoint write",
                leftover.display()
            ));
        }
    }
    Ok(notes)
}
