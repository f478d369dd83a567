//! Golden cases: attention computed by PyTorch in float64, replayed through the module.
//!
//! The file format and the contract the cases encode are described in
//! `shared/golden/README.md`; a copy of the cases lives in `tests/data/golden/`.

use std::fmt;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_sdpa::{
    AttentionError, AttentionInput, CausalAlignment, Implementation, ScalePolicy,
    ScaledDotProductAttentionConfig,
};
use serde::Deserialize;

/// A float tensor in a case file.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonTensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<f64>,
}

/// A boolean tensor in a case file.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonBoolTensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<bool>,
}

/// The expected results of a case.
#[derive(Debug, Clone, Deserialize)]
pub struct Expected {
    /// `[b, h, n, d_v]`
    pub context: JsonTensor,
    /// `[b, h, n, m]`
    pub weights: JsonTensor,
    /// Gradient of `sum(context · grad_out)` with respect to the query.
    pub grad_query: JsonTensor,
    /// ... to the key.
    pub grad_key: JsonTensor,
    /// ... to the value.
    pub grad_value: JsonTensor,
}

/// A case passes when `|got − want| <= abs + rel · |want|` everywhere.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Tolerance {
    /// Absolute part.
    pub abs: f64,
    /// Relative part.
    pub rel: f64,
}

/// One golden case.
#[derive(Debug, Clone, Deserialize)]
pub struct GoldenCase {
    /// Its name.
    pub name: String,
    /// `[b, h, n, d_k]`
    pub query: JsonTensor,
    /// `[b, h_kv, m, d_k]`
    pub key: JsonTensor,
    /// `[b, h_kv, m, d_v]`
    pub value: JsonTensor,
    /// True = masked out.
    pub mask: Option<JsonBoolTensor>,
    /// Added to the scaled scores.
    pub bias: Option<JsonTensor>,
    /// `none`, `top_left` or `bottom_right`.
    pub causal: String,
    /// `None` = 1/√d_k.
    pub scale: Option<f64>,
    /// The upstream gradient of the context.
    pub grad_out: JsonTensor,
    /// The reference results.
    pub expected: Expected,
    /// The tolerance.
    pub tolerance: Tolerance,
}

/// Why a case file could not be run.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct GoldenError {
    /// The file.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
    /// The implementation asked for cannot serve the case (e.g. the CPU kernel and a mask): not a
    /// wrong result.
    pub unsupported: bool,
}

/// The comparison of one tensor.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorCheck {
    /// `context`, `weights`, `grad_query`, `grad_key` or `grad_value`.
    pub name: &'static str,
    /// Largest |got − want|.
    pub max_abs_err: f64,
    /// Whether every element is within tolerance.
    pub passed: bool,
    /// Whether the result contains NaN or infinity.
    pub non_finite: bool,
}

/// The result of one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CaseReport {
    /// The case's name.
    pub name: String,
    /// One entry per compared tensor.
    pub checks: Vec<TensorCheck>,
}

impl CaseReport {
    /// Whether every tensor is within tolerance.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:<28}",
            if self.passed() { "ok  " } else { "FAIL" },
            self.name
        )?;
        for c in &self.checks {
            write!(
                f,
                " {}={:.1e}{}",
                c.name,
                c.max_abs_err,
                if c.passed { "" } else { "(!)" }
            )?;
        }
        Ok(())
    }
}

/// The largest case the runner accepts, in elements of the `[b, h, n, m]` weights it
/// materializes (16 Mi elements: 64 MiB per f32 tensor, a few of them alive at once). A larger
/// case is refused before anything is allocated.
pub const MAX_CASE_WEIGHTS: usize = 1 << 24;

/// The number of values of a shape, or an error when the product overflows.
fn checked_product(path: &str, what: &str, shape: &[usize]) -> Result<usize, GoldenError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GoldenError {
            path: path.to_string(),
            reason: format!("{what} has shape {shape:?}, whose number of values overflows"),
            unsupported: false,
        })
}

fn check_len(path: &str, what: &str, shape: &[usize], len: usize) -> Result<(), GoldenError> {
    let want = checked_product(path, what, shape)?;
    if want != len {
        return Err(GoldenError {
            path: path.to_string(),
            reason: format!("{what} has shape {shape:?} ({want} values) but {len} values"),
            unsupported: false,
        });
    }
    Ok(())
}

impl GoldenCase {
    /// Checks every tensor of the case against every other it must match (shapes, lengths,
    /// broadcasting, the gradients and expected results included) and its size against
    /// [`MAX_CASE_WEIGHTS`], before anything is allocated.
    pub fn validate(&self, path: &str) -> Result<(), GoldenError> {
        let err = |reason: String| GoldenError {
            path: path.to_string(),
            reason,
            unsupported: false,
        };
        let tensors: [(&str, &JsonTensor); 9] = [
            ("query", &self.query),
            ("key", &self.key),
            ("value", &self.value),
            ("grad_out", &self.grad_out),
            ("expected.context", &self.expected.context),
            ("expected.weights", &self.expected.weights),
            ("expected.grad_query", &self.expected.grad_query),
            ("expected.grad_key", &self.expected.grad_key),
            ("expected.grad_value", &self.expected.grad_value),
        ];
        // The inputs first, then the size (before the expected results, whose weights alone
        // would be as large as the limit), then everything else against the inputs.
        for (what, t) in &tensors[..3] {
            rank4(path, what, &t.shape)?;
            check_len(path, what, &t.shape, t.data.len())?;
        }
        let [b, h, n, d_k] = rank4(path, "query", &self.query.shape)?;
        let [b_k, h_kv, m, d_k2] = rank4(path, "key", &self.key.shape)?;
        let [b_v, h_v, m_v, d_v] = rank4(path, "value", &self.value.shape)?;
        if b_k != b || b_v != b || h_v != h_kv || m_v != m || d_k2 != d_k {
            return Err(err(format!(
                "query {:?}, key {:?} and value {:?} do not fit [b, h, n, d_k], [b, h_kv, m, d_k], [b, h_kv, m, d_v]",
                self.query.shape, self.key.shape, self.value.shape
            )));
        }
        if h_kv == 0 || !h.is_multiple_of(h_kv) {
            return Err(err(format!(
                "{h} query heads do not group over {h_kv} key/value heads"
            )));
        }
        let weights = checked_product(path, "the weights", &[b, h, n, m])?;
        if weights > MAX_CASE_WEIGHTS {
            return Err(err(format!(
                "the case is too large: its weights [b, h, n, m] = {:?} hold {weights} values, the runner's limit is {MAX_CASE_WEIGHTS}",
                [b, h, n, m]
            )));
        }
        for (what, t) in &tensors[3..] {
            rank4(path, what, &t.shape)?;
            check_len(path, what, &t.shape, t.data.len())?;
        }
        let must_be = |what: &str, shape: &[usize], want: [usize; 4]| {
            let got = rank4(path, what, shape)?;
            if got == want {
                Ok(())
            } else {
                Err(err(format!(
                    "{what} has shape {shape:?}, the case needs {want:?}"
                )))
            }
        };
        must_be("grad_out", &self.grad_out.shape, [b, h, n, d_v])?;
        must_be(
            "expected.context",
            &self.expected.context.shape,
            [b, h, n, d_v],
        )?;
        must_be(
            "expected.weights",
            &self.expected.weights.shape,
            [b, h, n, m],
        )?;
        must_be(
            "expected.grad_query",
            &self.expected.grad_query.shape,
            [b, h, n, d_k],
        )?;
        must_be(
            "expected.grad_key",
            &self.expected.grad_key.shape,
            [b, h_kv, m, d_k],
        )?;
        must_be(
            "expected.grad_value",
            &self.expected.grad_value.shape,
            [b, h_kv, m, d_v],
        )?;
        let broadcast = |what: &str, shape: &[usize]| {
            let got = rank4(path, what, shape)?;
            let full = [b, h, n, m];
            if (0..3).all(|i| got[i] == 1 || got[i] == full[i]) && got[3] == m {
                Ok(())
            } else {
                Err(err(format!(
                    "{what} of shape {shape:?} does not broadcast to [b, h, n, m] = {full:?}"
                )))
            }
        };
        if let Some(mask) = &self.mask {
            check_len(path, "mask", &mask.shape, mask.data.len())?;
            broadcast("mask", &mask.shape)?;
        }
        if let Some(bias) = &self.bias {
            check_len(path, "bias", &bias.shape, bias.data.len())?;
            broadcast("bias", &bias.shape)?;
        }
        Ok(())
    }
}

/// Left-pads a shape with 1s to rank 4.
fn rank4(path: &str, what: &str, shape: &[usize]) -> Result<[usize; 4], GoldenError> {
    if shape.len() > 4 || shape.is_empty() {
        return Err(GoldenError {
            path: path.to_string(),
            reason: format!("{what} must have rank 1 to 4, got shape {shape:?}"),
            unsupported: false,
        });
    }
    let mut out = [1; 4];
    out[4 - shape.len()..].copy_from_slice(shape);
    Ok(out)
}

fn float_tensor(
    path: &str,
    what: &str,
    t: &JsonTensor,
    device: &Device,
) -> Result<Tensor<4>, GoldenError> {
    check_len(path, what, &t.shape, t.data.len())?;
    let shape = rank4(path, what, &t.shape)?;
    let data: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
    Ok(Tensor::from_data(TensorData::new(data, shape), device))
}

/// Loads a case file.
pub fn load_case(path: &Path) -> Result<GoldenCase, GoldenError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| GoldenError {
        path: p.clone(),
        reason: format!("cannot read: {e}"),
        unsupported: false,
    })?;
    serde_json::from_str(&text).map_err(|e| GoldenError {
        path: p,
        reason: format!("not a golden case: {e}"),
        unsupported: false,
    })
}

/// Runs a case forward and backward on `device` (autodiff is turned on here) and compares the
/// context, the weights and the three gradients with the case's tolerance. The context and
/// gradients come from `implementation`; the weights from the naive path when that
/// implementation cannot return them.
///
/// [`Implementation::CpuKernel`] has its backward pass only where it runs in place (Flex and
/// NdArray): elsewhere it runs on `device` without autodiff, and only its context is compared.
pub fn run_case(
    case: &GoldenCase,
    path: &str,
    device: &Device,
    implementation: Implementation,
) -> Result<CaseReport, GoldenError> {
    let err = |reason: String| GoldenError {
        path: path.to_string(),
        reason,
        unsupported: false,
    };
    case.validate(path)?;
    let forward_err = |e: AttentionError| GoldenError {
        path: path.to_string(),
        reason: e.to_string(),
        unsupported: matches!(e, AttentionError::Unsupported { .. }),
    };
    let inference_only = implementation == Implementation::CpuKernel
        && !burn_sdpa::cpu_kernel::runs_in_place(device);
    let device = if inference_only {
        device.clone()
    } else {
        device.clone().autodiff()
    };
    let leaf = |t: Tensor<4>| if inference_only { t } else { t.require_grad() };
    let query = leaf(float_tensor(path, "query", &case.query, &device)?);
    let key = leaf(float_tensor(path, "key", &case.key, &device)?);
    let value = leaf(float_tensor(path, "value", &case.value, &device)?);
    let grad_out = float_tensor(path, "grad_out", &case.grad_out, &device)?;

    let (alignment, causal) = match case.causal.as_str() {
        "none" => (CausalAlignment::BottomRight, false),
        "top_left" => (CausalAlignment::TopLeft, true),
        "bottom_right" => (CausalAlignment::BottomRight, true),
        other => return Err(err(format!("unknown causal value `{other}`"))),
    };
    let scale = match case.scale {
        None => ScalePolicy::InvSqrtDk,
        Some(s) => ScalePolicy::Fixed(s),
    };
    let config = ScaledDotProductAttentionConfig::new()
        .with_scale(scale)
        .with_causal_alignment(alignment);
    let attn = config
        .clone()
        .with_implementation(implementation)
        .try_init()
        .map_err(|e| err(e.to_string()))?;
    let naive = config
        .with_implementation(Implementation::Naive)
        .try_init()
        .map_err(|e| err(e.to_string()))?;
    let returns_weights = implementation == Implementation::Naive;

    let mut input = AttentionInput::new(query.clone(), key.clone(), value.clone());
    if causal {
        input = input.causal();
    }
    if let Some(mask) = &case.mask {
        check_len(path, "mask", &mask.shape, mask.data.len())?;
        let shape = rank4(path, "mask", &mask.shape)?;
        input = input.mask(Tensor::from_data(
            TensorData::new(mask.data.clone(), shape),
            &device,
        ));
    }
    if let Some(bias) = &case.bias {
        input = input.bias(float_tensor(path, "bias", bias, &device)?);
    }
    let weights_input = input.clone().need_weights();
    if inference_only {
        let out = attn.try_forward(input).map_err(forward_err)?;
        let checks = vec![compare(
            path,
            case,
            "context",
            out.context,
            &case.expected.context,
        )?];
        return Ok(CaseReport {
            name: case.name.clone(),
            checks,
        });
    }
    let out = if returns_weights {
        attn.try_forward(weights_input.clone())
            .map_err(forward_err)?
    } else {
        attn.try_forward(input).map_err(forward_err)?
    };
    let weights = match out.weights.clone() {
        Some(w) => w,
        None => naive
            .try_forward(weights_input)
            .map_err(|e| err(e.to_string()))?
            .weights
            .ok_or_else(|| err("the module returned no weights".into()))?,
    };
    let grads = (out.context.clone() * grad_out).sum().backward();
    let grad = |t: &Tensor<4>, what: &str| {
        t.grad(&grads)
            .ok_or_else(|| err(format!("no gradient for the {what}")))
    };
    let results: [(&'static str, Tensor<4>, &JsonTensor); 5] = [
        ("context", out.context, &case.expected.context),
        ("weights", weights, &case.expected.weights),
        (
            "grad_query",
            grad(&query, "query")?,
            &case.expected.grad_query,
        ),
        ("grad_key", grad(&key, "key")?, &case.expected.grad_key),
        (
            "grad_value",
            grad(&value, "value")?,
            &case.expected.grad_value,
        ),
    ];
    let checks = results
        .into_iter()
        .map(|(name, got, want)| compare(path, case, name, got, want))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CaseReport {
        name: case.name.clone(),
        checks,
    })
}

/// Compares one result tensor with the case's expected values, within the case's tolerance.
fn compare(
    path: &str,
    case: &GoldenCase,
    name: &'static str,
    got: Tensor<4>,
    want: &JsonTensor,
) -> Result<TensorCheck, GoldenError> {
    let err = |reason: String| GoldenError {
        path: path.to_string(),
        reason,
        unsupported: false,
    };
    let got_shape = got.dims();
    let want_shape = rank4(path, name, &want.shape)?;
    if got_shape != want_shape {
        return Err(err(format!(
            "{name}: the module gave shape {got_shape:?}, the case expects {:?}",
            want.shape
        )));
    }
    check_len(path, name, &want.shape, want.data.len())?;
    let got: Vec<f64> = got
        .into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| err(format!("{name}: cannot read the result: {e:?}")))?;
    let mut max_abs_err = 0.0f64;
    let mut passed = true;
    let mut non_finite = false;
    for (g, w) in got.iter().zip(&want.data) {
        if !g.is_finite() {
            non_finite = true;
            passed = false;
            continue;
        }
        let e = (g - w).abs();
        max_abs_err = max_abs_err.max(e);
        if e > case.tolerance.abs + case.tolerance.rel * w.abs() {
            passed = false;
        }
    }
    Ok(TensorCheck {
        name,
        max_abs_err: if non_finite { f64::NAN } else { max_abs_err },
        passed,
        non_finite,
    })
}

/// Every `.json` file directly in `dir`, sorted by name.
pub fn case_files(dir: &Path) -> Result<Vec<PathBuf>, GoldenError> {
    let entries = std::fs::read_dir(dir).map_err(|e| GoldenError {
        path: dir.display().to_string(),
        reason: format!("cannot read the directory: {e}"),
        unsupported: false,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    Ok(files)
}

/// Loads and runs one case file.
pub fn run_file(
    path: &Path,
    device: &Device,
    implementation: Implementation,
) -> Result<CaseReport, GoldenError> {
    let case = load_case(path)?;
    let name = path.display().to_string();
    // A panic inside one case (a backend's own assertion, say) is that case's failure, not the
    // end of the run.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_case(&case, &name, device, implementation)
    }))
    .unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into());
        Err(GoldenError {
            path: name.clone(),
            reason: format!("panicked: {message}"),
            unsupported: false,
        })
    })
}
