//! The flash kernel in CubeCL for Burn's CubeCL backends (wgpu, CUDA, ROCm, Metal), through the
//! backend extension, forward (`forward.rs`) and backward (`backward.rs`, FlashAttention-2, no
//! atomics), registered for `Cube`, `Fusion` (`extension.rs`) and `Autodiff` over them
//! (`autodiff.rs`). The module's semantics: scale, soft-cap, causal masking in both alignments,
//! windows, grouped-query heads, padding, masks and biases in any broadcast shape (with the
//! bias's gradient), fully masked rows giving zeros; packed sequences (segment ids), ALiBi and
//! the NaN policy of the other paths computed key by key. f32, and f16 and bf16 where the device
//! has the type, always computed in f32. Head sizes up to 512, d_k ≠ d_v included, in tiles
//! sized from the device's shared memory (`tile.rs`); a call no tiling serves is refused by the
//! blocker. Not yet: tile sizes measured on a GPU (the rows per unit were measured on lavapipe).
//!
//! The three kernels share one shape (cubek's blueprint): a compile-time [`FlashConfig`]
//! (`config.rs`, with the runtime scalars and the score terms as one launch argument each, and
//! the sentinel values), the steps they are built from (`steps.rs`: the grid, the unit's own
//! rows, the register loops over d), how the streamed rows reach the units (`stream.rs`: shared
//! tiles or plane broadcasts), the blocks a cube owns and the one key loop of the forward and dQ
//! kernels (`blocks.rs`: `KeyStep`, `stream_keys`) and what a (query, key) pair sees
//! (`pair.rs`); the forward pass's row statistics are `row_stats.rs`. The tensor-core forward
//! (`mma.rs`, `Implementation::CubeTensorCores`) runs QKᵀ and P·V on the device's matrix
//! instructions with the same per-pair code between them, and its backward (`mma_backward.rs`)
//! dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q; their tiles and products are `mma_tile.rs`'s.
//!
//! [`FlashConfig`]: config::FlashConfig

mod autodiff;
mod backward;
mod blocks;
mod config;
mod extension;
mod forward;
mod mma;
mod mma_backward;
mod mma_rows;
mod mma_tile;
mod pair;
mod row_stats;
mod steps;
mod stream;
mod tile;

use std::borrow::Cow;

use burn::backend::{Dispatch, DispatchDevice};
use burn::tensor::{DType, FloatDType, IntDType};

use burn::prelude::*;

use self::config::{HIDDEN, SENTINEL_FLOOR, SENTINEL_SPLIT};
use self::extension::FlashInputs;
use super::call::Call;
use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::mask::user_mask;
use crate::vocabulary::BackendFamily;

/// The float dtypes the kernels store (they compute in f32 whatever the storage).
fn storage_dtype(dtype: DType) -> Option<FloatDType> {
    match dtype {
        DType::F32 => Some(FloatDType::F32),
        DType::F16 => Some(FloatDType::F16),
        DType::BF16 => Some(FloatDType::BF16),
        _ => None,
    }
}

/// The kernels' tiling for `call`'s head sizes on its device (a CubeCL device), or why there is
/// none.
fn tiling(call: &Call) -> Result<tile::Tiling, String> {
    let device = call.input.query.device().without_autodiff();
    let DispatchDevice::Cube(cube) = device.as_dispatch() else {
        return Err("it runs on the CubeCL backends only".into());
    };
    let limits = tile::Limits::of(cube.client().properties());
    let dims = &call.dims;
    let tiling = tile::Tiling::for_device(limits, dims.d_k, dims.d_v)?;
    let loops = tile::LoopDims {
        n: dims.n,
        m: dims.m,
        group: dims.group(),
        d_k: dims.d_k,
        d_v: dims.d_v,
    };
    tiling.check_loops(limits, loops)?;
    Ok(tiling)
}

/// Why the CubeCL kernel cannot serve `call`, if it cannot.
pub(crate) fn blocker(call: &Call) -> Option<Cow<'static, str>> {
    let reason = basic_blocker(call).map(Cow::Borrowed);
    reason.or_else(|| tiling(call).err().map(Cow::Owned))
}

/// The tensor-core kernels' tiling for `call` on its device, or why they cannot serve the call
/// (besides [`blocker`]'s reasons, which they inherit); under autodiff the backward kernels'
/// shared memory and loops count too.
fn mma_tiling(call: &Call) -> Result<mma_tile::MmaTiling, String> {
    let dtype = call.input.query.dtype();
    let (operand, half_bytes) = match dtype {
        DType::F16 => (cubecl::ir::FloatKind::F16, 2),
        DType::BF16 => (cubecl::ir::FloatKind::BF16, 2),
        _ => {
            return Err(format!(
                "the tensor-core tiles take f16 or bf16 inputs, not {dtype:?} (`cube_kernel` \
                 computes f32 calls on the scalar tiles)"
            ));
        }
    };
    let device = call.input.query.device().without_autodiff();
    let DispatchDevice::Cube(cube) = device.as_dispatch() else {
        return Err("it runs on the CubeCL backends only".into());
    };
    let client = cube.client();
    let properties = client.properties();
    let elem = |kind| cubecl::ir::ElemType::Float(kind);
    let form = |size: usize| cubecl::features::MmaConfig {
        a_type: elem(operand),
        b_type: elem(operand),
        cd_type: elem(cubecl::ir::FloatKind::F32),
        m: size as u32,
        k: size as u32,
        n: size as u32,
    };
    let cmma = &properties.features.matmul.cmma;
    let listed: Vec<usize> = mma_tile::MMA_SIZES
        .into_iter()
        .filter(|&size| cmma.contains(&form(size)))
        .collect();
    if listed.is_empty() {
        return Err(format!(
            "the device lists no square matrix instruction ({}) for {dtype:?} operands with an \
             f32 accumulator (tensor cores, or Vulkan's cooperative matrices)",
            mma_tile::MMA_SIZES
                .map(|s| format!("{s}x{s}x{s}"))
                .join(" or ")
        ));
    }
    let hardware = &properties.hardware;
    let lanes = hardware.plane_size_max as usize;
    if hardware.plane_size_min != hardware.plane_size_max || lanes == 0 {
        return Err(format!(
            "the device's plane size varies ({} to {} lanes): the tensor-core tiles need one",
            hardware.plane_size_min, hardware.plane_size_max
        ));
    }
    let dims = &call.dims;
    let limits = tile::Limits::of(properties);
    // The largest listed tile whose shared memory fits; under autodiff the backward kernels
    // run too, and their tiles must fit as well.
    let tiling = mma_tile::MmaTiling::fitting(
        &listed,
        lanes,
        (dims.d_k, dims.d_v),
        (half_bytes, call.autodiff),
        limits.shared_bytes,
    )
    .map_err(|needed| {
        let pass = if call.autodiff {
            "forward and backward need"
        } else {
            "forward needs"
        };
        format!(
            "the tensor-core {pass} {needed} bytes of shared memory per cube at d_k = {}, \
             d_v = {}, the device has {}",
            dims.d_k, dims.d_v, limits.shared_bytes
        )
    })?;
    let size = tiling.size;
    // The forward and dQ kernels launch a cube per tile of queries along the grid's first
    // axis, the dK/dV kernel (under autodiff) one per tile of keys.
    let mut tiles = vec![("n", dims.n)];
    if call.autodiff {
        tiles.push(("m", dims.m));
    }
    for (name, len) in tiles {
        let count = len.div_ceil(size);
        if count > extension::GRID_AXIS_MAX {
            return Err(format!(
                "the tensor-core tiles would launch {count} cubes along one grid axis at \
                 {name} = {len} (the most is {})",
                extension::GRID_AXIS_MAX
            ));
        }
    }
    if let Some(limit) = limits.loop_limit {
        let (key_tiles, query_tiles) = (dims.m.div_ceil(size), dims.n.div_ceil(size));
        let mut needed = tiling.loop_iterations(key_tiles, dims.d_v);
        if call.autodiff {
            let backward = tiling.backward_loop_iterations(key_tiles, query_tiles, dims.group());
            needed = needed.max(backward);
        }
        if needed as f64 * tile::LOOP_MARGIN > limit as f64 {
            return Err(format!(
                "lavapipe (Mesa's llvmpipe) ends a shader's loops silently after {limit} \
                 iterations in all, and a unit of the tensor-core kernels would run up to \
                 {needed} at n = {}, m = {}, d_k = {}, d_v = {}",
                dims.n, dims.m, dims.d_k, dims.d_v
            ));
        }
    }
    Ok(tiling)
}

/// Why the tensor-core path cannot serve `call`, if it cannot.
pub(crate) fn mma_blocker(call: &Call) -> Option<Cow<'static, str>> {
    blocker(call).or_else(|| mma_tiling(call).err().map(Cow::Owned))
}

/// Why the CubeCL kernel cannot serve `call`, besides the device's limits.
fn basic_blocker(call: &Call) -> Option<&'static str> {
    let input = &call.input;
    let dtype = input.query.dtype();
    let same_dtype = [&input.key, &input.value]
        .iter()
        .all(|t| t.dtype() == dtype);
    if call.family != BackendFamily::CubeCl {
        Some("it runs on the CubeCL backends only")
    } else if input.need_weights || input.need_scores {
        Some("it cannot return the weights or scores")
    } else if call.dropout.is_some() {
        Some("it has no dropout")
    } else if !same_dtype {
        Some("it needs queries, keys and values of one dtype")
    } else {
        match storage_dtype(dtype) {
            None => Some("it computes on f32, f16 and bf16 data only"),
            Some(float) if !input.query.device().supports_dtype(float) => {
                Some("the device does not support this dtype")
            }
            Some(_) => None,
        }
    }
}

/// The bias `[b|1, h|1, n|1, m]` (f32) the kernels add to the soft-capped scores, with every
/// key the padding mask or the mask hides at [`HIDDEN`] (the kernels hide a key whose entry is at
/// or below `config::MASKED`): `None` when there is neither a bias nor a mask. (Segments and
/// ALiBi are not in it: the kernels compute them key by key.)
fn masked_bias(call: &Call) -> Option<Tensor<4>> {
    let input = &call.input;
    let [_, _, _, m] = call.dims.scores_shape();
    let hidden = user_mask(input);
    // The kernels compute in f32: a bias of another dtype is widened (its gradient flows back
    // through the cast), and HIDDEN would not fit in f16.
    let bias = input.bias.clone().map(|bias| bias.cast(FloatDType::F32));
    match (bias, hidden) {
        (None, None) => None,
        (Some(bias), None) => Some(bias),
        (bias, Some(hidden)) => {
            let bias =
                bias.unwrap_or_else(|| Tensor::zeros([1, 1, 1, m], (&hidden.device(), DType::F32)));
            let (db, dh) = (bias.dims(), hidden.dims());
            let shape: [usize; 4] = core::array::from_fn(|i| db[i].max(dh[i]));
            Some(bias.expand(shape).mask_fill(hidden.expand(shape), HIDDEN))
        }
    }
}

/// `t` `[b, h, rows, d]` with its non-finite values replaced by 0, and `[b, h, rows]`: true for
/// each row that held one.
fn sanitized(t: Tensor<4>) -> (Tensor<4>, Tensor<3, Bool>) {
    let [b, h, rows, _] = t.dims();
    let bad = t.clone().is_finite().bool_not();
    // [b, h, rows, d] -> [b, h, rows, 1] -> [b, h, rows]
    let bad_rows = bad.clone().any_dim(3).reshape([b, h, rows]);
    (t.mask_fill(bad, 0.0), bad_rows)
}

/// A bool tensor as the kernels' f32 flags (the device's default float may be another dtype).
fn flags(t: Tensor<3, Bool>) -> Tensor<3> {
    t.float().cast(FloatDType::F32)
}

/// The kernels' inputs: q, k and v and their non-finite flags (sanitized by the caller) and the
/// terms that add to or hide scores, with the flags that say which of the bias, segments, slopes
/// and sinks are real.
fn flash_inputs(
    call: &Call,
    [q, k, v]: [Tensor<4>; 3],
    [bad_keys, bad_queries]: [Tensor<3>; 2],
) -> (FlashInputs<Dispatch>, [bool; 4]) {
    let input = &call.input;
    let device = input.query.device();
    let bias = masked_bias(call);
    let segments = input.segments.as_ref().map(|segments| {
        (
            segments.query.clone().cast(IntDType::I32),
            segments.key.clone().cast(IntDType::I32),
        )
    });
    let h = call.dims.n_heads;
    // Constants for the kernels: the sinks' gradient is attached by `paths::run`.
    let constant = |t: &Tensor<1>| t.clone().detach().cast(FloatDType::F32);
    let slopes = input.alibi_slopes.as_ref().map(constant);
    let sinks = input.sinks.as_ref().map(constant);
    let present = [
        bias.is_some(),
        segments.is_some(),
        slopes.is_some(),
        sinks.is_some(),
    ];
    let zeros = || Tensor::<1>::zeros([h], (&device, DType::F32));
    // [h] + [h] -> [2·h]: the slopes, then the sinks.
    let per_head = Tensor::cat(
        vec![slopes.unwrap_or_else(zeros), sinks.unwrap_or_else(zeros)],
        0,
    );
    let no_ids = || Tensor::<2, Int>::zeros([1, 1], (&device, DType::I32));
    let (q_segments, k_segments) = segments.unwrap_or_else(|| (no_ids(), no_ids()));
    let bias = bias.unwrap_or_else(|| Tensor::zeros([1, 1, 1, 1], (&device, DType::F32)));
    let inputs = FlashInputs {
        q: q.into_dispatch(),
        k: k.into_dispatch(),
        v: v.into_dispatch(),
        bias: bias.into_dispatch(),
        q_segments: q_segments.into_dispatch(),
        k_segments: k_segments.into_dispatch(),
        per_head: per_head.into_dispatch(),
        bad_keys: bad_keys.into_dispatch(),
        bad_queries: bad_queries.into_dispatch(),
    };
    (inputs, present)
}

/// Runs the kernel, with the module's policy for non-finite inputs (see `paths/nonfinite.rs`)
/// applied key by key: q, k and v go in with their non-finite values zeroed and their bad rows
/// flagged; the kernel marks the rows that see a bad key, a NaN or +∞ bias entry, or that see a
/// key with a bad query (`config::POISONED`), and their context becomes NaN here (constants:
/// no gradient flows through them). No `[n, m]` tensor is built for it.
///
/// With `tensor_cores`, the forward and the backward run on the matrix instructions (`mma.rs`,
/// `mma_backward.rs`).
pub(crate) fn run(call: Call, tensor_cores: bool) -> Result<AttentionOutput, AttentionError> {
    let implementation = if tensor_cores {
        crate::Implementation::CubeTensorCores
    } else {
        crate::Implementation::CubeKernel
    };
    let unsupported = |reason| AttentionError::Unsupported {
        implementation,
        reason,
    };
    let tiling = tiling(&call).map_err(unsupported)?;
    let mma = if tensor_cores {
        Some(mma_tiling(&call).map_err(unsupported)?)
    } else {
        None
    };
    let [b, h, n, m] = call.dims.scores_shape();
    let offset = call.alignment.offset(n, m);
    let window = call.input.window.and_then(|w| w.within(n, m));
    let to_i32 = |x: i64| i32::try_from(x).unwrap_or(if x < 0 { i32::MIN } else { i32::MAX });
    let cube_call = extension::CubeCall {
        scale: call.scale as f32,
        softcap: call.softcap.map(|c| c as f32),
        causal: call.input.causal,
        offset: to_i32(offset),
        has_bias: false,
        has_segments: false,
        has_alibi: false,
        has_sinks: false,
        window: window.map_or((None, None), |w| {
            (
                w.left.map(|l| to_i32(l as i64)),
                w.right.map(|r| to_i32(r as i64)),
            )
        }),
        tiling,
        stats: call.input.need_row_stats,
        score_grads: false,
        mma,
    };
    let need_lse = call.input.need_lse;
    let (query, bad_queries) = sanitized(call.input.query.clone());
    let (key, bad_key_rows) = sanitized(call.input.key.clone());
    let (value, bad_value_rows) = sanitized(call.input.value.clone());
    let bad_keys = flags(bad_key_rows.bool_or(bad_value_rows));
    let (inputs, [has_bias, has_segments, has_alibi, has_sinks]) =
        flash_inputs(&call, [query, key, value], [bad_keys, flags(bad_queries)]);
    let cube_call = extension::CubeCall {
        has_bias,
        has_segments,
        has_alibi,
        has_sinks,
        ..cube_call
    };
    let dtype = call.input.query.dtype();
    let (context, lse, stats) = extension::forward(inputs, cube_call);
    // Between the kernels' two sentinels: poisoned; above: no visible key.
    let poisoned = lse
        .clone()
        .greater_elem(SENTINEL_FLOOR)
        .bool_and(lse.clone().lower_elem(SENTINEL_SPLIT));
    let d_v = context.dims()[3];
    // [b, h, n] -> [b, h, n, 1] -> [b, h, n, d_v]
    let poisoned_rows = poisoned
        .clone()
        .reshape([b, h, n, 1])
        .expand([b, h, n, d_v]);
    let mut output = AttentionOutput::from_context(context.mask_fill(poisoned_rows, f32::NAN));
    // The kernel's no-key sentinel is the module's −∞, a poisoned row's log-sum-exp NaN (as
    // from the CPU kernel); it comes back in the queries' dtype, as from the other paths.
    let no_key = lse.clone().greater_elem(SENTINEL_SPLIT);
    let lse = lse
        .mask_fill(no_key, f32::NEG_INFINITY)
        .mask_fill(poisoned.clone(), f32::NAN);
    if let Some(stats) = stats {
        output.row_stats = Some(row_stats(stats, lse.clone(), poisoned).cast(dtype));
    }
    if need_lse {
        output.lse = Some(lse.cast(dtype));
    }
    Ok(output)
}

/// The module's row statistics from the kernel's `[b, h, n, ROW_STATS]` (see
/// [`row_stats::ROW_STATS`]), the log-sum-exp (sentinels already mapped) and the poisoned rows.
fn row_stats(stats: Tensor<4>, lse: Tensor<3>, poisoned: Tensor<3, Bool>) -> crate::RowStats {
    crate::RowStats::from_packed(stats, lse).poisoned(poisoned)
}
