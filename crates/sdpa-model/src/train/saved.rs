//! A run's saved configuration, `config.json`: the [`TrainConfig`] and the backend the run
//! trains on (a resume continues there), read back with its size bounded and every field
//! checked.

use std::fs::File;
use std::io::Read as _;
use std::path::Path;

use super::config::{TrainConfig, config_mismatch};
use super::options::RunOptions;
use crate::error::ModelError;

/// The most of `config.json` that is read (a run's configuration is a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The field of `config.json` that names the backend, beside the [`TrainConfig`]'s own.
const BACKEND_FIELD: &str = "backend";

/// A run's saved configuration (see [`read_saved_run`]).
#[derive(Debug, Clone)]
pub struct SavedRun {
    /// The run's configuration.
    pub config: TrainConfig,
    /// The backend the run trains on; `None` for a run written before the backend was
    /// recorded (its resume takes the backend it is given, see `sdpa train --resume`).
    pub backend: Option<String>,
}

/// The text of `config.json`: the configuration's own pretty JSON, with the backend's name as
/// its first field.
pub(crate) fn config_json(
    config: &TrainConfig,
    backend: &str,
    path: &Path,
) -> Result<String, ModelError> {
    let text = super::files::json(config, path)?;
    let name = serde_json::to_string(backend)
        .map_err(|e| ModelError::damaged(path, format!("cannot serialize: {e}")))?;
    Ok(match text.strip_prefix("{\n") {
        Some(rest) => format!("{{\n  \"{BACKEND_FIELD}\": {name},\n{rest}"),
        // Not an object with fields: written as it is (never the case for a TrainConfig).
        None => text,
    })
}

/// Reads at most `max` bytes of the regular file at `path` as UTF-8: a larger file is refused
/// from its size, before a byte of it is read (`what` says what it should hold).
pub(crate) fn read_bounded(path: &Path, max: u64, what: &str) -> Result<String, ModelError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| ModelError::io(path, e))?;
    if !meta.is_file() {
        return Err(ModelError::NotAFile(path.to_path_buf()));
    }
    if meta.len() > max {
        return Err(ModelError::damaged(
            path,
            format!(
                "{} bytes, where {what} holds at most {max}: not read (replaced or damaged?)",
                meta.len()
            ),
        ));
    }
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| ModelError::io(path, e))?;
    String::from_utf8(bytes).map_err(|_| ModelError::damaged(path, "not UTF-8 text"))
}

/// Reads the saved configuration of the run in `dir` (`dir/config.json`): its size bounded
/// ([`MAX_CONFIG_BYTES`]), and every field one this version writes. A field it does not know
/// (edited in, or written by another program) is refused, naming it, rather than dropped.
pub fn read_saved_run(dir: &Path) -> Result<SavedRun, ModelError> {
    let path = dir.join("config.json");
    let text = read_bounded(&path, MAX_CONFIG_BYTES, "a run's configuration")?;
    let bad = |reason: String| ModelError::damaged(&path, reason);
    let mut value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a run's configuration: {e}")))?;
    let backend = match value
        .as_object_mut()
        .and_then(|fields| fields.remove(BACKEND_FIELD))
    {
        None => None,
        Some(serde_json::Value::String(name)) => Some(name),
        Some(other) => {
            return Err(bad(format!(
                "its `{BACKEND_FIELD}` is {}, not a backend's name",
                shorten(&other.to_string())
            )));
        }
    };
    let config: TrainConfig = serde_json::from_value(value.clone())
        .map_err(|e| bad(format!("not a run's configuration: {e}")))?;
    let canonical =
        serde_json::to_value(&config).map_err(|e| bad(format!("cannot serialize: {e}")))?;
    if let Some(field) = unknown_field("", &value, &canonical) {
        return Err(bad(format!(
            "`{}` is not a setting of this version (edited in, or written by another program): \
             remove it to resume",
            shorten(&field)
        )));
    }
    Ok(SavedRun { config, backend })
}

/// The first field of `read` (its dotted path) that `canonical`, the same value written back by
/// this version, does not have.
fn unknown_field(
    prefix: &str,
    read: &serde_json::Value,
    canonical: &serde_json::Value,
) -> Option<String> {
    let (serde_json::Value::Object(read), serde_json::Value::Object(canonical)) = (read, canonical)
    else {
        return None;
    };
    read.iter().find_map(|(key, inner)| {
        let name = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match canonical.get(key) {
            None => Some(name),
            Some(known) => unknown_field(&name, inner, known),
        }
    })
}

/// A text quoted in a message, at most 80 characters of it (control characters escaped): a
/// damaged file's line or value may be megabytes long.
pub(crate) fn shorten(text: &str) -> String {
    const MAX: usize = 80;
    let escaped: String = text
        .chars()
        .take(MAX)
        .flat_map(char::escape_debug)
        .collect();
    let total = text.chars().count();
    if total > MAX {
        format!("{escaped}… ({total} characters in all)")
    } else {
        escaped
    }
}

/// Checks a resume against the configuration saved in its folder before anything is taken or
/// written: the backend it records (a resume continues on the run's own: another would change
/// its rows) and every setting but the budget and the attention path (see `config_mismatch`).
/// A folder without `config.json` has nothing to compare (a run killed before it wrote one).
pub(crate) fn check_resume(config: &TrainConfig, options: &RunOptions) -> Result<(), ModelError> {
    let path = options.out_dir.join("config.json");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(());
    }
    let saved = read_saved_run(&options.out_dir)?;
    let mismatch = |field: &str, saved: String, requested: String| ModelError::Mismatch {
        path: path.clone(),
        field: field.into(),
        saved,
        requested,
    };
    if let Some(backend) = saved.backend
        && backend != options.backend
    {
        return Err(mismatch("backend", backend, options.backend.clone()));
    }
    if let Some((field, was, now)) = config_mismatch(&saved.config, config) {
        return Err(mismatch(&field, was, now));
    }
    Ok(())
}
