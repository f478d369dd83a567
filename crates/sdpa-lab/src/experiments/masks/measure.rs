//! One `masks` cell: every fill value, mask count and row kind in one dtype on one backend.

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, TensorData};
use burn_sdpa::mask::most_negative;
use burn_sdpa::{AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig};
use serde::{Deserialize, Serialize};

use super::{MasksConfig, SCORES};
use crate::context::{LabError, normal_vec, rng, to_vec};

/// One (fill, masks, row) case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaskRow {
    /// Fill value as asked for.
    pub fill: String,
    /// Masks added together (1 or 2).
    pub n_masks: usize,
    /// Whether every key of the row is masked.
    pub fully_masked: bool,
    /// What a masked score became in this dtype.
    pub masked_score: String,
    /// Outcome of a plain softmax.
    pub softmax: String,
    /// Outcome of the module with the additive mask given as its bias.
    pub module_bias: String,
    /// Outcome of the module with the equivalent boolean mask.
    pub module_bool: String,
}

/// One cell's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MasksResult {
    /// Whether the backend supports the dtype (nothing else is measured when it does not).
    pub supported: bool,
    /// Every case.
    pub rows: Vec<MaskRow>,
    /// The article's Q3 example: softmax([5.0, −1e9]).
    pub q3_example: Vec<f64>,
    /// The article's §3.3 causal mask (triu of −∞ above the diagonal) on 8×8 random scores:
    /// (any NaN, largest |row sum − 1|, largest weight on a masked key).
    pub causal_minus_inf: (bool, f64, f64),
}

fn dtype_of(name: &str) -> DType {
    match name {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => DType::F32,
    }
}

/// Classifies a probability row.
pub fn outcome(p: &[f64], fully_masked: bool) -> String {
    if p.iter().any(|x| x.is_nan()) {
        return "NaN".into();
    }
    if fully_masked {
        let sum: f64 = p.iter().sum();
        return if sum.abs() < 1e-6 {
            "zeros".into()
        } else if p.iter().all(|x| (x - p[0]).abs() < 1e-3) {
            "uniform (masked keys attended)".into()
        } else {
            "non-uniform (masked keys attended)".into()
        };
    }
    // Keys 0 and 1 visible: the reference is softmax([1.5, -0.5]).
    let (e0, e1) = (SCORES[0].exp(), SCORES[1].exp());
    let want = [e0 / (e0 + e1), e1 / (e0 + e1)];
    let leak = p[2] + p[3];
    if leak > 1e-3 {
        format!("leaks {leak:.3} onto masked keys")
    } else if (p[0] - want[0]).abs() < 5e-3 && (p[1] - want[1]).abs() < 5e-3 {
        "correct".into()
    } else {
        "wrong".into()
    }
}

fn row_tensor(values: &[f64], device: &Device, dtype: DType) -> Tensor<4> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [1, 1, 1, values.len()]),
        (device, dtype),
    )
}

fn spell(v: f64) -> String {
    if v.is_infinite() {
        format!("{}inf", if v < 0.0 { "-" } else { "+" })
    } else {
        format!("{v:.4e}")
    }
}

fn case(
    device: &Device,
    dtype: DType,
    fill: f64,
    n_masks: usize,
    fully: bool,
) -> Result<[String; 4], LabError> {
    let masked: Vec<bool> = (0..4).map(|j| fully || j >= 2).collect();
    let mask_values: Vec<f64> = masked.iter().map(|&m| if m { fill } else { 0.0 }).collect();
    let scores = row_tensor(&SCORES, device, dtype);
    let mut additive = row_tensor(&mask_values, device, dtype);
    if n_masks == 2 {
        additive = additive.clone() + additive;
    }
    let masked_score = spell(to_vec(additive.clone())?[2]);
    let plain = outcome(&to_vec(softmax(scores + additive.clone(), 3))?, fully);
    // The module: d_k = 1 with q = 1 and k = scores gives QKᵀ = scores; V = I makes the context
    // equal to the weights.
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(ScalePolicy::Fixed(1.0))
        .try_init()?;
    let q = row_tensor(&[1.0], device, dtype).reshape([1, 1, 1, 1]);
    let k = row_tensor(&SCORES, device, dtype).reshape([1, 1, 4, 1]);
    let eye: Vec<f64> = (0..16)
        .map(|i| if i / 4 == i % 4 { 1.0 } else { 0.0 })
        .collect();
    let v = Tensor::<4>::from_data(TensorData::new(eye, [1, 1, 4, 4]), (device, dtype));
    let with_bias =
        attn.try_forward(AttentionInput::new(q.clone(), k.clone(), v.clone()).bias(additive))?;
    let bool_mask = Tensor::<4, Bool>::from_data(TensorData::new(masked, [1, 1, 1, 4]), device);
    let with_bool = attn.try_forward(AttentionInput::new(q, k, v).mask(bool_mask))?;
    Ok([
        masked_score,
        plain,
        outcome(&to_vec(with_bias.context)?, fully),
        outcome(&to_vec(with_bool.context)?, fully),
    ])
}

/// The article's causal example: `triu(ones · −∞, diagonal = 1)` added to 8×8 scores.
fn causal_minus_inf(
    device: &Device,
    dtype: DType,
    seed: u64,
) -> Result<(bool, f64, f64), LabError> {
    let n = 8;
    let mut r = rng(seed, 8);
    let scores: Vec<f64> = normal_vec(&mut r, n * n)
        .into_iter()
        .map(f64::from)
        .collect();
    let mask: Vec<f64> = (0..n * n)
        .map(|i| {
            if i % n > i / n {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let s = Tensor::<2>::from_data(TensorData::new(scores, [n, n]), (device, dtype));
    let m = Tensor::<2>::from_data(TensorData::new(mask, [n, n]), (device, dtype));
    let p = to_vec(softmax(s + m, 1))?;
    let nan = p.iter().any(|x| x.is_nan());
    let sums = p
        .chunks(n)
        .map(|r| (r.iter().sum::<f64>() - 1.0).abs())
        .fold(0.0, f64::max);
    let leak = (0..n * n)
        .filter(|i| i % n > i / n)
        .map(|i| p[i])
        .fold(0.0, f64::max);
    Ok((nan, sums, leak))
}

/// Measures a cell.
pub fn measure(c: &MasksConfig, device: &Device) -> Result<MasksResult, LabError> {
    let dtype = dtype_of(&c.dtype);
    if !device.supports_dtype(dtype) {
        return Ok(MasksResult {
            supported: false,
            rows: Vec::new(),
            q3_example: Vec::new(),
            causal_minus_inf: (false, 0.0, 0.0),
        });
    }
    let fills = [
        ("-inf".to_string(), f64::NEG_INFINITY),
        ("-1e9".to_string(), -1e9),
        ("-1e4".to_string(), -1e4),
        (
            format!("dtype min ({:.4e})", most_negative(dtype)),
            most_negative(dtype),
        ),
    ];
    let mut rows = Vec::new();
    for (name, fill) in fills {
        for n_masks in [1, 2] {
            for fully in [false, true] {
                let [masked_score, softmax, module_bias, module_bool] =
                    case(device, dtype, fill, n_masks, fully)?;
                rows.push(MaskRow {
                    fill: name.clone(),
                    n_masks,
                    fully_masked: fully,
                    masked_score,
                    softmax,
                    module_bias,
                    module_bool,
                });
            }
        }
    }
    let q3 = Tensor::<1>::from_data(TensorData::new(vec![5.0f64, -1e9], [2]), (device, dtype));
    Ok(MasksResult {
        supported: true,
        rows,
        q3_example: to_vec(softmax(q3, 0))?,
        causal_minus_inf: causal_minus_inf(device, dtype, c.seed)?,
    })
}
