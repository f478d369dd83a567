//! The CPU kernel path: this crate's flash kernel ([`kernel`]) run on host copies of the
//! tensors. This file is the adapter between Burn tensors and the kernel's slices.

pub mod kernel;
mod simd;

use std::borrow::Cow;

use burn::prelude::*;
use burn::tensor::DType;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::paths::auto::BackendFamily;
use crate::paths::call::Call;
use crate::paths::kind::Implementation;
use kernel::{KernelShape, Tiles};

/// Why the CPU kernel cannot serve `call`, if it cannot.
pub(crate) fn blocker(call: &Call) -> Option<&'static str> {
    let input = &call.input;
    let f32_data = [&input.query, &input.key, &input.value]
        .iter()
        .all(|t| t.dtype() == DType::F32);
    if input.need_weights || input.need_scores {
        Some("it cannot return the weights or scores")
    } else if input.query.device().is_autodiff() {
        Some("it has no backward pass (use Chunked or Auto under autodiff)")
    } else if input.has_mask_or_bias() {
        Some("it takes no mask or bias, only causal masking")
    } else if !f32_data {
        Some("it computes on f32 data only")
    } else {
        None
    }
}

/// Runs the kernel on the host copies of q, k and v and uploads the context.
pub(crate) fn run(call: Call) -> Result<AttentionOutput, AttentionError> {
    let dims = call.dims;
    let [b, h, n, m] = dims.scores_shape();
    let shape = KernelShape {
        dims,
        scale: call.scale as f32,
        causal_offset: call.input.causal.then(|| call.alignment.offset(n, m)),
    };
    let device = call.input.query.device();
    let ndarray = BackendFamily::of(&device) == BackendFamily::NdArray;
    let to_host = |t: Tensor<4>| {
        if ndarray {
            // NdArray's `into_data` walks a shared or permuted array element by element; after
            // an elementwise op (a uniquely owned array) and a reshape (standard layout) it hands
            // the buffer over, several times faster.
            let [d0, d1, d2, d3] = t.dims();
            t.mul_scalar(1.0).reshape([d0 * d1, d2, d3]).into_data()
        } else {
            t.into_data()
        }
    };
    let input = call.input;
    let (q, k, v) = (
        to_host(input.query),
        to_host(input.key),
        to_host(input.value),
    );
    let mut out = vec![0.0f32; b * h * n * dims.d_v];
    kernel::try_attention_f32_tiled(
        &shape,
        Tiles::default(),
        &host(&q)?,
        &host(&k)?,
        &host(&v)?,
        &mut out,
    )?;
    let context = Tensor::from_data(TensorData::new(out, [b, h, n, dims.d_v]), &device);
    Ok(AttentionOutput::from_context(context))
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
