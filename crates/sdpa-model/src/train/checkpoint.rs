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

use super::config::{TrainConfig, config_mismatch};
use super::files::{
    checksum, checksum_bytes, json, recover_checkpoint, swap_checkpoint, write_atomic,
};
use super::rows::{CoveredRows, RowsWanted, read_metrics};
use super::saved::read_bounded;
use crate::error::ModelError;
use crate::metrics::{LayerMetrics, StepMetrics};
use crate::model::AttentionModel;

/// What a checkpoint holds beside the model and optimizer files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CheckpointState {
    pub step: usize,
    pub rng_seed: [u8; 32],
    pub rng_stream: u64,
    pub rng_word_pos: String,
    pub steps_to_target: Option<usize>,
    /// Whether `steps_to_target` was set by the final evaluation of a finished run (its last
    /// step, which has no row), rather than by a recorded row's evaluation.
    #[serde(default)]
    pub target_without_row: bool,
    #[serde(with = "crate::json_float")]
    pub elapsed_s: f64,
    pub initial_attention: Vec<LayerMetrics>,
    pub config: TrainConfig,
    /// The backend the run trains on (`None` in a checkpoint written before it was recorded).
    #[serde(default)]
    pub backend: Option<String>,
    /// The first step whose `metrics.csv` row is not covered by this checkpoint: its step, or
    /// one more when the run stopped at its target there (that step's row is already written).
    pub rows_through: usize,
    /// `rows::rows_checksum` of the rows before `rows_through`: binds the checkpoint to its
    /// own run's `metrics.csv` (`None` in a checkpoint written before it was recorded, which a
    /// resume refuses).
    #[serde(default)]
    pub rows_checksum: Option<String>,
    /// Checksum of `model.bpk` (see `files::checksum`).
    pub model_checksum: Option<String>,
    /// Checksum of `optim.bpk`.
    pub optim_checksum: Option<String>,
    /// Size of `model.bpk` in bytes, checked before its checksum is computed (`None` in a
    /// checkpoint written before it was recorded: the size is then bounded by the model's).
    #[serde(default)]
    pub model_bytes: Option<u64>,
    /// Size of `optim.bpk` in bytes (as `model_bytes`).
    #[serde(default)]
    pub optim_bytes: Option<u64>,
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

/// The most of `state.json` that is read (a state is a few KiB).
const MAX_STATE_BYTES: u64 = 4 << 20;

/// Reads a checkpoint's state: its text (at most [`MAX_STATE_BYTES`]) and what it holds.
fn read_state_text(state_path: &Path) -> Result<(CheckpointState, String), ModelError> {
    let text = read_bounded(state_path, MAX_STATE_BYTES, "a checkpoint's state")?;
    let state = serde_json::from_str(&text).map_err(|e| {
        ModelError::checkpoint(
            state_path,
            format!("truncated or not a checkpoint state: {e}"),
        )
    })?;
    Ok((state, text))
}

/// Reads a checkpoint's state.
fn read_state(state_path: &Path) -> Result<CheckpointState, ModelError> {
    read_state_text(state_path).map(|(state, _)| state)
}

/// Whether a checkpoint directory is whole: its state loads and its model and optimizer files
/// are there and not empty.
fn is_complete(ckpt: &Path) -> bool {
    let nonempty = |name: &str| fs::metadata(ckpt.join(name)).is_ok_and(|m| m.len() > 0);
    read_state(&ckpt.join("state.json")).is_ok() && nonempty("model.bpk") && nonempty("optim.bpk")
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

/// Loads the checkpoint of the run in `dir` and checks it against `config` and `backend`;
/// `None` when the run stopped before its first checkpoint (it continues from step 0, with the
/// recovery notes).
pub(crate) fn load_checkpoint(
    config: &TrainConfig,
    dir: &Path,
    device: &Device,
    backend: &str,
) -> Result<Result<Resumed, Vec<String>>, ModelError> {
    let mut notes = recover_checkpoint(dir, is_complete)?;
    let ckpt = dir.join("checkpoint");
    if fs::symlink_metadata(&ckpt).is_err()
        && fs::symlink_metadata(dir.join("summary.json")).is_err()
    {
        return Ok(Err(notes));
    }
    let state_path = ckpt.join("state.json");
    let (mut state, text) = read_state_text(&state_path)?;
    if !own_checksum_holds(&text, state.state_checksum.as_deref()) {
        return Err(ModelError::checkpoint(
            &state_path,
            "damaged or edited: its checksum does not match its content (or it has none: written by an earlier version)",
        ));
    }
    check_state(&state, &state_path, config, backend)?;
    notes.extend(path_note(&state.config, config, state.step));
    let model_path = ckpt.join("model.bpk");
    let bound = config.memory_estimate()?.saturating_add(16 << 20);
    verify(
        &model_path,
        state.model_checksum.as_deref(),
        state.model_bytes,
        bound,
    )?;
    let model = config
        .model
        .try_init(device)?
        .try_load_file(&model_path)
        .map_err(|e| {
            ModelError::checkpoint(
                &model_path,
                format!("truncated or unreadable: {}", record_message(&e)),
            )
        })?;
    let optim_path = ckpt.join("optim.bpk");
    verify(
        &optim_path,
        state.optim_checksum.as_deref(),
        state.optim_bytes,
        bound,
    )?;
    // burn-optim loads the state on Burn's default device (`Device::default()`: CUDA first
    // when compiled in) and moves it to each parameter's device at the next step; where that
    // device cannot open, the runtime panics: said as an error, not a panic.
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        config.optimizer().load(&optim_path)
    }))
    .map_err(|_| {
        ModelError::checkpoint(
            &optim_path,
            "could not be loaded on Burn's default device (Device::default(), CUDA first when \
             compiled in), which did not open here: set BURN_DEVICE to a backend this machine \
             has (e.g. BURN_DEVICE=flex)",
        )
    })?;
    let optim = loaded.map_err(|e| {
        ModelError::checkpoint(
            &optim_path,
            format!("truncated or unreadable: {}", record_message(&e)),
        )
    })?;
    let wanted = RowsWanted {
        rows_through: state.rows_through,
        saved_steps: state.config.steps,
    };
    let metrics_path = dir.join("metrics.csv");
    let covered = read_metrics(&metrics_path, config, &wanted)?;
    check_own_rows(&state, &state_path, &metrics_path, &covered)?;
    state.initial_attention = initial_from_rows(&state, &state_path, &metrics_path, &covered)?;
    let metrics = covered.rows;
    Ok(Ok(Resumed {
        model,
        optim,
        state,
        metrics,
        notes,
    }))
}

/// Checks a checkpoint's state against the run it is resumed into: the same settings (see
/// [`config_mismatch`]), the same backend, a budget not already passed, and rows that its step
/// covers (`rows_through` is its step, or one more when the run stopped at its target there).
fn check_state(
    state: &CheckpointState,
    state_path: &Path,
    config: &TrainConfig,
    backend: &str,
) -> Result<(), ModelError> {
    let mismatch = |field: &str, saved: String, requested: String| ModelError::Mismatch {
        path: state_path.to_path_buf(),
        field: field.into(),
        saved,
        requested,
    };
    if let Some((field, saved, requested)) = config_mismatch(&state.config, config) {
        return Err(mismatch(&field, saved, requested));
    }
    if let Some(saved) = &state.backend
        && saved != backend
    {
        return Err(mismatch("backend", saved.clone(), backend.to_string()));
    }
    if state.step > config.steps {
        return Err(mismatch(
            "steps",
            format!("{} (already taken)", state.step),
            config.steps.to_string(),
        ));
    }
    // The data RNG is seeded from the run's seed once, and only moves on: a seed that is not
    // the config's is a state edited (or a config and state from two runs).
    if ChaCha8Rng::seed_from_u64(state.config.seed).get_seed() != state.rng_seed {
        return Err(ModelError::checkpoint(
            state_path,
            format!(
                "its data RNG was not seeded from its config's seed {} (the file was edited, or \
                 its config comes from another run)",
                state.config.seed
            ),
        ));
    }
    if !(state.elapsed_s.is_finite() && state.elapsed_s >= 0.0) {
        return Err(ModelError::checkpoint(
            state_path,
            format!(
                "elapsed_s is {}: a run's wall time is a finite number ≥ 0 (the file was edited)",
                state.elapsed_s
            ),
        ));
    }
    let stopped_there = state.steps_to_target == Some(state.step);
    if !(state.rows_through == state.step
        || (stopped_there && state.rows_through == state.step + 1))
    {
        return Err(ModelError::checkpoint(
            state_path,
            format!(
                "rows_through is {} at step {}: a checkpoint covers the rows before its step \
                 (and its step's own when the run stopped at its target there)",
                state.rows_through, state.step
            ),
        ));
    }
    Ok(())
}

/// Checks that the rows of `metrics.csv` are the ones the checkpoint was taken with (their
/// checksum is the one it recorded: another run's rows, or this run's rows under another run's
/// checkpoint and config, are refused), and that its `steps_to_target` is what those rows say:
/// the first recorded step whose held-out accuracy reached the target (none where none did), or,
/// when the final evaluation of a finished run set it (a step without a row), a step no later
/// than the checkpoint's before which no row reached the target.
fn check_own_rows(
    state: &CheckpointState,
    state_path: &Path,
    metrics_path: &Path,
    covered: &CoveredRows,
) -> Result<(), ModelError> {
    let foreign = |reason: String| ModelError::ForeignRun {
        path: metrics_path.to_path_buf(),
        checkpoint: state_path.to_path_buf(),
        reason,
    };
    let Some(recorded) = state.rows_checksum.as_deref() else {
        return Err(foreign(
            "the checkpoint records no checksum of its rows (written by an earlier version), \
             so these rows cannot be told to be its own"
                .into(),
        ));
    };
    if covered.checksum != recorded {
        return Err(foreign(format!(
            "its rows before step {} are not the ones the checkpoint was taken with (checksum \
             {}, the checkpoint recorded {recorded}): the rows, or the checkpoint and its \
             config, come from another run, or a file was edited",
            state.rows_through, covered.checksum
        )));
    }
    let reached = covered.reached;
    let consistent = match (state.steps_to_target, reached) {
        (None, reached) => reached.is_none(),
        // Set by a final evaluation without a row: at or before the checkpoint's step, and no
        // row before it reached the target (rows after it, of an extended run, may).
        // A row of that very step, recorded later by an extended run, evaluated the same model
        // on the same held-out set: it cannot show the target missed.
        (Some(at), reached) if state.target_without_row => {
            let missed_there = covered
                .rows
                .iter()
                .any(|r| r.step == at && r.eval_accuracy.is_some() && reached != Some(at));
            at <= state.step && reached.is_none_or(|r| r >= at) && !missed_there
        }
        (Some(at), reached) => reached == Some(at),
    };
    if !consistent {
        let shown = |s: Option<usize>| s.map_or_else(|| "none".to_string(), |s| s.to_string());
        return Err(foreign(format!(
            "the checkpoint's steps_to_target is {}, but its rows say {}",
            shown(state.steps_to_target),
            shown(reached)
        )));
    }
    Ok(())
}

/// The initial attention diagnostics, exactly: those of step 0's row, which recorded them
/// (`metrics.csv` holds the shortest text of each number, which reads back exactly; a number in
/// `state.json` may read back one unit in the last place off). The state's must agree with the
/// row's, to that unit, on every column the row holds (a row written before `max_logit` was
/// recorded holds NaN there: the state's is kept).
fn initial_from_rows(
    state: &CheckpointState,
    state_path: &Path,
    metrics_path: &Path,
    covered: &CoveredRows,
) -> Result<Vec<LayerMetrics>, ModelError> {
    let Some(first) = covered.rows.first().filter(|r| r.step == 0) else {
        return Ok(state.initial_attention.clone());
    };
    let close = |a: f64, b: f64| {
        (a.is_nan() && b.is_nan())
            || a == b
            || (a - b).abs() <= 4.0 * f64::EPSILON * a.abs().max(b.abs())
    };
    let agree = first.layers.len() == state.initial_attention.len()
        && first
            .layers
            .iter()
            .zip(&state.initial_attention)
            .all(|(row, saved)| {
                [
                    (row.entropy, saved.entropy),
                    (row.normalized_entropy, saved.normalized_entropy),
                    (row.max_prob, saved.max_prob),
                    (row.saturated_fraction, saved.saturated_fraction),
                    (row.logit_std, saved.logit_std),
                    (row.query_std, saved.query_std),
                    (row.key_std, saved.key_std),
                ]
                .into_iter()
                .all(|(a, b)| close(a, b))
                    && (row.max_logit.is_nan() || close(row.max_logit, saved.max_logit))
            });
    if !agree {
        return Err(ModelError::ForeignRun {
            path: metrics_path.to_path_buf(),
            checkpoint: state_path.to_path_buf(),
            reason: "the checkpoint's initial attention diagnostics are not those its step-0 row \
                     recorded"
                .into(),
        });
    }
    Ok(first
        .layers
        .iter()
        .zip(&state.initial_attention)
        .map(|(row, saved)| LayerMetrics {
            max_logit: if row.max_logit.is_nan() {
                saved.max_logit
            } else {
                row.max_logit
            },
            ..*row
        })
        .collect())
}

/// The note a resume prints when it changes the attention path: the rows it computes may then
/// differ in their last bits from an uninterrupted run's (the paths compute the same function,
/// each in its own order of floating-point operations).
fn path_note(saved: &TrainConfig, requested: &TrainConfig, step: usize) -> Option<String> {
    let (was, now) = (
        saved.model.attention.implementation,
        requested.model.attention.implementation,
    );
    (was != now).then(|| {
        format!(
            "the attention path changes from {was} to {now}: the rows from step {step} on may \
             differ in their last bits from those of an uninterrupted run on {was}"
        )
    })
}

/// Checks a checkpoint file against the size and checksum its state recorded (the checksum
/// must be there): the size first, from the file's metadata, so that a file replaced by a
/// huge one is refused before a byte of it is read. A state written before sizes were recorded
/// bounds the size by `bound`, more than any checkpoint of the run's model takes.
fn verify(
    path: &Path,
    want: Option<&str>,
    bytes: Option<u64>,
    bound: u64,
) -> Result<(), ModelError> {
    let meta = fs::symlink_metadata(path).map_err(|_| ModelError::checkpoint(path, "missing"))?;
    if !meta.is_file() {
        return Err(ModelError::NotAFile(path.to_path_buf()));
    }
    let Some(want) = want else {
        return Err(ModelError::checkpoint(
            path,
            "its checkpoint records no checksum for it (written by an earlier version): start afresh",
        ));
    };
    let size_ok = match bytes {
        Some(bytes) => meta.len() == bytes,
        None => meta.len() <= bound,
    };
    if !size_ok {
        return Err(ModelError::checkpoint(
            path,
            format!(
                "damaged: {} bytes, where the checkpoint recorded {} (the file changed after it \
                 was written); not read",
                meta.len(),
                bytes.map_or_else(|| format!("at most {bound}"), |b| b.to_string())
            ),
        ));
    }
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

/// What went wrong with a model or optimizer record, as a person reads it: the operating
/// system's own words for an I/O error ("No space left on device (os error 28)"), not Burn's
/// `Io("I/O error: …")`.
fn record_message(e: &burn::store::RecordError) -> String {
    use burn::store::RecordError;
    match e {
        RecordError::Io(message) => message
            .strip_prefix("I/O error: ")
            .unwrap_or(message)
            .to_string(),
        RecordError::Validation(message) => format!("it does not fit the model: {message}"),
    }
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
        model.clone().save_file(&model_path).map_err(|e| {
            ModelError::checkpoint(&model_path, format!("cannot write: {}", record_message(&e)))
        })?;
        let optim_path = tmp.join("optim.bpk");
        optim.save(&optim_path).map_err(|e| {
            ModelError::checkpoint(&optim_path, format!("cannot write: {}", record_message(&e)))
        })?;
        state.model_checksum = Some(checksum(&model_path)?);
        state.optim_checksum = Some(checksum(&optim_path)?);
        let size = |path: &Path| {
            fs::metadata(path)
                .map(|m| m.len())
                .map_err(|e| ModelError::io(path, e))
        };
        state.model_bytes = Some(size(&model_path)?);
        state.optim_bytes = Some(size(&optim_path)?);
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
