//! The row-wise layers around attention in a training step, fused on the CPU backends:
//! [`linear_rows`] (a linear layer on `[b, s, d]`), [`layer_norm`] (over the last axis) and
//! [`cross_entropy`] (the mean cross-entropy of `[rows, classes]` logits).
//!
//! On Flex and NdArray with this crate's `flex` / `ndarray` features and `f32` tensors, each is
//! one op of this crate's backend extension with its own backward pass (no intermediate
//! tensors, the products split over row blocks, the softmax with the kernel's vectorized
//! `exp`); on every other backend, and for other dtypes, they are Burn's own `Linear`,
//! `layer_norm` and `CrossEntropyLoss`, so the results agree everywhere (tested against them).

use burn::nn::Linear;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::read_back;

/// Applies `linear` to every row of `x` as one `[b·s, d_in] × [d_in, d_out]` product.
///
/// Burn 0.22.1's `Linear::forward` on a 3-D input broadcasts the weight into a batched product
/// (one small matrix product per batch row, and as many again in the backward pass) unless its
/// tiling rule folds the rows, which it does not for row counts that are multiples of 32. On
/// the CPU backends (see the module docs) the rows are folded here and go through this crate's
/// row-parallel product (one single-threaded `gemm` per block of 512 rows, forward and
/// backward); elsewhere this is `Linear::forward` on `x` as it is (with the rows folded on wgpu
/// too, the library tests took 20 minutes on lavapipe instead of about 8; the cause was not
/// established). The result is the same `[b, s, d_out]`.
///
/// ```
/// # use burn::prelude::*;
/// use burn::nn::LinearConfig;
/// let device = Device::flex();
/// let layer = LinearConfig::new(8, 4).init(&device);
/// let x = Tensor::<3>::ones([2, 5, 8], &device);
/// let y = burn_sdpa::rows::linear_rows(&layer, x.clone());
/// assert_eq!(y.dims(), [2, 5, 4]);
/// let reference = layer.forward(x);
/// assert!(y.all_close(reference, Some(1e-5), Some(1e-6)));
/// ```
///
/// # Shapes
/// - x: `[b, s, d_in]`
/// - returns `[b, s, d_out]`
pub fn linear_rows(linear: &Linear, x: Tensor<3>) -> Tensor<3> {
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    if crate::paths::cpu::linear_runs_in_place(linear, &x) {
        let [b, s, d_in] = x.dims();
        // [b, s, d_in] -> [b·s, d_in] -> [b·s, d_out] -> [b, s, d_out]
        let y = crate::paths::cpu::linear_in_place(linear, x.reshape([b * s, d_in]));
        let [_, d_out] = y.dims();
        return y.reshape([b, s, d_out]);
    }
    linear.forward(x)
}

/// The layer norm of `input` over its last axis, `(x − μ) / √(σ² + ε) · γ + β` with the biased
/// variance: Burn's `burn::tensor::module::layer_norm` (what `nn::LayerNorm::forward` calls),
/// with the same arguments.
///
/// Burn 0.22.1 composes it of generic ops, a pass over the tensor and a buffer each, forward and
/// backward. On the CPU backends (see the module docs) it is one op with its own backward pass
/// (one pass over the rows each way, the rows split over the thread pool).
///
/// ```
/// # use burn::prelude::*;
/// use burn::nn::LayerNormConfig;
/// let device = Device::flex();
/// let norm = LayerNormConfig::new(8).init(&device);
/// let x = Tensor::<3>::random([2, 5, 8], burn::tensor::Distribution::Default, &device);
/// let beta = norm.beta.as_ref().map(|b| b.val());
/// let y = burn_sdpa::rows::layer_norm(x.clone(), norm.gamma.val(), beta, 1e-5);
/// assert!(y.all_close(norm.forward(x), Some(1e-4), Some(1e-5)));
/// ```
///
/// # Shapes
/// - input: `[..., d]`; gamma, beta: `[d]`
/// - returns the shape of `input`
pub fn layer_norm<const D: usize>(
    input: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    epsilon: f64,
) -> Tensor<D> {
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    {
        let dims = input.dims();
        let d = dims[D - 1];
        if gamma.dims() == [d]
            && beta.as_ref().is_none_or(|b| b.dims() == [d])
            && crate::paths::cpu::layer_norm_runs_in_place(&input, &gamma, beta.as_ref())
        {
            // [..., d] -> [rows, d] -> [..., d]
            let rows = input.shape().num_elements() / d;
            let y =
                crate::paths::cpu::layer_norm_2d(input.reshape([rows, d]), gamma, beta, epsilon);
            return y.reshape(dims);
        }
    }
    burn::tensor::module::layer_norm(input, gamma, beta, epsilon)
}

/// The mean cross-entropy of `logits` against the class ids `targets`, as Burn's
/// `CrossEntropyLoss` with its defaults computes it (`−mean_r log softmax(x_r)[t_r]`), or an
/// error naming the first target that is not a class.
///
/// On the CPU backends (see the module docs) the targets are read to the host (one small
/// transfer) and the loss and its gradient are computed row by row.
///
/// ```
/// # use burn::prelude::*;
/// let device = Device::flex();
/// let logits = Tensor::<2>::from_data([[2.0, 0.0], [0.0, 0.0]], &device);
/// let targets = Tensor::<1, Int>::from_data([0, 1], &device);
/// let loss = burn_sdpa::rows::try_cross_entropy(logits, targets).unwrap();
/// let expected = ((1.0f32 + (-2.0f32).exp()).ln() + 2.0f32.ln()) / 2.0;
/// assert!((loss.into_scalar::<f32>() - expected).abs() < 1e-6);
/// ```
///
/// # Shapes
/// - logits: `[rows, classes]`; targets: `[rows]`
/// - returns `[1]`
pub fn try_cross_entropy(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
) -> Result<Tensor<1>, AttentionError> {
    let [_, classes] = check_targets("cross-entropy targets", &logits, &targets)?;
    // Burn's loss gathers the targets without checking them: they are checked here, on every
    // backend (one small read).
    let ids: Vec<i64> = read_back("the cross-entropy targets", targets.clone())?;
    let checked = ids
        .iter()
        .enumerate()
        .map(|(row_idx, &id)| {
            usize::try_from(id)
                .ok()
                .filter(|&c| c < classes)
                .ok_or_else(|| out_of_range(row_idx, id, classes))
        })
        .collect::<Result<Vec<usize>, _>>()?;
    // Zero rows: Burn's mean over nothing (NaN), on every backend.
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    if !checked.is_empty()
        && logits.dtype() == burn::tensor::DType::F32
        && crate::cpu_kernel::runs_in_place(&logits.device())
    {
        return Ok(crate::paths::cpu::cross_entropy_2d(logits, checked));
    }
    // Without the CPU op the checked ids are not needed beyond the check.
    #[cfg(not(any(feature = "flex", feature = "ndarray")))]
    let _ = checked;
    Ok(CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, targets))
}

/// `[rows, classes]` of `logits` when `targets` holds one class id per row and there is a class;
/// otherwise the error naming `what`.
fn check_targets(
    what: &'static str,
    logits: &Tensor<2>,
    targets: &Tensor<1, Int>,
) -> Result<[usize; 2], AttentionError> {
    let [rows, classes] = logits.dims();
    let [n_targets] = targets.dims();
    if n_targets != rows || classes == 0 {
        return Err(AttentionError::Shape {
            what,
            expected: format!("one target per row of logits [{rows}, {classes}] with classes > 0"),
            got: vec![n_targets],
        });
    }
    Ok([rows, classes])
}

fn out_of_range(row_idx: usize, id: i64, classes: usize) -> AttentionError {
    AttentionError::InvalidConfig {
        field: "cross-entropy target",
        value: format!("{id} (row {row_idx})"),
        reason: format!("a class id must be in 0..{classes}"),
    }
}

/// [`try_cross_entropy`].
///
/// # Panics
/// With the message of [`try_cross_entropy`]'s error.
///
/// # Shapes
/// - logits: `[rows, classes]`; targets: `[rows]`
/// - returns `[1]`
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    try_cross_entropy(logits, targets).unwrap_or_else(|e| panic!("{e}"))
}

/// The mean and the population standard deviation of every element of `x`, `[2]` `f32`,
/// without a gradient (read outside autodiff): the scale of activations a training run
/// records, such as the query and key heads that enter the scores.
///
/// On the CPU backends (see the module docs) with an `f32` tensor this is one pass over the
/// backend's buffer (on Flex in place even when `x` is a permuted view of it, heads split by a
/// transpose), summed in blocks about each block's first value in `f32` lanes and merged in
/// `f64`; elsewhere two sums of Burn's ops in `f32` (`E[x²] − E[x]²`, which loses precision
/// when the mean is large against the spread).
///
/// ```
/// # use burn::prelude::*;
/// let device = Device::flex();
/// let x = Tensor::<2>::from_data([[1.0, 3.0], [1.0, 3.0]], &device);
/// let [mean, std] = burn_sdpa::rows::mean_and_std(x.swap_dims(0, 1)).to_data().to_vec::<f32>().unwrap()[..] else { panic!() };
/// assert_eq!((mean, std), (2.0, 1.0));
/// ```
///
/// # Shapes
/// - x: any
/// - returns `[2]`: mean, std
pub fn mean_and_std<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    let x = if x.is_autodiff() {
        x.without_autodiff()
    } else {
        x
    };
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    if x.dtype() == burn::tensor::DType::F32
        && x.shape().num_elements() > 0
        && crate::cpu_kernel::runs_in_place(&x.device())
    {
        return crate::paths::cpu::reduce::cpu_mean_std(x);
    }
    let x = x.cast(burn::tensor::DType::F32);
    let len = x.shape().num_elements().max(1) as f64;
    let mean = x.clone().sum().div_scalar(len);
    let variance = x.square().sum().div_scalar(len) - mean.clone() * mean.clone();
    Tensor::cat(vec![mean, variance.clamp_min(0.0).sqrt()], 0)
}

/// The fraction of rows of `logits` whose prediction is the row's target, `[1]`, without a
/// gradient; or an error when there is not one target per row or no class. The prediction is
/// Burn's `argmax` (the first largest logit; on Flex and NdArray the first NaN of a row that
/// has one); a target that is not a class counts as wrong; zero rows give NaN (Burn's mean
/// over nothing), on every backend.
///
/// On the CPU backends (see the module docs) with `f32` logits the targets are read to the
/// host (one small transfer) and the logits are read once in place; elsewhere Burn's `argmax`.
///
/// ```
/// # use burn::prelude::*;
/// let device = Device::flex();
/// let logits = Tensor::<2>::from_data([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], &device);
/// let targets = Tensor::<1, Int>::from_data([0, 0, 1], &device);
/// let accuracy = burn_sdpa::rows::try_accuracy(logits, targets).unwrap();
/// assert_eq!(accuracy.into_scalar::<f32>(), 1.0 / 3.0);
/// ```
///
/// # Shapes
/// - logits: `[rows, classes]`; targets: `[rows]`
/// - returns `[1]`
pub fn try_accuracy(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
) -> Result<Tensor<1>, AttentionError> {
    let [rows, _] = check_targets("accuracy targets", &logits, &targets)?;
    let logits = if logits.is_autodiff() {
        logits.without_autodiff()
    } else {
        logits
    };
    if rows == 0 {
        return Ok(Tensor::full([1], f64::NAN, &logits.device()));
    }
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    if logits.dtype() == burn::tensor::DType::F32
        && crate::cpu_kernel::runs_in_place(&logits.device())
    {
        let ids: Vec<i64> = read_back("the accuracy targets", targets)?;
        // A target that is not a class is never the prediction: `classes` stands for it.
        let classes = logits.dims()[1];
        let ids = ids
            .into_iter()
            .map(|id| {
                usize::try_from(id)
                    .ok()
                    .filter(|&c| c < classes)
                    .unwrap_or(classes)
            })
            .collect();
        return Ok(crate::paths::cpu::reduce::cpu_accuracy(logits, ids));
    }
    let predicted = logits.argmax(1).squeeze_dim::<1>(1);
    Ok(predicted.equal(targets).float().mean())
}

/// [`try_accuracy`].
///
/// # Panics
/// With the message of [`try_accuracy`]'s error.
///
/// # Shapes
/// - logits: `[rows, classes]`; targets: `[rows]`
/// - returns `[1]`
pub fn accuracy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    try_accuracy(logits, targets).unwrap_or_else(|e| panic!("{e}"))
}
