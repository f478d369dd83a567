//! Reading a CPU backend's float tensors as `f32` slices in place, and making tensors from the
//! kernel's output: what the backend extension needs of Flex and NdArray.

use std::borrow::Cow;

use burn::backend::{Backend, TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape, TensorData};

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

    /// `tensor` itself when the backend holds it contiguous, else a contiguous copy of it, so
    /// that what is read twice (by a forward pass and by its backward) is copied at most once.
    fn contiguous(tensor: FloatTensor<Self>) -> Result<FloatTensor<Self>, AttentionError> {
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
