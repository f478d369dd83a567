//! The CPU kernel path: this crate's flash kernel ([`kernel`], forward; [`backward`]) on `f32`
//! host data.
//!
//! On Flex and NdArray (when the crate's `flex` / `ndarray` features are on) the call goes
//! through a Burn backend extension ([`extension`]) that reads the backend's buffers in place and
//! registers the kernel's own backward pass under autodiff. On any other backend the kernel
//! serves inference through host copies of the tensors.

pub mod backward;
#[cfg(test)]
mod bf16_tests;
#[cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code))]
mod cross_entropy;
pub(crate) mod element;
// NdArray is deprecated upstream since Burn 0.22; the product still serves it.
#[cfg(any(feature = "flex", feature = "ndarray"))]
#[allow(deprecated)]
mod extension;
pub(crate) mod features;
#[cfg(any(feature = "flex", feature = "ndarray"))]
#[allow(deprecated)]
mod host;
pub mod kernel;
#[cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code))]
mod layer_norm;
#[cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code))]
mod linear;
pub(crate) mod masking;
#[cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code))]
mod nonfinite;
#[cfg(any(feature = "flex", feature = "ndarray"))]
#[allow(deprecated)]
pub(crate) mod reduce;
#[cfg(test)]
mod reference;
// Host code of the row ops, reached through the backend extension only.
#[cfg(any(feature = "flex", feature = "ndarray"))]
#[allow(deprecated)]
mod row_ops;
mod scratch;
pub(crate) mod shape;
pub(crate) mod simd;
mod stats_scratch;
#[cfg(any(feature = "flex", feature = "ndarray"))]
mod storage;
mod tile;
pub(crate) mod tile_bf16;

use std::borrow::Cow;

use burn::prelude::*;
use burn::tensor::DType;

use crate::error::AttentionError;
use crate::input::{AttentionOutput, read_back};
use crate::mask::user_mask;
use crate::paths::call::Call;
use crate::vocabulary::{BackendFamily, Implementation};
use masking::HostTerms;
use shape::{KernelShape, Tiles};

/// Whether the kernel runs in place on `family` in this build: through its backend extension
/// (in-place reads, its own backward pass), which serves Flex and NdArray when the crate's
/// `flex` / `ndarray` features are on.
pub(crate) fn in_place_on(family: BackendFamily) -> bool {
    (family == BackendFamily::Flex && cfg!(feature = "flex"))
        || (family == BackendFamily::NdArray && cfg!(feature = "ndarray"))
}

/// Whether the kernel runs in place on `device`'s backend in this build (see
/// [`Implementation::CpuKernel`]).
pub fn runs_in_place(device: &Device) -> bool {
    in_place_on(BackendFamily::of(device))
}

/// Work (in flops) below which a CPU op runs on the calling thread: handing a job to the
/// thread pool and waking its workers costs tens of microseconds, and on a 2-core machine the
/// idle workers' spinning competes with the caller's next ops. Measured on a 2-core machine with
/// the default model at seq_len 16 (`sdpa train-bench --size small`), where every op of a step is
/// below it; on machines with many cores a lower threshold may pay (not measured).
pub(crate) const PARALLEL_WORK: usize = 1 << 24;

/// Threads of the pool the CPU kernels and row ops run on (rayon's global pool: every core, or
/// `RAYON_NUM_THREADS`).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Runs `f` on every task, on the thread pool when `work` (flops) is worth it
/// ([`PARALLEL_WORK`]), on the calling thread otherwise; `init` makes each thread's scratch.
pub(crate) fn for_each_task<T, S, I, F>(tasks: Vec<T>, work: usize, init: I, f: F)
where
    T: Send,
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, T) + Sync + Send,
{
    use rayon::prelude::*;
    if work >= PARALLEL_WORK && tasks.len() > 1 {
        tasks.into_par_iter().for_each_init(init, f);
    } else {
        let mut scratch = init();
        tasks.into_iter().for_each(|task| f(&mut scratch, task));
    }
}

/// Whether `layer` on `x` runs through the row-parallel op of [`linear`]: Flex and NdArray with
/// the crate's features, all tensors `f32`, nothing empty (zero rows, d_in = 0 or d_out = 0
/// take Burn's Linear).
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub(crate) fn linear_runs_in_place<const D: usize>(
    layer: &burn::nn::Linear,
    x: &Tensor<D>,
) -> bool {
    x.shape().num_elements() > 0
        && layer.weight.shape().num_elements() > 0
        && x.dtype() == DType::F32
        && layer.weight.dtype() == DType::F32
        && layer.bias.as_ref().is_none_or(|b| b.dtype() == DType::F32)
        && runs_in_place(&x.device())
}

/// `layer` applied to `x` `[rows, d_in]` through the row-parallel op of [`linear`] (the caller
/// has checked [`linear_runs_in_place`]).
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub(crate) fn linear_in_place(layer: &burn::nn::Linear, x: Tensor<2>) -> Tensor<2> {
    let bias = layer.bias.as_ref().map(|b| b.val());
    row_ops::cpu_linear(x, layer.weight.val(), bias)
}

/// The layer norm of every row of `x` `[rows, d]` through the CPU backends' op (the caller has
/// checked [`layer_norm_runs_in_place`]).
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub(crate) fn layer_norm_2d(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    epsilon: f64,
) -> Tensor<2> {
    row_ops::cpu_layer_norm(x, gamma, beta, epsilon)
}

/// Whether a layer norm of `x` with `gamma` (and `beta`) runs through the CPU backends' op:
/// Flex and NdArray with the crate's features, all tensors `f32`, nothing empty.
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub(crate) fn layer_norm_runs_in_place<const D: usize>(
    x: &Tensor<D>,
    gamma: &Tensor<1>,
    beta: Option<&Tensor<1>>,
) -> bool {
    x.shape().num_elements() > 0
        && gamma.shape().num_elements() > 0
        && x.dtype() == DType::F32
        && gamma.dtype() == DType::F32
        && beta.is_none_or(|b| b.dtype() == DType::F32)
        && runs_in_place(&x.device())
}

/// The mean cross-entropy of `logits` `[rows, classes]` against checked class ids, through the
/// CPU backends' op (the caller has checked that it runs in place and that the logits are
/// `f32`).
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub(crate) fn cross_entropy_2d(logits: Tensor<2>, targets: Vec<usize>) -> Tensor<1> {
    row_ops::cpu_cross_entropy(logits, targets)
}

/// The kernel's sizes and options for `call`: its scale, the causal and window diagonals (both on
/// the alignment's offset) and its soft-cap.
fn shape_of(call: &Call) -> KernelShape {
    let [_, _, n, m] = call.dims.scores_shape();
    let offset = call.alignment.offset(n, m);
    KernelShape {
        dims: call.dims,
        scale: call.scale as f32,
        causal_offset: call.input.causal.then_some(offset),
        softcap: call.softcap.map(|cap| cap as f32),
        window: call.input.window.map(|window| (window, offset)),
    }
}

/// Why the CPU kernel cannot serve `call`, if it cannot.
pub(crate) fn blocker(call: &Call) -> Option<&'static str> {
    let input = &call.input;
    let all = |dtype| {
        [&input.query, &input.key, &input.value]
            .iter()
            .all(|t| t.dtype() == dtype)
    };
    // bf16 and f16 through the backend extension on Flex (NdArray has no half-precision
    // tensors); the module has checked that the bias has the inputs' dtype.
    let half_data = (all(DType::BF16) || all(DType::F16))
        && call.kernel_in_place
        && call.family == BackendFamily::Flex;
    if input.need_weights || input.need_scores {
        Some("it cannot return the weights or scores")
    } else if call.dropout.is_some() {
        Some("it has no dropout")
    } else if !(all(DType::F32) || half_data) {
        Some(
            "it computes on f32 data, and on bf16 and f16 data on Flex (through its backend \
             extension)",
        )
    } else if call.autodiff && !call.kernel_in_place {
        Some("its backward pass runs on Flex and NdArray only (use Chunked or Auto under autodiff)")
    } else {
        None
    }
}

/// Segment ids, ALiBi slopes and sinks of `call` on the host (small: `[b, n + m]` and `[h]`).
fn host_terms(call: &Call) -> Result<HostTerms, AttentionError> {
    let segments = call
        .input
        .segments
        .as_ref()
        .map(|seg| -> Result<_, AttentionError> {
            Ok((
                read_back::<i64, 2, Int>("the query segment ids", seg.query.clone())?,
                read_back::<i64, 2, Int>("the key segment ids", seg.key.clone())?,
            ))
        })
        .transpose()?;
    let alibi = call
        .input
        .alibi_slopes
        .as_ref()
        .map(|slopes| -> Result<_, AttentionError> {
            let offset = call.alignment.offset(call.dims.n, call.dims.m);
            Ok((
                read_back::<f32, 1, Float>("the ALiBi slopes", slopes.clone())?,
                offset,
            ))
        })
        .transpose()?;
    let sinks = call
        .input
        .sinks
        .as_ref()
        .map(|sinks| read_back::<f32, 1, Float>("the attention sinks", sinks.clone()))
        .transpose()?;
    Ok(HostTerms {
        segments,
        alibi,
        sinks,
    })
}

/// The kernel's log-sum-exp `[b, h, n]` as the module returns it: −∞ (not the kernel's +∞) for
/// a row with no visible key.
fn lse_tensor(lse: Vec<f32>, dims: &crate::types::AttentionDims, device: &Device) -> Tensor<3> {
    let lse = lse
        .into_iter()
        .map(|x| {
            if x == f32::INFINITY {
                f32::NEG_INFINITY
            } else {
                x
            }
        })
        .collect::<Vec<_>>();
    Tensor::from_data(
        TensorData::new(lse, [dims.batch, dims.n_heads, dims.n]),
        device,
    )
}

/// The row statistics as the module returns them, from the kernel's log-sum-exp `[b, h, n]`
/// and statistics `[ROW_STATS, b, h, n]` (see [`stats_scratch::ROW_STATS`]).
///
/// The kernel writes a row without a visible key as the module returns it (−∞, 0, 0, 0, NaN,
/// NaN), and one statistic after another: each becomes a tensor as it is.
fn row_stats_tensors(
    lse: Vec<f32>,
    mut stats: Vec<f32>,
    dims: &crate::types::AttentionDims,
    device: &Device,
) -> crate::RowStats {
    let shape = [dims.batch, dims.n_heads, dims.n];
    let rows = dims.batch * dims.n_heads * dims.n;
    // [ROW_STATS, b·h·n] -> ROW_STATS × [b·h·n], split from the end (no copy of the first)
    let mut columns: Vec<Vec<f32>> = (1..stats_scratch::ROW_STATS)
        .rev()
        .map(|idx| stats.split_off(idx * rows))
        .collect();
    columns.push(stats);
    columns.reverse();
    let mut tensors = columns
        .into_iter()
        .map(|column| Tensor::<3>::from_data(TensorData::new(column, shape), device));
    let mut next = || {
        tensors
            .next()
            .unwrap_or_else(|| Tensor::zeros(shape, device))
    };
    crate::RowStats {
        max_logit: next(),
        entropy: next(),
        max_prob: next(),
        visible_keys: next(),
        logit_mean: next(),
        logit_std: next(),
        lse: lse_tensor(lse, dims, device),
    }
}

/// Runs the kernel: through the backend extension where it serves the backend, else on host
/// copies (inference).
pub(crate) fn run(call: Call) -> Result<AttentionOutput, AttentionError> {
    let shape = shape_of(&call);
    let mask = user_mask(&call.input)
        .map(|mask| -> Result<_, AttentionError> {
            let dims = mask.dims();
            Ok((read_back::<bool, 4, Bool>("the mask", mask)?, dims))
        })
        .transpose()?;
    let terms = host_terms(&call)?;
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    if call.kernel_in_place {
        let slot = || std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let need_stats = call.input.need_row_stats;
        let keep_lse = call.input.need_lse || super::sinks::tracked(&call);
        let lse_out = (keep_lse || need_stats).then(slot);
        let stats_out = need_stats.then(slot);
        let kernel_call = extension::KernelCall {
            shape,
            mask: mask
                .map(|(values, shape)| std::sync::Arc::new(extension::HostMask { values, shape })),
            terms: std::sync::Arc::new(terms),
            lse_out: lse_out.clone(),
            stats_out: stats_out.clone(),
        };
        let input = call.input;
        let (device, dtype) = (input.query.device(), input.query.dtype());
        let context =
            extension::attention(input.query, input.key, input.value, input.bias, kernel_call);
        let mut output = AttentionOutput::from_context(context);
        let take = |slot: std::sync::Arc<std::sync::Mutex<Vec<f32>>>| {
            std::mem::take(&mut *slot.lock().unwrap_or_else(|p| p.into_inner()))
        };
        let lse = lse_out.map(take);
        if let (Some(lse), Some(stats)) = (&lse, stats_out.map(take)) {
            let stats = row_stats_tensors(lse.clone(), stats, &call.dims, &device);
            output.row_stats = Some(stats.cast(dtype));
        }
        if keep_lse {
            // In the queries' dtype, as from the other paths.
            output.lse = lse.map(|lse| lse_tensor(lse, &call.dims, &device).cast(dtype));
        }
        return Ok(output);
    }
    host_copies(call, shape, mask, terms)
}

/// The kernel on host copies of the tensors (any backend, inference).
fn host_copies(
    call: Call,
    shape: KernelShape,
    mask: Option<(Vec<bool>, [usize; 4])>,
    terms: HostTerms,
) -> Result<AttentionOutput, AttentionError> {
    let (need_lse, need_stats) = (call.input.need_lse, call.input.need_row_stats);
    let dims = call.dims;
    let [b, h, n, _] = dims.scores_shape();
    let device = call.input.query.device();
    let input = call.input;
    let bias = input
        .bias
        .map(|bias| {
            let shape = bias.dims();
            Ok::<_, AttentionError>((read_back::<f32, 4, Float>("the bias", bias)?, shape))
        })
        .transpose()?;
    let (q, k, v) = (
        input.query.into_data(),
        input.key.into_data(),
        input.value.into_data(),
    );
    let masking = terms.masking(
        mask.as_ref().map(|(values, shape)| (&values[..], *shape)),
        bias.as_ref().map(|(values, shape)| (&values[..], *shape)),
    );
    let mut out = vec![0.0f32; b * h * n * dims.d_v];
    let mut lse = vec![0.0f32; b * h * n];
    let mut stats = need_stats.then(|| vec![0.0f32; b * h * n * stats_scratch::ROW_STATS]);
    nonfinite::forward(
        &shape,
        masking.fit(Tiles::for_keys(dims.m), dims.m),
        &masking,
        &host(&q)?,
        &host(&k)?,
        &host(&v)?,
        &mut out,
        &mut lse,
        stats.as_deref_mut(),
    )?;
    let context = Tensor::from_data(TensorData::new(out, [b, h, n, dims.d_v]), &device);
    let mut output = AttentionOutput::from_context(context);
    if let Some(stats) = stats {
        output.row_stats = Some(row_stats_tensors(lse.clone(), stats, &dims, &device));
    }
    if need_lse {
        output.lse = Some(lse_tensor(lse, &dims, &device));
    }
    Ok(output)
}

/// The values of host data as f32, read in place; copied only when the bytes are not aligned
/// for f32.
fn host(data: &TensorData) -> Result<Cow<'_, [f32]>, AttentionError> {
    match data.as_slice::<f32>() {
        Ok(values) => Ok(Cow::Borrowed(values)),
        Err(_) => data
            .clone()
            .try_into_vec::<f32>()
            .map(Cow::Owned)
            .map_err(|e| AttentionError::Unsupported {
                implementation: Implementation::CpuKernel,
                reason: format!("its input is not f32 data ({e:?})"),
            }),
    }
}
