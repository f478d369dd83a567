//! What must hold before a run writes or removes anything ([`check_start`]): its configuration
//! against the device it was given.

use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::config::TrainConfig;
use super::init::init_model;
use crate::error::ModelError;

/// Checks that a run of `config` can start on `device` (`backend` names it in the error),
/// writing nothing: the attention's dtype is one the device has, the model can be built, and
/// its attention paths serve the calls of a training step (recorded and not, forward and
/// backward) and of the held-out evaluation. A probe model runs one sequence of the task: the
/// path a call takes depends on the sizes of a sequence, the heads and the device, not on the
/// batch. [`train`](super::train) calls it before it takes the run folder, so that a run that
/// cannot start never removes the earlier run an `--overwrite` would replace, and never leaves
/// a folder behind.
pub fn check_start(config: &TrainConfig, device: &Device, backend: &str) -> Result<(), ModelError> {
    let cannot = |reason: String| ModelError::CannotStart {
        backend: backend.to_string(),
        reason,
    };
    config
        .model
        .attention
        .precision
        .check_device(device)
        .map_err(|e| cannot(e.to_string()))?;
    let autodiff = device.clone().autodiff();
    let inner = autodiff.clone().without_autodiff();
    // Seeded as the run's own model is (which is drawn again afterwards, from the same seed).
    let model =
        init_model(&config.model, config.seed, &autodiff).map_err(|e| cannot(e.to_string()))?;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let batch = config.task.batch(&mut rng, 1, &autodiff);
    for record in [true, false] {
        let out = model
            .try_forward_batch(&batch, record)
            .map_err(|e| cannot(e.to_string()))?;
        drop(out.loss.backward());
    }
    let batch = config.task.batch(&mut rng, 1, &inner);
    model
        .valid()
        .try_forward_batch(&batch, false)
        .map_err(|e| cannot(e.to_string()))?;
    Ok(())
}
