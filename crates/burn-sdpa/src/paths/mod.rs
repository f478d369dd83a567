//! The attention paths, and the only place that chooses one.
//!
//! Every path is one file with two functions: `blocker(&Call) -> Option<&'static str>` says why it
//! cannot serve a call (or `None`), and `run(Call)` computes it. [`resolve`] honours an explicit
//! [`Implementation`] or rejects it with the path's reason, and asks [`auto::auto_path`] for
//! `Auto`; [`run`] dispatches. Adding a path means a file here, a variant in [`kind`] (with its
//! spelling), and one arm in each of the two matches below.

pub mod auto;
pub(crate) mod call;
pub mod chunked;
pub mod cpu;
pub(crate) mod fused;
pub mod kind;
pub(crate) mod naive;
pub(crate) mod nonfinite;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use auto::{AutoRequest, BackendFamily, auto_path};
use call::Call;
use kind::{Implementation, Path};

/// Why `path` cannot serve `call`, if it cannot.
fn blocker(path: Path, call: &Call) -> Option<&'static str> {
    match path {
        Path::Naive => naive::blocker(call),
        Path::Chunked(_) => chunked::blocker(call),
        Path::Fused => fused::blocker(call),
        Path::CpuKernel => cpu::blocker(call),
    }
}

/// Runs `call` on `path`, with the policy for non-finite inputs of [`nonfinite`] (the CPU
/// kernel applies it on its host data itself, the tensor-op paths run between its two halves).
pub(crate) fn run(path: Path, call: Call) -> Result<AttentionOutput, AttentionError> {
    if path == Path::CpuKernel {
        return cpu::run(call);
    }
    let (call, poisoned) = nonfinite::sanitize(call);
    let out = match path {
        Path::Naive => naive::run(call),
        Path::Chunked(block_size) => chunked::run(call, block_size),
        Path::Fused => fused::run(call),
        Path::CpuKernel => cpu::run(call),
    }?;
    Ok(poisoned.apply(out))
}

/// The path `implementation` takes for `call`.
///
/// An explicit implementation is honoured, or rejected with [`AttentionError::Unsupported`] and
/// the path's reason (e.g. weights asked of `Chunked` or `Fused`). `Auto` takes `Naive` when the
/// weights or scores are asked for (only it has them); otherwise it follows the measured rule of
/// [`auto_path`]: by backend ([`BackendFamily`]), autodiff state, number of keys, size of the
/// scores and which paths can serve the call.
pub(crate) fn resolve(implementation: Implementation, call: &Call) -> Result<Path, AttentionError> {
    if let Some(path) = implementation.path() {
        return match blocker(path, call) {
            Some(reason) => Err(AttentionError::Unsupported {
                implementation,
                reason: reason.to_string(),
            }),
            None => Ok(path),
        };
    }
    if call.input.need_weights || call.input.need_scores {
        return Ok(Path::Naive);
    }
    let device = call.input.query.device();
    let [b, h, n, m] = call.dims.scores_shape();
    Ok(auto_path(AutoRequest {
        family: BackendFamily::of(&device),
        autodiff: device.is_autodiff(),
        n_keys: m,
        scores_bytes: (b * h * n * m * call.input.query.dtype().size()) as u64,
        fused_ok: blocker(Path::Fused, call).is_none(),
        cpu_kernel_ok: blocker(Path::CpuKernel, call).is_none(),
        cpu_kernel_in_place: cpu::runs_in_place(&device),
    }))
}
