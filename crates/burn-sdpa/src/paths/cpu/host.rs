//! Reading a CPU backend's float tensors as `f32` slices in place, and making tensors from the
//! kernel's output: what the backend extension needs of Flex and NdArray.

use std::borrow::Cow;

use burn::backend::{Backend, TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape, TensorData, bf16};

use crate::error::AttentionError;
use crate::vocabulary::Implementation;

/// A CPU backend whose float tensors the kernel can read on the host.
pub(crate) trait HostFloat: Backend {
    /// The values of an `f32` tensor in row-major order: borrowed when the backend holds them
    /// contiguous, copied into that order otherwise.
    fn host(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f32]>, AttentionError>;

    /// A tensor of the given shape from row-major values, on `like`'s device.
    fn from_host(
        values: Vec<f32>,
        shape: impl Into<Shape>,
        like: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let device = like.device();
        Self::float_from_data(TensorData::new(values, shape), &device)
    }

    /// The values of a bf16 tensor in row-major order, borrowed or copied as [`host`](Self::host)
    /// does (Flex only: NdArray has no bf16 tensors).
    fn host_bf16(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [bf16]>, AttentionError> {
        Err(unsupported_dtype(tensor.dtype()))
    }

    /// The values of an `f32` or bf16 tensor as `f32` (bf16 widened, exactly).
    fn host_widened(tensor: &FloatTensor<Self>) -> Result<Cow<'_, [f32]>, AttentionError> {
        if tensor.dtype() == DType::BF16 {
            Ok(Cow::Owned(
                Self::host_bf16(tensor)?
                    .iter()
                    .map(|x| x.to_f32())
                    .collect(),
            ))
        } else {
            Self::host(tensor)
        }
    }

    /// A tensor in `like`'s dtype from `f32` values (rounded to nearest even for bf16): what a
    /// gradient computed in `f32` becomes for a parameter stored in bf16.
    fn from_host_as(
        values: Vec<f32>,
        shape: impl Into<Shape>,
        like: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if like.dtype() == DType::BF16 {
            let rounded = values.into_iter().map(bf16::from_f32).collect();
            Self::from_host_bf16(rounded, shape, like)
        } else {
            Self::from_host(values, shape, like)
        }
    }

    /// A bf16 tensor of the given shape from row-major values, on `like`'s device.
    fn from_host_bf16(
        values: Vec<bf16>,
        shape: impl Into<Shape>,
        like: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let device = like.device();
        Self::float_from_data(TensorData::new(values, shape), &device)
    }

    /// `tensor` itself when the backend holds it contiguous, else a contiguous copy of it (in
    /// its dtype, `f32` or bf16), so that what is read twice (by a forward pass and by its
    /// backward) is copied at most once.
    fn contiguous(tensor: FloatTensor<Self>) -> Result<FloatTensor<Self>, AttentionError> {
        if tensor.dtype() == DType::BF16 {
            let copy = match Self::host_bf16(&tensor)? {
                Cow::Borrowed(_) => None,
                Cow::Owned(values) => Some(values),
            };
            return Ok(match copy {
                None => tensor,
                Some(values) => Self::from_host_bf16(values, tensor.shape(), &tensor),
            });
        }
        let copy = match Self::host(&tensor)? {
            Cow::Borrowed(_) => None,
            Cow::Owned(values) => Some(values),
        };
        Ok(match copy {
            None => tensor,
            Some(values) => Self::from_host(values, tensor.shape(), &tensor),
        })
    }
}

/// The error for a tensor the kernel cannot read as bf16.
fn unsupported_dtype(dtype: DType) -> AttentionError {
    AttentionError::Unsupported {
        implementation: Implementation::CpuKernel,
        reason: format!(
            "it computes on f32 data (and bf16 on Flex), got {dtype:?} on this backend"
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
