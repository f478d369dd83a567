//! The vocabulary of the attention paths: what a user can ask for ([`Implementation`]), what
//! actually runs ([`AttentionPath`]), and the backend facts the choice depends on
//! ([`BackendFamily`]).
//!
//! `Implementation` and `AttentionPath` print themselves and `Implementation` parses back from
//! what it prints, so the CLI, the bench and error messages share one spelling: `auto`, `naive`,
//! `chunked:256` (`chunked` alone is the default block), `fused`, `cpu_kernel` (paths print a
//! chunked block size as `chunked(256)`).

use core::fmt;
use core::str::FromStr;

use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// Which computation path the module takes. All paths have the same semantics (masks, bias,
/// causal alignment, grouped-query heads, zero output for fully masked rows); they differ in speed
/// and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Implementation {
    /// Pick the fastest correct path for the request, the backend and the autodiff state: the
    /// crate's kernel where it serves the call (the CPU kernel on Flex and NdArray, the CubeCL
    /// kernel on the CubeCL backends, but `Fused` for inference on a device with tensor cores),
    /// else `Naive`, `Chunked` or `Fused` by the backend, the
    /// autodiff state and the number of keys; `Naive` when the weights are asked for. The rule
    /// and the measurements behind each branch are in the README ("Attention paths and speed").
    #[default]
    Auto,
    /// Materialize the scores and weights `[b, h, n, m]`; the only path that can return the
    /// weights.
    Naive,
    /// Online softmax over blocks of `block_size` keys, in Burn tensor ops: O(n · block_size)
    /// memory for inference, works on every backend and under autodiff.
    Chunked {
        /// Keys per block.
        block_size: usize,
    },
    /// Delegate to `burn::tensor::module::attention` (Flex's tiled CPU kernel, CubeCL's flash
    /// kernel, the fallback under autodiff). Cannot return weights or apply dropout, and only
    /// knows bottom-right causal alignment.
    Fused,
    /// This crate's query-blocked flash kernel ([`crate::cpu_kernel`]): `f32` (and bf16 on Flex,
    /// stored in bf16, the softmax and every sum in f32), every mask, bias, window and soft-cap,
    /// no weights, no dropout. On Flex and NdArray (the crate's `flex` /
    /// `ndarray` features) it reads their buffers in place and has its own backward pass, so it
    /// trains there; on other backends it serves inference on host copies.
    CpuKernel,
    /// This crate's flash kernel in CubeCL, for Burn's CubeCL backends (wgpu, CUDA, ROCm,
    /// Metal; the crate's `cube` feature), forward and backward (its own, registered through
    /// Burn's backend extension): f32, and f16 or bf16 where the device has them (computed in
    /// f32), every mask, bias (with its gradient), window, soft-cap, segment and ALiBi (the last
    /// two computed key by key), no weights, no dropout. It multiplies with scalar FMAs (no
    /// tensor cores), so `Auto` takes it wherever it serves the call except for inference on a
    /// device with tensor cores, which stays on `Fused` (Burn's tensor-core kernel) until a GPU
    /// has measured otherwise.
    CubeKernel,
    /// [`CubeKernel`](Implementation::CubeKernel) with its products on the device's matrix
    /// instructions (CubeCL's `cmma`: tensor cores on CUDA, cooperative matrices on Vulkan
    /// through Burn's `vulkan` feature): QKᵀ and P·V forward, QKᵀ, dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q
    /// backward, square tiles (16×16×16, or 8×8×8 where the device lists only that or the
    /// larger tiles pass its shared memory) of f16 or bf16 operands with f32 accumulators, everything between them as `CubeKernel` computes
    /// it. For f16 and bf16 inputs on a device that lists those matrix shapes;
    /// refused otherwise, with the reason. `Auto` does not take it: it has not yet passed the
    /// golden cases on a GPU, only on a CPU Vulkan driver with cooperative matrices (Mesa 26's
    /// lavapipe, `.ci/lavapipe-coopmat.sh`).
    CubeTensorCores,
}

/// The path an attention call actually takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttentionPath {
    /// See [`Implementation::Naive`].
    Naive,
    /// See [`Implementation::Chunked`].
    Chunked(usize),
    /// See [`Implementation::Fused`].
    Fused,
    /// See [`Implementation::CpuKernel`].
    CpuKernel,
    /// See [`Implementation::CubeKernel`].
    CubeKernel,
    /// See [`Implementation::CubeTensorCores`].
    CubeTensorCores,
}

/// Keys per block of the chunked path when no block size is given (`chunked`), and when `Auto`
/// picks it: the block size the benchmark measured.
pub(crate) const DEFAULT_BLOCK_SIZE: usize = 256;

/// The backend family of a device, as far as the choice of attention path is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendFamily {
    /// Burn's Flex CPU backend: a tiled (flash) inference kernel for `attention`.
    Flex,
    /// Burn's NdArray CPU backend: `attention` is the plain matmul/softmax/matmul fallback.
    NdArray,
    /// A CubeCL backend (wgpu, CUDA, ROCm, Metal, the CubeCL CPU runtime): an autotuned flash
    /// kernel for `attention` when no explicit scale, bias or softcap is given.
    CubeCl,
    /// Anything else (LibTorch, remote, ...).
    Other,
}

impl BackendFamily {
    /// The family of `device` (its autodiff wrapper, if any, looked through).
    ///
    /// Burn 0.22 has no public accessor for the backend behind a [`Device`] that works without
    /// naming the backend's cargo feature, so this reads the variant name of the device's
    /// `Debug` form (`Device<Flex(..)>`, `Device<NdArray(..)>`, `Device<Cube(..)>`); the
    /// integration tests check it on every backend the workspace builds, so a change in Burn
    /// shows up there.
    ///
    /// ```
    /// use burn::prelude::*;
    /// use burn_sdpa::BackendFamily;
    /// assert_eq!(BackendFamily::of(&Device::flex()), BackendFamily::Flex);
    /// assert_eq!(BackendFamily::of(&Device::flex().autodiff()), BackendFamily::Flex);
    /// ```
    pub fn of(device: &Device) -> Self {
        let name = format!("{:?}", device.clone().without_autodiff());
        let variant = name.strip_prefix("Device<").unwrap_or(&name);
        if variant.starts_with("Flex") {
            BackendFamily::Flex
        } else if variant.starts_with("NdArray") {
            BackendFamily::NdArray
        } else if variant.starts_with("Cube") {
            BackendFamily::CubeCl
        } else {
            BackendFamily::Other
        }
    }

    /// Whether Burn's `attention` runs a kernel that never materializes the `[b, h, n, m]`
    /// scores for inference on this backend.
    pub fn has_fused_inference_kernel(self) -> bool {
        matches!(self, BackendFamily::Flex | BackendFamily::CubeCl)
    }
}

impl Implementation {
    /// Keys per block of the chunked path when no block size is given (`chunked`), and when
    /// `Auto` picks it: the block size the benchmark measured.
    pub const DEFAULT_BLOCK_SIZE: usize = DEFAULT_BLOCK_SIZE;

    /// The path an explicit implementation asks for; `None` for `Auto`, which chooses.
    pub fn path(self) -> Option<AttentionPath> {
        match self {
            Implementation::Auto => None,
            Implementation::Naive => Some(AttentionPath::Naive),
            Implementation::Chunked { block_size } => Some(AttentionPath::Chunked(block_size)),
            Implementation::Fused => Some(AttentionPath::Fused),
            Implementation::CpuKernel => Some(AttentionPath::CpuKernel),
            Implementation::CubeKernel => Some(AttentionPath::CubeKernel),
            Implementation::CubeTensorCores => Some(AttentionPath::CubeTensorCores),
        }
    }

    /// `Auto`, then every path of [`AttentionPath::all`] (the chunked one with `block_size` keys
    /// per block): what a test or a benchmark iterates to cover every implementation.
    ///
    /// ```
    /// use burn_sdpa::Implementation;
    /// let all: Vec<_> = Implementation::all(2).collect();
    /// assert_eq!(all[0], Implementation::Auto);
    /// assert!(all.contains(&Implementation::Chunked { block_size: 2 }));
    /// ```
    pub fn all(block_size: usize) -> impl Iterator<Item = Implementation> {
        core::iter::once(Implementation::Auto).chain(
            AttentionPath::all(block_size)
                .into_iter()
                .map(AttentionPath::implementation),
        )
    }

    /// Whether the implementation serves some call on a backend of `family` (`Auto` always
    /// does; see [`AttentionPath::runs_on`]).
    ///
    /// ```
    /// use burn::prelude::*;
    /// use burn_sdpa::{BackendFamily, Implementation};
    /// let family = BackendFamily::of(&Device::flex());
    /// let on_flex: Vec<_> = Implementation::all(8).filter(|i| i.runs_on(family)).collect();
    /// assert!(!on_flex.contains(&Implementation::CubeKernel));
    /// ```
    pub fn runs_on(self, family: BackendFamily) -> bool {
        self.path().is_none_or(|path| path.runs_on(family))
    }

    /// The implementation's name as the CLI, the bench and the reports spell it: `auto`, or its
    /// path's [`name`](AttentionPath::name) (a chunked block size apart).
    pub fn name(self) -> &'static str {
        self.path().map_or("auto", AttentionPath::name)
    }

    /// What [`FromStr`] accepts, for help texts and error messages:
    /// `auto, naive, chunked[:BLOCK], fused, cpu_kernel, cube_kernel or cube_tensor_cores`.
    pub fn spellings() -> String {
        let names: Vec<&str> = Implementation::all(DEFAULT_BLOCK_SIZE)
            .map(|implementation| match implementation {
                Implementation::Chunked { .. } => "chunked[:BLOCK]",
                other => other.name(),
            })
            .collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        format!("{} or {last}", rest.join(", "))
    }
}

impl AttentionPath {
    /// Every path, the chunked one with `block_size` keys per block: the one list the tests,
    /// the bench and the CLI iterate (adding a path adds it here, and the compiler then asks
    /// for its arm in every `match`).
    pub const fn all(block_size: usize) -> [AttentionPath; 6] {
        [
            AttentionPath::Naive,
            AttentionPath::Chunked(block_size),
            AttentionPath::Fused,
            AttentionPath::CpuKernel,
            AttentionPath::CubeKernel,
            AttentionPath::CubeTensorCores,
        ]
    }

    /// The path's name as the CLI, the bench and the reports spell it (a chunked path's block
    /// size apart): `naive`, `chunked`, `fused`, `cpu_kernel`, `cube_kernel`,
    /// `cube_tensor_cores`.
    pub const fn name(self) -> &'static str {
        match self {
            AttentionPath::Naive => "naive",
            AttentionPath::Chunked(_) => "chunked",
            AttentionPath::Fused => "fused",
            AttentionPath::CpuKernel => "cpu_kernel",
            AttentionPath::CubeKernel => "cube_kernel",
            AttentionPath::CubeTensorCores => "cube_tensor_cores",
        }
    }

    /// Whether the path serves some call on a backend of `family`: every path does but the
    /// CubeCL kernel, which runs on the CubeCL backends only (a path may still refuse a given
    /// call; [`AttentionError::Unsupported`](crate::AttentionError::Unsupported) says why).
    pub fn runs_on(self, family: BackendFamily) -> bool {
        match self {
            AttentionPath::CubeKernel | AttentionPath::CubeTensorCores => {
                family == BackendFamily::CubeCl
            }
            AttentionPath::Naive
            | AttentionPath::Chunked(_)
            | AttentionPath::Fused
            | AttentionPath::CpuKernel => true,
        }
    }

    /// The implementation that asks for exactly this path.
    pub fn implementation(self) -> Implementation {
        match self {
            AttentionPath::Naive => Implementation::Naive,
            AttentionPath::Chunked(block_size) => Implementation::Chunked { block_size },
            AttentionPath::Fused => Implementation::Fused,
            AttentionPath::CpuKernel => Implementation::CpuKernel,
            AttentionPath::CubeKernel => Implementation::CubeKernel,
            AttentionPath::CubeTensorCores => Implementation::CubeTensorCores,
        }
    }
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path() {
            None => f.write_str("auto"),
            Some(AttentionPath::Chunked(block_size)) => write!(f, "chunked:{block_size}"),
            Some(path) => f.write_str(path.name()),
        }
    }
}

impl fmt::Display for AttentionPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionPath::Chunked(block_size) => write!(f, "chunked({block_size})"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Implementation {
    type Err = String;

    /// Parses what [`Implementation::spellings`] lists: `auto`, a path's
    /// [`name`](AttentionPath::name) (`chunked` alone is the default block,
    /// [`Implementation::DEFAULT_BLOCK_SIZE`]), `chunked:BLOCK` or `chunked(BLOCK)` (BLOCK > 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(implementation) =
            Implementation::all(DEFAULT_BLOCK_SIZE).find(|i| i.name() == s)
        {
            return Ok(implementation);
        }
        let block = s
            .strip_prefix("chunked:")
            .or_else(|| s.strip_prefix("chunked(")?.strip_suffix(')'))
            .map(str::parse::<usize>);
        match block {
            Some(Ok(block_size)) if block_size > 0 => Ok(Implementation::Chunked { block_size }),
            _ => Err(format!(
                "expected {} (BLOCK > 0), got `{s}`",
                Implementation::spellings()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implementations_print_and_parse_back() {
        for implementation in Implementation::all(256) {
            let printed = implementation.to_string();
            assert_eq!(printed.parse::<Implementation>(), Ok(implementation));
        }
        assert_eq!(AttentionPath::Chunked(8).to_string(), "chunked(8)");
        assert_eq!(
            "chunked(8)".parse::<Implementation>(),
            Ok(Implementation::Chunked { block_size: 8 })
        );
        assert_eq!(AttentionPath::CpuKernel.to_string(), "cpu_kernel");
        assert_eq!(
            "chunked".parse::<Implementation>(),
            Ok(Implementation::Chunked {
                block_size: DEFAULT_BLOCK_SIZE
            })
        );
        for bad in ["chunked:0", "chunked:", "flash", "chunked(3"] {
            assert!(bad.parse::<Implementation>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_help_text_and_the_names_come_from_the_one_list() {
        assert_eq!(
            Implementation::spellings(),
            "auto, naive, chunked[:BLOCK], fused, cpu_kernel, cube_kernel or cube_tensor_cores"
        );
        let paths = AttentionPath::all(4);
        for (idx, path) in paths.into_iter().enumerate() {
            assert_eq!(path.implementation().path(), Some(path));
            assert_eq!(
                path.name()
                    .parse::<Implementation>()
                    .map(|i| i.path().is_some()),
                Ok(true)
            );
            assert!(paths[..idx].iter().all(|other| other.name() != path.name()));
        }
        assert_eq!(Implementation::all(4).count(), paths.len() + 1);
    }
}
