//! Experiment 10 (`complexity`): the article's question 4. Time and peak memory of attention as
//! the sequence grows, with the full n × m weights materialized vs the fastest path available,
//! fitted growth exponents, and the LLaMA-7B arithmetic computed from a config.

use std::time::Instant;

use burn::prelude::*;
use burn_sdpa::{AttentionInput, Implementation, ScaledDotProductAttentionConfig};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, f, md_table, out_path, write_csv};
use crate::claims::{Claim, Source, short};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};
use crate::memory::measure_peak;
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::{Estimate, exponent_ci, median};

/// One timed computation.
type Runner<'a> = Box<dyn Fn() -> Result<f64, LabError> + 'a>;

/// The attention-matrix memory of a transformer, from its config.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixMemory {
    /// Batch size.
    pub batch: u64,
    /// Heads.
    pub heads: u64,
    /// Tokens.
    pub seq_len: u64,
    /// Bytes per element (2 for fp16).
    pub bytes_per_element: u64,
    /// Layers.
    pub layers: u64,
    /// batch · heads · seq² · bytes.
    pub bytes_per_layer: u64,
    /// Times the layers.
    pub bytes_all_layers: u64,
}

impl MatrixMemory {
    /// Computes the sizes.
    pub fn new(batch: u64, heads: u64, seq_len: u64, bytes_per_element: u64, layers: u64) -> Self {
        let per_layer = batch * heads * seq_len * seq_len * bytes_per_element;
        Self {
            batch,
            heads,
            seq_len,
            bytes_per_element,
            layers,
            bytes_per_layer: per_layer,
            bytes_all_layers: per_layer * layers,
        }
    }

    /// LLaMA-7B as in the article: batch 2, 32 heads, 4096 tokens, fp16, 32 layers.
    pub fn llama_7b() -> Self {
        Self::new(2, 32, 4096, 2, 32)
    }
}

/// One sequence length.
#[derive(Debug, Clone, Serialize)]
pub struct ComplexityRow {
    /// Path measured.
    pub path: String,
    /// n = m.
    pub n: usize,
    /// Median forward time (ms).
    pub time_ms: f64,
    /// Every timed forward (ms).
    pub times_ms: Vec<f64>,
    /// Peak resident memory added by one forward (MiB), when measurable.
    pub peak_mib: Option<f64>,
    /// Size of the weights tensor b·h·n·m·4 bytes (MiB), for the path that materializes it.
    pub weights_mib: Option<f64>,
}

/// The label of the path that materializes the weights.
const MATERIALIZED: &str = "materialized weights (module, need_weights)";
/// The label of the fastest path.
const FASTEST: &str = "fastest path (module, Auto)";

/// The experiment.
pub struct Complexity;

impl Experiment for Complexity {
    fn name(&self) -> &'static str {
        "complexity"
    }

    fn title(&self) -> &'static str {
        "Cost of attention as the sequence grows; the LLaMA-7B attention-matrix arithmetic"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let backend = ctx.primary();
        let device = &backend.device;
        let (b, h, d) = (1usize, 8usize, 64usize);
        let ns: Vec<usize> = if ctx.quick {
            vec![128, 256, 512, 1024]
        } else {
            vec![128, 256, 512, 1024, 2048, 4096]
        };
        let reps = if ctx.quick { 3 } else { 5 };
        let attn = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Naive)
            .try_init()?;
        let fast = ScaledDotProductAttentionConfig::new().try_init()?;
        let mut rows = Vec::new();
        let mut rng = ctx.rng(10);
        for &n in &ns {
            let q = normal_tensor(&mut rng, [b, h, n, d], device);
            let k = normal_tensor(&mut rng, [b, h, n, d], device);
            let v = normal_tensor(&mut rng, [b, h, n, d], device);
            let paths: [(&str, Runner<'_>); 2] = [
                (
                    MATERIALIZED,
                    Box::new(|| {
                        let out = attn.try_forward(
                            AttentionInput::new(q.clone(), k.clone(), v.clone()).need_weights(),
                        )?;
                        let w = out
                            .weights
                            .ok_or_else(|| LabError::Other("no weights".into()))?;
                        Ok(to_vec(out.context.slice(s![0..1, 0..1, 0..1, 0..1]))?[0]
                            + to_vec(w.slice(s![0..1, 0..1, 0..1, 0..1]))?[0])
                    }),
                ),
                (
                    FASTEST,
                    Box::new(|| {
                        let out = fast
                            .try_forward(AttentionInput::new(q.clone(), k.clone(), v.clone()))?
                            .context;
                        Ok(to_vec(out.slice(s![0..1, 0..1, 0..1, 0..1]))?[0])
                    }),
                ),
            ];
            for (name, run) in paths.iter() {
                run()?; // warm-up
                let mut times = Vec::new();
                for _ in 0..reps {
                    let t = Instant::now();
                    run()?;
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let (_, peak) = measure_peak(run);
                rows.push(ComplexityRow {
                    path: name.to_string(),
                    n,
                    time_ms: median(&times),
                    times_ms: times,
                    peak_mib: peak.map(|p| p as f64 / (1 << 20) as f64),
                    weights_mib: (*name == MATERIALIZED)
                        .then(|| (b * h * n * n * 4) as f64 / (1 << 20) as f64),
                });
            }
        }
        let table = md_table(
            &[
                "path",
                "n = m",
                "time (ms)",
                "peak memory added (MiB)",
                "its weights tensor (MiB)",
            ],
            &rows
                .iter()
                .map(|r| {
                    vec![
                        r.path.clone(),
                        r.n.to_string(),
                        f(r.time_ms, 2),
                        r.peak_mib.map_or("n/a".into(), |m| f(m, 1)),
                        r.weights_mib.map_or("– (none)".into(), |m| f(m, 1)),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let llama = MatrixMemory::llama_7b();
        let gb = |x: u64| x as f64 / 1e9;
        let gib = |x: u64| x as f64 / (1u64 << 30) as f64;
        let markdown = format!(
            "b = {b}, h = {h}, d = {d}, n = m; median of {reps} forward passes after a warm-up on {}; peak \
             memory is the rise of the process's resident high-water mark during one forward. Growth \
             exponents are least-squares slopes on log-log axes over every timed run with n ≥ 512 (memory: \
             one measurement per n, sizes with a measurable rise only).\n\n{table}\n\
             **LLaMA-7B arithmetic** (batch {}, {} heads, {} tokens, {} bytes per element, {} layers): one \
             layer's attention matrices take {} × {} × {}² × {} = {} bytes = {} GB ({} GiB); all {} \
             layers {} GB ({} GiB).\n",
            backend.name,
            llama.batch,
            llama.heads,
            llama.seq_len,
            llama.bytes_per_element,
            llama.layers,
            llama.batch,
            llama.heads,
            llama.seq_len,
            llama.bytes_per_element,
            llama.bytes_per_layer,
            f(gb(llama.bytes_per_layer), 2),
            f(gib(llama.bytes_per_layer), 2),
            llama.layers,
            f(gb(llama.bytes_all_layers), 1),
            f(gib(llama.bytes_all_layers), 1),
        );
        let csv = write_csv(
            ctx,
            "complexity.csv",
            "path,n,time_ms,peak_mib,weights_mib",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "\"{}\",{},{},{},{}",
                        r.path,
                        r.n,
                        r.time_ms,
                        r.peak_mib.map(|m| m.to_string()).unwrap_or_default(),
                        r.weights_mib.map(|m| m.to_string()).unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let mut series: Vec<Series> = [MATERIALIZED, FASTEST]
            .iter()
            .map(|p| {
                Series::line(
                    p.to_string(),
                    rows.iter()
                        .filter(|r| r.path == *p)
                        .map(|r| (r.n as f64, r.time_ms))
                        .collect(),
                )
            })
            .collect();
        if let Some(first) = rows.iter().find(|r| r.n == ns[0]) {
            let c = first.time_ms / (ns[0] as f64).powi(2);
            series.push(Series::reference(
                "∝ n²",
                ns.iter()
                    .map(|&n| (n as f64, c * (n as f64).powi(2)))
                    .collect(),
            ));
        }
        let plot = "complexity_time.png";
        line_plot(
            &out_path(ctx, plot),
            &LinePlot {
                title: format!(
                    "Attention forward time vs sequence length ({})",
                    backend.name
                ),
                x_label: "n = m".into(),
                y_label: "time (ms)".into(),
                log_x: true,
                log_y: true,
                series,
            },
        )?;
        let claims = claims(&rows, &llama);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "rows": rows, "llama_7b": llama }),
            t0,
        )
        .files(vec![plot.into()], vec![csv]))
    }
}

/// The fitted growth exponent of a path's time on n (every run, n ≥ 512).
fn time_exponent(rows: &[ComplexityRow], path: &str) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.path == path && r.n >= 512)
        .flat_map(|r| r.times_ms.iter().map(move |t| (r.n as f64, *t)))
        .unzip();
    exponent_ci(&xs, &ys)
}

/// The claims of `complexity`, decided by its rows and the LLaMA arithmetic.
pub fn claims(rows: &[ComplexityRow], llama: &MatrixMemory) -> Vec<Claim> {
    let gb = |x: u64| x as f64 / 1e9;
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.path == MATERIALIZED && r.n >= 512)
        .filter_map(|r| r.peak_mib.filter(|m| *m > 0.0).map(|m| (r.n as f64, m)))
        .unzip();
    let memory = exponent_ci(&xs, &ys);
    let largest = rows.iter().map(|r| r.n).max().unwrap_or(0);
    let fast_at_largest = rows.iter().find(|r| r.path == FASTEST && r.n == largest);
    let weights_at_largest = (rows
        .iter()
        .find(|r| r.path == MATERIALIZED && r.n == largest))
    .and_then(|r| r.weights_mib);
    vec![
        Claim::in_range(
            "time-quadratic",
            Source::Article("Q4"),
            "attention's time grows as n²",
            "fitted exponent of the materialized path's time on n",
            time_exponent(rows, MATERIALIZED),
            1.7,
            2.3,
        ),
        Claim::in_range(
            "memory-quadratic",
            Source::Article("Q4"),
            "its memory grows as n² (the n × n weights)",
            "fitted exponent of the materialized path's peak memory on n",
            memory,
            1.7,
            2.3,
        ),
        Claim::within(
            "llama-per-layer",
            Source::Article("Q4"),
            "LLaMA-7B holds 2.1 GB of attention matrices per layer",
            "GB per layer",
            gb(llama.bytes_per_layer),
            2.1,
            0.06,
        ),
        Claim::within(
            "llama-all-layers",
            Source::Article("Q4"),
            "and 68 GB for its 32 layers",
            "GB for 32 layers",
            gb(llama.bytes_all_layers),
            68.0,
            1.0,
        ),
        Claim::decided(
            "fast-path-holds-no-weights",
            Source::Lab,
            format!("the fastest path never holds the n × n weights (n = {largest})"),
            "its peak memory added is below the size of the weights tensor",
            format!(
                "peak {} MiB, weights {} MiB",
                fast_at_largest
                    .and_then(|r| r.peak_mib)
                    .map_or("n/a".into(), short),
                weights_at_largest.map_or("n/a".into(), short)
            ),
            fast_at_largest
                .and_then(|r| r.peak_mib)
                .zip(weights_at_largest)
                .map(|(peak, weights)| peak < weights),
        ),
        Claim::in_range(
            "fast-path-time-still-quadratic",
            Source::Lab,
            "the fastest path saves memory, not work: its time still grows as n²",
            "fitted exponent of the fastest path's time on n",
            time_exponent(rows, FASTEST),
            1.7,
            2.3,
        ),
    ]
}
