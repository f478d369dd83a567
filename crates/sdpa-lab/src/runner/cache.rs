//! The cell cache: every finished cell is one JSON file under the output folder, holding the key
//! it was measured under, its result, the run that measured it and a checksum. A cell is read
//! back only when its saved key equals the key the run expects: the experiment, the version of its
//! `measure`, the cell's id and whole configuration (sizes, seeds, backends are all in it), the
//! lab's crate version, Burn's, and the fingerprint of the code that measures it (fixed at build
//! time by `build.rs`: a cell measured by other code is never reused), and when its checksum
//! matches its contents (a cell edited or damaged on disk is measured again, with a message, or
//! refused by `--render-only`).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::context::LabError;
use crate::experiment::{Experiment, PlannedCell, StoredCell};
use crate::files::{own_dir, write_atomic};

mod fingerprints {
    include!(concat!(env!("OUT_DIR"), "/fingerprints.rs"));
}

/// The fingerprint of the code that measures `experiment`'s cells (see `build.rs`); an
/// experiment without a folder of its own (one defined outside the lab) gets the shared code's.
pub fn code_fingerprint(experiment: &str) -> &'static str {
    let folder = experiment.replace('-', "_");
    fingerprints::FINGERPRINTS
        .iter()
        .find(|(name, _)| *name == folder)
        .map_or(fingerprints::COMMON, |(_, f)| f)
}

/// The cache's format: 2 added the code fingerprint, the checksum and the measuring run.
const FORMAT: u32 = 2;

/// What determines a cell's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellKey {
    /// The cache format.
    pub format: u32,
    /// The experiment.
    pub experiment: String,
    /// The version of its `measure`.
    pub version: u32,
    /// The cell's id.
    pub id: String,
    /// The planning stage.
    pub stage: usize,
    /// The cell's configuration.
    pub config: serde_json::Value,
    /// The `sdpa-lab` crate version.
    pub lab: String,
    /// The Burn version.
    pub burn: String,
    /// The fingerprint of the code that measures the cell ([`code_fingerprint`]).
    pub code: String,
}

impl CellKey {
    /// The key of `cell` of `experiment`.
    pub fn of(experiment: &dyn Experiment, cell: &PlannedCell) -> Self {
        Self {
            format: FORMAT,
            experiment: experiment.name().into(),
            version: experiment.version(),
            id: cell.id.clone(),
            stage: cell.stage,
            config: cell.config.clone(),
            lab: env!("CARGO_PKG_VERSION").into(),
            burn: "0.22.1".into(),
            code: code_fingerprint(experiment.name()).into(),
        }
    }

    /// A 64-bit FNV-1a hash of the key's JSON text (in the file name, so that two keys of one
    /// id never share a file).
    pub fn hash(&self) -> u64 {
        let text = serde_json::to_string(self).unwrap_or_default();
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

/// One saved cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedCell {
    /// What it was measured under.
    pub key: CellKey,
    /// Seconds it took.
    pub seconds: f64,
    /// Its result.
    pub result: serde_json::Value,
    /// The run that measured it ([`run_stamp`]).
    pub measured_by: String,
}

/// A 64-bit FNV-1a hash, hex.
fn fnv_hex(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{h:016x}")
}

/// How a saved cell's file begins: `{"checksum":"<16 hex digits>","cell":<the cell's JSON>}`.
/// The checksum is the hash of the cell's JSON text exactly as written (the bytes, not a value
/// parsed back: parsing a float is not exact), so that any edit of the cell shows.
const HEAD: &str = "{\"checksum\":\"";
/// Between the checksum and the cell.
const MIDDLE: &str = "\",\"cell\":";

/// A cell's file text: its JSON `body` with the checksum in front.
fn encode(body: &str) -> String {
    format!("{HEAD}{}{MIDDLE}{body}}}", fnv_hex(body.as_bytes()))
}

/// The cell's JSON text of a file written by [`encode`] when its checksum matches; `Ok(None)`
/// for a file of another format; `Err(why)` for a cell whose checksum does not match.
fn decode(text: &str) -> Result<Option<&str>, String> {
    let Some(rest) = text.strip_prefix(HEAD) else {
        return Ok(None);
    };
    let (Some(saved), Some(rest)) = (rest.get(..16), rest.get(16..)) else {
        return Err("its checksum is cut short".into());
    };
    let Some(body) = rest
        .strip_prefix(MIDDLE)
        .and_then(|b| b.trim_end().strip_suffix('}'))
    else {
        return Err("it is not laid out as the lab writes a cell".into());
    };
    if fnv_hex(body.as_bytes()) == saved {
        Ok(Some(body))
    } else {
        // The right value is not printed: the message is no recipe for a forged cell.
        Err(format!(
            "its checksum {saved} does not match its contents: edited or damaged after it was \
             measured"
        ))
    }
}

/// This process's run, as a saved cell names it: when it started (UTC), the sources' commit and
/// its pid.
pub fn run_stamp() -> &'static str {
    static STAMP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    STAMP.get_or_init(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!(
            "{} · commit {} · pid {}",
            utc(secs),
            crate::report::git_commit(),
            std::process::id()
        )
    })
}

/// `YYYY-MM-DD HH:MM UTC` of seconds since 1970 (days to civil date: Howard Hinnant's
/// algorithm).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{d:02} {h:02}:{m:02} UTC")
}

/// What the cache holds for a key.
#[derive(Debug)]
pub enum Loaded {
    /// A cell saved under exactly this key, intact.
    Cell(StoredCell),
    /// Nothing under this key (or a file written by something else, or under another key).
    Missing,
    /// A cell whose checksum does not match its contents (edited or damaged on disk), or that is
    /// not a regular file: why.
    Damaged(String),
}

/// The file of `key` under `root` (`cells/` or `support/` of an output folder).
pub fn path(root: &Path, key: &CellKey) -> PathBuf {
    let id: String = key
        .id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._=-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    root.join(&key.experiment)
        .join(format!("{id}--{:016x}.json", key.hash()))
}

/// Reads the saved cell of `key`: [`Loaded::Cell`] when there is one with exactly this key and
/// an intact checksum; a file that does not parse as a cell, or holds another key, is
/// [`Loaded::Missing`] (the cell runs again); one whose checksum fails, [`Loaded::Damaged`].
pub fn load(root: &Path, key: &CellKey, cell: &PlannedCell) -> Result<Loaded, LabError> {
    let path = path(root, key);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(LabError::io(&path, e)),
        Ok(meta) if !meta.is_file() => {
            return Ok(Loaded::Damaged(format!(
                "{} is not a regular file (a link or a folder)",
                path.display()
            )));
        }
        Ok(_) => {}
    }
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Ok(Loaded::Damaged(format!(
                "{} is not UTF-8 text",
                path.display()
            )));
        }
        Err(e) => return Err(LabError::io(&path, e)),
    };
    // The file at this key's own name (the name holds the key's hash) must be a cell as the lab
    // writes it; anything else there was put or rewritten by something else.
    let body = match decode(&text) {
        Ok(Some(body)) => body,
        Ok(None) => {
            return Ok(Loaded::Damaged(format!(
                "{} is not laid out as the lab writes a cell",
                path.display()
            )));
        }
        Err(why) => return Ok(Loaded::Damaged(format!("{}: {why}", path.display()))),
    };
    let Ok(saved) = serde_json::from_str::<SavedCell>(body) else {
        return Ok(Loaded::Damaged(format!(
            "{}: its checksum matches but it is not a cell",
            path.display()
        )));
    };
    if &saved.key != key {
        return Ok(Loaded::Missing);
    }
    Ok(Loaded::Cell(StoredCell {
        cell: cell.clone(),
        result: saved.result,
        seconds: saved.seconds,
        measured_by: saved.measured_by,
        reused: true,
    }))
}

/// Saves a measured cell atomically and returns it as read back from the saved text: a fresh
/// cell is analyzed from exactly the bits a later run reads from the file.
pub fn save(
    root: &Path,
    key: &CellKey,
    cell: &PlannedCell,
    result: serde_json::Value,
    seconds: f64,
) -> Result<StoredCell, LabError> {
    let path = path(root, key);
    own_dir(root)?;
    if let Some(dir) = path.parent() {
        own_dir(dir)?;
    }
    let saved = SavedCell {
        key: key.clone(),
        seconds,
        result,
        measured_by: run_stamp().to_string(),
    };
    let text = serde_json::to_string(&saved).map_err(|e| LabError::UnsavableCell {
        experiment: key.experiment.clone(),
        id: key.id.clone(),
        message: e.to_string(),
    })?;
    write_atomic(&path, encode(&text).as_bytes())?;
    let back: SavedCell = serde_json::from_str(&text).map_err(|e| LabError::UnreadableCell {
        experiment: key.experiment.clone(),
        id: key.id.clone(),
        what: "record",
        message: e.to_string(),
    })?;
    Ok(StoredCell {
        cell: cell.clone(),
        result: back.result,
        seconds: back.seconds,
        measured_by: back.measured_by,
        reused: false,
    })
}

/// When `root` holds a saved cell of `key`'s experiment and id under another key, the fields
/// that differ (`code`: measured by other code; `version`, `format`, `lab`, …), for the message
/// that refuses to reuse it.
pub fn other_key(root: &Path, key: &CellKey) -> Option<String> {
    let wanted = path(root, key);
    let dir = wanted.parent()?;
    let prefix = wanted
        .file_name()?
        .to_string_lossy()
        .split("--")
        .next()?
        .to_string();
    let mut differs = Vec::new();
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{prefix}--"))
            || !entry.file_type().is_ok_and(|t| t.is_file())
        {
            continue;
        }
        let Ok(saved) = fs::read_to_string(entry.path())
            .map_err(|_| ())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|_| ()))
        else {
            continue;
        };
        let Ok(expected) = serde_json::to_value(key) else {
            continue;
        };
        let saved_key = if saved.get("cell").is_some() {
            &saved["cell"]["key"]
        } else {
            &saved["key"]
        };
        if saved_key["id"] != expected["id"] {
            continue;
        }
        for field in [
            "format", "version", "lab", "burn", "code", "stage", "config",
        ] {
            if saved_key[field] != expected[field] {
                differs.push(match field {
                    "code" => format!(
                        "measured by other code: fingerprint {} there, {} in this build",
                        saved_key[field].as_str().unwrap_or("none"),
                        key.code
                    ),
                    "config" => "another configuration".to_string(),
                    f => format!("{f} {} there, {} here", saved_key[f], expected[f]),
                });
            }
        }
        if !differs.is_empty() {
            return Some(differs.join("; "));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_checksum_covers_its_bytes() {
        let body = r#"{"key":1,"result":[0.1,2.5e-300]}"#;
        let text = encode(body);
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "{text}"
        );
        assert_eq!(decode(&text), Ok(Some(body)));
        assert_eq!(decode(&format!("{text}\n")), Ok(Some(body)));
        // One digit changed, or the layout changed: refused, and the right checksum not told.
        assert!(
            !decode(&text.replace("0.1", "0.2"))
                .unwrap_err()
                .contains(&fnv_hex(body.replace("0.1", "0.2").as_bytes()))
        );
        assert!(decode(&text.replace("0.1", "0.2")).is_err());
        assert!(decode(&text.replace(",\"cell\":", ", \"cell\":")).is_err());
        assert!(decode(&text[..20]).is_err());
        // Another format is not this cache's.
        assert_eq!(decode(r#"{"key":{}}"#), Ok(None));
    }
}
