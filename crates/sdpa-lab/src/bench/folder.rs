//! The benches' output folders: `sdpa bench` and `sdpa train-bench` write only into a folder of
//! their own, as the lab does ([`crate::files::claim_folder`]): a new or empty folder, or one
//! holding their manifest [`BENCH_MANIFEST`], which lists every file they wrote there. They
//! replace only files it lists (a folder several benches share, `docs/bench/`, keeps one
//! manifest), and refuse anything else with a usage error unless told to overwrite.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::context::LabError;
use crate::files::write_atomic;

/// The benches' manifest: the files they wrote in its folder, one name a line (lines starting
/// with `#` are comments).
pub const BENCH_MANIFEST: &str = ".sdpa-bench";

/// The largest manifest read (1 MiB: tens of thousands of names); a larger one is not the
/// benches'.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// A folder the benches may write into, and the files they wrote there.
#[derive(Debug)]
pub struct BenchFolder {
    dir: PathBuf,
    listed: BTreeSet<String>,
    /// The folder itself, locked (`flock`) while the bench writes it: a second bench started on
    /// it at the same moment is told the folder is in use, never left to race on the manifest.
    /// No lock file is left behind.
    _lock: fs::File,
}

/// At most five names of `names`, quoted, and how many more.
fn some_names<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    let names: Vec<&String> = names.into_iter().collect();
    let mut shown: Vec<String> = names.iter().take(5).map(|n| format!("{n:?}")).collect();
    if names.len() > 5 {
        shown.push(format!("and {} more", names.len() - 5));
    }
    shown.join(", ")
}

impl BenchFolder {
    /// Claims `dir` for a bench that will write the files `names` (plain file names) there:
    /// creates it when absent; accepts it when empty, or when it holds the manifest and none of
    /// `names` exists unlisted. Anything else (a folder holding files the benches did not write,
    /// a name the bench would replace that the manifest does not list) is a usage error naming
    /// them, unless `overwrite`; a `dir` that is not a folder or is a link, or one of `names`
    /// that is a folder, a FIFO or a device, is refused whatever `overwrite` says (a link there
    /// is a file: replaced, never followed). Nothing is written but the manifest.
    pub fn claim(dir: &Path, names: &[String], overwrite: bool) -> Result<Self, LabError> {
        let shown = dir.display().to_string().escape_debug().to_string();
        let usage = |reason: String| LabError::Usage(format!("{shown}: {reason}"));
        match fs::symlink_metadata(dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(usage(
                    "a symbolic link; give the bench a real folder (--out)".into(),
                ));
            }
            Ok(meta) if !meta.is_dir() => {
                return Err(usage(
                    "exists and is not a folder; --out names the folder the bench writes its \
                     files into"
                        .into(),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).map_err(|e| usage(format!("cannot create it: {e}")))?;
            }
            Err(e) => return Err(LabError::io(dir, e)),
        }
        let lock = fs::File::open(dir).map_err(|e| LabError::io(dir, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(usage(
                    "in use by another bench run (one at a time may write a folder): wait for \
                     it, or choose another --out"
                        .into(),
                ));
            }
            Err(fs::TryLockError::Error(e)) => return Err(LabError::io(dir, e)),
        }
        let listed = read_manifest(dir).map_err(usage)?;
        let existing: Vec<String> = names
            .iter()
            .filter(|name| fs::symlink_metadata(dir.join(name)).is_ok())
            .cloned()
            .collect();
        // Never replaced, overwrite or not: a folder, a FIFO, a device where a file would go. (A
        // link counts as a file: replacing it replaces the link itself, never what it points
        // to, so it follows the rule of files.)
        let odd: Vec<&String> = existing
            .iter()
            .filter(|name| {
                !fs::symlink_metadata(dir.join(name))
                    .is_ok_and(|m| m.is_file() || m.file_type().is_symlink())
            })
            .collect();
        if !odd.is_empty() {
            return Err(usage(format!(
                "{} not a plain file where the bench writes one: move it away",
                some_names(odd)
            )));
        }
        if !overwrite {
            match &listed {
                None => {
                    let others = foreign_entries(dir).map_err(usage)?;
                    if !others.is_empty() {
                        return Err(usage(format!(
                            "holds files the benches did not write ({}); they write only into \
                             an empty folder or one of their own (holding {BENCH_MANIFEST}): \
                             choose another --out, or pass --overwrite to write there anyway \
                             (replacing {})",
                            some_names(&others),
                            if existing.is_empty() {
                                "nothing".to_string()
                            } else {
                                some_names(&existing)
                            }
                        )));
                    }
                }
                Some(listed) => {
                    let unlisted: Vec<&String> =
                        existing.iter().filter(|n| !listed.contains(*n)).collect();
                    if !unlisted.is_empty() {
                        return Err(usage(format!(
                            "{} would be replaced, and {BENCH_MANIFEST} does not list it as a \
                             bench's: move it away, choose another --out, or pass --overwrite",
                            some_names(unlisted)
                        )));
                    }
                }
            }
        }
        let folder = Self {
            dir: dir.to_path_buf(),
            listed: listed.unwrap_or_default(),
            _lock: lock,
        };
        folder.save()?;
        Ok(folder)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lists `name` in the manifest (before the file is written: a run killed in between leaves
    /// a file the manifest lists, never one it does not), and returns its path.
    pub fn record(&mut self, name: &str) -> Result<PathBuf, LabError> {
        if self.listed.insert(name.to_string()) {
            self.save()?;
        }
        Ok(self.dir.join(name))
    }

    /// Records `name` and writes `bytes` to it atomically; returns its path.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<PathBuf, LabError> {
        let path = self.record(name)?;
        write_atomic(&path, bytes)?;
        Ok(path)
    }

    fn save(&self) -> Result<(), LabError> {
        let mut text = String::from(
            "# Files written here by `sdpa bench` and `sdpa train-bench`, one name a line: they\n\
             # replace only these, and write into no folder that is neither empty nor holding\n\
             # this manifest (unless given --overwrite).\n",
        );
        for name in &self.listed {
            text.push_str(name);
            text.push('\n');
        }
        write_atomic(&self.dir.join(BENCH_MANIFEST), text.as_bytes())
    }
}

/// The names the manifest of `dir` lists, `None` when it has none; a manifest that is not a
/// plain file, or too large, or not text, is refused (the reason).
fn read_manifest(dir: &Path) -> Result<Option<BTreeSet<String>>, String> {
    let path = dir.join(BENCH_MANIFEST);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {BENCH_MANIFEST}: {e}")),
        Ok(meta) if !meta.is_file() => {
            return Err(format!(
                "{BENCH_MANIFEST} is not a plain file (a link or a folder): not the benches' \
                 manifest; move it away"
            ));
        }
        Ok(meta) if meta.len() > MAX_MANIFEST_BYTES => {
            return Err(format!(
                "{BENCH_MANIFEST} is {} bytes, over {MAX_MANIFEST_BYTES}: not the benches' \
                 manifest; move it away",
                meta.len()
            ));
        }
        Ok(_) => {}
    }
    let text =
        fs::read_to_string(&path).map_err(|e| format!("cannot read {BENCH_MANIFEST}: {e}"))?;
    Ok(Some(
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect(),
    ))
}

/// The entries of `dir` but the manifest's temporary file (a run killed while writing it).
fn foreign_entries(dir: &Path) -> Result<Vec<String>, String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list it: {e}"))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if name != format!("{BENCH_MANIFEST}.tmp") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_benches_write_only_into_their_own_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let names = vec!["bench_flex.json".to_string(), "BENCH_flex.md".to_string()];
        let fresh = tmp.path().join("new");
        let mut folder = BenchFolder::claim(&fresh, &names, false).unwrap();
        folder.write("bench_flex.json", b"{}").unwrap();
        // One bench at a time: a second claim while the first holds the folder is refused.
        let err = BenchFolder::claim(&fresh, &names, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("in use by another bench run"), "{err}");
        drop(folder);
        // Its own: accepted again, the listed file replaced, a user's other file kept.
        fs::write(fresh.join("notes.txt"), "mine").unwrap();
        BenchFolder::claim(&fresh, &names, false).unwrap();
        // A file the manifest does not list is never replaced without --overwrite.
        fs::write(fresh.join("BENCH_flex.md"), "mine").unwrap();
        let err = BenchFolder::claim(&fresh, &names, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("BENCH_flex.md"), "{err}");
        BenchFolder::claim(&fresh, &names, true).unwrap();
        // A user's folder without the manifest.
        let user = tmp.path().join("user");
        fs::create_dir(&user).unwrap();
        fs::write(user.join("data.csv"), "x").unwrap();
        let err = BenchFolder::claim(&user, &names, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("data.csv") && err.contains("--overwrite"),
            "{err}"
        );
        assert!(!user.join(BENCH_MANIFEST).exists());
        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        assert!(BenchFolder::claim(&file, &names, true).is_err());
    }
}
