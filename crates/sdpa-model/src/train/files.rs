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

/// The lock file a run holds while it writes its directory (see `lock`).
pub(crate) const LOCK_FILE: &str = "run.lock";

/// The temporary name a file is written under before its rename ([`write_atomic`]).
pub fn temp_name(name: &str) -> String {
    format!("{name}.tmp")
}

/// Whether `name` is a file a run writes in a directory holding `files`.
fn is_own_file(name: &str, files: &[&str]) -> bool {
    files.iter().any(|f| name == *f || name == temp_name(f))
}

/// Whether `name` is a file a run writes in a checkpoint directory: a checkpoint file, its
/// temporary name, or the temporary name Burn writes a record under before its own rename
/// (`model.bpk.<pid>-<n>.tmp`), which a kill can leave behind.
fn is_own_checkpoint_file(name: &str) -> bool {
    is_own_file(name, &CHECKPOINT_FILES)
        || CHECKPOINT_FILES.iter().any(|f| {
            name.strip_prefix(f)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| rest.ends_with(".tmp"))
        })
}

/// The kind of the entry at `path` without following a link; `None` when nothing is there.
fn entry_kind(path: &Path) -> Result<Option<fs::FileType>, ModelError> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(meta.file_type())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ModelError::io(path, e)),
    }
}

/// The entries of `dir` (an empty list when it does not exist; an error when it exists but
/// cannot be listed: a folder that cannot be read is never taken for an empty one).
fn list(dir: &Path) -> Result<Vec<fs::DirEntry>, ModelError> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ModelError::io(dir, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(ModelError::io(dir, e)),
    }
}

/// Checksum of a file's bytes (64-bit FNV-1a, hex): a checkpoint records those of its model and
/// optimizer files, and resume verifies them, so that a flipped byte is never loaded silently.
pub(crate) fn checksum(path: &Path) -> Result<String, ModelError> {
    let bytes = fs::read(path).map_err(|e| ModelError::io(path, e))?;
    Ok(checksum_bytes(&bytes))
}

/// [`checksum`] of bytes in memory.
pub(crate) fn checksum_bytes(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Syncs a file or directory to disk.
fn sync(path: &Path) -> Result<(), ModelError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| ModelError::io(path, e))
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or the new one: they go to
/// a temporary file beside it (`NAME.tmp`, created exclusively after removing whatever is at that
/// name, so that no link is followed), which is synced, renamed over `path` (a link at `path` is
/// replaced, never written through), and the directory synced. The one durable write of training
/// runs and of the lab (its cells, reports, plots and bench files). Two processes must not write
/// one path at once: the callers hold their directory's lock (`DirLock`).
pub fn write_atomic(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), ModelError> {
    let text = bytes.as_ref();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(temp_name(&name));
    // Never through a link or into a file someone placed there: the temporary name is removed
    // (a link itself, not what it points to) and created anew, exclusively.
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(ModelError::io(&tmp, e)),
        _ => {}
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| ModelError::io(&tmp, e))?;
    file.write_all(text)
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

/// Refuses a run directory where one of the names a run writes is a symbolic link, or not what a
/// run writes there (a FIFO, a device, a folder where a file belongs, a lock file with other hard
/// links): a run never follows a link, never blocks on a FIFO, and never writes through another
/// name (the directory itself may be a link the user made).
pub(crate) fn refuse_links(dir: &Path) -> Result<(), ModelError> {
    let files = RUN_FILES
        .iter()
        .flat_map(|f| [f.to_string(), temp_name(f)])
        .chain([LOCK_FILE.to_string()])
        .map(|name| (dir.join(name), false));
    let dirs = CHECKPOINT_DIRS.iter().map(|d| (dir.join(d), true));
    for (path, is_dir) in files.chain(dirs) {
        check_entry(&path, is_dir)?;
        if is_dir && entry_kind(&path)?.is_some() {
            for entry in list(&path)? {
                check_entry(&entry.path(), false)?;
            }
        }
    }
    Ok(())
}

/// An entry a run owns must be absent, or a regular file (`is_dir`: a folder) that is not a link;
/// the lock file, which is written in place, must have no other hard link.
fn check_entry(path: &Path, is_dir: bool) -> Result<(), ModelError> {
    let Some(kind) = entry_kind(path)? else {
        return Ok(());
    };
    if kind.is_symlink() {
        return Err(ModelError::Link(path.to_path_buf()));
    }
    if (is_dir && !kind.is_dir()) || (!is_dir && !kind.is_file()) {
        return Err(ModelError::NotAFile(path.to_path_buf()));
    }
    #[cfg(unix)]
    if path.file_name().is_some_and(|n| n == LOCK_FILE) {
        use std::os::unix::fs::MetadataExt as _;
        let links = fs::symlink_metadata(path)
            .map_err(|e| ModelError::io(path, e))?
            .nlink();
        if links > 1 {
            return Err(ModelError::ForeignFile(path.to_path_buf()));
        }
    }
    Ok(())
}

/// The first entry of the checkpoint folder `path` that a run did not write, if any.
fn foreign_in_checkpoint(path: &Path) -> Result<Option<PathBuf>, ModelError> {
    for inner in list(path)? {
        let inner_name = inner.file_name().to_string_lossy().into_owned();
        let inner_kind = inner.file_type().map_err(|e| ModelError::io(path, e))?;
        if !is_own_checkpoint_file(&inner_name) || !inner_kind.is_file() {
            return Ok(Some(inner.path()));
        }
    }
    Ok(None)
}

/// Refuses a run folder whose checkpoint folders (`checkpoint/`, `checkpoint.tmp/`,
/// `checkpoint.old/`) hold an entry that a run does not write there (a user's notes, say): the
/// checkpoint swap would move it, and the removal of an old checkpoint would stop at it. A
/// resume checks it before anything changes.
pub(crate) fn refuse_foreign_checkpoint_files(dir: &Path) -> Result<(), ModelError> {
    for name in CHECKPOINT_DIRS {
        let path = dir.join(name);
        if entry_kind(&path)?.is_some_and(|kind| kind.is_dir())
            && let Some(foreign) = foreign_in_checkpoint(&path)?
        {
            return Err(ModelError::ForeignFile(foreign));
        }
    }
    Ok(())
}

/// The first entry of `dir` that a run did not write, if any (`dir/checkpoint*` directories are
/// looked into; links are never followed, and a folder that cannot be listed is an error).
pub(crate) fn foreign_entry(dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    refuse_links(dir)?;
    for entry in list(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| ModelError::io(&path, e))?;
        if CHECKPOINT_DIRS.contains(&name.as_str()) && kind.is_dir() {
            if let Some(foreign) = foreign_in_checkpoint(&path)? {
                return Ok(Some(foreign));
            }
        } else if !(is_own_file(&name, &RUN_FILES) || name == LOCK_FILE) || !kind.is_file() {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// The first entry of `dir` other than the run's lock file, if any.
pub(crate) fn first_entry(dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    Ok(list(dir)?
        .into_iter()
        .find(|entry| entry.file_name() != LOCK_FILE)
        .map(|entry| entry.path()))
}

/// Whether the run in `dir` got as far as a checkpoint or a summary (anything worth keeping).
pub(crate) fn has_progress(dir: &Path) -> Result<bool, ModelError> {
    for name in CHECKPOINT_DIRS.iter().chain(["summary.json"].iter()) {
        if entry_kind(&dir.join(name))?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Removes the files a run writes in `dir` (its checkpoint directories included), and only those:
/// `dir` must hold nothing else (see [`foreign_entry`]). The lock file stays: the caller holds it.
pub(crate) fn remove_run_files(dir: &Path) -> Result<(), ModelError> {
    refuse_links(dir)?;
    for name in CHECKPOINT_DIRS {
        remove_checkpoint_dir(&dir.join(name))?;
    }
    for name in RUN_FILES {
        for file in [dir.join(name), dir.join(temp_name(name))] {
            match entry_kind(&file)? {
                Some(kind) if kind.is_symlink() => return Err(ModelError::Link(file)),
                Some(kind) if kind.is_file() => {
                    fs::remove_file(&file).map_err(|e| ModelError::io(&file, e))?;
                }
                Some(_) => return Err(ModelError::ForeignFile(file)),
                None => {}
            }
        }
    }
    Ok(())
}

/// Removes a checkpoint directory and the checkpoint files in it; a file it does not know, or a
/// link, stops the removal with an error naming it (links are never followed).
fn remove_checkpoint_dir(path: &Path) -> Result<(), ModelError> {
    match entry_kind(path)? {
        None => return Ok(()),
        Some(kind) if kind.is_symlink() => return Err(ModelError::Link(path.to_path_buf())),
        Some(kind) if !kind.is_dir() => return Err(ModelError::ForeignFile(path.to_path_buf())),
        Some(_) => {}
    }
    for entry in list(path)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type().map_err(|e| ModelError::io(path, e))?;
        if kind.is_symlink() {
            return Err(ModelError::Link(entry.path()));
        }
        if !is_own_checkpoint_file(&name) || !kind.is_file() {
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
    if entry_kind(&current)?.is_some_and(|kind| kind.is_dir()) {
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
            if entry_kind(candidate)?.is_some_and(|kind| kind.is_dir()) && complete(candidate) {
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
        if entry_kind(leftover)?.is_some() {
            remove_checkpoint_dir(leftover)?;
            notes.push(format!(
                "removed {}, left by an interrupted checkpoint write",
                leftover.display()
            ));
        }
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_that_cannot_be_listed_is_an_error_not_an_empty_folder() {
        let root = std::env::temp_dir().join(format!("sdpa-files-{}", std::process::id()));
        fs::create_dir_all(&root).unwrap();
        let file = root.join("a-file");
        fs::write(&file, "x").unwrap();
        // Listing a file fails (ENOTDIR) as listing a mode-733 folder does (EACCES) for a user
        // who is not root: neither may read as "empty".
        assert!(first_entry(&file).is_err());
        assert!(foreign_entry(&file).is_err());
        assert!(first_entry(&root.join("missing")).unwrap().is_none());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn burns_temporary_record_names_are_a_checkpoints_own() {
        assert!(is_own_checkpoint_file("model.bpk.4242-7.tmp"));
        assert!(is_own_checkpoint_file("optim.bpk.1-0.tmp"));
        assert!(is_own_checkpoint_file("state.json.tmp"));
        assert!(!is_own_checkpoint_file("model.bpk.keep"));
        assert!(!is_own_checkpoint_file("notes.tmp"));
    }
}

#[cfg(all(test, unix))]
mod link_tests {
    use super::*;

    #[test]
    fn an_atomic_write_never_goes_through_a_link_at_its_temporary_name() {
        let root = std::env::temp_dir().join(format!("sdpa-atomic-{}", std::process::id()));
        fs::create_dir_all(&root).unwrap();
        let victim = root.join("victim");
        fs::write(&victim, "the user's").unwrap();
        std::os::unix::fs::symlink(&victim, root.join("summary.json.tmp")).unwrap();
        write_atomic(&root.join("summary.json"), "{}").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "the user's");
        assert_eq!(fs::read_to_string(root.join("summary.json")).unwrap(), "{}");
        fs::remove_dir_all(&root).unwrap();
    }
}

/// Pretty JSON of a value (non-finite floats are spelled out by the fields that may hold them,
/// see `json_float`).
pub(crate) fn json<T: serde::Serialize>(value: &T, path: &Path) -> Result<String, ModelError> {
    serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::checkpoint(path, format!("cannot serialize: {e}")))
}
