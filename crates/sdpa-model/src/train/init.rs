//! Building a model from a seed ([`init_model`]): every parameter drawn at once, under a
//! process-wide lock.

use std::sync::Mutex;

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

use crate::error::ModelError;
use crate::model::{AttentionModel, ModelConfig};

/// Parameter initialization draws from the backend's process-global RNG; this lock keeps two
/// runs in one process (e.g. parallel tests) from interleaving their draws.
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// Forces every lazily initialized parameter to draw its values now.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// Builds the model from a seed, drawing all its parameters at once under a process-wide lock
/// (the backend RNG is global, so two runs in one process must not interleave their draws).
pub fn init_model(
    config: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<AttentionModel, ModelError> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    device.seed(seed);
    let model = config.try_init(device)?;
    model.visit(&mut Materialize);
    Ok(model)
}
