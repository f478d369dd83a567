//! The CubeCL kernel as a Burn backend extension: `cube_kernel_forward` and
//! `cube_kernel_backward`, implemented for the CubeCL backend and, through the generated lazy
//! implementation, for `Fusion` over it (`Autodiff` over both: `autodiff.rs`).

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::{
    Backend, Dispatch, ExtensionType, backend_extension,
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
use super::config::{FlashConfig, ScalarsLaunch, TermsLaunch};
use super::forward::flash_forward;
use super::mma::flash_forward_mma;
use super::mma_backward::{flash_backward_dkdv_mma, flash_backward_dq_mma};
use super::mma_tile::MmaTiling;
use super::row_stats::ROW_STATS;
use super::steps::UNITS;
use super::tile::Tiling;

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
pub(crate) const GRID_AXIS_MAX: usize = 65_535;

/// The cube count for `blocks` blocks of rows of each of `rows` (batch·head) rows: the blocks
/// on the first axis, the rows on the second and, past [`GRID_AXIS_MAX`], the third
/// ([`grid_block`](super::steps::grid_block) reads them back).
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
    /// Whether the inputs' `bias` holds a bias or masks (else it is a placeholder).
    pub has_bias: bool,
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
    /// Whether the backward writes the score gradient, the bias's (else a `[1, 1, 1, 1]` zero).
    pub score_grads: bool,
    /// The tensor-core kernels' tiling, when the call asked for the tensor-core tiles
    /// (`mma.rs` forward, `mma_backward.rs` backward).
    pub mma: Option<MmaTiling>,
}

impl CubeCall {
    /// The kernels' configuration for this call with `rows` rows per unit, writing neither
    /// optional output (the launch sets `has_stats` or `write_scores`) and unrolling as the
    /// tiling says.
    fn config(&self, d_k: usize, d_v: usize, rows: usize) -> FlashConfig {
        let Tiling {
            tile_rows,
            planes,
            unroll,
        } = self.tiling;
        FlashConfig {
            d_k,
            d_v,
            rows,
            tile_rows,
            planes,
            unroll_d: unroll,
            causal: self.causal,
            has_left: self.window.0.is_some(),
            has_right: self.window.1.is_some(),
            capped: self.softcap.is_some(),
            has_bias: self.has_bias,
            has_segments: self.has_segments,
            has_alibi: self.has_alibi,
            has_sinks: false,
            has_stats: false,
            write_scores: false,
        }
    }

    /// The kernels' [`Scalars`](super::config::Scalars) argument (the absent ones 0, or 1 for
    /// the soft-cap).
    fn scalars(&self) -> ScalarsLaunch {
        let (left, right) = self.window;
        ScalarsLaunch::new(
            self.scale,
            self.softcap.unwrap_or(1.0),
            self.offset,
            left.unwrap_or(0),
            right.unwrap_or(0),
        )
    }
}

/// The inputs every op reads: q `[b, h, n, d_k]`, k `[b, h_kv, m, d_k]`, v `[b, h_kv, m, d_v]`
/// in one float dtype, with their non-finite values zeroed and flagged (`bad_keys`,
/// `bad_queries`), and the terms that add to or hide scores, each a placeholder the kernels do
/// not read when absent ([`CubeCall::has_bias`], `has_segments`, `has_alibi`, `has_sinks`): the
/// bias `[b|1, h|1, n|1, m]` (f32) with the masked keys at `config::HIDDEN` or −∞, the segment
/// ids `[b, n]` and `[b, m]` (I32), ALiBi's slopes then the sinks `[2·h]` (f32).
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion)]
pub(crate) struct FlashInputs<B: Backend> {
    /// The queries.
    pub q: FloatTensor<B>,
    /// The keys.
    pub k: FloatTensor<B>,
    /// The values.
    pub v: FloatTensor<B>,
    /// The bias with the masks.
    pub bias: FloatTensor<B>,
    /// The queries' segment ids.
    pub q_segments: IntTensor<B>,
    /// The keys' segment ids.
    pub k_segments: IntTensor<B>,
    /// ALiBi's slopes, then the sinks.
    pub per_head: FloatTensor<B>,
    /// `[b, h_kv, m]` (f32): 1 where the key or value row held a NaN or ±∞ (the forward kernel
    /// poisons the rows that see it; a constant).
    pub bad_keys: FloatTensor<B>,
    /// `[b, h, n]` (f32): 1 where the query row held a NaN or ±∞ (a constant).
    pub bad_queries: FloatTensor<B>,
}

impl<B: Backend> FlashInputs<B> {
    /// The inputs with `float` applied to every float tensor and `int` to the segment ids.
    pub(crate) fn map<C: Backend>(
        self,
        float: impl Fn(FloatTensor<B>) -> FloatTensor<C>,
        int: impl Fn(IntTensor<B>) -> IntTensor<C>,
    ) -> FlashInputs<C> {
        FlashInputs {
            q: float(self.q),
            k: float(self.k),
            v: float(self.v),
            bias: float(self.bias),
            q_segments: int(self.q_segments),
            k_segments: int(self.k_segments),
            per_head: float(self.per_head),
            bad_keys: float(self.bad_keys),
            bad_queries: float(self.bad_queries),
        }
    }
}

/// What the backward pass reads besides the inputs: the forward's context `out`
/// `[b, h, n, d_v]` and log-sum-exp `lse` `[b, h, n]` (f32), and the context's gradient `d_out`.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion)]
pub(crate) struct OutputGrad<B: Backend> {
    /// The forward's context.
    pub out: FloatTensor<B>,
    /// The forward's log-sum-exp.
    pub lse: FloatTensor<B>,
    /// The context's gradient.
    pub d_out: FloatTensor<B>,
}

/// The forward's outputs: context, log-sum-exp, row statistics.
pub(crate) type Outputs<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// The backward's outputs: dQ, dK, dV and the score gradient.
pub(crate) type Grads<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

/// The output specs: context `[b, h, n, d_v]` in q's dtype, log-sum-exp `[b, h, n]` in f32 and
/// the row statistics `[b, h, n, ROW_STATS]` in f32 (`[1, 1, 1, 1]` when not asked for).
fn forward_meta(
    inputs: &FlashInputsMetadata,
    call: &CubeCall,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    let (qd, vd) = (&inputs.q.shape, &inputs.v.shape);
    let rows = [qd[0], qd[1], qd[2]];
    (
        TensorSpec::new(Shape::new([qd[0], qd[1], qd[2], vd[3]]), inputs.q.dtype),
        TensorSpec::new(Shape::new(rows), DType::F32),
        TensorSpec::new(Shape::new(stats_shape(call, rows)), DType::F32),
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

/// The score gradient's shape: `[b, h, n, m]`, or `[1, 1, 1, 1]` when not asked for.
fn scores_shape(call: &CubeCall, [b, h, n]: [usize; 3], m: usize) -> [usize; 4] {
    if call.score_grads {
        [b, h, n, m]
    } else {
        [1, 1, 1, 1]
    }
}

/// The gradient specs: dQ, dK, dV shaped like q, k, v, and the score gradient `[b, h, n, m]`
/// in f32 (`[1, 1, 1, 1]` when not asked for).
fn backward_meta(
    inputs: &FlashInputsMetadata,
    _grad: &OutputGradMetadata,
    call: &CubeCall,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    let (q, k) = (&inputs.q, &inputs.k);
    let rows = [q.shape[0], q.shape[1], q.shape[2]];
    let scores = scores_shape(call, rows, k.shape[2]);
    let scores = TensorSpec::new(Shape::new(scores), DType::F32);
    (q.clone(), k.clone(), inputs.v.clone(), scores)
}

/// The ops. Calling them on a backend that is not listed panics: `super::blocker` refuses those.
#[backend_extension(Cube, Fusion, Autodiff)]
pub(crate) trait CubeKernelBackend: Backend {
    /// (context `[b, h, n, d_v]` in q's dtype, log-sum-exp `[b, h, n]` in f32, `config::NO_KEY`
    /// for a row with no visible key, row statistics `[b, h, n, ROW_STATS]` in f32 when
    /// `call.stats`); the rows the inputs' `bad_keys` and `bad_queries` poison (see
    /// [`FlashInputs`]) get the log-sum-exp `config::POISONED`.
    #[fusion(meta = forward_meta)]
    fn cube_kernel_forward(
        #[extension_type] inputs: FlashInputs<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// (dQ, dK, dV, dS) of the forward pass with the same inputs, from its output, its
    /// log-sum-exp and the output's gradient (`grad`); dS `[b, h, n, m]` is the gradient of the
    /// scores after the soft-cap (that of the bias, f32) when `call.score_grads`, else a
    /// `[1, 1, 1, 1]` zero.
    #[fusion(meta = backward_meta)]
    fn cube_kernel_backward(
        #[extension_type] inputs: FlashInputs<Self>,
        #[extension_type] grad: OutputGrad<Self>,
        call: CubeCall,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

impl FlashInputs<CubeBackend> {
    /// Every input made contiguous (the kernels index them row-major).
    fn contiguous(self) -> Self {
        self.map(into_contiguous, into_contiguous)
    }

    /// The kernels' [`Terms`](super::config::Terms) argument.
    fn terms(&self) -> TermsLaunch {
        TermsLaunch::new(
            self.bias.clone().into_tensor_arg(),
            self.q_segments.clone().into_tensor_arg(),
            self.k_segments.clone().into_tensor_arg(),
            self.per_head.clone().into_tensor_arg(),
        )
    }
}

impl CubeKernelBackend for CubeBackend {
    fn cube_kernel_forward(inputs: FlashInputs<Self>, call: CubeCall) -> Outputs<Self> {
        let inputs = inputs.contiguous();
        let [b, h, n, d_k] = inputs.q.meta.shape.dims::<4>();
        let d_v = inputs.v.meta.shape.dims::<4>()[3];
        let client = inputs.q.client.clone();
        let (device, dtype) = (inputs.q.device.clone(), inputs.q.dtype);
        let empty =
            |shape: Shape, dtype| empty_device_dtype(client.clone(), device.clone(), shape, dtype);
        let context = empty(Shape::new([b, h, n, d_v]), dtype);
        let lse = empty(Shape::new([b, h, n]), DType::F32);
        let stats = empty(Shape::new(stats_shape(&call, [b, h, n])), DType::F32);
        let terms = inputs.terms();
        if let Some(mma) = call.mma {
            let config = FlashConfig {
                has_sinks: call.has_sinks,
                has_stats: call.stats,
                ..call.config(d_k, d_v, mma.rows())
            };
            flash_forward_mma::launch(
                &client,
                grid(n.div_ceil(mma.size), b * h),
                CubeDim::new_1d(mma.lanes as u32),
                inputs.q.into_tensor_arg(),
                inputs.k.into_tensor_arg(),
                inputs.v.into_tensor_arg(),
                terms,
                inputs.bad_keys.into_tensor_arg(),
                inputs.bad_queries.into_tensor_arg(),
                context.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                stats.clone().into_tensor_arg(),
                call.scalars(),
                config,
                mma,
                storage(dtype),
            );
            return (context, lse, stats);
        }
        let rows = call.tiling.unit_rows(n, d_k.max(d_v));
        let config = FlashConfig {
            has_sinks: call.has_sinks,
            has_stats: call.stats,
            ..call.config(d_k, d_v, rows)
        };
        flash_forward::launch(
            &client,
            grid(n.div_ceil(UNITS * rows), b * h),
            CubeDim::new_1d(UNITS as u32),
            inputs.q.into_tensor_arg(),
            inputs.k.into_tensor_arg(),
            inputs.v.into_tensor_arg(),
            terms,
            inputs.bad_keys.into_tensor_arg(),
            inputs.bad_queries.into_tensor_arg(),
            context.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            call.scalars(),
            config,
            storage(dtype),
        );
        (context, lse, stats)
    }

    fn cube_kernel_backward(
        inputs: FlashInputs<Self>,
        grad: OutputGrad<Self>,
        call: CubeCall,
    ) -> Grads<Self> {
        let [b, h, n, d_k] = inputs.q.meta.shape.dims::<4>();
        let [_, h_kv, m, d_v] = inputs.v.meta.shape.dims::<4>();
        let OutputGrad { out, lse, d_out } = grad;
        // D = rowsum(dO ∘ O) in f32: [b, h, n, d_v] -> [b, h, n, 1] -> [b, h, n]
        let to_f32 = |x| Self::float_cast(x, FloatDType::F32);
        let delta = Self::float_sum_dim(Self::float_mul(to_f32(d_out.clone()), to_f32(out)), 3);
        let delta = into_contiguous(Self::float_reshape(delta, Shape::new([b, h, n])));
        let inputs = inputs.contiguous();
        let (lse, d_out) = (into_contiguous(lse), into_contiguous(d_out));
        let client = inputs.q.client.clone();
        let (device, dtype) = (inputs.q.device.clone(), inputs.q.dtype);
        let empty = |shape: [usize; 4]| {
            empty_device_dtype(client.clone(), device.clone(), Shape::new(shape), dtype)
        };
        let (dq, dk, dv) = (
            empty([b, h, n, d_k]),
            empty([b, h_kv, m, d_k]),
            empty([b, h_kv, m, d_v]),
        );
        let scores_shape = Shape::new(scores_shape(&call, [b, h, n], m));
        let d_scores = Self::float_zeros(scores_shape, &device, FloatDType::F32);
        let arg = |t: &FloatTensor<Self>| t.clone().into_tensor_arg();
        if let Some(mma) = call.mma {
            let dq_config = call.config(d_k, d_v, mma.rows());
            let dkdv_config = FlashConfig {
                write_scores: call.score_grads,
                ..dq_config
            };
            let dim = CubeDim::new_1d(mma.lanes as u32);
            flash_backward_dq_mma::launch(
                &client,
                grid(n.div_ceil(mma.size), b * h),
                dim,
                arg(&inputs.q),
                arg(&inputs.k),
                arg(&inputs.v),
                inputs.terms(),
                arg(&d_out),
                arg(&lse),
                arg(&delta),
                arg(&dq),
                call.scalars(),
                dq_config,
                mma,
                storage(dtype),
            );
            flash_backward_dkdv_mma::launch(
                &client,
                grid(m.div_ceil(mma.size), b * h_kv),
                dim,
                arg(&inputs.q),
                arg(&inputs.k),
                arg(&inputs.v),
                inputs.terms(),
                arg(&d_out),
                arg(&lse),
                arg(&delta),
                arg(&d_scores),
                arg(&dk),
                arg(&dv),
                call.scalars(),
                dkdv_config,
                mma,
                storage(dtype),
            );
            return (dq, dk, dv, d_scores);
        }
        let d = d_k.max(d_v);
        let (dq_rows, dkdv_rows) = (call.tiling.unit_rows(n, d), call.tiling.unit_rows(m, d));
        let dq_config = call.config(d_k, d_v, dq_rows);
        let dkdv_config = FlashConfig {
            write_scores: call.score_grads,
            ..call.config(d_k, d_v, dkdv_rows)
        };
        // The two kernels' arguments but their own (dQ's `bad_keys` and output, dK/dV's three
        // outputs).
        macro_rules! launch {
            ($kernel:ident, $count:expr, $config:expr, $($own:expr),+) => {
                $kernel::launch(
                    &client,
                    $count,
                    CubeDim::new_1d(UNITS as u32),
                    arg(&inputs.q),
                    arg(&inputs.k),
                    arg(&inputs.v),
                    inputs.terms(),
                    arg(&d_out),
                    arg(&lse),
                    arg(&delta),
                    $(arg($own)),+,
                    call.scalars(),
                    $config,
                    storage(dtype),
                )
            };
        }
        let dq_grid = grid(n.div_ceil(UNITS * dq_rows), b * h);
        launch!(flash_backward_dq, dq_grid, dq_config, &inputs.bad_keys, &dq);
        let dkdv_grid = grid(m.div_ceil(UNITS * dkdv_rows), b * h_kv);
        launch!(
            flash_backward_dkdv,
            dkdv_grid,
            dkdv_config,
            &d_scores,
            &dk,
            &dv
        );
        (dq, dk, dv, d_scores)
    }
}

/// Runs the op on tensors of a Cube (or Fusion over Cube) device: (context, log-sum-exp in f32,
/// row statistics `[b, h, n, ROW_STATS]` in f32 when `call.stats`).
pub(crate) fn forward(
    inputs: FlashInputs<Dispatch>,
    call: CubeCall,
) -> (Tensor<4>, Tensor<3>, Option<Tensor<4>>) {
    let (context, lse, stats) = <Dispatch as CubeKernelBackend>::cube_kernel_forward(inputs, call);
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
