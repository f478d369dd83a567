//! The cell cache: every finished cell is one JSON file under the output folder, holding the key
//! it was measured under and its result. A cell is read back only when its saved key equals the
//! key the run expects: the experiment, the version of its `measure`, the cell's id and whole
//! configuration (sizes, seeds, backends are all in it), the lab's crate version and Burn's.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::context::LabError;
use crate::experiment::{Experiment, PlannedCell, StoredCell};
use crate::files::write_atomic;

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
}

impl CellKey {
    /// The key of `cell` of `experiment`.
    pub fn of(experiment: &dyn Experiment, cell: &PlannedCell) -> Self {
        Self {
            format: 1,
            experiment: experiment.name().into(),
            version: experiment.version(),
            id: cell.id.clone(),
            stage: cell.stage,
            config: cell.config.clone(),
            lab: env!("CARGO_PKG_VERSION").into(),
            burn: "0.22.1".into(),
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

/// Reads the saved cell of `key`, if there is one with exactly this key. A file that does not
/// parse (written by something else) is not reused: `Ok(None)`, and the cell runs again.
pub fn load(
    root: &Path,
    key: &CellKey,
    cell: &PlannedCell,
) -> Result<Option<StoredCell>, LabError> {
    let path = path(root, key);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LabError::io(&path, e)),
    };
    let Ok(saved) = serde_json::from_str::<SavedCell>(&text) else {
        return Ok(None);
    };
    if &saved.key != key {
        return Ok(None);
    }
    Ok(Some(StoredCell {
        cell: cell.clone(),
        result: saved.result,
        seconds: saved.seconds,
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
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
    }
    let saved = SavedCell {
        key: key.clone(),
        seconds,
        result,
    };
    let text = serde_json::to_string(&saved)
        .map_err(|e| LabError::Other(format!("cannot save cell {}: {e}", key.id)))?;
    write_atomic(&path, text.as_bytes())?;
    let back: SavedCell = serde_json::from_str(&text)
        .map_err(|e| LabError::Other(format!("cannot read back cell {}: {e}", key.id)))?;
    Ok(StoredCell {
        cell: cell.clone(),
        result: back.result,
        seconds: back.seconds,
    })
}
