//! What `Implementation::Auto` knows about the device: which Burn backend runs the call, because
//! the paths' speed and memory depend on it (Flex and CubeCL have fused inference kernels for
//! `burn::tensor::module::attention`, NdArray and every autodiff device run Burn's plain
//! fallback).

use burn::prelude::*;

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
    /// use burn_sdpa::auto::BackendFamily;
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

/// Key block of the chunked path when `Auto` picks it (the block size the benchmark measured).
pub const AUTO_BLOCK_SIZE: usize = 256;

/// Largest `[b, h, n, m]` score tensor (in bytes) that `Auto` lets an inference call
/// materialize on a backend without a fused inference kernel; above it, `Auto` takes the chunked
/// path, whose memory is O(n · block). 4 GiB keeps the benchmark's largest training-size case
/// (b = 4, h = 8, n = m = 4096, f32: 2 GiB) on the faster plain path, while n = 16 384 at
/// b = 1, h = 8 (8 GiB of scores, three times that with the softmax temporaries) no longer
/// runs a 24 GiB machine out of memory.
pub const AUTO_INFERENCE_SCORES_BUDGET_BYTES: u64 = 4 << 30;

/// What `Auto` looks at (built by [`ScaledDotProductAttention::resolve`](crate::ScaledDotProductAttention::resolve)).
#[derive(Debug, Clone, Copy)]
pub struct AutoRequest {
    /// The device's backend.
    pub family: BackendFamily,
    /// Whether the call runs on an autodiff device (training).
    pub autodiff: bool,
    /// Number of keys m.
    pub n_keys: usize,
    /// Size of the `[b, h, n, m]` scores in the input's dtype.
    pub scores_bytes: u64,
    /// Whether `Fused` can serve the call (no weights, no active dropout, alignment it knows).
    pub fused_ok: bool,
    /// Whether [`Implementation::CpuKernel`](crate::Implementation::CpuKernel) can serve the call
    /// (f32, no mask or bias, no weights, no dropout, no autodiff).
    pub cpu_kernel_ok: bool,
}

/// `Auto`'s rule for a call that does not ask for the weights or scores (those always take
/// `Naive`). Measured with `sdpa bench` (b = 4, h = 8, d = 64, n = m from 128 to 4096, 2 CPU
/// cores, medians; the tables are in the README):
///
/// - **Training (autodiff)** on CPU backends: Burn's `attention` is its plain fallback built from
///   autodiff ops, slower than `Naive` on flex from n = 256 (by 8–15% in one run,
///   up to 44% in another), because its masked, clamped softmax adds
///   passes over the n×m scores in both directions. `Chunked` (block 256) is the fastest path
///   from m = 256 up (flex, forward+backward, n = 2048: 4.6 s against 5.8 s for `Naive` and
///   6.7 s for `Fused`), because it normalizes the n×d output instead of the n×m weights; at
///   m = 128 it ties with `Naive` (19.2 ms against 19.1 ms). So: m < [`AUTO_BLOCK_SIZE`] →
///   `Naive`, else `Chunked`. On CubeCL (GPU) backends, where the chunked path's per-block
///   kernel launches were not measured, `Naive`.
/// - **Inference on Flex and NdArray**, when [`Implementation::CpuKernel`](crate::Implementation::CpuKernel)
///   can serve the call (f32, no mask or bias, causal or not): `CpuKernel`, this crate's
///   query-blocked flash kernel. On flex it ran 73–82 GFLOP/s from n = 512 up, 1.8–2.1× Flex's
///   own kernel (n = 1024: 107.7 ms against 195.5 ms, and 333 ms for `Naive`); at m = 128,
///   where Flex's kernel materializes one small score matrix per head, the two tie (4.6 against
///   4.5 ms) and the kernel pays a host copy of shared inputs, so Flex keeps `Fused` for
///   m < [`AUTO_BLOCK_SIZE`]. On ndarray, whose `attention` is the plain fallback, the kernel
///   was 3.7–4.7× faster than every tensor-op path from n = 256 (n = 1024: 110 ms against
///   522 ms for `Chunked` and 557 ms for `Fused`) and 1.8× at n = 128 (3.8 against 6.9 ms).
/// - **Other inference on Flex and CubeCL** (a mask or bias, another dtype): `Fused`, i.e.
///   Burn's own kernel. Flex's tiled kernel was 1.5–2.2× faster than the tensor-op paths at
///   every n on flex (n = 1024: 215 ms against 381 ms for `Naive`) and holds O(n) memory
///   (n = 32 768, b = 1: +64 MiB); CubeCL's flash kernel is kept reachable by passing no
///   explicit scale.
/// - **Other inference on NdArray and other backends**: Burn's `attention` is the plain
///   fallback, and all tensor-op paths are within ±15% of each other. `Chunked` is ahead for
///   256 ≤ m ≤ 512 (ndarray, n = 512, two runs: 109 and 113 ms against 126 and 120 ms for
///   `Fused`) and behind at m = 128 (one partial block: 7.7 ms against 6.6 ms) and from
///   m = 1024 (491 against 433 ms). So `Chunked` for 256 ≤ m ≤ 512 or when the scores exceed
///   [`AUTO_INFERENCE_SCORES_BUDGET_BYTES`], else `Fused`.
/// - When `Fused` cannot serve an inference call either (top-left causal with n ≠ m and a
///   mask): `Naive`, or `Chunked` above the budget.
pub fn auto_path(request: AutoRequest) -> crate::Path {
    use crate::Path;
    let chunked = Path::Chunked(AUTO_BLOCK_SIZE);
    let over_budget = request.scores_bytes > AUTO_INFERENCE_SCORES_BUDGET_BYTES;
    if request.autodiff {
        if request.family == BackendFamily::CubeCl || request.n_keys < AUTO_BLOCK_SIZE {
            Path::Naive
        } else {
            chunked
        }
    } else if request.cpu_kernel_ok
        && (request.family == BackendFamily::NdArray
            || (request.family == BackendFamily::Flex && request.n_keys >= AUTO_BLOCK_SIZE))
    {
        Path::CpuKernel
    } else if !request.fused_ok {
        if over_budget { chunked } else { Path::Naive }
    } else if request.family.has_fused_inference_kernel() {
        Path::Fused
    } else if over_budget || (AUTO_BLOCK_SIZE..=2 * AUTO_BLOCK_SIZE).contains(&request.n_keys) {
        chunked
    } else {
        Path::Fused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Path;

    fn request(family: BackendFamily, autodiff: bool, n_keys: usize, gib: u64) -> AutoRequest {
        AutoRequest {
            family,
            autodiff,
            n_keys,
            scores_bytes: gib << 30,
            fused_ok: true,
            cpu_kernel_ok: !autodiff,
        }
    }

    #[test]
    fn the_rule_as_documented() {
        use BackendFamily::*;
        // Training on CPU backends: naive for one block of keys, chunked beyond.
        assert_eq!(auto_path(request(Flex, true, 255, 0)), Path::Naive);
        assert_eq!(auto_path(request(Flex, true, 256, 0)), Path::Chunked(256));
        assert_eq!(
            auto_path(request(NdArray, true, 4096, 2)),
            Path::Chunked(256)
        );
        assert_eq!(auto_path(request(CubeCl, true, 4096, 2)), Path::Naive);
        // Inference on the host CPU: this crate's kernel whenever it can serve the call.
        assert_eq!(auto_path(request(Flex, false, 32768, 32)), Path::CpuKernel);
        assert_eq!(auto_path(request(Flex, false, 256, 0)), Path::CpuKernel);
        assert_eq!(auto_path(request(NdArray, false, 128, 0)), Path::CpuKernel);
        // Below one key block on Flex, Burn's kernel ties with it and needs no host copy.
        assert_eq!(auto_path(request(Flex, false, 255, 0)), Path::Fused);
        assert_eq!(auto_path(request(CubeCl, false, 128, 0)), Path::Fused);
        // Otherwise (a mask or bias): Burn's kernel where it has one, the fallback within the
        // budget.
        let request = |family, autodiff, n_keys, gib| AutoRequest {
            cpu_kernel_ok: false,
            ..request(family, autodiff, n_keys, gib)
        };
        assert_eq!(auto_path(request(Flex, false, 32768, 32)), Path::Fused);
        assert_eq!(auto_path(request(CubeCl, false, 32768, 32)), Path::Fused);
        assert_eq!(auto_path(request(NdArray, false, 4096, 2)), Path::Fused);
        assert_eq!(auto_path(request(NdArray, false, 128, 0)), Path::Fused);
        assert_eq!(
            auto_path(request(NdArray, false, 512, 0)),
            Path::Chunked(256)
        );
        assert_eq!(
            auto_path(request(NdArray, false, 16384, 8)),
            Path::Chunked(256)
        );
        let top_left = AutoRequest {
            fused_ok: false,
            ..request(Flex, false, 100, 0)
        };
        assert_eq!(auto_path(top_left), Path::Naive);
    }

    #[test]
    fn the_family_of_a_flex_device() {
        let device = Device::flex();
        assert_eq!(BackendFamily::of(&device), BackendFamily::Flex);
        assert_eq!(BackendFamily::of(&device.autodiff()), BackendFamily::Flex);
    }
}
