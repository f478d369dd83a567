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
    /// Burn's CUDA backend (cargo feature `cuda`): NVIDIA GPUs through CubeCL; the driver and
    /// NVRTC are loaded at run time, so the binary builds and starts without them.
    Cuda,
    /// Burn's wgpu backend pinned to Vulkan, with CubeCL's SPIR-V compiler (cargo feature
    /// `vulkan`): the wgpu route to matrix instructions (cooperative matrices), which
    /// `cube_tensor_cores` needs where the driver has them.
    Vulkan,
}

/// Backends with the device each opened ([`BackendKind::usable`]).
pub type OpenedBackends = Vec<(BackendKind, Device)>;

/// Backends with the reason each opened no device ([`BackendKind::usable`]).
pub type RefusedBackends = Vec<(BackendKind, BackendError)>;

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
    #[error("unknown backend `{0}`: expected ndarray, flex, wgpu, cuda or vulkan")]
    Unknown(String),
}

impl BackendKind {
    /// Every backend, compiled in or not.
    pub const ALL: [BackendKind; 5] = [
        BackendKind::Ndarray,
        BackendKind::Flex,
        BackendKind::Wgpu,
        BackendKind::Cuda,
        BackendKind::Vulkan,
    ];

    /// Its name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            BackendKind::Ndarray => "ndarray",
            BackendKind::Flex => "flex",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Vulkan => "vulkan",
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
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Vulkan => cfg!(feature = "vulkan"),
        }
    }

    /// The backends compiled into this binary.
    pub fn compiled() -> Vec<BackendKind> {
        Self::ALL.into_iter().filter(|b| b.is_compiled()).collect()
    }

    /// Whether the backend computes in float64 (for finite-difference checks). Not on wgpu
    /// (WGSL has none); not claimed on CUDA either, where it is not verified.
    pub fn supports_f64(&self) -> bool {
        !matches!(
            self,
            BackendKind::Wgpu | BackendKind::Cuda | BackendKind::Vulkan
        )
    }

    /// What turns this binary's CubeCL kernels into code the backend's driver loads, as a GPU
    /// result should name it; `None` for the CPU backends (plain Rust).
    ///
    /// cubecl-cuda 0.11.3 has two compilers, both always compiled in, one chosen at build time
    /// by its `cpp` feature (`cubecl-cuda/src/compiler.rs`): PTX through LLVM's NVPTX back end
    /// (the default; this repository links Debian sid's LLVM 23.1, `.ci/llvm-for-cuda.sh`), or
    /// CUDA C++ through NVRTC (this binary's `cuda-nvrtc` feature), which needs the host's
    /// `libnvrtc` at run time.
    pub fn kernel_compiler(&self) -> Option<&'static str> {
        match self {
            BackendKind::Ndarray | BackendKind::Flex => None,
            // Burn's `vulkan` feature gives wgpu's Vulkan adapters CubeCL's SPIR-V compiler.
            BackendKind::Wgpu if cfg!(feature = "vulkan") => {
                Some("SPIR-V on a Vulkan adapter (the vulkan feature), else WGSL")
            }
            BackendKind::Wgpu => Some("WGSL (wgpu)"),
            BackendKind::Vulkan => Some("SPIR-V (wgpu on Vulkan)"),
            BackendKind::Cuda if cfg!(feature = "cuda-nvrtc") => Some("CUDA C++ by NVRTC"),
            BackendKind::Cuda => Some("PTX by LLVM 23.1 (NVPTX)"),
        }
    }

    /// What this binary was built with, for `sdpa --version` and a GPU sitting's record: the
    /// backends compiled in, one line each, with the kernel compiler of each GPU backend.
    pub fn build_summary() -> String {
        let mut lines = vec![env!("CARGO_PKG_VERSION").to_string()];
        for kind in Self::compiled() {
            lines.push(match kind.kernel_compiler() {
                Some(compiler) => format!("backend {kind}: kernels compiled to {compiler}"),
                None => format!("backend {kind}"),
            });
        }
        lines.join("\n")
    }

    /// Whether the backend runs only on a GPU with its driver, so that being compiled in does
    /// not mean it is usable on this machine (CUDA: a CI machine builds it without a GPU; wgpu
    /// falls back to a CPU driver, lavapipe, where there is no GPU).
    pub fn needs_gpu(&self) -> bool {
        matches!(self, BackendKind::Cuda)
    }

    /// The compiled-in backends that open a device here, each with its device, and the
    /// compiled-in ones that do not with the reason (a [`needs_gpu`](Self::needs_gpu) backend
    /// on a machine without its GPU).
    pub fn usable() -> (OpenedBackends, RefusedBackends) {
        let mut usable = Vec::new();
        let mut unusable = Vec::new();
        for kind in Self::compiled() {
            match kind.device() {
                Ok(device) => usable.push((kind, device)),
                Err(e) => unusable.push((kind, e)),
            }
        }
        (usable, unusable)
    }

    /// Opens the backend's default device (without autodiff; call `.autodiff()` for training).
    ///
    /// For wgpu and CUDA this also runs one tiny operation, so that a machine without an adapter,
    /// a driver or a GPU gets a clear error here ([`BackendError::NoDevice`], with the runtime's
    /// own message) instead of a panic deep inside the first real computation.
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
            BackendKind::Wgpu => self.probed(Device::wgpu(DeviceKind::DefaultDevice)),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => self.probed(Device::cuda(0)),
            #[cfg(feature = "vulkan")]
            BackendKind::Vulkan => self.probed(Device::vulkan(DeviceKind::DefaultDevice)),
            #[allow(unreachable_patterns)]
            _ => unreachable!("is_compiled() was checked above"),
        }
    }

    /// `device` once a sum of four ones computed on it gave 4, else why not. The GPU runtimes
    /// panic when they find no adapter, driver or GPU, on the thread that opens the device (a
    /// runner thread of CubeCL's) and then on the caller's: every panic message of the probe is
    /// kept (the first is the runtime's own, e.g. cudarc's "Unable to dynamically load the
    /// \"cuda\" shared library") and none is printed.
    ///
    /// The probe runs once per backend and process; later calls give its answer again (a
    /// runtime that failed to start is not started twice).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn probed(&self, device: Device) -> Result<Device, BackendError> {
        use std::sync::OnceLock;
        static PROBES: [OnceLock<Result<(), BackendError>>; BackendKind::ALL.len()] =
            [const { OnceLock::new() }; BackendKind::ALL.len()];
        let index = Self::ALL.iter().position(|k| k == self).unwrap_or_default();
        PROBES[index]
            .get_or_init(|| self.probe(&device))
            .clone()
            .map(|()| device)
    }

    /// Runs the probe of [`probed`](Self::probed) on `device`.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn probe(&self, device: &Device) -> Result<(), BackendError> {
        use std::sync::{Arc, Mutex};
        let probe = device.clone();
        let messages: Arc<Mutex<Vec<String>>> = Arc::default();
        let hook = std::panic::take_hook();
        let seen = Arc::clone(&messages);
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| info.to_string());
            if let Ok(mut seen) = seen.lock() {
                seen.push(message);
            }
        }));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            Tensor::<1>::ones([4], &probe).sum().into_scalar::<f32>()
        }));
        std::panic::set_hook(hook);
        let messages = messages.lock().map(|m| m.clone()).unwrap_or_default();
        match result {
            Ok(4.0) => Ok(()),
            Ok(v) => Err(BackendError::NoDevice {
                backend: *self,
                reason: format!("a probe sum of four ones gave {v}"),
            }),
            Err(panic) => {
                let last = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                let mut reasons: Vec<String> = messages;
                if let Some(last) = last
                    && !reasons.contains(&last)
                {
                    reasons.push(last);
                }
                let reason = if reasons.is_empty() {
                    format!("the {self} runtime panicked")
                } else {
                    reasons.join("; then: ")
                };
                Err(BackendError::NoDevice {
                    backend: *self,
                    reason,
                })
            }
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
            "cuda" => Ok(BackendKind::Cuda),
            "vulkan" => Ok(BackendKind::Vulkan),
            _ => Err(BackendError::Unknown(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_parses_from_its_name_in_any_case() {
        for kind in BackendKind::ALL {
            assert_eq!(kind.name().parse::<BackendKind>(), Ok(kind));
            assert_eq!(kind.name().to_uppercase().parse::<BackendKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!("Cuda".parse::<BackendKind>(), Ok(BackendKind::Cuda));
    }

    #[test]
    fn an_unknown_name_lists_every_backend() {
        let err = "rocm".parse::<BackendKind>().unwrap_err();
        assert_eq!(err, BackendError::Unknown("rocm".into()));
        let text = err.to_string();
        for kind in BackendKind::ALL {
            assert!(text.contains(kind.name()), "{text}");
        }
        assert!(
            text.contains("expected ndarray, flex, wgpu, cuda or vulkan"),
            "{text}"
        );
    }

    #[test]
    fn cuda_needs_a_gpu_its_feature_and_claims_no_f64() {
        let cuda = BackendKind::Cuda;
        assert!(cuda.needs_gpu());
        assert!(!cuda.supports_f64());
        assert_eq!(cuda.feature(), "cuda");
        assert_eq!(cuda.is_compiled(), cfg!(feature = "cuda"));
        assert_eq!(
            BackendKind::compiled().contains(&cuda),
            cfg!(feature = "cuda")
        );
        assert!(!BackendKind::Wgpu.needs_gpu() && !BackendKind::Flex.needs_gpu());
    }

    #[test]
    fn every_gpu_backend_names_its_kernel_compiler() {
        for kind in BackendKind::ALL {
            assert_eq!(
                kind.kernel_compiler().is_some(),
                !kind.supports_f64(),
                "{kind}"
            );
        }
        let cuda = BackendKind::Cuda.kernel_compiler().unwrap_or_default();
        if cfg!(feature = "cuda-nvrtc") {
            assert!(cuda.contains("NVRTC"), "{cuda}");
        } else {
            assert!(cuda.contains("LLVM"), "{cuda}");
        }
    }

    #[test]
    fn the_build_summary_names_every_compiled_backend_and_its_compiler() {
        let summary = BackendKind::build_summary();
        for kind in BackendKind::ALL {
            let line = summary.lines().find(|l| {
                *l == format!("backend {kind}") || l.starts_with(&format!("backend {kind}:"))
            });
            assert_eq!(line.is_some(), kind.is_compiled(), "{kind}: {summary}");
            if let (Some(line), Some(compiler)) = (line, kind.kernel_compiler()) {
                assert!(line.ends_with(compiler), "{line}");
            }
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_its_feature_names_the_feature() {
        let err = BackendKind::Cuda.device().unwrap_err();
        assert!(
            matches!(
                &err,
                BackendError::NotCompiled {
                    backend: BackendKind::Cuda,
                    feature: "cuda",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }

    /// With the feature, on a machine without a CUDA GPU or driver: a `NoDevice` error holding
    /// the runtime's reason, not a panic; on a machine with one, a device that computes.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_opens_a_device_or_says_why_not() {
        match BackendKind::Cuda.device() {
            Ok(device) => {
                let sum = Tensor::<1>::ones([8], &device).sum().into_scalar::<f32>();
                assert_eq!(sum, 8.0);
            }
            Err(BackendError::NoDevice { backend, reason }) => {
                assert_eq!(backend, BackendKind::Cuda);
                assert!(reason.len() > 10, "{reason}");
                // Asking again gives an error again (no hang, no panic after the first probe).
                assert!(BackendKind::Cuda.device().is_err());
            }
            Err(other) => panic!("{other:?}"),
        }
        let (usable, unusable) = BackendKind::usable();
        assert!(usable.iter().all(|(b, _)| *b != BackendKind::Cuda) || unusable.is_empty());
    }
}
