//! The lab's files: atomic writes, and the rule that the lab writes only into a folder that is
//! its own (empty, or holding its manifest) and never deletes what it did not write.

use std::fs;
use std::path::Path;

use crate::context::LabError;

/// The manifest that marks a folder as a lab output folder.
pub const MANIFEST: &str = ".sdpa-lab";

/// The lock file of a lab folder: one writer at a time ([`lock`]).
pub const LOCK: &str = "lab.lock";

/// Writes `bytes` to `path` atomically and durably, without following a link: the one write of
/// training runs and the lab ([`sdpa_model::train::write_atomic`]). A process killed at any
/// moment leaves the old file or the new one, never half of one (and at worst a `NAME.tmp` of its
/// own, which the next run removes).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LabError> {
    sdpa_model::train::write_atomic(path, bytes).map_err(LabError::from)
}

/// Whether a file name is one of the lab's temporary files: `NAME.tmp` of [`write_atomic`] for a
/// file the lab writes (JSON, Markdown, CSV, PNG, its manifest), or `.NAME.tmp-PID` of earlier
/// versions; a user's `notes.tmp` is not.
pub fn is_temporary(name: &str) -> bool {
    let own = |stem: &str| {
        stem == MANIFEST
            || [".json", ".md", ".csv", ".png"]
                .iter()
                .any(|ext| stem.ends_with(ext))
    };
    name.strip_suffix(".tmp").is_some_and(own) || (name.starts_with('.') && name.contains(".tmp-"))
}

/// Removes the temporary files a killed run left in `dir` (only those: the lab's own, and only
/// regular files; a link is never followed nor removed).
pub fn remove_temporaries(dir: &Path) -> Result<(), LabError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(|e| LabError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && is_temporary(&name) {
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Makes `path` a folder of the lab's own inside one of its folders: creates it when absent,
/// accepts a real folder, and refuses a symbolic link (never followed: the lab would write and
/// delete in its target) or anything else.
pub fn own_dir(path: &Path) -> Result<(), LabError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(LabError::Usage(format!(
            "{} is a symbolic link where the lab keeps its own folder: refusing to follow it \
             (remove the link)",
            path.display()
        ))),
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(LabError::Usage(format!(
            "{} is not a folder, where the lab keeps one: move it away",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match fs::create_dir(path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(sdpa_model::ModelError::cannot_create(path, e).into())
            }
            _ => own_dir_exists(path),
        },
        Err(e) => Err(LabError::io(path, e)),
    }
}

/// After a create, what is at `path` must be a real folder.
fn own_dir_exists(path: &Path) -> Result<(), LabError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() && !meta.file_type().is_symlink() => Ok(()),
        _ => Err(LabError::Usage(format!(
            "{} is not a folder of the lab's own",
            path.display()
        ))),
    }
}

/// Takes the lab's lock of its folder `dir` (one writer at a time, as for training runs: the same
/// lock, see [`sdpa_model::train::DirLock`]); another live writer is a usage error naming it.
pub fn lock(dir: &Path) -> Result<sdpa_model::train::DirLock, LabError> {
    use sdpa_model::ModelError;
    match sdpa_model::train::DirLock::acquire_named(dir, LOCK, "lab run") {
        Ok((lock, note)) => {
            if let Some(note) = note {
                eprintln!("note: {note}");
            }
            Ok(lock)
        }
        Err(e @ (ModelError::Locked { .. } | ModelError::Link(_) | ModelError::ForeignFile(_))) => {
            Err(LabError::Usage(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Refuses a folder that is not a lab folder (no manifest): `--render-only` and `--merge`'s
/// shards read only what the lab wrote, and never write into a user's folder.
pub fn require_own(dir: &Path) -> Result<(), LabError> {
    match fs::symlink_metadata(dir.join(MANIFEST)) {
        Ok(meta) if meta.is_file() => Ok(()),
        _ => Err(LabError::Usage(format!(
            "{} is not a folder the lab wrote (it has no {MANIFEST} manifest): give the output \
             folder of `sdpa report` or `sdpa exp`",
            dir.display()
        ))),
    }
}

/// Makes `dir` the lab's and takes its lock ([`lock`]): checks the folder ([`check_folder`]),
/// locks it, checks it again under the lock, and only then writes the manifest. Two lab runs
/// started together on a new or empty folder: one takes it, the other is told who holds it (a
/// usage error), as when it starts later; neither ever writes the manifest beside the other.
pub fn claim_and_lock(dir: &Path) -> Result<sdpa_model::train::DirLock, LabError> {
    check_folder(dir)?;
    let lock = lock(dir)?;
    claim_folder(dir)?;
    Ok(lock)
}

/// Makes `dir` the lab's ([`check_folder`]), then writes its manifest.
pub fn claim_folder(dir: &Path) -> Result<(), LabError> {
    if check_folder(dir)? {
        return Ok(());
    }
    write_atomic(
        &dir.join(MANIFEST),
        b"This folder is written by `sdpa report` / `sdpa exp`: REPORT.md, APPENDIX.md, results.json, run.json, \
          cells/, support/ and the CSV and PNG files the report names.\n",
    )
}

/// Checks that `dir` may be the lab's: creates it, or accepts it when it is empty (but for the
/// lab's lock file, or a manifest being written) or already holds the lab's manifest (then
/// true); refuses (a usage error) a folder holding anything else, naming what is there, and a
/// path that is not a folder. Listing a folder that cannot be read is an error, never "empty".
pub fn check_folder(dir: &Path) -> Result<bool, LabError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(LabError::Usage(format!(
                "{} is a symbolic link; give the lab a real folder",
                dir.display()
            )));
        }
        Ok(meta) if !meta.is_dir() => {
            return Err(LabError::Usage(format!(
                "{} exists and is not a folder",
                dir.display()
            )));
        }
        Ok(_) => {
            let mut others = Vec::new();
            let entries = fs::read_dir(dir)
                .map_err(|e| LabError::Usage(format!("cannot list {}: {e}", dir.display())))?;
            for entry in entries {
                let entry = entry.map_err(|e| LabError::io(dir, e))?;
                let name = entry.file_name().to_string_lossy().to_string();
                if name == MANIFEST {
                    return Ok(true);
                }
                // The lock and the manifest being written by another lab run starting on this
                // folder (or left by one killed then): the lab's own, not the user's.
                if name == format!("{MANIFEST}.tmp") || name == LOCK {
                    continue;
                }
                others.push(name);
            }
            if !others.is_empty() {
                others.sort();
                let shown: Vec<String> = others.iter().take(5).map(|n| format!("{n:?}")).collect();
                return Err(LabError::Usage(format!(
                    "{} holds files the lab did not write ({}{}); the lab writes only into an \
                     empty folder or one of its own: choose another --out",
                    dir.display(),
                    shown.join(", "),
                    if others.len() > 5 {
                        format!(" and {} more", others.len() - 5)
                    } else {
                        String::new()
                    }
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(|e| sdpa_model::ModelError::cannot_create(dir, e))?;
        }
        Err(e) => return Err(LabError::io(dir, e)),
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lab_writes_only_into_its_own_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("new");
        claim_folder(&fresh).unwrap();
        assert!(fresh.join(MANIFEST).is_file());
        claim_folder(&fresh).unwrap(); // its own: accepted again
        let foreign = tmp.path().join("user");
        fs::create_dir(&foreign).unwrap();
        fs::write(foreign.join("REPORT.md"), "mine").unwrap();
        let err = claim_folder(&foreign).unwrap_err().to_string();
        assert!(err.contains("REPORT.md"), "{err}");
        assert_eq!(
            fs::read_to_string(foreign.join("REPORT.md")).unwrap(),
            "mine"
        );
        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        assert!(claim_folder(&file).is_err());
    }
}
