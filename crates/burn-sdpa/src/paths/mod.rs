//! The attention paths, and the only place that chooses one.
//!
//! Every path is one file with two functions: `blocker(&Call)` says why it cannot serve a call
//! (`Option<&'static str>`; the cube path's a `Cow`, since its reasons name the device's limits),
//! and `run(Call)` computes it. [`resolve`] honours an explicit [`Implementation`] or rejects it
//! with the path's reason, and asks [`auto::auto_path`] for `Auto`, then reroutes a kernel whose
//! scores may overflow to the chunked path ([`overflow`]); [`run`] dispatches. Adding a
//! path means a file here, a variant in [`crate::vocabulary`] (with its
//! spelling), and one arm in each of the two matches below.

pub(crate) mod auto;
pub(crate) mod call;
pub(crate) mod chunked;
pub mod cpu;
#[cfg(feature = "cube")]
pub(crate) mod cube;
pub(crate) mod fused;
pub(crate) mod naive;
pub(crate) mod nonfinite;
pub(crate) mod online_stats;
pub(crate) mod overflow;
pub(crate) mod sinks;

use std::borrow::Cow;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::vocabulary::{AttentionPath, DEFAULT_BLOCK_SIZE, Implementation};
use auto::{AutoRequest, auto_path};
use call::Call;

/// Why `path` cannot serve `call`, if it cannot.
pub(crate) fn blocker(path: AttentionPath, call: &Call) -> Option<Cow<'static, str>> {
    let reason = match path {
        AttentionPath::Naive => naive::blocker(call),
        AttentionPath::Chunked(_) => chunked::blocker(call),
        AttentionPath::Fused => fused::blocker(call),
        AttentionPath::CpuKernel => cpu::blocker(call),
        #[cfg(feature = "cube")]
        AttentionPath::CubeKernel => return cube::blocker(call),
        #[cfg(feature = "cube")]
        AttentionPath::CubeTensorCores => return cube::mma_blocker(call),
        #[cfg(not(feature = "cube"))]
        AttentionPath::CubeKernel | AttentionPath::CubeTensorCores => {
            Some("burn-sdpa was built without its `cube` feature")
        }
    };
    reason.map(Cow::Borrowed)
}

/// Whether `device` has tensor cores as `Auto` counts them: a CubeCL device whose client lists
/// a matrix instruction (CubeCL's `cmma`) for f16 or bf16 operands with an f32 accumulator of at
/// least 16×16×16, the shape NVIDIA's tensor cores list from Volta on (CUDA; Vulkan through
/// Burn's `vulkan` feature on such a GPU). Mesa 26's lavapipe lists cooperative matrices of
/// 8×8×8 only, emulated on the CPU: not tensor cores, and `false` here. `false` on every other
/// backend, on wgpu's WGSL compiler, and in builds without the crate's `cube` feature, where the
/// answer would not change `Auto`'s choice. `Auto` keeps inference on such a device on Burn's
/// tensor-core kernel (`Fused`).
///
/// ```
/// use burn::prelude::*;
/// assert!(!burn_sdpa::has_tensor_cores(&Device::flex()));
/// ```
pub fn has_tensor_cores(device: &burn::prelude::Device) -> bool {
    #[cfg(feature = "cube")]
    {
        use burn::backend::DispatchDevice;
        use cubecl::ir::{ElemType, FloatKind};
        if let DispatchDevice::Cube(cube) = device.clone().without_autodiff().as_dispatch() {
            let half = |t: ElemType| matches!(t, ElemType::Float(FloatKind::F16 | FloatKind::BF16));
            return cube
                .client()
                .properties()
                .features
                .matmul
                .cmma
                .iter()
                .any(|form| {
                    half(form.a_type)
                        && form.b_type == form.a_type
                        && form.cd_type == ElemType::Float(FloatKind::F32)
                        && form.m.min(form.n).min(form.k) >= 16
                });
        }
    }
    #[cfg(not(feature = "cube"))]
    let _ = device;
    false
}

/// Runs `call` on `path`, with the policy for non-finite inputs of [`nonfinite`] (the CPU
/// kernel applies it on its host data itself, the CubeCL kernel key by key; the tensor-op paths
/// run between its two halves).
pub(crate) fn run(path: AttentionPath, call: Call) -> Result<AttentionOutput, AttentionError> {
    let (mut call, bad_sinks) = sinks::sanitize(call);
    // The kernels' backward passes differentiate q, k and v: the sinks' gradient is attached
    // from their log-sum-exp (see `sinks`).
    let kernel = matches!(
        path,
        AttentionPath::CpuKernel | AttentionPath::CubeKernel | AttentionPath::CubeTensorCores
    );
    let sink_gradient = (kernel && sinks::tracked(&call)).then(|| {
        let asked = call.input.need_lse;
        call.input.need_lse = true;
        (call.input.sinks.clone(), asked)
    });
    let mut out = run_path(path, call)?;
    if let Some((Some(sinks), asked)) = sink_gradient
        && let Some(lse) = out.lse.take()
    {
        out.context = sinks::attach_gradient(out.context, lse.clone(), sinks);
        out.lse = asked.then_some(lse);
    }
    Ok(bad_sinks.apply(out))
}

/// [`run`] on `path`, the sinks' policy aside.
fn run_path(path: AttentionPath, call: Call) -> Result<AttentionOutput, AttentionError> {
    match path {
        AttentionPath::CpuKernel => cpu::run(call),
        AttentionPath::Naive => tensor_ops(call, naive::run),
        AttentionPath::Chunked(block_size) => tensor_ops(call, |c| chunked::run(c, block_size)),
        AttentionPath::Fused => tensor_ops(call, fused::run),
        #[cfg(feature = "cube")]
        AttentionPath::CubeKernel => cube::run(call, false),
        #[cfg(feature = "cube")]
        AttentionPath::CubeTensorCores => cube::run(call, true),
        #[cfg(not(feature = "cube"))]
        AttentionPath::CubeKernel | AttentionPath::CubeTensorCores => {
            Err(AttentionError::Unsupported {
                implementation: path.implementation(),
                reason: "burn-sdpa was built without its `cube` feature".into(),
            })
        }
    }
}

/// A tensor-op path between the two halves of the non-finite policy.
fn tensor_ops(
    call: Call,
    path: impl FnOnce(Call) -> Result<AttentionOutput, AttentionError>,
) -> Result<AttentionOutput, AttentionError> {
    let (call, poisoned) = nonfinite::sanitize(call);
    Ok(poisoned.apply(path(call)?))
}

/// The path `implementation` takes for `call`.
///
/// An explicit implementation is honoured, or rejected with [`AttentionError::Unsupported`] and
/// the path's reason (e.g. weights asked of `Chunked` or `Fused`). `Auto` takes `Naive` when the
/// weights or scores are asked for (only it has them); otherwise it follows the measured rule of
/// [`auto_path`]: by backend ([`BackendFamily`](crate::BackendFamily)), autodiff state, number of keys, size of the
/// scores and which paths can serve the call. Either way, a kernel whose scores may overflow
/// takes the chunked path instead ([`overflow_safe`]).
pub(crate) fn resolve(
    implementation: Implementation,
    call: &Call,
) -> Result<AttentionPath, AttentionError> {
    if let Some(path) = implementation.path() {
        return match blocker(path, call) {
            Some(reason) => Err(AttentionError::Unsupported {
                implementation,
                reason: reason.into_owned(),
            }),
            None => overflow_safe(path, call),
        };
    }
    if call.input.need_weights || call.input.need_scores {
        return Ok(AttentionPath::Naive);
    }
    let [b, h, n, m] = call.dims.scores_shape();
    overflow_safe(
        auto_path(AutoRequest {
            family: call.family,
            autodiff: call.autodiff,
            n_keys: m,
            scores_bytes: (b * h * n * m * call.input.query.dtype().size()) as u64,
            fused_ok: blocker(AttentionPath::Fused, call).is_none(),
            cpu_kernel_ok: blocker(AttentionPath::CpuKernel, call).is_none(),
            cube_kernel_ok: blocker(AttentionPath::CubeKernel, call).is_none(),
            cpu_kernel_in_place: call.kernel_in_place,
            tensor_cores: call.tensor_cores,
        }),
        call,
    )
}

/// `path`, or `Chunked` with blocks of [`DEFAULT_BLOCK_SIZE`](crate::Implementation::DEFAULT_BLOCK_SIZE) keys (`Naive` where it cannot
/// serve the call) when `path` is one of the kernels that compute the scores inside their tiles
/// (`CpuKernel`, `CubeKernel`, Burn's op behind `Fused`) and the call's scores may overflow
/// ([`overflow::may_overflow`]: one read-back of a few values, on these paths only). The
/// tensor-op paths apply the rule for overflowing scores ([`overflow`]); the kernels then only
/// see scores that cannot overflow. An explicit request for a kernel is rerouted too, and
/// [`ScaledDotProductAttention::path`](crate::ScaledDotProductAttention::path) reports the path
/// taken.
fn overflow_safe(path: AttentionPath, call: &Call) -> Result<AttentionPath, AttentionError> {
    let kernel = matches!(
        path,
        AttentionPath::CpuKernel
            | AttentionPath::CubeKernel
            | AttentionPath::CubeTensorCores
            | AttentionPath::Fused
    );
    if !kernel || !overflow::may_overflow(call)? {
        return Ok(path);
    }
    Ok(if chunked::blocker(call).is_none() {
        AttentionPath::Chunked(DEFAULT_BLOCK_SIZE)
    } else {
        AttentionPath::Naive
    })
}
