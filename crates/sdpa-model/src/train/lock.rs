//! One writer per directory: an advisory lock held for the whole run, and the checks that make a
//! directory a run's own before it writes ([`take_dir`]). Training runs lock their run directory
//! with it, and the lab its output folders ([`DirLock`] is public for that: one lock code).
//!
//! The lock is the operating system's (`flock` on Unix, `LockFileEx` on Windows, through
//! [`File::try_lock`]): the kernel drops it when the holder dies, SIGKILL included, so a lock is
//! never left held by a dead process on the same machine. On Unix the directory itself is locked
//! as well as its lock file, so that deleting the lock file (`rm run.lock`) does not let a second
//! writer in while the first still runs; where a directory cannot be locked (Windows), the taker
//! checks after locking that the file it locked is still the one at the lock file's name. The file
//! names its holder (pid and host) for the message a second writer gets, and is emptied when a run
//! ends normally: a lock file that still names a holder but can be taken belongs to a run that was
//! killed, and the taker says so. On another host the holder cannot be checked, so such a lock is
//! refused.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use super::files::{
    LOCK_FILE, first_entry, foreign_entry, has_progress, refuse_foreign_checkpoint_files,
    refuse_links, remove_run_files,
};
use super::options::RunOptions;
use crate::error::ModelError;

/// The lock of a directory (a training run's, or a lab folder); released (and its file emptied)
/// when dropped.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
    /// The directory itself, locked (Unix).
    _dir: Option<File>,
}

/// A training run's lock.
pub(crate) type RunLock = DirLock;

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
        |(pid, host)| {
            format!(
                "pid {} on host {}",
                printable(&pid),
                printable(host.as_deref().unwrap_or("unknown"))
            )
        },
    )
}

/// A name read from a lock file, safe to print: control characters (an ANSI escape, a newline)
/// are shown escaped, never sent to the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// The most of a lock file that is read (the lab's own hold a pid and a host name).
const MAX_LOCK_TEXT: u64 = 4096;

/// A lock file's text (any bytes: a file that is not UTF-8 is read lossily, never an error; at
/// most [`MAX_LOCK_TEXT`] bytes of it).
fn read_text(file: &mut File) -> String {
    let mut bytes = Vec::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = Read::take(&mut *file, MAX_LOCK_TEXT).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The lock file must be absent or a regular file with no other name: a link would be followed, a
/// FIFO would block, and a hard link's other name (a user's file) would be emptied.
fn check_lock_file(path: &Path) -> Result<(), ModelError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ModelError::io(path, e)),
    };
    if meta.file_type().is_symlink() {
        return Err(ModelError::Link(path.to_path_buf()));
    }
    if !meta.is_file() {
        return Err(ModelError::ForeignFile(path.to_path_buf()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        if meta.nlink() > 1 {
            return Err(ModelError::ForeignFile(path.to_path_buf()));
        }
    }
    Ok(())
}

/// Locks the directory `dir` itself (Unix; elsewhere `None`), or says who holds it.
fn lock_dir(dir: &Path, lock: &Path, what: &str) -> Result<Option<File>, ModelError> {
    #[cfg(unix)]
    {
        let handle = File::open(dir).map_err(|e| ModelError::io(dir, e))?;
        match handle.try_lock() {
            Ok(()) => Ok(Some(handle)),
            Err(TryLockError::WouldBlock) => {
                let text = File::open(lock)
                    .map(|mut f| read_text(&mut f))
                    .unwrap_or_default();
                Err(ModelError::Locked {
                    dir: dir.to_path_buf(),
                    what: what.to_string(),
                    holder: holder_words(&text),
                    lock: lock.to_path_buf(),
                })
            }
            Err(TryLockError::Error(e)) => Err(ModelError::io(dir, e)),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (dir, lock, what);
        Ok(None)
    }
}

/// Whether `file` is the file now at `path` (same device and inode on Unix).
fn still_at(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        match (file.metadata(), fs::symlink_metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.is_file()
    }
}

impl DirLock {
    /// Takes the lock of the training run directory `dir` (which must exist), or says who holds
    /// it. Returns a note for the user when the lock of a killed run was taken over.
    pub(crate) fn acquire(dir: &Path) -> Result<(Self, Option<String>), ModelError> {
        Self::acquire_named(dir, LOCK_FILE, "training run")
    }

    /// Takes the lock of `dir` (which must exist) through its lock file `name`, or says who holds
    /// it; `what` names the kind of writer in the message a second one gets ("training run", "lab
    /// run"). Returns a note for the user when the lock of a killed process was taken over.
    pub fn acquire_named(
        dir: &Path,
        name: &str,
        what: &str,
    ) -> Result<(Self, Option<String>), ModelError> {
        let path = dir.join(name);
        check_lock_file(&path)?;
        let dir_lock = lock_dir(dir, &path, what)?;
        let locked = |text: &str| ModelError::Locked {
            dir: dir.to_path_buf(),
            what: what.to_string(),
            holder: holder_words(text),
            lock: path.clone(),
        };
        // Open, lock, and check that the locked file is still the one at `path`: a file unlinked
        // (or replaced) between the open and the lock is no lock at all.
        let mut file = loop {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| ModelError::io(&path, e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => return Err(locked(&read_text(&mut file))),
                Err(TryLockError::Error(e)) => return Err(ModelError::io(&path, e)),
            }
            if still_at(&file, &path) {
                break file;
            }
        };
        let text = read_text(&mut file);
        let me = host();
        let note = match holder(&text) {
            None => None,
            Some((pid, host)) if host.as_deref().is_none_or(|h| h == me) => Some(format!(
                "took over the lock of pid {} (a process killed before it could release {}): \
                 it no longer holds it",
                printable(&pid),
                path.display()
            )),
            Some((pid, host)) => {
                let host = printable(&host.unwrap_or_default());
                return Err(ModelError::Locked {
                    dir: dir.to_path_buf(),
                    what: what.to_string(),
                    holder: format!(
                        "pid {} on host {host}, which this machine ({}) cannot check: it may still \
                         be running there. Once you know it has ended, empty {} (for example \
                         `: > {}`) and start again",
                        printable(&pid),
                        printable(&me),
                        path.display(),
                        path.display()
                    ),
                    lock: path,
                });
            }
        };
        let lock = Self {
            file,
            path,
            _dir: dir_lock,
        };
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
/// no link or odd entry where the run keeps its files, nothing in its checkpoint folders that a
/// run does not write there, and no live run holding its lock (the error names it). `sdpa train
/// --resume` calls it before it reads the run's configuration.
pub fn check_run_dir(dir: &Path) -> Result<(), ModelError> {
    refuse_links(dir)?;
    refuse_foreign_checkpoint_files(dir)?;
    check_unlocked(dir, LOCK_FILE, "training run")
}

/// Checks, without writing anything, that no process holds the lock of `dir` taken through its
/// lock file `name` (see [`DirLock::acquire_named`]); the error names the holder.
pub fn check_unlocked(dir: &Path, name: &str, what: &str) -> Result<(), ModelError> {
    let path = dir.join(name);
    check_lock_file(&path)?;
    drop(lock_dir(dir, &path, what)?);
    let mut file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ModelError::io(&path, e)),
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(())
        }
        Err(TryLockError::WouldBlock) => Err(ModelError::Locked {
            dir: dir.to_path_buf(),
            what: what.to_string(),
            holder: holder_words(&read_text(&mut file)),
            lock: path,
        }),
        Err(TryLockError::Error(e)) => Err(ModelError::io(&path, e)),
    }
}

impl Drop for DirLock {
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
        refuse_foreign_checkpoint_files(dir)?;
    } else {
        // A link to nothing: there is no folder to create, and none is created at its target.
        if fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink())
            && fs::metadata(dir).is_err()
        {
            return Err(ModelError::Link(dir.to_path_buf()));
        }
        // Checked before the lock file is created, so that a refused run leaves nothing behind.
        check_fresh(dir, options.overwrite)?;
        fs::create_dir_all(dir).map_err(|e| ModelError::cannot_create(dir, e))?;
    }
    let (lock, note) = RunLock::acquire(dir)?;
    notes.extend(note);
    if options.resume {
        // Under the lock, before the recovery of a checkpoint swap moves anything.
        refuse_foreign_checkpoint_files(dir)?;
    } else {
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
