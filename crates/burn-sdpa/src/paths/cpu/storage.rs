//! The storage types the backend extension runs the kernel on: `f32` (Flex and NdArray), bf16
//! and f16 (Flex). Each reads its tensors on the host, runs the forward and backward passes under
//! the NaN policy (`nonfinite.rs`) and makes the output tensor; gradients are computed in `f32`
//! and stored in the dtype of the tensor they belong to.
//!
//! bf16 under the policy: a bf16 call whose inputs are all finite runs the bf16 kernel; one with a
//! NaN or an infinity (rare: the policy's own case) runs the f32 kernel on widened copies, whose
//! output is rounded back to bf16, so both dtypes poison exactly the same rows.
//!
//! f16 has no product instructions on the CPUs this was measured on (no AVX512_FP16, no AMX-FP16),
//! and its 10-bit fraction does not fit bf16's products: an f16 call runs the f32 kernel on
//! widened copies of its inputs (exact) and rounds the output once. It keeps f16 storage between
//! calls and the f32 kernel's accuracy, not a speed-up.

use std::borrow::Cow;

use burn::backend::tensor::FloatTensor;
use burn::tensor::{DType, bf16, f16};

use super::backward::{BackwardInputs, BackwardOutputs, try_backward_bf16};
use super::host::HostFloat;
use super::masking::Masking;
use super::nonfinite;
use super::shape::{KernelShape, Tiles};
use crate::error::AttentionError;

/// A storage type of the kernel on Burn tensors.
pub(crate) trait Storage: Copy + Send + Sync + 'static {
    /// Zero in this type.
    fn zero() -> Self;

    /// The tensor's values in this type, row-major: borrowed when the backend holds them so,
    /// converted (a copy) when the tensor has the other float type.
    fn read<B: HostFloat>(tensor: &FloatTensor<B>) -> Result<Cow<'_, [Self]>, AttentionError>;

    /// A tensor of this type from row-major values, on `like`'s device.
    fn tensor<B: HostFloat>(
        values: Vec<Self>,
        shape: [usize; 4],
        like: &FloatTensor<B>,
    ) -> FloatTensor<B>;

    /// The forward pass under the NaN policy: `out` and the log-sum-exp of every row.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        q: &[Self],
        k: &[Self],
        v: &[Self],
        out: &mut [Self],
        lse: &mut [f32],
        stats: Option<&mut [f32]>,
    ) -> Result<(), AttentionError>;

    /// The backward pass under the NaN policy.
    fn backward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        inputs: BackwardInputs<'_, Self>,
        outputs: BackwardOutputs<'_>,
    ) -> Result<(), AttentionError>;
}

impl Storage for f32 {
    fn zero() -> f32 {
        0.0
    }

    fn read<B: HostFloat>(tensor: &FloatTensor<B>) -> Result<Cow<'_, [f32]>, AttentionError> {
        B::host_widened(tensor)
    }

    fn tensor<B: HostFloat>(
        values: Vec<f32>,
        shape: [usize; 4],
        like: &FloatTensor<B>,
    ) -> FloatTensor<B> {
        B::from_host(values, shape, like)
    }

    fn forward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
        lse: &mut [f32],
        stats: Option<&mut [f32]>,
    ) -> Result<(), AttentionError> {
        nonfinite::forward(shape, tiles, masking, q, k, v, out, lse, stats)
    }

    fn backward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        inputs: BackwardInputs<'_, f32>,
        outputs: BackwardOutputs<'_>,
    ) -> Result<(), AttentionError> {
        nonfinite::backward(shape, tiles, masking, inputs, outputs)
    }
}

impl Storage for bf16 {
    fn zero() -> bf16 {
        bf16::ZERO
    }

    fn read<B: HostFloat>(tensor: &FloatTensor<B>) -> Result<Cow<'_, [bf16]>, AttentionError> {
        use burn::backend::TensorMetadata;
        if tensor.dtype() == DType::BF16 {
            B::host_bf16(tensor)
        } else {
            Ok(Cow::Owned(
                B::host(tensor)?
                    .iter()
                    .map(|&x| bf16::from_f32(x))
                    .collect(),
            ))
        }
    }

    fn tensor<B: HostFloat>(
        values: Vec<bf16>,
        shape: [usize; 4],
        like: &FloatTensor<B>,
    ) -> FloatTensor<B> {
        B::from_host(values, shape, like)
    }

    fn forward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        q: &[bf16],
        k: &[bf16],
        v: &[bf16],
        out: &mut [bf16],
        lse: &mut [f32],
        stats: Option<&mut [f32]>,
    ) -> Result<(), AttentionError> {
        if all_finite(&[q, k, v]) && !nonfinite::bias_poisons(masking) {
            return super::kernel::forward(shape, tiles, masking, q, k, v, out, Some(lse), stats);
        }
        forward_widened(shape, tiles, masking, q, k, v, out, lse, stats)
    }

    fn backward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        inputs: BackwardInputs<'_, bf16>,
        outputs: BackwardOutputs<'_>,
    ) -> Result<(), AttentionError> {
        if all_finite(&[inputs.q, inputs.k, inputs.v]) && !nonfinite::bias_poisons(masking) {
            return try_backward_bf16(shape, tiles, masking, inputs, outputs);
        }
        backward_widened(shape, tiles, masking, inputs, outputs)
    }
}

impl Storage for f16 {
    fn zero() -> f16 {
        f16::ZERO
    }

    fn read<B: HostFloat>(tensor: &FloatTensor<B>) -> Result<Cow<'_, [f16]>, AttentionError> {
        use burn::backend::TensorMetadata;
        if tensor.dtype() == DType::F16 {
            B::host_f16(tensor)
        } else {
            Ok(Cow::Owned(
                B::host_widened(tensor)?
                    .iter()
                    .map(|&x| f16::from_f32(x))
                    .collect(),
            ))
        }
    }

    fn tensor<B: HostFloat>(
        values: Vec<f16>,
        shape: [usize; 4],
        like: &FloatTensor<B>,
    ) -> FloatTensor<B> {
        B::from_host(values, shape, like)
    }

    fn forward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        q: &[f16],
        k: &[f16],
        v: &[f16],
        out: &mut [f16],
        lse: &mut [f32],
        stats: Option<&mut [f32]>,
    ) -> Result<(), AttentionError> {
        forward_widened(shape, tiles, masking, q, k, v, out, lse, stats)
    }

    fn backward(
        shape: &KernelShape,
        tiles: Tiles,
        masking: &Masking<'_>,
        inputs: BackwardInputs<'_, f16>,
        outputs: BackwardOutputs<'_>,
    ) -> Result<(), AttentionError> {
        backward_widened(shape, tiles, masking, inputs, outputs)
    }
}

/// Whether no value of the runs is a NaN or an infinity (all exponent bits set), in one
/// branch-free pass per chunk.
fn all_finite(runs: &[&[bf16]]) -> bool {
    runs.iter().all(|run| {
        run.chunks(1 << 12).all(|chunk| {
            !chunk
                .iter()
                .fold(false, |any, x| any | (x.to_bits() & 0x7f80 == 0x7f80))
        })
    })
}

/// Half-precision values as `f32` (exact).
fn widen<T: Half>(values: &[T]) -> Vec<f32> {
    values.iter().map(|x| x.widen()).collect()
}

/// bf16 and f16: widened to `f32` exactly, rounded from it to nearest even.
trait Half: Copy {
    fn widen(self) -> f32;
    fn round(x: f32) -> Self;
}

impl Half for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn round(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl Half for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn round(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// The forward pass of the f32 kernel under the NaN policy on widened copies, the output
/// rounded to `T`.
#[allow(clippy::too_many_arguments)]
fn forward_widened<T: Half>(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    lse: &mut [f32],
    stats: Option<&mut [f32]>,
) -> Result<(), AttentionError> {
    let mut out32 = vec![0.0f32; out.len()];
    nonfinite::forward(
        shape,
        tiles,
        masking,
        &widen(q),
        &widen(k),
        &widen(v),
        &mut out32,
        lse,
        stats,
    )?;
    for (o, x) in out.iter_mut().zip(out32) {
        *o = T::round(x);
    }
    Ok(())
}

/// The backward pass of the f32 kernel under the NaN policy on widened copies.
fn backward_widened<T: Half>(
    shape: &KernelShape,
    tiles: Tiles,
    masking: &Masking<'_>,
    inputs: BackwardInputs<'_, T>,
    outputs: BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    let (q, k, v) = (widen(inputs.q), widen(inputs.k), widen(inputs.v));
    let (out, grad_out) = (widen(inputs.out), widen(inputs.grad_out));
    let widened = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        grad_out: &grad_out,
        lse: inputs.lse,
    };
    nonfinite::backward(shape, tiles, masking, widened, outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_bf16_values_are_found_wherever_they_are() {
        let finite: Vec<bf16> = (0..5000)
            .map(|i| bf16::from_f32(i as f32 - 2500.0))
            .collect();
        assert!(all_finite(&[&finite, &finite[..3]]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 4095, 4096, 4999] {
                let mut run = finite.clone();
                run[at] = bf16::from_f32(bad);
                assert!(!all_finite(&[&finite, &run]), "{bad} at {at}");
            }
        }
        // The largest finite bf16 is finite.
        assert!(all_finite(&[&[bf16::MAX, bf16::MIN]]));
    }
}
