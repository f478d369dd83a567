//! The golden case files: their format (with the optional extension fields `softcap`, `window`,
//! `segments`, `alibi_slopes`, `sinks` and `quiet_softmax`), the checks that run before anything is allocated, and loading. Unknown fields are
//! refused, so a case written for a newer format never passes by being half read.

use std::fmt;
use std::path::Path;

use burn_sdpa::CausalAlignment;
use burn_sdpa::cpu_kernel::AttentionDims;
use burn_sdpa::util::validate_softcap;
use serde::Deserialize;

/// A float tensor in a case file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonTensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Row-major values; `null` in the file is NaN (JSON has no NaN), which an expected tensor
    /// uses where the contract makes a row NaN (the `overflow` cases).
    #[serde(deserialize_with = "floats_or_null")]
    pub data: Vec<f64>,
}

/// A JSON array of numbers and `null`s, each `null` read as NaN.
fn floats_or_null<'de, D>(deserializer: D) -> Result<Vec<f64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let values: Vec<Option<f64>> = Deserialize::deserialize(deserializer)?;
    Ok(values.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
}

/// A boolean tensor in a case file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonBoolTensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<bool>,
}

/// The expected results of a case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Extension: ... to the attention sinks, `[h]` (present exactly when the case has sinks).
    #[serde(default)]
    pub grad_sinks: Option<Vec<f64>>,
}

/// A case passes when `|got − want| <= abs + rel · |want|` everywhere.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute part.
    pub abs: f64,
    /// Relative part.
    pub rel: f64,
}

/// One golden case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
    pub causal: Causal,
    /// `None` = 1/√d_k.
    pub scale: Option<f64>,
    /// Extension: the logit soft-cap `c` (scores become `c · tanh(s / c)` before the bias).
    #[serde(default)]
    pub softcap: Option<f64>,
    /// Extension: the local window `[left, right]` (`null` = unbounded side), centred on
    /// `i + (m − n)`.
    #[serde(default, deserialize_with = "window_field")]
    pub window: Option<[Option<usize>; 2]>,
    /// Extension: packed sequences' segment ids, `query [b][n]` and `key [b][m]`.
    #[serde(default)]
    pub segments: Option<JsonSegments>,
    /// Extension: ALiBi slopes, one per query head.
    #[serde(default)]
    pub alibi_slopes: Option<Vec<f64>>,
    /// Extension: attention sinks, one learned logit per query head in every row's softmax
    /// denominator (they take no value and carry a gradient).
    #[serde(default)]
    pub sinks: Option<Vec<f64>>,
    /// Extension: quiet softmax, a constant zero logit in every row's denominator.
    #[serde(default)]
    pub quiet_softmax: Option<bool>,
    /// The upstream gradient of the context.
    pub grad_out: JsonTensor,
    /// The reference results.
    pub expected: Expected,
    /// The tolerance.
    pub tolerance: Tolerance,
}

/// A case's causal masking: none, or aligned top-left or bottom-right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Causal {
    /// No causal mask.
    None,
    /// Query i sees keys `j ≤ i` (PyTorch's `is_causal`).
    TopLeft,
    /// Query i sees keys `j ≤ i + (m − n)` (FlashAttention's, Burn's).
    BottomRight,
}

impl Causal {
    /// The module's alignment, and whether the mask is on.
    pub fn alignment(self) -> (CausalAlignment, bool) {
        match self {
            Causal::None => (CausalAlignment::BottomRight, false),
            Causal::TopLeft => (CausalAlignment::TopLeft, true),
            Causal::BottomRight => (CausalAlignment::BottomRight, true),
        }
    }
}

/// The segment ids of a case (extension).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSegments {
    /// `[b][n]`.
    pub query: Vec<Vec<i64>>,
    /// `[b][m]`.
    pub key: Vec<Vec<i64>>,
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
    /// `context`, `weights`, `grad_query`, `grad_key`, `grad_value`, `grad_sinks` or a row
    /// statistic (`row_max_logit`, `row_lse`, `row_entropy`, `row_max_prob`,
    /// `row_visible_keys`, `row_logit_mean`, `row_logit_std`).
    pub name: &'static str,
    /// Largest |got − want|.
    pub max_abs_err: f64,
    /// Whether every element is within tolerance.
    pub passed: bool,
    /// Whether the result contains NaN or infinity.
    pub non_finite: bool,
    /// Whether the case's tolerance cannot fail on this expected tensor (an output of zeros would
    /// pass it, see [`GoldenCase::cannot_fail`]): the check says nothing, and `--strict` fails
    /// the case.
    pub cannot_fail: bool,
}

/// The result of one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CaseReport {
    /// The case's name (its `name` field).
    pub name: String,
    /// The case's file, as the runner names it (relative to the folder given, on the command
    /// line): several cases may share a name.
    pub file: String,
    /// One entry per compared tensor.
    pub checks: Vec<TensorCheck>,
    /// Why some checks cannot fail (the tolerance against the expected tensors they name), if so.
    pub note: Option<String>,
    /// The path the call took (`None` for a report not made by running the module).
    pub path: Option<burn_sdpa::AttentionPath>,
}

impl CaseReport {
    /// Whether every tensor is within tolerance (a check that cannot fail passes).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// Whether every tensor is within tolerance and every check could have failed (`--strict`).
    pub fn passed_strict(&self) -> bool {
        self.passed() && self.checks.iter().all(|c| !c.cannot_fail)
    }

    /// The case's result line: `ok` or `FAIL` (under `strict`, a check that cannot fail fails
    /// the case), the file, the name, each check's largest error, and the note.
    pub fn line(&self, strict: bool) -> String {
        let passed = if strict {
            self.passed_strict()
        } else {
            self.passed()
        };
        // Escaped: a case's name and file are data, and must never print a line of their own.
        let mut line = format!(
            "{} {:<28}",
            if passed { "ok  " } else { "FAIL" },
            format!(
                "{} [{}]",
                self.file.escape_debug(),
                self.name.escape_debug()
            )
        );
        if let Some(path) = self.path {
            line.push_str(&format!(" via {}", path.name()));
        }
        for c in &self.checks {
            line.push_str(&format!(
                " {}={:.1e}{}",
                c.name,
                c.max_abs_err,
                if !c.passed {
                    "(!)"
                } else if c.cannot_fail {
                    "(cannot fail)"
                } else {
                    ""
                }
            ));
        }
        if let Some(note) = &self.note {
            line.push_str(&format!(" -- {}", note.escape_debug()));
        }
        line
    }
}

impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line(false))
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

pub(crate) fn check_len(
    path: &str,
    what: &str,
    shape: &[usize],
    len: usize,
) -> Result<(), GoldenError> {
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
        // The library's own checks, on the shapes (its messages name them).
        let library = |e: burn_sdpa::AttentionError| err(e.to_string());
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
        let mut inputs = [[0; 4]; 3];
        for (shape, (what, t)) in inputs.iter_mut().zip(&tensors[..3]) {
            *shape = rank4(path, what, &t.shape)?;
            check_len(path, what, &t.shape, t.data.len())?;
        }
        let [query, key, value] = inputs;
        let dims = AttentionDims::from_shapes(query, key, value).map_err(library)?;
        let scores = dims.scores_shape();
        let weights = checked_product(path, "the weights", &scores)?;
        if weights > MAX_CASE_WEIGHTS {
            return Err(err(format!(
                "the case is too large: its weights [b, h, n, m] = {scores:?} hold {weights} values, the runner's limit is {MAX_CASE_WEIGHTS}"
            )));
        }
        let [b, h, n, _] = scores;
        let context = [b, h, n, dims.d_v];
        let expected_shapes = [context, context, scores, query, key, value];
        for ((what, t), want) in tensors[3..].iter().zip(expected_shapes) {
            check_len(path, what, &t.shape, t.data.len())?;
            if rank4(path, what, &t.shape)? != want {
                return Err(err(format!(
                    "{what} has shape {:?}, the case needs {want:?}",
                    t.shape
                )));
            }
        }
        if let Some(mask) = &self.mask {
            check_len(path, "mask", &mask.shape, mask.data.len())?;
            let shape = rank4(path, "mask", &mask.shape)?;
            dims.check_broadcast("mask", shape).map_err(library)?;
        }
        if let Some(bias) = &self.bias {
            check_len(path, "bias", &bias.shape, bias.data.len())?;
            let shape = rank4(path, "bias", &bias.shape)?;
            dims.check_broadcast("bias", shape).map_err(library)?;
        }
        if let Some(softcap) = self.softcap {
            validate_softcap(softcap).map_err(library)?;
        }
        if let Some(seg) = &self.segments {
            let shape = |what: &str, ids: &[Vec<i64>]| -> Result<[usize; 2], GoldenError> {
                let len = ids.first().map_or(0, Vec::len);
                if ids.iter().any(|row| row.len() != len) {
                    return Err(err(format!(
                        "segments.{what} has rows of different lengths"
                    )));
                }
                Ok([ids.len(), len])
            };
            let (query, key) = (shape("query", &seg.query)?, shape("key", &seg.key)?);
            dims.check_segments(&query, &key).map_err(library)?;
        }
        if let Some(slopes) = &self.alibi_slopes {
            let shape = [slopes.len()];
            dims.check_per_head("ALiBi slopes", &shape)
                .map_err(library)?;
        }
        if let Some(sinks) = &self.sinks {
            let shape = [sinks.len()];
            dims.check_per_head("attention sinks", &shape)
                .map_err(library)?;
        }
        match (&self.sinks, &self.expected.grad_sinks) {
            (Some(_), None) => {
                return Err(err(
                    "a case with sinks must give expected.grad_sinks, their gradient".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(err(
                    "expected.grad_sinks is given but the case has no sinks".into(),
                ));
            }
            (Some(_), Some(grad)) if grad.len() != dims.n_heads => {
                return Err(err(format!(
                    "expected.grad_sinks must hold {} values (one per query head), got {}",
                    dims.n_heads,
                    grad.len()
                )));
            }
            _ => {}
        }
        if self.sinks.is_some() && self.quiet_softmax == Some(true) {
            return Err(err(
                "a case has either sinks or quiet_softmax: quiet softmax is the sink 0 on every \
                 head"
                    .into(),
            ));
        }
        self.check_tolerance(path)
    }

    /// A tolerance must be a tolerance: finite and not negative. (One that is too loose to fail
    /// on some expected tensor is valid: [`GoldenCase::cannot_fail`] says so, and the runner
    /// reports it on the case's line.)
    fn check_tolerance(&self, path: &str) -> Result<(), GoldenError> {
        let Tolerance { abs, rel } = self.tolerance;
        if !(abs.is_finite() && rel.is_finite() && abs >= 0.0 && rel >= 0.0) {
            return Err(GoldenError {
                path: path.to_string(),
                reason: format!(
                    "tolerance abs = {}, rel = {}: both must be finite and ≥ 0",
                    compact(abs),
                    compact(rel)
                ),
                unsupported: false,
            });
        }
        Ok(())
    }

    /// Whether the case's tolerance cannot fail on `want`: its numbers are not all zeros, yet an
    /// output of zeros would pass them (`|0 − want| <= abs + rel·|want|` for every number), so
    /// that the comparison cannot tell a wrong result from nothing. (Numbers that are all zeros
    /// pass zeros whatever the tolerance: that is not the tolerance's doing.) An expected NaN
    /// (`null`) is matched by a NaN only, whatever the tolerance: it does not count here.
    pub fn cannot_fail(&self, want: &JsonTensor) -> bool {
        let Tolerance { abs, rel } = self.tolerance;
        let mut numbers = want.data.iter().filter(|w| !w.is_nan());
        numbers.clone().any(|w| *w != 0.0) && numbers.all(|w| w.abs() <= abs + rel * w.abs())
    }

    /// The note of a case whose tolerance cannot fail on the expected tensors named in `fields`,
    /// naming the tolerance compactly (`1e300`, not three hundred digits).
    pub fn cannot_fail_note(&self, fields: &[&str]) -> String {
        format!(
            "tolerance abs = {}, rel = {} cannot fail on {}: an output of zeros would pass (every \
             |expected| ≤ abs + rel·|expected|), so {} not checked (--strict fails the case)",
            compact(self.tolerance.abs),
            compact(self.tolerance.rel),
            fields
                .iter()
                .map(|f| format!("expected.{f}"))
                .collect::<Vec<_>>()
                .join(", "),
            if fields.len() == 1 {
                "it is"
            } else {
                "they are"
            }
        )
    }
}

/// A number as a short line: the shortest text that reads back as the same f64, in exponent
/// form when large or small (`1e300`, `1e-7`, `0.5`), never three hundred digits.
pub fn compact(x: f64) -> String {
    if x != 0.0 && x.is_finite() && (x.abs() >= 1e6 || x.abs() < 1e-4) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// Left-pads a shape with 1s to rank 4.
pub(crate) fn rank4(path: &str, what: &str, shape: &[usize]) -> Result<[usize; 4], GoldenError> {
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

/// The largest case file the runner reads, in bytes (1 GiB): thousands of times the largest
/// case shipped (under 0.5 MiB), and room for a case at [`MAX_CASE_WEIGHTS`] written as JSON
/// (about 24 bytes a value). A larger file is refused from its size, before a byte is read.
pub const MAX_CASE_BYTES: u64 = 1 << 30;

/// Loads a case file: its size is checked first ([`MAX_CASE_BYTES`]), then it is parsed as it is
/// read (never held whole in memory as text).
pub fn load_case(path: &Path) -> Result<GoldenCase, GoldenError> {
    use std::io::Read;
    let err = |reason: String| GoldenError {
        path: path.display().to_string(),
        reason,
        unsupported: false,
    };
    let file = std::fs::File::open(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let size = file
        .metadata()
        .map_err(|e| err(format!("cannot read: {e}")))?
        .len();
    if size > MAX_CASE_BYTES {
        return Err(err(format!(
            "the file is {size} bytes ({:.1} GiB), over the runner's limit of {MAX_CASE_BYTES} \
             bytes (1 GiB) for a case: not read",
            size as f64 / (1u64 << 30) as f64
        )));
    }
    // At most the limit and one byte more, should the file grow while it is read.
    let reader = std::io::BufReader::new(file.take(MAX_CASE_BYTES + 1));
    serde_json::from_reader(reader).map_err(|e| err(format!("not a golden case: {e}")))
}

/// Reads the `window` field: `[left, right]`, each a whole number ≥ 0 or `null`, or the field
/// `null`. Anything else is refused naming the field and the form it must have (serde's own
/// message for a third entry was "trailing characters at column …").
fn window_field<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<[Option<usize>; 2]>, D::Error> {
    use serde::Deserialize as _;
    use serde::de::Error as _;
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    let Some(value) = value else {
        return Ok(None);
    };
    let side = |v: &serde_json::Value| match v {
        serde_json::Value::Null => Some(None),
        v => v.as_u64().and_then(|n| usize::try_from(n).ok()).map(Some),
    };
    let pair = match value.as_array().map(Vec::as_slice) {
        Some([left, right]) => side(left).zip(side(right)),
        _ => None,
    };
    let shown = value.to_string();
    let shown = if shown.chars().count() > 60 {
        format!("{}…", shown.chars().take(60).collect::<String>())
    } else {
        shown
    };
    pair.map(|(left, right)| Some([left, right]))
        .ok_or_else(|| {
            D::Error::custom(format!(
                "window must be [left, right], two entries each a whole number ≥ 0 or null \
             (unbounded), got {shown}"
            ))
        })
}
