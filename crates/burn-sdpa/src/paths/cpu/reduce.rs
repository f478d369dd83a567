//! Whole-tensor reductions a training step records, on the CPU backends as a Burn backend
//! extension (`cpu_mean_std`, `cpu_accuracy`, `cpu_row_diagnostics`) for Flex and NdArray,
//! reading their buffers in place: the mean and standard deviation of every element (on Flex a
//! permuted view, such as heads split by a transpose, is summed in storage order without a
//! copy), a classifier's accuracy (one pass over the logits), and the per-head sums of the
//! attention diagnostics from the row statistics (one pass instead of some thirty tensor ops).
//! None has a gradient: callers pass tensors outside autodiff.

use burn::backend::{Backend, Dispatch, TensorMetadata, backend_extension, tensor::FloatTensor};
use burn::prelude::*;

use super::host::HostFloat;
use super::row_ops::Targets;
use super::{for_each_task, simd};

/// How many values per head [`row_diagnostics`] writes (the layout of `diagnostics_tensor`,
/// whose module checks that it has as many).
pub(crate) const ROW_DIAGNOSTIC_VALUES: usize = 9;

/// The largest weight above which a row counts as saturated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Saturation(pub f32);

/// Elements per task of the reductions' passes.
const BLOCK: usize = 1 << 16;

/// The work (in [`for_each_task`]'s flops) counted per element read: these passes are bound by
/// memory, not arithmetic, and a pass over a few million elements already pays for the pool.
const WORK_PER_ELEMENT: usize = 8;

/// The ops. Calling one on a backend that is not listed panics: their callers check the device
/// first, and pass tensors outside autodiff.
#[backend_extension(Flex: cfg(feature = "flex"), NdArray: cfg(feature = "ndarray"))]
pub(crate) trait CpuReduce: Backend {
    /// `[mean, std]` (population) of every element of `x` (`f32`), as `[2]`.
    fn cpu_mean_std(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `[1]`: the fraction of rows of `logits` `[rows, classes]` (`f32`) whose first largest
    /// logit is at the row's target.
    fn cpu_accuracy(logits: FloatTensor<Self>, targets: Targets) -> FloatTensor<Self>;

    /// `diagnostics_tensor`'s `[DIAGNOSTIC_VALUES · h]` from the row statistics `[b, h, n]`
    /// (`f32`): entropy, largest weight, visible keys, logit std, largest logit.
    fn cpu_row_diagnostics(
        entropy: FloatTensor<Self>,
        max_prob: FloatTensor<Self>,
        visible_keys: FloatTensor<Self>,
        logit_std: FloatTensor<Self>,
        max_logit: FloatTensor<Self>,
        saturation: Saturation,
    ) -> FloatTensor<Self>;
}

/// [`CpuReduce::cpu_row_diagnostics`] on the statistics' tensors (outside autodiff, `f32`, on
/// a backend the extension lists).
pub(crate) fn cpu_row_diagnostics(stats: [Tensor<3>; 5], saturation: f32) -> Tensor<1> {
    let [entropy, max_prob, visible_keys, logit_std, max_logit] = stats.map(Tensor::into_dispatch);
    Tensor::from_dispatch(<Dispatch as CpuReduce>::cpu_row_diagnostics(
        entropy,
        max_prob,
        visible_keys,
        logit_std,
        max_logit,
        Saturation(saturation),
    ))
}

/// `diagnostics_tensor`'s values on host slices `[b, h, n]`, in its order: per head the rows
/// that count (a visible key, not poisoned), the rows with two keys or more, then the sums over
/// counting rows of entropy, entropy / ln k (rows with two keys or more), largest weight,
/// e^entropy, rows whose largest weight is above `saturation` and logit std (two keys or
/// more), and the largest logit: `[ROW_DIAGNOSTIC_VALUES, h]`.
pub(crate) fn row_diagnostics(
    [entropy, max_prob, keys, logit_std, max_logit]: [&[f32]; 5],
    n_heads: usize,
    n: usize,
    saturation: f32,
) -> Vec<f32> {
    const DIAGNOSTIC_VALUES: usize = ROW_DIAGNOSTIC_VALUES;
    // The largest logit starts at −∞ (what a head without a counting row keeps, as on the
    // tensor path); the rest are sums.
    let mut start = [0.0f64; DIAGNOSTIC_VALUES];
    start[8] = f64::NEG_INFINITY;
    let mut sums = vec![start; n_heads];
    for (row_idx, head) in (0..entropy.len()).map(|r| (r, (r / n.max(1)) % n_heads.max(1))) {
        let sums = &mut sums[head];
        let (h, k) = (entropy[row_idx], keys[row_idx]);
        let valid = k > 0.5 && !h.is_nan();
        let multi = k > 1.5 && valid;
        if valid {
            sums[0] += 1.0;
            sums[2] += f64::from(h);
            sums[4] += f64::from(max_prob[row_idx]);
            sums[5] += f64::from(h.exp());
            // Compared in f32, as the tensor path compares.
            sums[6] += f64::from(u8::from(max_prob[row_idx] > saturation));
            sums[8] = sums[8].max(f64::from(max_logit[row_idx]));
        }
        if multi {
            sums[1] += 1.0;
            sums[3] += f64::from(h / k.max(2.0).ln());
            sums[7] += f64::from(logit_std[row_idx]);
        }
    }
    // [h, DIAGNOSTIC_VALUES] -> [DIAGNOSTIC_VALUES, h]
    let mut out = vec![0.0f32; DIAGNOSTIC_VALUES * n_heads];
    for (head, sums) in sums.iter().enumerate() {
        for (value_idx, sum) in sums.iter().enumerate() {
            out[value_idx * n_heads + head] = *sum as f32;
        }
    }
    out
}

/// `[mean, std]` of every element of `x` (outside autodiff, `f32`, on a backend the extension
/// lists).
pub(crate) fn cpu_mean_std<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as CpuReduce>::cpu_mean_std(x.into_dispatch()))
}

/// The accuracy `[1]` of `logits` against `targets` (outside autodiff, `f32`, on a backend the
/// extension lists; every target below the number of classes).
pub(crate) fn cpu_accuracy(logits: Tensor<2>, targets: Vec<usize>) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as CpuReduce>::cpu_accuracy(
        logits.into_dispatch(),
        Targets(std::sync::Arc::new(targets)),
    ))
}

/// `[mean, std]` of `values`: each block's sums about its first element in `f32` lanes (no
/// cancellation when the mean is large against the spread), the blocks' means and squared
/// deviations merged in `f64` (Chan et al.'s pairwise update).
pub(crate) fn mean_std(values: &[f32]) -> [f32; 2] {
    // Per block: (count, mean, Σ (x − mean)²).
    let mut partial = vec![(0.0f64, 0.0f64, 0.0f64); values.len().div_ceil(BLOCK)];
    let tasks: Vec<_> = values.chunks(BLOCK).zip(partial.iter_mut()).collect();
    for_each_task(
        tasks,
        WORK_PER_ELEMENT * values.len(),
        || (),
        |(), (block, out)| {
            let shift = block[0];
            let [sum, squares] = simd::sum_and_squares_about(block, shift);
            let (n, sum, squares) = (block.len() as f64, f64::from(sum), f64::from(squares));
            *out = (
                n,
                f64::from(shift) + sum / n,
                (squares - sum * sum / n).max(0.0),
            );
        },
    );
    let (n, mean, m2) = partial.iter().fold(
        (0.0f64, 0.0f64, 0.0f64),
        |(n_a, mean_a, m2_a), &(n_b, mean_b, m2_b)| {
            let n = n_a + n_b;
            let delta = mean_b - mean_a;
            (
                n,
                mean_a + delta * n_b / n,
                m2_a + m2_b + delta * delta * n_a * n_b / n,
            )
        },
    );
    [mean as f32, (m2 / n.max(1.0)).sqrt() as f32]
}

/// The fraction of rows of `logits` `[rows, classes]` whose prediction is `targets[row]` (a
/// target `≥ classes` never is), the prediction being Burn's `argmax` on Flex and NdArray: the
/// first NaN of a row that has one, else the first largest logit.
pub(crate) fn accuracy(logits: &[f32], targets: &[usize], classes: usize) -> f32 {
    let rows_per_task = (BLOCK / classes.max(1)).max(1);
    let mut correct = vec![0usize; targets.len().div_ceil(rows_per_task)];
    let tasks: Vec<_> = targets
        .chunks(rows_per_task)
        .zip(correct.iter_mut())
        .enumerate()
        .collect();
    for_each_task(
        tasks,
        WORK_PER_ELEMENT * targets.len() * classes,
        || (),
        |(), (task_idx, (targets, count))| {
            for (i, &target) in targets.iter().enumerate() {
                let row_idx = task_idx * rows_per_task + i;
                let row = &logits[row_idx * classes..][..classes];
                let predicted = if simd::non_finite(row) && row.iter().any(|x| x.is_nan()) {
                    row.iter().position(|x| x.is_nan())
                } else {
                    // `max` skips NaN; the first index holding it is the prediction.
                    let max = simd::max(row);
                    row.iter().position(|&x| x == max)
                };
                *count += usize::from(predicted == Some(target));
            }
        },
    );
    correct.iter().sum::<usize>() as f32 / targets.len().max(1) as f32
}

/// The values of `x` in some order, without a copy when the backend's buffer holds exactly them
/// (contiguous, or on Flex a permutation of a contiguous layout: split heads; NdArray copies a
/// permuted view).
trait AnyOrder: HostFloat {
    fn any_order(x: &FloatTensor<Self>) -> std::borrow::Cow<'_, [f32]> {
        Self::host(x).unwrap_or_else(|e| panic!("{e}"))
    }
}

#[cfg(feature = "flex")]
impl AnyOrder for burn::backend::Flex {
    fn any_order(x: &FloatTensor<Self>) -> std::borrow::Cow<'_, [f32]> {
        let layout = x.layout();
        let storage = x.storage::<f32>();
        // A permutation of a contiguous layout over the whole buffer: sorted by stride, each
        // stride is the product of the sizes before it.
        let mut axes: Vec<(isize, usize)> = layout
            .strides()
            .iter()
            .copied()
            .zip(layout.shape().iter().copied())
            .filter(|&(_, size)| size > 1)
            .collect();
        axes.sort_unstable();
        let mut expected = 1isize;
        let dense = axes.iter().all(|&(stride, size)| {
            let ok = stride == expected;
            expected = expected.saturating_mul(size as isize);
            ok
        });
        if dense && layout.start_offset() == 0 && storage.len() == layout.num_elements() {
            std::borrow::Cow::Borrowed(storage)
        } else {
            Self::host(x).unwrap_or_else(|e| panic!("{e}"))
        }
    }
}

#[cfg(feature = "ndarray")]
impl AnyOrder for burn::backend::NdArray {}

/// The op on a backend whose buffers it reads in place (the same for Flex and NdArray).
macro_rules! in_place_backend {
    ($backend:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        impl CpuReduce for $backend {
            fn cpu_mean_std(x: FloatTensor<Self>) -> FloatTensor<Self> {
                let values = <Self as AnyOrder>::any_order(&x);
                Self::from_host(mean_std(&values).to_vec(), [2], &x)
            }

            fn cpu_accuracy(logits: FloatTensor<Self>, targets: Targets) -> FloatTensor<Self> {
                let classes = logits.shape().dims::<2>()[1];
                let values = Self::host(&logits).unwrap_or_else(|e| panic!("{e}"));
                Self::from_host(vec![accuracy(&values, &targets.0, classes)], [1], &logits)
            }

            fn cpu_row_diagnostics(
                entropy: FloatTensor<Self>,
                max_prob: FloatTensor<Self>,
                visible_keys: FloatTensor<Self>,
                logit_std: FloatTensor<Self>,
                max_logit: FloatTensor<Self>,
                saturation: Saturation,
            ) -> FloatTensor<Self> {
                let [_, n_heads, n] = entropy.shape().dims::<3>();
                let read = |t| Self::host(t).unwrap_or_else(|e| panic!("{e}"));
                let columns =
                    [&entropy, &max_prob, &visible_keys, &logit_std, &max_logit].map(read);
                let columns = columns.each_ref().map(|c| &c[..]);
                let values = row_diagnostics(columns, n_heads, n, saturation.0);
                let len = values.len();
                Self::from_host(values, [len], &entropy)
            }
        }
    };
}

in_place_backend!(burn::backend::Flex, "flex");
in_place_backend!(burn::backend::NdArray, "ndarray");
