//! The CubeCL kernel as a Burn backend extension: `cube_kernel_forward` and
//! `cube_kernel_backward`, implemented for the CubeCL backend and, through the generated lazy
//! implementation, for `Fusion` over it (`Autodiff` over both: `autodiff.rs`).

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::{
    Backend, Dispatch, backend_extension,
    tensor::{FloatTensor, IntTensor},
};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::{CubeCount, CubeDim};

use super::backward::{flash_backward_dkdv, flash_backward_dq};
use super::kernel::{ROW_STATS, UNITS, flash_forward};
use super::tile::Tiling;

/// Whether the dK/dV kernel unrolls its loops over d at every head size (the forward and dQ
/// kernels follow `Tiling::unroll`, loops above 128). As loops, lavapipe (Mesa 22.3) returned
/// wrong dK and dV (all but the first element of a row zero) for every key block that met three
/// or more (head, query tile) steps, though the WGSL CubeCL generated reads right; unrolled, every
/// case passes (`tests/library/cube_head_sizes.rs`). It costs compile time at large heads only.
const DKDV_UNROLLED: bool = true;

/// The kernels' storage type for a float dtype (they compute in f32 whatever it is);
/// `super::blocker` lets only these three through.
fn storage(dtype: DType) -> ElemType {
    match dtype {
        DType::F16 => ElemType::Float(FloatKind::F16),
        DType::BF16 => ElemType::Float(FloatKind::BF16),
        _ => ElemType::Float(FloatKind::F32),
    }
}

/// Vulkan and Metal bound each axis of the grid to 65 535 cubes.
const GRID_AXIS_MAX: usize = 65_535;

/// The cube count for `blocks` blocks of rows of each of `rows` (batch·head) rows: the blocks
/// on the first axis, the rows on the second and, past [`GRID_AXIS_MAX`], the third
/// (`kernel::grid_row` reads them back).
fn grid(blocks: usize, rows: usize) -> CubeCount {
    let y = rows.clamp(1, GRID_AXIS_MAX);
    CubeCount::Static(blocks as u32, y as u32, rows.div_ceil(y) as u32)
}

/// What the kernel needs besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CubeCall {
    /// The factor that multiplies QKᵀ.
    pub scale: f32,
    /// The logit soft-cap, if any.
    pub softcap: Option<f32>,
    /// Causal masking on the diagonal `i + offset`.
    pub causal: bool,
    /// The diagonal's offset (the causal alignment's).
    pub offset: i32,
    /// Whether `extra` holds a bias and masks (else it is a placeholder).
    pub has_extra: bool,
    /// Whether the segment ids are given (else they are placeholders).
    pub has_segments: bool,
    /// Whether ALiBi's slopes are given (else zeros).
    pub has_alibi: bool,
    /// Whether the sinks are given (else zeros; the forward kernel reads them, the backward
    /// kernels need only the log-sum-exp, which includes them).
    pub has_sinks: bool,
    /// Keys before and after the diagonal a query sees, when bounded.
    pub window: (Option<i32>, Option<i32>),
    /// The tiles, from the device's limits (the blocker admitted the call with this tiling).
    pub tiling: Tiling,
    /// Whether the forward writes the row statistics (else a `[1, 1, 1, 1]` placeholder).
    pub stats: bool,
}

/// The output specs: context `[b, h, n, d_v]` in q's dtype, log-sum-exp `[b, h, n]` in f32 and
/// the row statistics `[b, h, n, ROW_STATS]` in f32 (`[1, 1, 1, 1]` when not asked for).
#[allow(clippy::too_many_arguments)]
fn forward_meta(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _extra: &TensorSpec,
    _q_segments: &TensorSpec,
    _k_segments: &TensorSpec,
    _slopes: &TensorSpec,
    _bad_keys: &TensorSpec,
    _bad_queries: &TensorSpec,
    call: &CubeCall,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    let (qd, vd) = (q.shape.clone(), v.shape.clone());
    (
        TensorSpec::new(Shape::new([qd[0], qd[1], qd[2], vd[3]]), q.dtype),
        TensorSpec::new(Shape::new([qd[0], qd[1], qd[2]]), DType::F32),
        TensorSpec::new(
            Shape::new(stats_shape(call, [qd[0], qd[1], qd[2]])),
            DType::F32,
        ),
    )
}

/// The row statistics' shape: `[b, h, n, ROW_STATS]`, or `[1, 1, 1, 1]` when not asked for.
fn stats_shape(call: &CubeCall, [b, h, n]: [usize; 3]) -> [usize; 4] {
    if call.stats {
        [b, h, n, ROW_STATS]
    } else {
        [1, 1, 1, 1]
    }
}

/// The gradient specs: dQ, dK, dV shaped like q, k, v, and the score gradient `[b, h, n, m]`
/// in f32 (`[1, 1, 1, 1]` when not asked for).
#[allow(clippy::too_many_arguments)]
fn backward_meta(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    _extra: &TensorSpec,
    _q_segments: &TensorSpec,
    _k_segments: &TensorSpec,
    _slopes: &TensorSpec,
    _out: &TensorSpec,
    _lse: &TensorSpec,
    _d_out: &TensorSpec,
    _call: &CubeCall,
    want_scores: &bool,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    (
        q.clone(),
        k.clone(),
        v.clone(),
        scores_spec(q, k, *want_scores),
    )
}

/// The score gradient's spec.
fn scores_spec(q: &TensorSpec, k: &TensorSpec, want: bool) -> TensorSpec {
    let shape = if want {
        Shape::new([q.shape[0], q.shape[1], q.shape[2], k.shape[2]])
    } else {
        Shape::new([1, 1, 1, 1])
    };
    TensorSpec::new(shape, DType::F32)
}

/// The ops. Calling them on a backend that is not listed panics: `super::blocker` refuses those.
#[backend_extension(Cube, Fusion, Autodiff)]
pub(crate) trait CubeKernelBackend: Backend {
    /// (context `[b, h, n, d_v]` in q's dtype, log-sum-exp `[b, h, n]` in f32, +3e38 for a row
    /// with no visible key, row statistics `[b, h, n, ROW_STATS]` in f32 when `call.stats`); `extra` `[b|1, h|1, n|1, m]` (f32) is the bias with the masked keys
    /// at −3e38 or −∞, `q_segments [b, n]` and `k_segments [b, m]` (I32) the segment ids and
    /// `slopes [2·h]` (f32) ALiBi's slopes then the sinks (zeros where absent);
    /// `bad_keys [b, h_kv, m]` and `bad_queries [b, h, n]` (f32) are 1 where q, k or v held a
    /// non-finite value (zeroed before the call): such rows get the log-sum-exp
    /// `kernel::POISONED`.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = forward_meta)]
    fn cube_kernel_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        q_segments: IntTensor<Self>,
        k_segments: IntTensor<Self>,
        slopes: FloatTensor<Self>,
        bad_keys: FloatTensor<Self>,
        bad_queries: FloatTensor<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// (dQ, dK, dV, dS) of the forward pass with the same inputs, from its output `out`, its
    /// log-sum-exp and the output's gradient `d_out`; dS `[b, h, n, m]` is the gradient of the
    /// scores after the soft-cap (that of `extra`, f32) when `want_scores`, else a `[1, 1, 1, 1]`
    /// zero.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = backward_meta)]
    fn cube_kernel_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        q_segments: IntTensor<Self>,
        k_segments: IntTensor<Self>,
        slopes: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        call: CubeCall,
        want_scores: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

impl CubeKernelBackend for CubeBackend {
    fn cube_kernel_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        q_segments: IntTensor<Self>,
        k_segments: IntTensor<Self>,
        slopes: FloatTensor<Self>,
        bad_keys: FloatTensor<Self>,
        bad_queries: FloatTensor<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let extra = into_contiguous(extra);
        let (bad_keys, bad_queries) = (into_contiguous(bad_keys), into_contiguous(bad_queries));
        let (q_segments, k_segments) = (into_contiguous(q_segments), into_contiguous(k_segments));
        let slopes = into_contiguous(slopes);
        let [b, h, n, d_k] = q.meta.shape.dims::<4>();
        let d_v = v.meta.shape.dims::<4>()[3];
        let client = q.client.clone();
        let (device, dtype) = (q.device.clone(), q.dtype);
        let context = empty_device_dtype(
            client.clone(),
            device.clone(),
            Shape::new([b, h, n, d_v]),
            dtype,
        );
        let lse = empty_device_dtype(
            client.clone(),
            device.clone(),
            Shape::new([b, h, n]),
            DType::F32,
        );
        let stats = empty_device_dtype(
            client.clone(),
            device,
            Shape::new(stats_shape(&call, [b, h, n])),
            DType::F32,
        );
        let tiling = call.tiling;
        let rows = tiling.unit_rows(n, d_k.max(d_v));
        let (left, right) = call.window;
        flash_forward::launch(
            &client,
            grid(n.div_ceil(UNITS * rows), b * h),
            CubeDim::new_1d(UNITS as u32),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            extra.into_tensor_arg(),
            q_segments.into_tensor_arg(),
            k_segments.into_tensor_arg(),
            slopes.into_tensor_arg(),
            bad_keys.into_tensor_arg(),
            bad_queries.into_tensor_arg(),
            context.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            call.scale,
            call.softcap.unwrap_or(1.0),
            call.offset,
            left.unwrap_or(0),
            right.unwrap_or(0),
            d_k,
            d_v,
            rows,
            tiling.tile_rows,
            tiling.planes,
            tiling.unroll,
            call.causal,
            left.is_some(),
            right.is_some(),
            call.softcap.is_some(),
            call.has_extra,
            call.has_segments,
            call.has_alibi,
            call.has_sinks,
            call.stats,
            storage(dtype),
        );
        (context, lse, stats)
    }

    fn cube_kernel_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        q_segments: IntTensor<Self>,
        k_segments: IntTensor<Self>,
        slopes: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        call: CubeCall,
        want_scores: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [b, h, n, d_k] = q.meta.shape.dims::<4>();
        let [_, h_kv, m, d_v] = v.meta.shape.dims::<4>();
        // D = rowsum(dO ∘ O) in f32: [b, h, n, d_v] -> [b, h, n, 1] -> [b, h, n]
        let to_f32 = |x| Self::float_cast(x, FloatDType::F32);
        let delta = Self::float_sum_dim(Self::float_mul(to_f32(d_out.clone()), to_f32(out)), 3);
        let delta = into_contiguous(Self::float_reshape(delta, Shape::new([b, h, n])));
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let (extra, lse, d_out) = (
            into_contiguous(extra),
            into_contiguous(lse),
            into_contiguous(d_out),
        );
        let (q_segments, k_segments) = (into_contiguous(q_segments), into_contiguous(k_segments));
        let slopes = into_contiguous(slopes);
        let client = q.client.clone();
        let (device, dtype) = (q.device.clone(), q.dtype);
        let empty = |shape: [usize; 4]| {
            empty_device_dtype(client.clone(), device.clone(), Shape::new(shape), dtype)
        };
        let (dq, dk, dv) = (
            empty([b, h, n, d_k]),
            empty([b, h_kv, m, d_k]),
            empty([b, h_kv, m, d_v]),
        );
        let scores_shape = if want_scores {
            [b, h, n, m]
        } else {
            [1, 1, 1, 1]
        };
        let d_scores = Self::float_zeros(Shape::new(scores_shape), &device, FloatDType::F32);
        let (left, right) = call.window;
        let tiling = call.tiling;
        let d = d_k.max(d_v);
        let (dq_rows, dkdv_rows) = (tiling.unit_rows(n, d), tiling.unit_rows(m, d));
        flash_backward_dq::launch(
            &client,
            grid(n.div_ceil(UNITS * dq_rows), b * h),
            CubeDim::new_1d(UNITS as u32),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            extra.clone().into_tensor_arg(),
            q_segments.clone().into_tensor_arg(),
            k_segments.clone().into_tensor_arg(),
            slopes.clone().into_tensor_arg(),
            d_out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            d_scores.clone().into_tensor_arg(),
            call.scale,
            call.softcap.unwrap_or(1.0),
            call.offset,
            left.unwrap_or(0),
            right.unwrap_or(0),
            d_k,
            d_v,
            dq_rows,
            tiling.tile_rows,
            tiling.planes,
            tiling.unroll,
            call.causal,
            left.is_some(),
            right.is_some(),
            call.softcap.is_some(),
            call.has_extra,
            call.has_segments,
            call.has_alibi,
            want_scores,
            storage(dtype),
        );
        flash_backward_dkdv::launch(
            &client,
            grid(m.div_ceil(UNITS * dkdv_rows), b * h_kv),
            CubeDim::new_1d(UNITS as u32),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            extra.into_tensor_arg(),
            q_segments.into_tensor_arg(),
            k_segments.into_tensor_arg(),
            slopes.into_tensor_arg(),
            d_out.into_tensor_arg(),
            lse.into_tensor_arg(),
            delta.into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            call.scale,
            call.softcap.unwrap_or(1.0),
            call.offset,
            left.unwrap_or(0),
            right.unwrap_or(0),
            d_k,
            d_v,
            dkdv_rows,
            tiling.tile_rows,
            tiling.planes,
            DKDV_UNROLLED,
            call.causal,
            left.is_some(),
            right.is_some(),
            call.softcap.is_some(),
            call.has_extra,
            call.has_segments,
            call.has_alibi,
            storage(dtype),
        );
        (dq, dk, dv, d_scores)
    }
}

/// The extra inputs of one call besides q, k, v: the bias (f32, with the masks), the segment
/// ids (I32), ALiBi's slopes and the sinks (f32), each a placeholder the kernels do not read
/// when absent (`CubeCall::has_extra`, `has_segments`, `has_alibi`, `has_sinks`).
pub(crate) struct Extras {
    /// `[b|1, h|1, n|1, m]`.
    pub extra: Tensor<4>,
    /// `[b, n]`.
    pub q_segments: Tensor<2, Int>,
    /// `[b, m]`.
    pub k_segments: Tensor<2, Int>,
    /// `[2·h]`: ALiBi's slopes, then the attention sinks (zeros where absent).
    pub slopes: Tensor<1>,
    /// `[b, h_kv, m]`, 1 where a key or value row held a non-finite value.
    pub bad_keys: Tensor<3>,
    /// `[b, h, n]`, 1 where a query row did.
    pub bad_queries: Tensor<3>,
}

/// Runs the op on tensors of a Cube (or Fusion over Cube) device: (context, log-sum-exp in f32,
/// row statistics `[b, h, n, ROW_STATS]` in f32 when `call.stats`).
pub(crate) fn forward(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    extras: Extras,
    call: CubeCall,
) -> (Tensor<4>, Tensor<3>, Option<Tensor<4>>) {
    let (context, lse, stats) = <Dispatch as CubeKernelBackend>::cube_kernel_forward(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        extras.extra.into_dispatch(),
        extras.q_segments.into_dispatch(),
        extras.k_segments.into_dispatch(),
        extras.slopes.into_dispatch(),
        extras.bad_keys.into_dispatch(),
        extras.bad_queries.into_dispatch(),
        call,
    );
    (
        Tensor::from_dispatch(context),
        Tensor::from_dispatch(lse),
        call.stats.then(|| Tensor::from_dispatch(stats)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_spreads_rows_over_two_axes_past_the_axis_limit() {
        let count = |c: CubeCount| match c {
            CubeCount::Static(x, y, z) => (x, y, z),
            other => panic!("a static count, got {other:?}"),
        };
        assert_eq!(count(grid(3, 10)), (3, 10, 1));
        assert_eq!(count(grid(3, GRID_AXIS_MAX)), (3, 65_535, 1));
        let (_, y, z) = count(grid(1, GRID_AXIS_MAX + 2));
        assert_eq!((y, z), (65_535, 2));
        assert!(y as usize * z as usize >= GRID_AXIS_MAX + 2);
    }
}
