//! One writer per run directory: an advisory lock on `run.lock`, held for the whole run, and
//! the checks that make a directory a run's own before it writes ([`take_dir`]).
//!
//! The lock is the operating system's (`flock` on Unix, `LockFileEx` on Windows, through
//! [`File::try_lock`]): the kernel drops it when the holder dies, SIGKILL included, so a lock is
//! never left held by a dead process on the same machine. The file also names its holder (pid and
//! host) for the message a second writer gets, and is emptied when a run ends normally: a lock
//! file that still names a holder but can be taken belongs to a run that was killed, and the
//! taker says so. On another host the holder cannot be checked, so such a lock is refused.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use super::RunOptions;
use super::files::{
    LOCK_FILE, first_entry, foreign_entry, has_progress, refuse_links, remove_run_files,
};
use crate::error::ModelError;

/// The lock of a run directory; released (and its file emptied) when dropped.
#[derive(Debug)]
pub(crate) struct RunLock {
    file: File,
    path: PathBuf,
}

/// This machine's name, as the lock file records it.
fn host() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// The holder a lock file names (pid, host), `None` when it names none. A file cut short (no
/// closing `end` line: its writer was killed while writing it) names no host, which is read as
/// this one: that writer is gone, since its lock could be taken.
fn holder(text: &str) -> Option<(String, Option<String>)> {
    let mut pid = None;
    let mut host = None;
    let complete = text.lines().any(|l| l == "end");
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("pid ") {
            pid = Some(p.trim().to_string());
        } else if let Some(h) = line.strip_prefix("host ") {
            host = Some(h.trim().to_string());
        }
    }
    pid.map(|pid| (pid, host.filter(|_| complete)))
}

/// The holder a lock file names, in words, for the message a second writer gets.
fn holder_words(text: &str) -> String {
    holder(text).map_or_else(
        || "a process that has not yet written its name".to_string(),
        |(pid, host)| format!("pid {pid} on host {}", host.as_deref().unwrap_or("unknown")),
    )
}

impl RunLock {
    /// Takes the lock of `dir` (which must exist), or says who holds it. Returns a note for the
    /// user when the lock of a killed run was taken over.
    pub fn acquire(dir: &Path) -> Result<(Self, Option<String>), ModelError> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ModelError::io(&path, e))?;
        let mut text = String::new();
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let _ = file.read_to_string(&mut text);
                return Err(ModelError::Locked {
                    dir: dir.to_path_buf(),
                    holder: holder_words(&text),
                    lock: path,
                });
            }
            Err(TryLockError::Error(e)) => return Err(ModelError::io(&path, e)),
        }
        file.read_to_string(&mut text)
            .map_err(|e| ModelError::io(&path, e))?;
        let me = host();
        let note = match holder(&text) {
            None => None,
            Some((pid, host)) if host.as_deref().is_none_or(|h| h == me) => Some(format!(
                "took over the lock of pid {pid} (a run killed before it could release {}): \
                 it no longer holds it",
                path.display()
            )),
            Some((pid, host)) => {
                let host = host.unwrap_or_default();
                return Err(ModelError::Locked {
                    dir: dir.to_path_buf(),
                    holder: format!(
                        "pid {pid} on host {host}, which this machine ({me}) cannot check; if \
                         that run is over, empty or delete {}",
                        path.display()
                    ),
                    lock: path,
                });
            }
        };
        let lock = Self { file, path };
        lock.write(&format!("pid {}\nhost {me}\nend\n", std::process::id()))?;
        Ok((lock, note))
    }

    /// Replaces the lock file's text.
    fn write(&self, text: &str) -> Result<(), ModelError> {
        let mut file = &self.file;
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.sync_all())
            .map_err(|e| ModelError::io(&self.path, e))
    }
}

/// Checks, without writing anything, that the run directory `dir` can be read by a new process:
/// no link or odd entry where the run keeps its files, and no live run holding its lock (the
/// error names it). `sdpa train --resume` calls it before it reads the run's configuration.
pub fn check_run_dir(dir: &Path) -> Result<(), ModelError> {
    refuse_links(dir)?;
    let path = dir.join(LOCK_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ModelError::io(&path, e)),
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(())
        }
        Err(TryLockError::WouldBlock) => {
            let text = fs::read_to_string(&path).unwrap_or_default();
            Err(ModelError::Locked {
                dir: dir.to_path_buf(),
                holder: holder_words(&text),
                lock: path,
            })
        }
        Err(TryLockError::Error(e)) => Err(ModelError::io(&path, e)),
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // A run that ends (or fails) normally leaves an empty lock file: nothing to take over.
        let _ = self.write("");
        let _ = self.file.unlock();
    }
}

/// Makes the run directory the run's own before anything is written: no link where the run keeps
/// its files, the lock taken (one writer at a time), and for a fresh run an empty directory (see
/// [`check_fresh`]). Returns the lock and notes for the user.
pub(crate) fn take_dir(
    dir: &Path,
    options: &RunOptions,
) -> Result<(RunLock, Vec<String>), ModelError> {
    refuse_links(dir)?;
    let mut notes = Vec::new();
    if options.resume {
        // A resumed run's directory must exist: the lock is never the first thing in it.
        fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    } else {
        // Checked before the lock file is created, so that a refused run leaves nothing behind.
        check_fresh(dir, options.overwrite)?;
        fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    }
    let (lock, note) = RunLock::acquire(dir)?;
    notes.extend(note);
    if !options.resume {
        // Under the lock, again: another process may have written there since.
        if let Some(note) = check_fresh(dir, options.overwrite)? {
            remove_run_files(dir)?;
            notes.push(note);
        }
    }
    Ok((lock, notes))
}

/// Refuses a fresh run into a directory that holds anything, except a run's files when they are
/// worth nothing (no checkpoint, no summary: killed before its first checkpoint) or when
/// `overwrite` says to replace them; a file no run wrote always refuses it. Returns a note when
/// the run's files are to be replaced.
fn check_fresh(dir: &Path, overwrite: bool) -> Result<Option<String>, ModelError> {
    let Some(found) = first_entry(dir)? else {
        return Ok(None);
    };
    if let Some(foreign) = foreign_entry(dir)? {
        return Err(if overwrite {
            ModelError::ForeignFile(foreign)
        } else {
            ModelError::RunExists {
                dir: dir.to_path_buf(),
                found: foreign,
            }
        });
    }
    if !has_progress(dir)? {
        return Ok(Some(format!(
            "replacing the files of a run in {} that stopped before its first checkpoint",
            dir.display()
        )));
    }
    if !overwrite {
        return Err(ModelError::RunExists {
            dir: dir.to_path_buf(),
            found,
        });
    }
    Ok(Some(format!(
        "replacing the earlier run in {} (--overwrite)",
        dir.display()
    )))
}
