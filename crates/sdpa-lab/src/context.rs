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
            .ok_or_else(|| {
                LabError::Other(format!(
                    "a cell asks for the {name} backend, which this run did not open (opened: {})",
                    self.backends
                        .iter()
                        .map(|b| b.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
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
    /// Anything else, in words.
    #[error("{0}")]
    Other(String),
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
    Ok(burn_sdpa::read_back("a lab tensor", t)?)
}

/// Reads a one-element tensor.
pub fn scalar<const D: usize>(t: Tensor<D>) -> Result<f64, LabError> {
    to_vec(t)?
        .first()
        .copied()
        .ok_or_else(|| LabError::Other("an empty tensor where a number was expected".into()))
}
