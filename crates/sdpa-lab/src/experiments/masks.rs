//! Experiment 8 (`masks`): the article's §3.3, §5 and question 3, measured in half precision.
//! Additive masks with fill values −∞, −10⁹, −10⁴ and the dtype's most negative finite value, in
//! f32, f16 and bf16 where the backend supports them; one mask, two masks added together (e.g.
//! causal + padding), and a fully masked row; through a plain softmax and through the module.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, TensorData};
use burn_sdpa::most_negative;
use burn_sdpa::{AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, Verdict, md_table, write_csv};
use crate::context::{LabContext, LabError, to_vec};

/// The logits of the test row (4 keys; keys 2 and 3 are masked in the partial case).
pub const SCORES: [f64; 4] = [1.5, -0.5, 2.0, 0.3];

/// One cell of the outcome table.
#[derive(Debug, Clone, Serialize)]
pub struct MaskRow {
    /// Backend.
    pub backend: String,
    /// dtype.
    pub dtype: String,
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

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
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
    let e0 = (SCORES[0]).exp();
    let e1 = (SCORES[1]).exp();
    let want = [e0 / (e0 + e1), e1 / (e0 + e1)];
    let leak = p[2] + p[3];
    if leak > 1e-3 {
        format!("leaks {:.3} onto masked keys", leak)
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

fn run_cell(
    device: &Device,
    dtype: DType,
    fill: f64,
    n_masks: usize,
    fully: bool,
) -> Result<(String, String, String, String), LabError> {
    let masked: Vec<bool> = (0..4).map(|j| fully || j >= 2).collect();
    let mask_values: Vec<f64> = masked.iter().map(|&m| if m { fill } else { 0.0 }).collect();
    let scores = row_tensor(&SCORES, device, dtype);
    let mut additive = row_tensor(&mask_values, device, dtype);
    if n_masks == 2 {
        additive = additive.clone() + additive;
    }
    let masked_score = {
        let v = to_vec(additive.clone())?[2];
        if v.is_infinite() {
            format!("{}inf", if v < 0.0 { "-" } else { "+" })
        } else {
            format!("{v:.4e}")
        }
    };
    let p = to_vec(softmax(scores + additive.clone(), 3))?;
    let plain = outcome(&p, fully);

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
    let module_bias = outcome(&to_vec(with_bias.context)?, fully);
    let bool_mask = Tensor::<4, Bool>::from_data(TensorData::new(masked, [1, 1, 1, 4]), device);
    let with_bool = attn.try_forward(AttentionInput::new(q, k, v).mask(bool_mask))?;
    let module_bool = outcome(&to_vec(with_bool.context)?, fully);
    Ok((masked_score, plain, module_bias, module_bool))
}

/// The experiment.
pub struct Masks;

impl Experiment for Masks {
    fn name(&self) -> &'static str {
        "masks"
    }

    fn title(&self) -> &'static str {
        "Mask fill values in half precision: −∞, −1e9, −1e4, dtype min; one and two masks; fully masked rows"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let mut rows = Vec::new();
        let mut skipped = Vec::new();
        for backend in &ctx.backends {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                if !backend.device.supports_dtype(dtype) {
                    skipped.push(format!(
                        "{} on {}: the backend does not support this dtype",
                        dtype_name(dtype),
                        backend.name
                    ));
                    continue;
                }
                let fills = [
                    ("-inf", f64::NEG_INFINITY),
                    ("-1e9", -1e9),
                    ("-1e4", -1e4),
                    ("dtype min", most_negative(dtype)),
                ];
                for (fill_name, fill) in fills {
                    for n_masks in [1, 2] {
                        for fully in [false, true] {
                            let (masked_score, softmax, module_bias, module_bool) =
                                run_cell(&backend.device, dtype, fill, n_masks, fully)?;
                            rows.push(MaskRow {
                                backend: backend.name.clone(),
                                dtype: dtype_name(dtype).into(),
                                fill: if fill_name == "dtype min" {
                                    format!("dtype min ({:.4e})", fill)
                                } else {
                                    fill_name.into()
                                },
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
            }
        }
        let table = md_table(
            &[
                "backend",
                "dtype",
                "fill",
                "masks added",
                "row",
                "masked score becomes",
                "plain softmax",
                "module, additive mask as bias",
                "module, bool mask",
            ],
            &rows
                .iter()
                .map(|r| {
                    vec![
                        r.backend.clone(),
                        r.dtype.clone(),
                        r.fill.clone(),
                        r.n_masks.to_string(),
                        if r.fully_masked {
                            "fully masked".into()
                        } else {
                            "2 of 4 masked".into()
                        },
                        r.masked_score.clone(),
                        r.softmax.clone(),
                        r.module_bias.clone(),
                        r.module_bool.clone(),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let find = |dtype: &str, fill: &str, n: usize, fully: bool| {
            rows.iter().find(|r| {
                r.dtype == dtype
                    && r.fill.starts_with(fill)
                    && r.n_masks == n
                    && r.fully_masked == fully
            })
        };
        let f16_1e9 = find("f16", "-1e9", 1, false)
            .map(|r| r.masked_score.clone())
            .unwrap_or_else(|| "(f16 not run)".into());
        let markdown = format!(
            "Logits {:?} for 4 keys; \"2 of 4 masked\" hides keys 2 and 3, \"fully masked\" hides all. The \
             additive mask is built in the dtype, as a model in that precision would hold it.\n\n{table}\n\
             **What the article gets right.** −10⁹ does not fit in f16 (max 65504): it becomes {f16_1e9}, and \
             two masks added together overflow the dtype's minimum to −∞ as well. For a row with at least one \
             visible key this is harmless: exp(−∞) = 0, so −∞, −10⁹ and the dtype minimum all give the \
             correct softmax, and −10⁴ does too here because the logits are small (it leaks when logits reach \
             ~10⁴, e.g. unscaled attention at large d, and in f16 −10⁴ is near the edge of the range).\n\n\
             **What it misses: the fully masked row.** There the outcome depends on the fill: with −∞ (or any \
             fill that overflows to −∞, as two added masks do) the plain softmax computes (−∞) − (−∞) = NaN; with \
             a finite fill the row becomes a softmax over the hidden keys: uniform when the fill swamps the \
             logits' differences in that precision (−10⁹ in f32, anything in f16), the unmasked distribution \
             when it does not (−10⁴ in f32). Either way the query attends to exactly the keys that were \
             supposed to be hidden. Neither is what a padded query should get. \
             PyTorch's `softmax` gives NaN too; the article's claim that `-inf` is \"safe because softmax \
             handles it specially\" is wrong for this row.\n\n\
             **The module.** With a boolean mask it gives zeros for the fully masked row and the correct \
             distribution otherwise, in every dtype. With an additive mask passed as its bias it treats −∞ \
             entries as masked (zeros, never NaN) but, by design, treats a finite fill as an ordinary bias: \
             a fully masked row then attends to the hidden keys, as in the plain softmax. Use boolean masks.\n",
            SCORES
        );
        let csv = write_csv(
            ctx,
            "masks.csv",
            "backend,dtype,fill,n_masks,fully_masked,masked_score,softmax,module_bias,module_bool",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},\"{}\",{},{},{},\"{}\",\"{}\",\"{}\"",
                        r.backend,
                        r.dtype,
                        r.fill,
                        r.n_masks,
                        r.fully_masked,
                        r.masked_score,
                        r.softmax,
                        r.module_bias,
                        r.module_bool
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let nan_inf = find("f32", "-inf", 1, true)
            .map(|r| r.softmax.clone())
            .unwrap_or_default();
        Ok(ExperimentOutput {
            name: self.name().into(),
            title: self.title().into(),
            verdict: Verdict::Corrected,
            summary: format!(
                "fully masked row: plain softmax with −∞ gives {nan_inf}, with a finite fill it attends to the hidden keys; the module's bool mask gives zeros in every dtype; −1e9 in f16 becomes {f16_1e9}"
            ),
            markdown,
            results: serde_json::json!({ "scores": SCORES, "rows": rows }),
            plots: vec![],
            csv: vec![csv],
            skipped,
            backends: ctx.backends.iter().map(|b| b.name.clone()).collect(),
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
