//! Backend selection at run time, among the backends compiled in by cargo features.

use std::fmt;
use std::str::FromStr;

use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// A Burn backend this binary may run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Burn's NdArray CPU backend (cargo feature `ndarray`; deprecated upstream since 0.22).
    Ndarray,
    /// Burn's Flex CPU backend (cargo feature `flex`), the default.
    #[default]
    Flex,
    /// Burn's wgpu GPU backend (cargo feature `wgpu`).
    Wgpu,
}

/// A backend that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Not compiled into this binary.
    #[error(
        "the {backend} backend is not compiled in: rebuild with `--features {feature}` (compiled in: {compiled})"
    )]
    NotCompiled {
        /// The backend asked for.
        backend: BackendKind,
        /// The cargo feature that enables it.
        feature: &'static str,
        /// The backends that are compiled in.
        compiled: String,
    },
    /// Compiled in, but no device could be opened.
    #[error("the {backend} backend found no usable device: {reason}")]
    NoDevice {
        /// The backend asked for.
        backend: BackendKind,
        /// What went wrong.
        reason: String,
    },
    /// Not a backend name.
    #[error("unknown backend `{0}`: expected ndarray, flex or wgpu")]
    Unknown(String),
}

impl BackendKind {
    /// Every backend, compiled in or not.
    pub const ALL: [BackendKind; 3] = [BackendKind::Ndarray, BackendKind::Flex, BackendKind::Wgpu];

    /// Its name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            BackendKind::Ndarray => "ndarray",
            BackendKind::Flex => "flex",
            BackendKind::Wgpu => "wgpu",
        }
    }

    /// The cargo feature that compiles it in.
    pub fn feature(&self) -> &'static str {
        self.name()
    }

    /// Whether this binary was built with it.
    pub fn is_compiled(&self) -> bool {
        match self {
            BackendKind::Ndarray => cfg!(feature = "ndarray"),
            BackendKind::Flex => cfg!(feature = "flex"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
        }
    }

    /// The backends compiled into this binary.
    pub fn compiled() -> Vec<BackendKind> {
        Self::ALL.into_iter().filter(|b| b.is_compiled()).collect()
    }

    /// Whether the backend computes in float64 (for finite-difference checks).
    pub fn supports_f64(&self) -> bool {
        !matches!(self, BackendKind::Wgpu)
    }

    /// Opens the backend's default device (without autodiff; call `.autodiff()` for training).
    ///
    /// For wgpu this also runs one tiny operation, so that a machine without an adapter gets a
    /// clear error here instead of a panic deep inside the first real computation.
    pub fn device(&self) -> Result<Device, BackendError> {
        if !self.is_compiled() {
            return Err(BackendError::NotCompiled {
                backend: *self,
                feature: self.feature(),
                compiled: Self::compiled()
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        match self {
            #[cfg(feature = "ndarray")]
            #[allow(deprecated)]
            BackendKind::Ndarray => Ok(Device::ndarray()),
            #[cfg(feature = "flex")]
            BackendKind::Flex => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => {
                let device = Device::wgpu(DeviceKind::DefaultDevice);
                let probe = device.clone();
                let hook = std::panic::take_hook();
                std::panic::set_hook(Box::new(|_| {}));
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    Tensor::<1>::ones([4], &probe).sum().into_scalar::<f32>()
                }));
                std::panic::set_hook(hook);
                match result {
                    Ok(4.0) => Ok(device),
                    Ok(v) => Err(BackendError::NoDevice {
                        backend: *self,
                        reason: format!("a probe sum of four ones gave {v}"),
                    }),
                    Err(panic) => Err(BackendError::NoDevice {
                        backend: *self,
                        reason: panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "the wgpu runtime panicked".into()),
                    }),
                }
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("is_compiled() was checked above"),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ndarray" => Ok(BackendKind::Ndarray),
            "flex" => Ok(BackendKind::Flex),
            "wgpu" => Ok(BackendKind::Wgpu),
            _ => Err(BackendError::Unknown(s.to_string())),
        }
    }
}
