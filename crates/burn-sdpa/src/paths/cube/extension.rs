//! The CubeCL kernel as a Burn backend extension: `cube_kernel_forward`, implemented for the
//! CubeCL backend and, through the generated lazy implementation, for `Fusion` over it.

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::{Backend, Dispatch, backend_extension, tensor::FloatTensor};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use cubecl::prelude::{CubeCount, CubeDim, Scalar};

use super::kernel::{QUERY_ROWS, flash_forward};

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
    /// Keys before and after the diagonal a query sees, when bounded.
    pub window: (Option<i32>, Option<i32>),
}

/// The output specs: context `[b, h, n, d_v]` and log-sum-exp `[b, h, n]`, in q's dtype.
fn forward_meta(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _extra: &TensorSpec,
    _call: &CubeCall,
) -> (TensorSpec, TensorSpec) {
    let (qd, vd) = (q.shape.clone(), v.shape.clone());
    (
        TensorSpec::new(Shape::new([qd[0], qd[1], qd[2], vd[3]]), q.dtype),
        TensorSpec::new(Shape::new([qd[0], qd[1], qd[2]]), q.dtype),
    )
}

/// The op. Calling it on a backend that is not listed panics: `super::blocker` refuses those.
#[backend_extension(Cube, Fusion)]
pub(crate) trait CubeKernelBackend: Backend {
    /// (context `[b, h, n, d_v]`, log-sum-exp `[b, h, n]`, +3e38 for a row with no visible key);
    /// `extra` `[b|1, h|1, n|1, m]` is the bias with the masked keys at −3e38 or −∞.
    #[fusion(meta = forward_meta)]
    fn cube_kernel_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

impl CubeKernelBackend for CubeBackend {
    fn cube_kernel_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        extra: FloatTensor<Self>,
        call: CubeCall,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let extra = into_contiguous(extra);
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
        let lse = empty_device_dtype(client.clone(), device, Shape::new([b, h, n]), dtype);
        let cube_count = CubeCount::Static(n.div_ceil(QUERY_ROWS) as u32, (b * h) as u32, 1);
        let cube_dim = CubeDim::new_1d(QUERY_ROWS as u32);
        let (left, right) = call.window;
        flash_forward::launch(
            &client,
            cube_count,
            cube_dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            extra.into_tensor_arg(),
            context.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            call.scale,
            call.softcap.unwrap_or(1.0),
            call.offset,
            left.unwrap_or(0),
            right.unwrap_or(0),
            d_k,
            d_v,
            call.causal,
            left.is_some(),
            right.is_some(),
            call.softcap.is_some(),
            call.has_extra,
            f32::elem_type_native(),
        );
        (context, lse)
    }
}

/// Runs the op on tensors of a Cube (or Fusion over Cube) device: (context, log-sum-exp).
pub(crate) fn forward(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    extra: Tensor<4>,
    call: CubeCall,
) -> (Tensor<4>, Tensor<3>) {
    let (context, lse) = <Dispatch as CubeKernelBackend>::cube_kernel_forward(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        extra.into_dispatch(),
        call,
    );
    (Tensor::from_dispatch(context), Tensor::from_dispatch(lse))
}
