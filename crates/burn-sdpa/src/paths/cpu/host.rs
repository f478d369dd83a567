//! Reading a CPU backend's float tensors as `f32` slices in place, and making tensors from the
//! kernel's output: what the backend extension needs of Flex and NdArray.

use std::borrow::Cow;

use burn::backend::{Backend, TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape, TensorData, bf16, f16};

use crate::error::AttentionError;
use crate::vocabulary::Implementation;

/// A CPU backend whose float tensors the kernel can read on the host.
pub(crate) trait HostFloat: Backend {
    /// The values of an `f32` tensor in row-major order: borrowed when the backend holds them
    /// contiguous, copied into that order otherwise.
    fn host(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f32]>, AttentionError>;

    /// A tensor of `E` (`f32`, bf16 or f16) of the given shape from row-major values, on
    /// `like`'s device.
    fn from_host<E: burn::tensor::Element>(
        values: Vec<E>,
        shape: impl Into<Shape>,
        like: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let device = like.device();
        Self::float_from_data(TensorData::new(values, shape), &device)
    }

    /// The values of a bf16 tensor in row-major order, borrowed or copied as [`host`](Self::host)
    /// does (Flex only: NdArray has no half-precision tensors).
    fn host_bf16(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [bf16]>, AttentionError> {
        Err(unsupported_dtype(tensor.dtype()))
    }

    /// The values of an f16 tensor in row-major order, as [`host_bf16`](Self::host_bf16).
    fn host_f16(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f16]>, AttentionError> {
        Err(unsupported_dtype(tensor.dtype()))
    }

    /// The values of an `f32`, bf16 or f16 tensor as `f32` (half types widened, exactly).
    fn host_widened(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f32]>, AttentionError> {
        Ok(match tensor.dtype() {
            DType::BF16 => Cow::Owned(
                Self::host_bf16(tensor)?
                    .iter()
                    .map(|x| x.to_f32())
                    .collect(),
            ),
            DType::F16 => Cow::Owned(Self::host_f16(tensor)?.iter().map(|x| x.to_f32()).collect()),
            _ => Self::host(tensor)?,
        })
    }

    /// A tensor in `like`'s dtype from `f32` values (rounded to nearest even for bf16 and f16):
    /// what a gradient computed in `f32` becomes for a parameter stored in a half type.
    fn from_host_as(
        values: Vec<f32>,
        shape: impl Into<Shape>,
        like: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match like.dtype() {
            DType::BF16 => {
                let mut rounded = vec![bf16::ZERO; values.len()];
                super::tile_bf16::round_to_bf16(&values, &mut rounded);
                Self::from_host(rounded, shape, like)
            }
            DType::F16 => Self::from_host(
                values.into_iter().map(f16::from_f32).collect::<Vec<_>>(),
                shape,
                like,
            ),
            _ => Self::from_host(values, shape, like),
        }
    }

    /// `tensor` itself when the backend holds it contiguous, else a contiguous copy of it (in
    /// its dtype, `f32`, bf16 or f16), so that what is read twice (by a forward pass and by its
    /// backward) is copied at most once.
    fn contiguous(tensor: FloatTensor<Self>) -> Result<FloatTensor<Self>, AttentionError> {
        /// A tensor like `like` from the values a read copied; `None` when it borrowed them.
        fn from_copy<B: HostFloat, E: burn::tensor::Element>(
            read: Cow<'_, [E]>,
            like: &FloatTensor<B>,
        ) -> Option<FloatTensor<B>> {
            match read {
                Cow::Borrowed(_) => None,
                Cow::Owned(values) => Some(B::from_host(values, like.shape(), like)),
            }
        }
        let copy = match tensor.dtype() {
            DType::BF16 => from_copy::<Self, _>(Self::host_bf16(&tensor)?, &tensor),
            DType::F16 => from_copy::<Self, _>(Self::host_f16(&tensor)?, &tensor),
            _ => from_copy::<Self, _>(Self::host(&tensor)?, &tensor),
        };
        Ok(copy.unwrap_or(tensor))
    }
}

/// The error for a tensor the kernel cannot read in a half type.
fn unsupported_dtype(dtype: DType) -> AttentionError {
    AttentionError::Unsupported {
        implementation: Implementation::CpuKernel,
        reason: format!(
            "it computes on f32 data (and bf16 and f16 on Flex), got {dtype:?} on this backend"
        ),
    }
}

/// The error for a tensor the kernel cannot read.
fn not_f32(dtype: DType) -> AttentionError {
    AttentionError::Unsupported {
        implementation: Implementation::CpuKernel,
        reason: format!("it computes on f32 data only, got {dtype:?}"),
    }
}

#[cfg(feature = "flex")]
impl HostFloat for burn::backend::Flex {
    fn host(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f32]>, AttentionError> {
        if tensor.dtype() != DType::F32 {
            return Err(not_f32(tensor.dtype()));
        }
        Ok(match tensor.as_slice::<f32>() {
            Some(values) => Cow::Borrowed(values),
            // A strided view (e.g. heads split by a transpose): one copy into row-major order.
            None => Cow::Owned(tensor.to_contiguous().storage::<f32>().to_vec()),
        })
    }

    fn host_bf16(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [bf16]>, AttentionError> {
        if tensor.dtype() != DType::BF16 {
            return Err(unsupported_dtype(tensor.dtype()));
        }
        Ok(match tensor.as_slice::<bf16>() {
            Some(values) => Cow::Borrowed(values),
            None => Cow::Owned(tensor.to_contiguous().storage::<bf16>().to_vec()),
        })
    }

    fn host_f16(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f16]>, AttentionError> {
        if tensor.dtype() != DType::F16 {
            return Err(unsupported_dtype(tensor.dtype()));
        }
        Ok(match tensor.as_slice::<f16>() {
            Some(values) => Cow::Borrowed(values),
            None => Cow::Owned(tensor.to_contiguous().storage::<f16>().to_vec()),
        })
    }
}

#[cfg(feature = "ndarray")]
impl HostFloat for burn::backend::NdArray {
    fn host(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f32]>, AttentionError> {
        use burn::backend::ndarray::NdArrayTensor;
        let NdArrayTensor::F32(storage) = tensor else {
            return Err(not_f32(tensor.dtype()));
        };
        let view = storage.view();
        Ok(match view.to_slice() {
            Some(values) => Cow::Borrowed(values),
            // A permuted or broadcast view: one copy into row-major order.
            None => Cow::Owned(view.iter().copied().collect()),
        })
    }
}
