//! Golden cases: attention computed by PyTorch in float64, replayed through the module.
//!
//! The file format and the contract the cases encode are described in
//! `shared/golden/README.md`; a copy of the cases lives in `tests/data/golden/` (and of the
//! soft-cap and window cases in `tests/data/golden-extensions/`).

mod case;
mod half;
mod row_stats;
mod values;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::{FloatDType, TensorData};
use burn_sdpa::{
    AttentionError, AttentionInput, AttentionPath, Implementation, ScalePolicy,
    ScaledDotProductAttentionConfig,
};

pub use case::{
    CaseReport, Causal, Expected, GoldenCase, GoldenError, JsonBoolTensor, JsonTensor,
    MAX_CASE_BYTES, MAX_CASE_WEIGHTS, TensorCheck, Tolerance, load_case,
};
use case::{check_len, rank4};
pub use half::{CONTEXT_ROUNDINGS, GRADIENT_ROUNDINGS, roundings, run_case_half, unit_roundoff};

/// How a case's float inputs reach the module: rounded to `round` on the host first (the half
/// type of a `--dtype` run; `None` leaves the f32 values as they are) and stored in `store`.
#[derive(Debug, Clone, Copy)]
struct Storage {
    round: Option<FloatDType>,
    store: FloatDType,
}

impl Storage {
    const F32: Storage = Storage {
        round: None,
        store: FloatDType::F32,
    };

    /// `values` (f32) as they reach the module: rounded to the half type on the host (a value
    /// past the type's range becomes ±∞, as a cast would make it), so that the reference and
    /// the half-precision run see the very same numbers whatever a device's cast does.
    fn round(self, values: Vec<f32>) -> Vec<f32> {
        use burn::tensor::{bf16, f16};
        match self.round {
            Some(FloatDType::F16) => values.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
            Some(FloatDType::BF16) => values.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
            _ => values,
        }
    }

    fn store<const D: usize>(self, t: Tensor<D>) -> Tensor<D> {
        if self.store == FloatDType::F32 {
            t
        } else {
            t.cast(self.store)
        }
    }
}

fn float_tensor(
    path: &str,
    what: &str,
    t: &JsonTensor,
    device: &Device,
    storage: Storage,
) -> Result<Tensor<4>, GoldenError> {
    check_len(path, what, &t.shape, t.data.len())?;
    let shape = rank4(path, what, &t.shape)?;
    let data = storage.round(t.data.iter().map(|&x| x as f32).collect());
    Ok(storage.store(Tensor::from_data(TensorData::new(data, shape), device)))
}

/// A case's call on `device`: its input (every option of the case), the leaves whose gradients
/// are checked (tracked when `track`) and the gradient of the output.
struct CaseTensors {
    input: AttentionInput,
    query: Tensor<4>,
    key: Tensor<4>,
    value: Tensor<4>,
    grad_out: Tensor<4>,
    sinks: Option<Tensor<1>>,
}

fn case_tensors(
    case: &GoldenCase,
    path: &str,
    device: &Device,
    storage: Storage,
    track: bool,
) -> Result<CaseTensors, GoldenError> {
    let leaf = |t: Tensor<4>| if track { t.require_grad() } else { t };
    let query = leaf(float_tensor(path, "query", &case.query, device, storage)?);
    let key = leaf(float_tensor(path, "key", &case.key, device, storage)?);
    let value = leaf(float_tensor(path, "value", &case.value, device, storage)?);
    let grad_out = float_tensor(path, "grad_out", &case.grad_out, device, storage)?;
    let mut input = AttentionInput::new(query.clone(), key.clone(), value.clone());
    let (_, causal) = case.causal.alignment();
    if causal {
        input = input.causal();
    }
    if let Some([left, right]) = case.window {
        input = input.window(left, right);
    }
    if let Some(seg) = &case.segments {
        // Segment ids are only compared for equality: each is replaced by its rank among the
        // case's distinct ids, so that ids anywhere in i64 (the format allows them) fit the
        // backend's integers and mean exactly the same.
        let mut distinct: Vec<i64> = seg.query.concat();
        distinct.extend(seg.key.concat());
        distinct.sort_unstable();
        distinct.dedup();
        let ids = |rows: &[Vec<i64>]| {
            let len = rows.first().map_or(0, Vec::len);
            let ranks: Vec<i64> = rows
                .concat()
                .iter()
                .map(|x| distinct.partition_point(|d| d < x) as i64)
                .collect();
            Tensor::<2, Int>::from_data(TensorData::new(ranks, [rows.len(), len]), device)
        };
        input = input.segments(ids(&seg.query), ids(&seg.key));
    }
    if let Some(slopes) = &case.alibi_slopes {
        let values: Vec<f32> = slopes.iter().map(|&x| x as f32).collect();
        input = input.alibi(Tensor::from_data(
            TensorData::new(values, [slopes.len()]),
            device,
        ));
    }
    // [h], a parameter in the queries' dtype (the module asks for one float dtype): its
    // gradient is checked.
    let sinks = case.sinks.as_ref().map(|sinks| {
        let values = storage.round(sinks.iter().map(|&x| x as f32).collect());
        let t = storage.store(Tensor::<1>::from_data(
            TensorData::new(values, [sinks.len()]),
            device,
        ));
        if track { t.require_grad() } else { t }
    });
    if let Some(sinks) = &sinks {
        input = input.sinks(sinks.clone());
    }
    if let Some(mask) = &case.mask {
        check_len(path, "mask", &mask.shape, mask.data.len())?;
        let shape = rank4(path, "mask", &mask.shape)?;
        input = input.mask(Tensor::from_data(
            TensorData::new(mask.data.clone(), shape),
            device,
        ));
    }
    if let Some(bias) = &case.bias {
        input = input.bias(float_tensor(path, "bias", bias, device, storage)?);
    }
    Ok(CaseTensors {
        input,
        query,
        key,
        value,
        grad_out,
        sinks,
    })
}

/// The module configured as `case` asks, on `implementation`.
fn case_module(
    case: &GoldenCase,
    implementation: Implementation,
) -> Result<burn_sdpa::ScaledDotProductAttention, String> {
    let (alignment, _) = case.causal.alignment();
    let scale = match case.scale {
        None => ScalePolicy::InvSqrtDk,
        Some(s) => ScalePolicy::Fixed(s),
    };
    ScaledDotProductAttentionConfig::new()
        .with_scale(scale)
        .with_softcap(case.softcap)
        .with_quiet_softmax(case.quiet_softmax.unwrap_or(false))
        .with_causal_alignment(alignment)
        .with_implementation(implementation)
        .try_init()
        .map_err(|e| e.to_string())
}

/// Runs a case forward and backward on `device` (autodiff is turned on here) and compares the
/// context, the weights and the three gradients with the case's tolerance. The context and
/// gradients come from `implementation`; the weights from the naive path when that
/// implementation cannot return them. The forward asks for the row statistics, so the
/// gradients are those of a call with statistics; the statistics are checked too (`row_*`,
/// see `row_stats.rs`). The report names the path the call took.
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
    let attn = case_module(case, implementation).map_err(err)?;
    let naive = case_module(case, Implementation::Naive).map_err(err)?;
    let returns_weights = implementation == Implementation::Naive;
    let CaseTensors {
        input,
        query,
        key,
        value,
        grad_out,
        sinks,
    } = case_tensors(case, path, &device, Storage::F32, !inference_only)?;
    let input = input.need_row_stats();
    let weights_input = input.clone().need_weights();
    let taken = if returns_weights {
        attn.path(&weights_input)
    } else {
        attn.path(&input)
    }
    .map_err(forward_err)?;
    // The naive path's scores of the same call: the reference of the statistics (over the keys
    // the case leaves visible, read from the case).
    let reference = naive
        .try_forward(weights_input.clone().need_scores())
        .map_err(|e| err(e.to_string()))?;
    let scores = reference
        .scores
        .ok_or_else(|| err("the module returned no scores".into()))?
        .detach();
    let stats_checks = |stats: Option<burn_sdpa::RowStats>| {
        let stats = stats.ok_or_else(|| err("the module returned no row statistics".into()))?;
        row_stats::checks(path, case, stats, scores.clone())
    };
    if inference_only {
        let out = attn.try_forward(input).map_err(forward_err)?;
        let mut checks = vec![compare(
            path,
            case,
            "context",
            out.context,
            &case.expected.context,
        )?];
        checks.extend(stats_checks(out.row_stats)?);
        return Ok(report(case, path, checks, taken));
    }
    let mut out = if returns_weights {
        attn.try_forward(weights_input.clone())
            .map_err(forward_err)?
    } else {
        attn.try_forward(input).map_err(forward_err)?
    };
    let stats = stats_checks(out.row_stats.take())?;
    let weights = match out.weights.clone() {
        Some(w) => w,
        None => reference
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
    let mut checks = results
        .into_iter()
        .map(|(name, got, want)| compare(path, case, name, got, want))
        .collect::<Result<Vec<_>, _>>()?;
    if let (Some(sinks), Some(want)) = (&sinks, &case.expected.grad_sinks) {
        let h = want.len();
        // [h] -> [1, 1, 1, h], compared as the other tensors are.
        let got = sinks
            .grad(&grads)
            .ok_or_else(|| err("no gradient for the sinks".into()))?
            .reshape([1, 1, 1, h]);
        let want = JsonTensor {
            shape: vec![1, 1, 1, h],
            data: want.clone(),
        };
        checks.push(compare(path, case, "grad_sinks", got, &want)?);
    }
    checks.extend(stats);
    Ok(report(case, path, checks, taken))
}

/// The report of `case` (read from `path`): its checks, and a note naming the expected tensors
/// its tolerance cannot fail on, if any.
fn report(
    case: &GoldenCase,
    path: &str,
    checks: Vec<TensorCheck>,
    taken: AttentionPath,
) -> CaseReport {
    let loose: Vec<&str> = checks
        .iter()
        .filter(|c| c.cannot_fail)
        .map(|c| c.name)
        .collect();
    CaseReport {
        name: case.name.clone(),
        file: path.to_string(),
        note: (!loose.is_empty()).then(|| case.cannot_fail_note(&loose)),
        checks,
        path: Some(taken),
    }
}

/// Compares one result tensor with the case's expected values, within the case's tolerance; an
/// expected NaN (`null` in the case) is matched by a NaN only, and a NaN or infinity where a
/// number is expected fails.
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
    let tolerance = case.tolerance;
    let found = values::compare_values(&got, &want.data, |w| {
        tolerance.abs + tolerance.rel * w.abs()
    });
    Ok(TensorCheck {
        name,
        max_abs_err: found.max_abs_err,
        passed: found.passed,
        non_finite: found.non_finite,
        cannot_fail: case.cannot_fail(want),
    })
}

/// Every entry of `dir` whose name ends in `.json`, sorted by name, whatever it is: a regular
/// file (or a link to one) is a case; anything else (a dangling or looping link, a FIFO, a
/// folder) is reported by [`run_file`] as that entry's failure, never skipped in silence.
pub fn case_files(dir: &Path) -> Result<Vec<PathBuf>, GoldenError> {
    let unreadable = |e: std::io::Error| GoldenError {
        path: escaped(dir),
        reason: format!("cannot read the directory: {e}"),
        unsupported: false,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        if path.extension().is_some_and(|x| x == "json") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// A path as one printable line: control characters (a newline in a name, say) escaped, so that
/// a name can never print a forged line of its own.
pub fn escaped(path: &Path) -> String {
    path.display().to_string().escape_debug().to_string()
}

/// `text` on one line: control characters (newlines, carriage returns, escapes) written as
/// escapes, everything else as it is.
pub fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Why `path` is not a case file that can be read (a regular file, or a link to one), if so.
fn not_a_case_file(path: &Path) -> Option<String> {
    let link = std::fs::symlink_metadata(path).ok()?;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => None,
        Ok(meta) if meta.is_dir() => Some("a folder, not a case file".into()),
        Ok(_) => Some("not a regular file (a FIFO, socket or device): not read".into()),
        Err(e) if link.file_type().is_symlink() => {
            Some(format!("a link that leads nowhere readable: {e}"))
        }
        Err(e) => Some(format!("cannot read: {e}")),
    }
}

/// Loads and runs one case file (in f32: [`run_file_in`] for another dtype).
pub fn run_file(
    path: &Path,
    device: &Device,
    implementation: Implementation,
) -> Result<CaseReport, GoldenError> {
    run_file_in(path, device, implementation, FloatDType::F32)
}

/// Loads and runs one case file with its float inputs in `dtype`: f32 checks the case's own
/// answers ([`run_case`]), f16 and bf16 the rule of [`run_case_half`].
pub fn run_file_in(
    path: &Path,
    device: &Device,
    implementation: Implementation,
    dtype: FloatDType,
) -> Result<CaseReport, GoldenError> {
    let name = escaped(path);
    if let Some(reason) = not_a_case_file(path) {
        return Err(GoldenError {
            path: name,
            reason,
            unsupported: false,
        });
    }
    let case = load_case(path).map_err(|e| GoldenError {
        path: name.clone(),
        ..e
    })?;
    // A panic inside one case (a backend's own assertion, say) is that case's failure, not the
    // end of the run.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let report = if dtype == FloatDType::F32 {
            run_case(&case, &name, device, implementation)
        } else {
            run_case_half(&case, &name, device, implementation, dtype)
        };
        report.map(|report| CaseReport {
            // Unescaped: the report's line escapes it.
            file: path.display().to_string(),
            ..report
        })
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
