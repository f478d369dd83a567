//! Checkpoints: what a run saves so that a resumed run continues exactly (model, optimizer,
//! data RNG, progress), loading them back with every check done before anything is written, and
//! the small file helpers the run uses.

use std::fs;
use std::path::Path;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::files::{checksum, checksum_bytes, recover_checkpoint, swap_checkpoint, write_atomic};
use crate::error::ModelError;
use crate::metrics::{LayerMetrics, StepMetrics, csv_header, csv_header_before_max_logit};
use crate::model::AttentionModel;

/// What a checkpoint holds beside the model and optimizer files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CheckpointState {
    pub step: usize,
    pub rng_seed: [u8; 32],
    pub rng_stream: u64,
    pub rng_word_pos: String,
    pub steps_to_target: Option<usize>,
    #[serde(with = "crate::json_float")]
    pub elapsed_s: f64,
    pub initial_attention: Vec<LayerMetrics>,
    pub config: TrainConfig,
    /// The first step whose `metrics.csv` row is not covered by this checkpoint: its step, or
    /// one more when the run stopped at its target there (that step's row is already written).
    pub rows_through: usize,
    /// Checksum of `model.bpk` (see `files::checksum`).
    pub model_checksum: Option<String>,
    /// Checksum of `optim.bpk`.
    pub optim_checksum: Option<String>,
    /// Checksum of this state's JSON written with this field `None`: an edited `state.json` is
    /// refused as a damaged one.
    pub state_checksum: Option<String>,
}

/// How `state.json` holds its own checksum before the checksum is known.
const NO_STATE_CHECKSUM: &str = "\"state_checksum\": null";

/// The text of `state.json` with its own checksum written in: the checksum is that of the text
/// with `"state_checksum": null`, so that it is computed on the bytes on disk (JSON numbers do
/// not always survive a parse and a write unchanged).
fn with_own_checksum(text: &str) -> String {
    let sum = checksum_bytes(text.as_bytes());
    text.replacen(
        NO_STATE_CHECKSUM,
        &format!("\"state_checksum\": \"{sum}\""),
        1,
    )
}

/// Whether the text of `state.json` holds the checksum of itself.
fn own_checksum_holds(text: &str, recorded: Option<&str>) -> bool {
    let Some(recorded) = recorded else {
        return false;
    };
    let bare = text.replacen(
        &format!("\"state_checksum\": \"{recorded}\""),
        NO_STATE_CHECKSUM,
        1,
    );
    bare != text && checksum_bytes(bare.as_bytes()) == recorded
}

/// Pretty JSON of a value (non-finite floats are spelled out by the fields that may hold them,
/// see `json_float`).
pub(crate) fn json<T: Serialize>(value: &T, path: &Path) -> Result<String, ModelError> {
    serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::checkpoint(path, format!("cannot serialize: {e}")))
}

/// Reads a checkpoint's state.
fn read_state(state_path: &Path) -> Result<CheckpointState, ModelError> {
    let text = fs::read_to_string(state_path)
        .map_err(|e| ModelError::checkpoint(state_path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| {
        ModelError::checkpoint(
            state_path,
            format!("truncated or not a checkpoint state: {e}"),
        )
    })
}

/// Whether a checkpoint directory is whole: its state loads and its model and optimizer files
/// are there and not empty.
fn is_complete(ckpt: &Path) -> bool {
    let nonempty = |name: &str| fs::metadata(ckpt.join(name)).is_ok_and(|m| m.len() > 0);
    read_state(&ckpt.join("state.json")).is_ok() && nonempty("model.bpk") && nonempty("optim.bpk")
}

/// Names the first setting that differs between two configurations, ignoring `steps` (a
/// resumed run may extend its budget) and the attention path (it computes the same function).
fn config_mismatch(
    saved: &TrainConfig,
    requested: &TrainConfig,
) -> Option<(String, String, String)> {
    let a = serde_json::to_value(saved).ok()?;
    let b = serde_json::to_value(requested).ok()?;
    fn walk(
        prefix: &str,
        a: &serde_json::Value,
        b: &serde_json::Value,
    ) -> Option<(String, String, String)> {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                for (k, va) in x {
                    // The budget may grow, and the attention path computes the same function.
                    if (prefix.is_empty() && k == "steps")
                        || (prefix == "model.attention" && k == "implementation")
                    {
                        continue;
                    }
                    let vb = y.get(k).unwrap_or(&serde_json::Value::Null);
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if let Some(d) = walk(&name, va, vb) {
                        return Some(d);
                    }
                }
                None
            }
            _ if a != b => Some((prefix.to_string(), a.to_string(), b.to_string())),
            _ => None,
        }
    }
    walk("", &a, &b)
}

/// A run resumed from disk: everything is loaded and checked before anything is written.
pub(crate) struct Resumed {
    pub model: AttentionModel,
    pub optim: ModuleOptimizer,
    pub state: CheckpointState,
    pub metrics: Vec<StepMetrics>,
    /// What the recovery of an interrupted checkpoint swap did, for the user.
    pub notes: Vec<String>,
}

/// Loads the checkpoint of the run in `dir` and checks it against `config`; `None` when the run
/// stopped before its first checkpoint (it continues from step 0, with the recovery notes).
pub(crate) fn load_checkpoint(
    config: &TrainConfig,
    dir: &Path,
    device: &Device,
) -> Result<Result<Resumed, Vec<String>>, ModelError> {
    let notes = recover_checkpoint(dir, is_complete)?;
    let ckpt = dir.join("checkpoint");
    if fs::symlink_metadata(&ckpt).is_err()
        && fs::symlink_metadata(dir.join("summary.json")).is_err()
    {
        return Ok(Err(notes));
    }
    let state_path = ckpt.join("state.json");
    let state = read_state(&state_path)?;
    let text = fs::read_to_string(&state_path)
        .map_err(|e| ModelError::checkpoint(&state_path, format!("cannot read: {e}")))?;
    if !own_checksum_holds(&text, state.state_checksum.as_deref()) {
        return Err(ModelError::checkpoint(
            &state_path,
            "damaged or edited: its checksum does not match its content (or it has none: written by an earlier version)",
        ));
    }
    if let Some((field, saved, requested)) = config_mismatch(&state.config, config) {
        return Err(ModelError::Mismatch {
            path: state_path,
            field,
            saved,
            requested,
        });
    }
    if state.step > config.steps {
        return Err(ModelError::Mismatch {
            path: state_path,
            field: "steps".into(),
            saved: format!("{} (already taken)", state.step),
            requested: config.steps.to_string(),
        });
    }
    let model_path = ckpt.join("model.bpk");
    if !model_path.is_file() {
        return Err(ModelError::checkpoint(&model_path, "missing"));
    }
    verify(&model_path, state.model_checksum.as_deref())?;
    let model = config
        .model
        .try_init(device)?
        .try_load_file(&model_path)
        .map_err(|e| {
            ModelError::checkpoint(&model_path, format!("truncated or unreadable: {e:?}"))
        })?;
    let optim_path = ckpt.join("optim.bpk");
    if !optim_path.is_file() {
        return Err(ModelError::checkpoint(&optim_path, "missing"));
    }
    verify(&optim_path, state.optim_checksum.as_deref())?;
    let optim = config.optimizer().load(&optim_path).map_err(|e| {
        ModelError::checkpoint(&optim_path, format!("truncated or unreadable: {e:?}"))
    })?;
    let metrics = read_metrics(&dir.join("metrics.csv"), config, state.rows_through)?;
    Ok(Ok(Resumed {
        model,
        optim,
        state,
        metrics,
        notes,
    }))
}

/// Checks a checkpoint file against the checksum its state recorded (which must be there).
fn verify(path: &Path, want: Option<&str>) -> Result<(), ModelError> {
    let Some(want) = want else {
        return Err(ModelError::checkpoint(
            path,
            "its checkpoint records no checksum for it (written by an earlier version): start afresh",
        ));
    };
    let got = checksum(path)?;
    if got != want {
        return Err(ModelError::checkpoint(
            path,
            format!(
                "damaged: its checksum is {got}, the checkpoint recorded {want} (the file changed after it was written)"
            ),
        ));
    }
    Ok(())
}

/// The rows of `metrics.csv` before `rows_through` (the checkpoint's step, see
/// [`CheckpointState::rows_through`]), checked: the header is the run's, every row parses as
/// UTF-8 and as a row, its loss and accuracy are finite (a non-finite one would have stopped the
/// run), it holds a held-out evaluation exactly on the evaluation steps, steps increase, and no
/// step the run records (every `log_every`-th) is missing. Later rows are left out (the resumed
/// run recomputes them), and so is a last line without its newline (an append a kill
/// interrupted).
pub(crate) fn read_metrics(
    path: &Path,
    config: &TrainConfig,
    rows_through: usize,
) -> Result<Vec<StepMetrics>, ModelError> {
    let (n_layers, log_every) = (config.model.n_layers, config.log_every);
    let checkpoint_step = rows_through;
    let bytes =
        fs::read(path).map_err(|e| ModelError::checkpoint(path, format!("cannot read: {e}")))?;
    let damaged = |line: usize, reason: String| ModelError::DamagedMetrics {
        path: path.to_path_buf(),
        line,
        reason,
        checkpoint_step,
    };
    let mut lines = Vec::new();
    let mut pieces: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // After the last newline: empty, or an interrupted append.
    pieces.pop();
    for (idx, piece) in pieces.into_iter().enumerate() {
        lines.push(
            std::str::from_utf8(piece)
                .map_err(|_| damaged(idx + 1, "the line is not UTF-8 text".into()))?,
        );
    }
    let header = lines.first().map(|h| h.trim_end_matches('\r'));
    let known = [csv_header(n_layers), csv_header_before_max_logit(n_layers)];
    if !known.iter().any(|k| header == Some(k.as_str())) {
        return Err(damaged(
            1,
            "the header is not that of this run's metrics".into(),
        ));
    }
    let mut rows: Vec<StepMetrics> = Vec::new();
    // The next step the run must have recorded.
    let mut due = 0;
    for (idx, line) in lines.iter().enumerate().skip(1) {
        let line_no = idx + 1;
        let step = line
            .split(',')
            .next()
            .and_then(|s| s.trim().parse::<usize>().ok());
        if step.is_some_and(|s| s >= checkpoint_step) {
            break;
        }
        let row = StepMetrics::from_csv_row(line, n_layers).ok_or_else(|| {
            damaged(
                line_no,
                format!("`{}` is not a metrics row", line.escape_debug()),
            )
        })?;
        if !(row.loss.is_finite() && row.accuracy.is_finite()) {
            return Err(damaged(
                line_no,
                format!("step {}: its loss or accuracy is not finite", row.step),
            ));
        }
        let evaluated = row.eval_loss.is_some() && row.eval_accuracy.is_some();
        if evaluated != row.step.is_multiple_of(config.eval_every) {
            let what = if evaluated {
                "recorded, but none is due"
            } else {
                "due, but missing"
            };
            return Err(damaged(
                line_no,
                format!("step {}: a held-out evaluation is {what} there", row.step),
            ));
        }
        if let Some(last) = rows.last()
            && row.step <= last.step
        {
            return Err(damaged(
                line_no,
                format!(
                    "step {} comes after step {} (repeated or out of order)",
                    row.step, last.step
                ),
            ));
        }
        if row.step > due {
            return Err(damaged(
                line_no,
                format!("step {due} is missing before step {}", row.step),
            ));
        }
        due = (row.step / log_every + 1) * log_every;
        rows.push(row);
    }
    if due < checkpoint_step {
        return Err(damaged(
            rows.len() + 2,
            format!("the rows stop before step {due}"),
        ));
    }
    // The row of an earlier budget's last step (recorded because it was the last, not a
    // `log_every`-th) is not one this run records when it goes on past it: dropped, so that a run
    // extended on resume writes the rows an uninterrupted run of the new budget writes.
    rows.retain(|r| r.step.is_multiple_of(log_every) || r.step + 1 == config.steps);
    Ok(rows)
}

/// Writes a checkpoint of the run in `dir`, replacing the previous one atomically (see
/// `files`).
pub(crate) fn save_checkpoint(
    dir: &Path,
    model: &AttentionModel,
    optim: &ModuleOptimizer,
    state: &CheckpointState,
) -> Result<(), ModelError> {
    let mut state = state.clone();
    swap_checkpoint(dir, |tmp| {
        let model_path = tmp.join("model.bpk");
        model
            .clone()
            .save_file(&model_path)
            .map_err(|e| ModelError::checkpoint(&model_path, format!("cannot write: {e:?}")))?;
        let optim_path = tmp.join("optim.bpk");
        optim
            .save(&optim_path)
            .map_err(|e| ModelError::checkpoint(&optim_path, format!("cannot write: {e:?}")))?;
        state.model_checksum = Some(checksum(&model_path)?);
        state.optim_checksum = Some(checksum(&optim_path)?);
        let state_path = tmp.join("state.json");
        state.state_checksum = None;
        write_atomic(&state_path, with_own_checksum(&json(&state, &state_path)?))
    })
}

impl CheckpointState {
    /// The data RNG's position, as a checkpoint stores it.
    pub fn rng_fields(rng: &ChaCha8Rng) -> ([u8; 32], u64, String) {
        (
            rng.get_seed(),
            rng.get_stream(),
            rng.get_word_pos().to_string(),
        )
    }

    /// The data RNG at the saved position (`state_path` names the file in the error).
    pub fn rng(&self, state_path: &Path) -> Result<ChaCha8Rng, ModelError> {
        let mut rng = ChaCha8Rng::from_seed(self.rng_seed);
        rng.set_stream(self.rng_stream);
        let pos: u128 = self
            .rng_word_pos
            .parse()
            .map_err(|_| ModelError::checkpoint(state_path, "bad rng_word_pos"))?;
        rng.set_word_pos(pos);
        Ok(rng)
    }
}
