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

use super::{Experiment, ExperimentOutput, md_table, write_csv};
use crate::claims::{Claim, Source};
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
        let markdown = format!(
            "Logits {:?} for 4 keys; \"2 of 4 masked\" hides keys 2 and 3, \"fully masked\" hides all. The \
             additive mask is built in the dtype, as a model in that precision would hold it, and \"masks \
             added\" = 2 adds it to itself (e.g. a causal and a padding mask). The module sees the same \
             row through d_k = 1, q = 1, k = the logits and V = I, so that its context is its weights.\n\n{table}",
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
        let claims = claims(&rows);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "scores": SCORES, "rows": rows }),
            t0,
        )
        .files(vec![], vec![csv])
        .on_every_backend(ctx, Vec::new())
        .skipped(skipped))
    }
}

/// The claims of `masks`, decided by its rows (every backend and dtype that ran).
pub fn claims(rows: &[MaskRow]) -> Vec<Claim> {
    let cells = |dtype: &str, fill: &str, n_masks: usize, fully: bool| -> Vec<&MaskRow> {
        rows.iter()
            .filter(|r| {
                (dtype.is_empty() || r.dtype == dtype)
                    && r.fill.starts_with(fill)
                    && r.n_masks == n_masks
                    && r.fully_masked == fully
            })
            .collect()
    };
    // Holds when every cell satisfies `test`; undecided when no cell ran.
    let every = |cells: Vec<&MaskRow>, test: &dyn Fn(&MaskRow) -> bool| -> (Option<bool>, String) {
        let seen = cells
            .iter()
            .map(|r| format!("{} {}", r.backend, r.dtype))
            .collect::<Vec<_>>()
            .join(", ");
        (
            (!cells.is_empty()).then(|| cells.iter().all(|r| test(r))),
            if seen.is_empty() {
                "not run".into()
            } else {
                seen
            },
        )
    };
    let claim =
        |id, source, statement: &str, check: &str, (holds, seen): (Option<bool>, String)| {
            Claim::decided(id, source, statement, check, seen, holds)
        };
    vec![
        claim(
            "minus-1e9-works-in-f32",
            Source::Article("§5"),
            "a −10⁹ fill masks correctly in f32",
            "plain softmax of the 2-of-4 row with −1e9 in f32 is the softmax of the visible keys (cells listed)",
            every(cells("f32", "-1e9", 1, false), &|r| r.softmax == "correct"),
        ),
        claim(
            "minus-1e9-overflows-f16",
            Source::Article("Q3"),
            "in f16, −10⁹ does not fit and becomes −∞",
            "the masked score of −1e9 in f16 reads −inf (cells listed)",
            every(cells("f16", "-1e9", 1, false), &|r| {
                r.masked_score == "-inf"
            }),
        ),
        claim(
            "minus-inf-is-safe",
            Source::Article("§5"),
            "a −∞ fill is safe because softmax handles it",
            "plain softmax of the fully masked row with −∞ has no NaN (cells listed)",
            every(cells("", "-inf", 1, true), &|r| r.softmax != "NaN"),
        ),
        claim(
            "two-masks-overflow",
            Source::Lab,
            "two masks of the dtype's most negative value, added, overflow to −∞",
            "the masked score of dtype min + dtype min reads −inf (cells listed)",
            every(cells("", "dtype min", 2, false), &|r| {
                r.masked_score == "-inf"
            }),
        ),
        claim(
            "finite-fill-attends-hidden-keys",
            Source::Lab,
            "with a finite fill, a fully masked row of a plain softmax attends to the hidden keys",
            "plain softmax of the fully masked row with −1e9 and −1e4 is neither NaN nor zeros (cells listed)",
            every(
                cells("", "-1e9", 1, true)
                    .into_iter()
                    .chain(cells("", "-1e4", 1, true))
                    .filter(|r| !r.masked_score.contains("inf"))
                    .collect(),
                &|r| r.softmax.contains("attended"),
            ),
        ),
        claim(
            "module-bool-mask-is-exact",
            Source::Lab,
            "the module's boolean mask gives zeros for a fully masked row and the correct weights otherwise, in every dtype and backend",
            "every module-with-bool-mask cell is \"zeros\" (fully masked) or \"correct\" (cells listed)",
            every(rows.iter().collect(), &|r| {
                r.module_bool == if r.fully_masked { "zeros" } else { "correct" }
            }),
        ),
        claim(
            "module-never-nan",
            Source::Lab,
            "the module never gives NaN for a −∞ bias, even on a fully masked row",
            "no module-with-bias cell with a −∞ masked score is NaN (cells listed)",
            every(
                rows.iter().filter(|r| r.masked_score == "-inf").collect(),
                &|r| r.module_bias != "NaN",
            ),
        ),
    ]
}
