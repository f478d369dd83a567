//! What a cell is measured with: the backends' devices ([`Env`]), seeded random draws, reading
//! tensors back, and the lab's error type.

use std::path::PathBuf;

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// A backend an experiment may run on.
#[derive(Debug, Clone)]
pub struct LabBackend {
    /// Its name (`flex`, `ndarray`, `wgpu`).
    pub name: String,
    /// Its device (not autodiff; experiments call `.autodiff()` where they need gradients).
    pub device: Device,
}

/// The devices cells are measured on.
#[derive(Debug, Clone)]
pub struct Env {
    /// The backends opened for this run; the first is the primary one.
    pub backends: Vec<LabBackend>,
}

impl Env {
    /// The device of the backend named `name`.
    pub fn device(&self, name: &str) -> Result<&Device, LabError> {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .map(|b| &b.device)
            .ok_or_else(|| LabError::BackendNotOpened {
                name: name.to_string(),
                opened: self.backends.iter().map(|b| b.name.clone()).collect(),
            })
    }
}

/// Why an experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// An attention call or config was rejected.
    #[error(transparent)]
    Attention(#[from] burn_sdpa::AttentionError),
    /// Training failed.
    #[error(transparent)]
    Model(#[from] sdpa_model::ModelError),
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The output folder holds files the lab did not write, or is otherwise not usable; the
    /// command line answers this with exit code 2.
    #[error("{0}")]
    Usage(String),
    /// A cell asks for a backend this run did not open.
    #[error(
        "a cell asks for the {name} backend, which this run did not open (opened: {})",
        .opened.join(", ")
    )]
    BackendNotOpened {
        /// The backend the cell asks for.
        name: String,
        /// The backends this run opened.
        opened: Vec<String>,
    },
    /// A computation did not give back what it was asked for (the attention's weights, a
    /// gradient).
    #[error("{from} gave no {what}")]
    Missing {
        /// What was asked (`the attention module`, `autodiff`).
        from: &'static str,
        /// What it did not give (`weights`, `gradient for Q`).
        what: String,
    },
    /// A tensor read back to be one number held none.
    #[error("an empty tensor where a number was expected")]
    EmptyTensor,
    /// Measuring a cell failed.
    #[error("{experiment}: cell {id}: {error}")]
    CellFailed {
        /// The experiment.
        experiment: String,
        /// The cell's id.
        id: String,
        /// Why it failed.
        error: Box<LabError>,
    },
    /// A cell's configuration or result could not be saved as JSON.
    #[error("{experiment}: cell {id}: cannot save it: {message}")]
    UnsavableCell {
        /// The experiment.
        experiment: String,
        /// The cell's id.
        id: String,
        /// What went wrong.
        message: String,
    },
    /// A saved cell does not read back as the experiment's types (saved by other code).
    #[error("{experiment}: cell {id}: its saved {what} cannot be read back: {message}")]
    UnreadableCell {
        /// The experiment.
        experiment: String,
        /// The cell's id.
        id: String,
        /// What of it (`configuration`, `result`, `record`).
        what: &'static str,
        /// What went wrong.
        message: String,
    },
    /// A value could not be serialized to JSON (an analysis, `run.json`, the report).
    #[error("cannot serialize {what}: {message}")]
    Serialize {
        /// What (`the report`, `run.json`).
        what: String,
        /// What went wrong.
        message: String,
    },
    /// A parallel run was not started because another one failed first.
    #[error("run {index} was not started because another run failed")]
    NotStarted {
        /// The run's index among the items.
        index: usize,
    },
    /// The device failed to run or synchronize a benchmark's work.
    #[error("the device failed while {during}: {message}")]
    Device {
        /// What it was doing (`reading the context back`, `synchronizing`).
        during: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl LabError {
    /// An [`LabError::Io`].
    pub fn io(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        LabError::Io {
            path: path.into(),
            message: e.to_string(),
        }
    }
}

/// A seeded RNG for one purpose: `seed` is the cell's, `salt` keeps the streams of different
/// purposes apart.
pub fn rng(seed: u64, salt: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt)
}

/// `len` standard normal values.
pub fn normal_vec(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| StandardNormal.sample(rng)).collect()
}

/// A tensor of standard normal values drawn on the host (so every backend sees the same input).
pub fn normal_tensor<const D: usize>(
    rng: &mut ChaCha8Rng,
    shape: [usize; D],
    device: &Device,
) -> Tensor<D> {
    let len = shape.iter().product();
    Tensor::from_data(TensorData::new(normal_vec(rng, len), shape), device)
}

/// A tensor from host values.
pub fn tensor<const D: usize>(data: &[f32], shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

/// Reads a float tensor as f64 values (an error when the device cannot give it back).
pub fn to_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f64>, LabError> {
    Ok(burn_sdpa::util::read_back("a lab tensor", t)?)
}

/// Reads a one-element tensor.
pub fn scalar<const D: usize>(t: Tensor<D>) -> Result<f64, LabError> {
    to_vec(t)?.first().copied().ok_or(LabError::EmptyTensor)
}
