//! What an experiment runs on: the backends asked for, the seed, the size, the output folder.

use std::path::PathBuf;

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use sdpa_model::{Progress, ProgressMode};

/// A backend an experiment may run on.
#[derive(Debug, Clone)]
pub struct LabBackend {
    /// Its name (`flex`, `ndarray`, `wgpu`).
    pub name: String,
    /// Its device (not autodiff; experiments call `.autodiff()` where they need gradients).
    pub device: Device,
}

/// Everything an experiment needs to run.
#[derive(Debug, Clone)]
pub struct LabContext {
    /// The backends asked for; the first is the primary one, used by experiments that run on a
    /// single backend. Never empty.
    pub backends: Vec<LabBackend>,
    /// The seed of every random draw.
    pub seed: u64,
    /// Smaller sizes for a first look.
    pub quick: bool,
    /// Where results and plots go.
    pub out_dir: PathBuf,
    /// How progress of long experiments is shown.
    pub progress: ProgressMode,
    /// Backends asked for that could not be opened (no adapter), with the reason; the report
    /// says so instead of stopping.
    pub skipped_backends: Vec<String>,
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
    /// A file could not be written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
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

impl LabContext {
    /// The primary backend.
    pub fn primary(&self) -> &LabBackend {
        &self.backends[0]
    }

    /// Progress lines for `total` steps of long work (none when the context is quiet).
    pub fn progress_lines(&self, label: &str, total: usize) -> Progress {
        let mode = if self.progress == ProgressMode::Quiet {
            ProgressMode::Quiet
        } else {
            ProgressMode::Lines
        };
        Progress::new(mode, label, 0, total as u64)
    }

    /// A seeded RNG for one purpose (`salt` keeps the streams of experiments apart).
    pub fn rng(&self, salt: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt)
    }
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

/// Reads a float tensor as f64 values (an error when the device cannot give it back).
pub fn to_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f64>, LabError> {
    Ok(burn_sdpa::read_back("a lab tensor", t)?)
}
