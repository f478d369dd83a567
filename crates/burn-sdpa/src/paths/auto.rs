//! `Implementation::Auto`: the measured rule, a pure function of [`AutoRequest`] (tested as a
//! table). It reads which Burn backend runs the call ([`BackendFamily`], worked out once per call),
//! because the paths' speed and memory depend on it (Flex and CubeCL have fused inference kernels
//! for `burn::tensor::module::attention`, NdArray and every autodiff device run Burn's plain
//! fallback).

use crate::vocabulary::{AttentionPath, BackendFamily, DEFAULT_BLOCK_SIZE};

/// Largest `[b, h, n, m]` score tensor (in bytes) that `Auto` lets an inference call
/// materialize on a backend without a fused inference kernel; above it, `Auto` takes the chunked
/// path, whose memory is O(n · block). 4 GiB keeps the benchmark's largest training-size case
/// (b = 4, h = 8, n = m = 4096, f32: 2 GiB) on the faster plain path, while n = 16 384 at
/// b = 1, h = 8 (8 GiB of scores, three times that with the softmax temporaries) no longer
/// runs a 24 GiB machine out of memory.
pub const AUTO_INFERENCE_SCORES_BUDGET_BYTES: u64 = 4 << 30;

/// What `Auto` looks at (built by `paths::resolve` from the call's device facts, worked out
/// once per call, and from what each path says it supports).
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
    /// (f32, or bf16 on Flex; no weights, no dropout; under autodiff only where it runs in
    /// place).
    pub cpu_kernel_ok: bool,
    /// Whether [`Implementation::CubeKernel`](crate::Implementation::CubeKernel) can serve the
    /// call (a CubeCL backend, the crate's `cube` feature, f32, no weights, no dropout).
    pub cube_kernel_ok: bool,
    /// Whether the CPU kernel runs in place on this backend, through its backend extension
    /// (Flex and NdArray when the crate's `flex` / `ndarray` features are on), rather than on
    /// host copies.
    pub cpu_kernel_in_place: bool,
    /// Whether the device offers matrix instructions (tensor cores: a CubeCL device whose
    /// client lists `cmma` shapes; see [`has_tensor_cores`](super::has_tensor_cores)).
    pub tensor_cores: bool,
}

/// `Auto`'s rule for a call that does not ask for the weights or scores (those always take
/// `Naive`). It was set by `sdpa bench` (b = 4, h = 8, d = 64, n = m from 128 to 4096, 2 CPU
/// cores); the measurements behind each branch are in the README ("Attention paths and speed").
///
/// - **Flex and NdArray with the kernel's backend extension**: `CpuKernel` whenever it can serve
///   the call (f32, or bf16 on Flex; no weights, no dropout), for inference and training, masked
///   or not: it was the fastest path at every measured size, forward and forward + backward (in
///   bf16 too: `sdpa bench --dtype bf16`).
/// - **Inference on a CubeCL device with tensor cores**
///   ([`has_tensor_cores`](super::has_tensor_cores): 16×16×16 half-precision matrix
///   instructions, as on NVIDIA GPUs; not lavapipe's emulated 8×8×8), when `Fused` can serve the
///   call: `Fused`, Burn's own flash forward
///   (cubek-attention), which multiplies on the tensor cores, where this crate's CubeCL kernel
///   multiplies with scalar FMAs (at most about 8% of an H200's dense bf16 rate). Not measured on
///   any GPU yet: the rule keeps inference on Burn's kernel until a sitting
///   (`benches/gpu_sitting.sh`) shows this crate's kernel faster there. Training on such a device
///   still takes `CubeKernel` (next rule): Burn's default under autodiff materializes the
///   `[b, h, n, m]` scores, the kernel holds O(n).
/// - **CubeCL backends with the crate's `cube` feature**: `CubeKernel` whenever it can serve the
///   call (f32, no weights, no dropout), for inference and training. On lavapipe (a CPU driver,
///   the only Vulkan device measured so far) it was the fastest training path at n = 128, 512
///   and 1024 (3× `Naive` at 1024) and the fastest forward on the device from n = 512 (Burn's
///   `attention` was faster at n = 128); its memory is O(n) where `Naive`'s is O(n · m)
///   (`docs/bench/BENCH_wgpu.md`).
/// - **Training (autodiff) otherwise** on CPU backends: Burn's `attention` is its plain fallback
///   built from autodiff ops, slower than `Naive`, and `Chunked` (block [`DEFAULT_BLOCK_SIZE`](crate::Implementation::DEFAULT_BLOCK_SIZE))
///   normalizes the n×d output instead of the n×m weights: m < [`DEFAULT_BLOCK_SIZE`](crate::Implementation::DEFAULT_BLOCK_SIZE) → `Naive`,
///   else `Chunked`. On CubeCL (GPU) backends, where the chunked path's per-block kernel
///   launches were not measured, `Naive`.
/// - **Inference on Flex and NdArray without the extension**, when the kernel can serve the call
///   on host copies: `CpuKernel`, except on Flex for m < [`DEFAULT_BLOCK_SIZE`](crate::Implementation::DEFAULT_BLOCK_SIZE), where Flex's own
///   kernel tied with it and needs no host copy.
/// - **Other inference on Flex** (a mask or bias, another dtype) **and on CubeCL** (another dtype,
///   or no `cube` feature): `Fused`, Burn's own kernel, which holds O(n) memory.
/// - **Other inference on NdArray and other backends**: Burn's `attention` is the plain
///   fallback: `Chunked` for [`DEFAULT_BLOCK_SIZE`](crate::Implementation::DEFAULT_BLOCK_SIZE) ≤ m ≤ 2·[`DEFAULT_BLOCK_SIZE`](crate::Implementation::DEFAULT_BLOCK_SIZE) or when the scores
///   exceed [`AUTO_INFERENCE_SCORES_BUDGET_BYTES`], else `Fused`.
/// - When `Fused` cannot serve an inference call either (top-left causal with n ≠ m and a
///   mask): `Naive`, or `Chunked` above the budget.
pub fn auto_path(request: AutoRequest) -> AttentionPath {
    let chunked = AttentionPath::Chunked(DEFAULT_BLOCK_SIZE);
    let over_budget = request.scores_bytes > AUTO_INFERENCE_SCORES_BUDGET_BYTES;
    let tensor_core_inference = request.family == BackendFamily::CubeCl
        && request.tensor_cores
        && !request.autodiff
        && request.fused_ok;
    if request.cpu_kernel_ok && request.cpu_kernel_in_place {
        AttentionPath::CpuKernel
    } else if tensor_core_inference {
        AttentionPath::Fused
    } else if request.cube_kernel_ok {
        AttentionPath::CubeKernel
    } else if request.autodiff {
        if request.family == BackendFamily::CubeCl || request.n_keys < DEFAULT_BLOCK_SIZE {
            AttentionPath::Naive
        } else {
            chunked
        }
    } else if request.cpu_kernel_ok
        && (request.family == BackendFamily::NdArray
            || (request.family == BackendFamily::Flex && request.n_keys >= DEFAULT_BLOCK_SIZE))
    {
        AttentionPath::CpuKernel
    } else if !request.fused_ok {
        if over_budget {
            chunked
        } else {
            AttentionPath::Naive
        }
    } else if request.family.has_fused_inference_kernel() {
        AttentionPath::Fused
    } else if over_budget || (DEFAULT_BLOCK_SIZE..=2 * DEFAULT_BLOCK_SIZE).contains(&request.n_keys)
    {
        chunked
    } else {
        AttentionPath::Fused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(family: BackendFamily, autodiff: bool, n_keys: usize, gib: u64) -> AutoRequest {
        AutoRequest {
            family,
            autodiff,
            n_keys,
            scores_bytes: gib << 30,
            fused_ok: true,
            cpu_kernel_ok: !autodiff,
            cube_kernel_ok: false,
            cpu_kernel_in_place: false,
            tensor_cores: false,
        }
    }

    #[test]
    fn inference_on_tensor_cores_stays_on_burns_kernel() {
        use BackendFamily::CubeCl;
        let on_tensor_cores = |autodiff, n_keys, fused_ok| AutoRequest {
            cube_kernel_ok: true,
            tensor_cores: true,
            fused_ok,
            ..request(CubeCl, autodiff, n_keys, n_keys as u64 >> 10)
        };
        for n_keys in [1, 64, 256, 4096, 32768] {
            // Inference: Burn's tensor-core kernel wherever it serves the call ...
            assert_eq!(
                auto_path(on_tensor_cores(false, n_keys, true)),
                AttentionPath::Fused
            );
            // ... this crate's kernel where it does not (e.g. top-left causal with n != m) ...
            assert_eq!(
                auto_path(on_tensor_cores(false, n_keys, false)),
                AttentionPath::CubeKernel
            );
            // ... and for training, where Burn's default materializes the scores.
            assert_eq!(
                auto_path(on_tensor_cores(true, n_keys, true)),
                AttentionPath::CubeKernel
            );
        }
        // Only CubeCL devices report tensor cores; a CPU backend's rule is unchanged.
        let flex = AutoRequest {
            tensor_cores: true,
            cpu_kernel_in_place: true,
            ..request(BackendFamily::Flex, false, 4096, 0)
        };
        assert_eq!(auto_path(flex), AttentionPath::CpuKernel);
    }

    #[test]
    fn the_cube_kernel_serves_every_call_it_can_without_tensor_cores() {
        use BackendFamily::CubeCl;
        for autodiff in [false, true] {
            for n_keys in [1, 64, 256, 4096, 32768] {
                let request = AutoRequest {
                    cube_kernel_ok: true,
                    ..request(CubeCl, autodiff, n_keys, n_keys as u64 >> 10)
                };
                assert_eq!(auto_path(request), AttentionPath::CubeKernel);
            }
        }
        // A call it cannot serve (weights, dropout, another dtype, no `cube` feature) falls back
        // to the other rules.
        assert_eq!(
            auto_path(request(CubeCl, true, 4096, 2)),
            AttentionPath::Naive
        );
    }

    #[test]
    fn the_kernel_in_place_serves_every_call_it_can() {
        use BackendFamily::*;
        let in_place = |family, autodiff, n_keys| AutoRequest {
            cpu_kernel_ok: true,
            cpu_kernel_in_place: true,
            ..request(family, autodiff, n_keys, 0)
        };
        for family in [Flex, NdArray] {
            for autodiff in [false, true] {
                for n_keys in [1, 64, 255, 256, 4096] {
                    assert_eq!(
                        auto_path(in_place(family, autodiff, n_keys)),
                        AttentionPath::CpuKernel
                    );
                }
            }
        }
        // A call it cannot serve (weights, dropout, another dtype) falls back to the other rules.
        let blocked = AutoRequest {
            cpu_kernel_ok: false,
            ..in_place(Flex, true, 4096)
        };
        assert_eq!(auto_path(blocked), AttentionPath::Chunked(256));
    }

    #[test]
    fn the_rule_without_the_extension() {
        use BackendFamily::*;
        // Training on CPU backends: naive for one block of keys, chunked beyond.
        assert_eq!(auto_path(request(Flex, true, 255, 0)), AttentionPath::Naive);
        assert_eq!(
            auto_path(request(Flex, true, 256, 0)),
            AttentionPath::Chunked(256)
        );
        assert_eq!(
            auto_path(request(NdArray, true, 4096, 2)),
            AttentionPath::Chunked(256)
        );
        assert_eq!(
            auto_path(request(CubeCl, true, 4096, 2)),
            AttentionPath::Naive
        );
        // Inference on the host CPU: this crate's kernel whenever it can serve the call.
        assert_eq!(
            auto_path(request(Flex, false, 32768, 32)),
            AttentionPath::CpuKernel
        );
        assert_eq!(
            auto_path(request(Flex, false, 256, 0)),
            AttentionPath::CpuKernel
        );
        assert_eq!(
            auto_path(request(NdArray, false, 128, 0)),
            AttentionPath::CpuKernel
        );
        // Below one key block on Flex, Burn's kernel ties with it and needs no host copy.
        assert_eq!(
            auto_path(request(Flex, false, 255, 0)),
            AttentionPath::Fused
        );
        assert_eq!(
            auto_path(request(CubeCl, false, 128, 0)),
            AttentionPath::Fused
        );
        // Otherwise (a mask or bias): Burn's kernel where it has one, the fallback within the
        // budget.
        let request = |family, autodiff, n_keys, gib| AutoRequest {
            cpu_kernel_ok: false,
            ..request(family, autodiff, n_keys, gib)
        };
        assert_eq!(
            auto_path(request(Flex, false, 32768, 32)),
            AttentionPath::Fused
        );
        assert_eq!(
            auto_path(request(CubeCl, false, 32768, 32)),
            AttentionPath::Fused
        );
        assert_eq!(
            auto_path(request(NdArray, false, 4096, 2)),
            AttentionPath::Fused
        );
        assert_eq!(
            auto_path(request(NdArray, false, 128, 0)),
            AttentionPath::Fused
        );
        assert_eq!(
            auto_path(request(NdArray, false, 512, 0)),
            AttentionPath::Chunked(256)
        );
        assert_eq!(
            auto_path(request(NdArray, false, 16384, 8)),
            AttentionPath::Chunked(256)
        );
        let top_left = AutoRequest {
            fused_ok: false,
            ..request(Flex, false, 100, 0)
        };
        assert_eq!(auto_path(top_left), AttentionPath::Naive);
    }

    #[test]
    fn the_family_of_a_flex_device() {
        let device = burn::prelude::Device::flex();
        assert_eq!(BackendFamily::of(&device), BackendFamily::Flex);
        assert_eq!(BackendFamily::of(&device.autodiff()), BackendFamily::Flex);
    }
}
