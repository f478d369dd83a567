//! `sdpa bench`: the attention paths against each other and against a hand-written
//! matmul/softmax/matmul baseline, forward and forward+backward, plus an inference memory sweep.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn_sdpa::{
    AttentionInput, Implementation, ScaledDotProductAttention, ScaledDotProductAttentionConfig,
};
use sdpa_model::Progress;
use serde::Serialize;

use crate::context::{LabBackend, LabContext, LabError, normal_tensor};
use crate::experiments::{f, md_table};
use crate::memory::measure_peak;
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::median;

/// Sizes of the benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    /// Batch.
    pub b: usize,
    /// Heads.
    pub h: usize,
    /// Head dimension.
    pub d: usize,
    /// Sequence lengths (n = m).
    pub ns: Vec<usize>,
    /// Least timed runs per cell (after one warm-up).
    pub reps: usize,
    /// More runs are timed (up to `max_reps`) until every path of a cell has run this long in
    /// total, so that the medians of the fast small-n cells are not at the mercy of one hiccup.
    pub min_total_ms: f64,
    /// Most timed runs per cell.
    pub max_reps: usize,
    /// Key block of the chunked path.
    pub block_size: usize,
    /// Sequence lengths of the inference memory sweep (b = 1).
    pub memory_ns: Vec<usize>,
    /// The naive path is skipped in the memory sweep once its three n×n tensors would exceed
    /// this many bytes.
    pub naive_limit_bytes: u64,
}

impl BenchConfig {
    /// The sizes; `quick` shrinks them for a smoke run.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                b: 1,
                h: 2,
                d: 16,
                ns: vec![64, 128],
                reps: 2,
                min_total_ms: 0.0,
                max_reps: 2,
                block_size: 32,
                memory_ns: vec![256, 512],
                naive_limit_bytes: 1 << 30,
            }
        } else {
            Self {
                b: 4,
                h: 8,
                d: 64,
                ns: vec![128, 256, 512, 1024, 2048, 4096],
                reps: 5,
                min_total_ms: 3000.0,
                max_reps: 30,
                block_size: 256,
                memory_ns: vec![1024, 2048, 4096, 8192, 16384, 32768],
                naive_limit_bytes: 12 << 30,
            }
        }
    }
}

/// One timed cell.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// `auto`, `naive`, `chunked`, `fused` or `baseline`.
    pub path: String,
    /// `forward` or `forward+backward`.
    pub mode: String,
    /// n = m.
    pub n: usize,
    /// Median time (ms).
    pub median_ms: f64,
    /// All timed runs (ms).
    pub times_ms: Vec<f64>,
    /// 4·b·h·n·m·d (forward) or 12·b·h·n·m·d (forward+backward) per second, in GFLOP/s.
    pub gflops: f64,
    /// Peak resident memory added by one run (MiB).
    pub peak_mib: Option<f64>,
    /// The path the module actually took (`naive`, `chunked(256)`, `fused`; `None` for the
    /// baseline).
    pub takes: Option<String>,
}

/// One cell of the memory sweep.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// `chunked`, `auto` or `naive`.
    pub path: String,
    /// n = m.
    pub n: usize,
    /// Time of one inference forward (s), if it ran.
    pub seconds: Option<f64>,
    /// Peak resident memory added (MiB), if it ran.
    pub peak_mib: Option<f64>,
    /// Why it did not run.
    pub skipped: Option<String>,
    /// The path the module actually took.
    pub takes: Option<String>,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Backend.
    pub backend: String,
    /// Sizes.
    pub config: BenchConfig,
    /// Timed cells.
    pub rows: Vec<BenchRow>,
    /// Memory sweep.
    pub memory: Vec<MemoryRow>,
    /// For each (mode, n): Auto's median time over the smallest median of the other paths
    /// (≤ 1.10 is the target).
    pub auto_ratio: Vec<(String, usize, f64)>,
    /// For each (mode, n): the largest, over the other paths p, of the median over rounds of
    /// auto_i / p_i, where round i ran every path once, one after the other. Pairing runs that
    /// are seconds apart cancels the slow spells of a shared machine, which move single runs by
    /// ±20% here; it is the estimate the target is checked against.
    pub auto_ratio_paired: Vec<(String, usize, f64)>,
}

/// The hand-written baseline: softmax(QKᵀ/√d)·V with nothing else.
pub fn baseline(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let d = q.dims()[3];
    softmax(q.matmul(k.transpose()) / (d as f64).sqrt(), 3).matmul(v)
}

/// The attention module with the given implementation and the default settings.
pub fn module(implementation: Implementation) -> Result<ScaledDotProductAttention, LabError> {
    Ok(ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .try_init()?)
}

/// The paths, as (name, implementation or None for the baseline).
pub fn paths(block_size: usize) -> Vec<(&'static str, Option<Implementation>)> {
    vec![
        ("auto", Some(Implementation::Auto)),
        ("naive", Some(Implementation::Naive)),
        ("chunked", Some(Implementation::Chunked { block_size })),
        ("fused", Some(Implementation::Fused)),
        ("cpu_kernel", Some(Implementation::CpuKernel)),
        ("baseline", None),
    ]
}

/// The paths that can run in a mode: all of them for inference; for forward+backward, all but
/// `cpu_kernel`, which has no backward pass.
pub fn paths_for(block_size: usize, backward: bool) -> Vec<(&'static str, Option<Implementation>)> {
    paths(block_size)
        .into_iter()
        .filter(|(_, implementation)| {
            !(backward && *implementation == Some(Implementation::CpuKernel))
        })
        .collect()
}

/// The path `attn` takes for q, k, v, as it prints: `naive`, `chunked(B)`, `fused` or
/// `cpu_kernel`.
fn path_taken(
    attn: &ScaledDotProductAttention,
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
) -> Result<String, LabError> {
    let input = AttentionInput::new(q.clone(), k.clone(), v.clone());
    Ok(attn.path(&input)?.to_string())
}

/// The context of one path: the module's forward, or [`baseline`] when `attn` is `None`.
pub fn forward_path(
    attn: Option<&ScaledDotProductAttention>,
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
) -> Result<Tensor<4>, LabError> {
    Ok(match attn {
        Some(a) => a.try_forward(AttentionInput::new(q, k, v))?.context,
        None => baseline(q, k, v),
    })
}

fn run_once(
    attn: Option<&ScaledDotProductAttention>,
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    backward: bool,
) -> Result<(), LabError> {
    let (q, k, v) = if backward {
        (
            q.clone().require_grad(),
            k.clone().require_grad(),
            v.clone().require_grad(),
        )
    } else {
        (q.clone(), k.clone(), v.clone())
    };
    let out = forward_path(attn, q.clone(), k.clone(), v.clone())?;
    let device = out.device();
    if backward {
        let grads = out.sum().backward();
        for t in [&q, &k, &v] {
            let g = t
                .grad(&grads)
                .ok_or_else(|| LabError::Other("missing gradient".into()))?;
            let _ = g.slice(s![0..1, 0..1, 0..1, 0..1]).into_data();
        }
    } else {
        let _ = out.slice(s![0..1, 0..1, 0..1, 0..1]).into_data();
    }
    device
        .sync()
        .map_err(|e| LabError::Other(format!("device sync failed: {e:?}")))?;
    Ok(())
}

/// Runs the benchmark on one backend.
pub fn run_bench(
    backend: &LabBackend,
    config: &BenchConfig,
    ctx: &LabContext,
) -> Result<BenchReport, LabError> {
    let (b, h, d) = (config.b, config.h, config.d);
    let total = (config.ns.len()
        * (paths_for(config.block_size, false).len() + paths_for(config.block_size, true).len())
        + config.memory_ns.len() * 3) as u64;
    let progress = Progress::new(ctx.progress, &format!("bench {}", backend.name), 0, total);
    let mut done = 0;
    let mut rows = Vec::new();
    let mut rng = ctx.rng(5);
    for &n in &config.ns {
        for backward in [false, true] {
            let device = if backward {
                backend.device.clone().autodiff()
            } else {
                backend.device.clone()
            };
            let q = normal_tensor(&mut rng, [b, h, n, d], &device);
            let k = normal_tensor(&mut rng, [b, h, n, d], &device);
            let v = normal_tensor(&mut rng, [b, h, n, d], &device);
            let attns = paths_for(config.block_size, backward)
                .iter()
                .map(|(name, implementation)| Ok((*name, implementation.map(module).transpose()?)))
                .collect::<Result<Vec<_>, LabError>>()?;
            for (_, attn) in &attns {
                run_once(attn.as_ref(), &q, &k, &v, backward)?; // warm-up
            }
            // Round-robin over the paths, so that a slow spell of the machine hits all of them,
            // starting each round one path later, so that no path always runs first (right after
            // the previous round's last path freed its memory): with a fixed order, Auto (first)
            // ran up to 11% slower than the identical path it takes.
            let mut times = vec![Vec::new(); attns.len()];
            let mut round = 0;
            let enough = |times: &Vec<Vec<f64>>| {
                times.iter().all(|t| {
                    t.len() >= config.max_reps
                        || (t.len() >= config.reps && t.iter().sum::<f64>() >= config.min_total_ms)
                })
            };
            while !enough(&times) {
                for offset in 0..attns.len() {
                    let path_idx = (round + offset) % attns.len();
                    let t = Instant::now();
                    run_once(attns[path_idx].1.as_ref(), &q, &k, &v, backward)?;
                    times[path_idx].push(t.elapsed().as_secs_f64() * 1e3);
                }
                round += 1;
            }
            for ((name, attn), times) in attns.iter().zip(times) {
                let (r, peak) = measure_peak(|| run_once(attn.as_ref(), &q, &k, &v, backward));
                r?;
                let flop = (if backward { 12.0 } else { 4.0 }) * (b * h * n * n * d) as f64;
                let med = median(&times);
                let row = BenchRow {
                    path: name.to_string(),
                    mode: if backward {
                        "forward+backward".into()
                    } else {
                        "forward".into()
                    },
                    n,
                    median_ms: med,
                    times_ms: times,
                    gflops: flop / (med * 1e-3) / 1e9,
                    peak_mib: peak.map(|p| p as f64 / (1u64 << 20) as f64),
                    takes: attn
                        .as_ref()
                        .map(|a| path_taken(a, &q, &k, &v))
                        .transpose()?,
                };
                done += 1;
                let line = format!(
                    "{} {} n={n}: {:.1} ms, {:.1} GFLOP/s{}",
                    row.path,
                    row.mode,
                    row.median_ms,
                    row.gflops,
                    row.takes
                        .as_ref()
                        .map_or(String::new(), |t| format!(" ({t})"))
                );
                progress.update(done, &line);
                progress.println(&line);
                rows.push(row);
            }
        }
    }
    // Inference memory sweep, b = 1.
    let mut memory = Vec::new();
    for &n in &config.memory_ns {
        let device = backend.device.clone();
        let q = normal_tensor(&mut rng, [1, h, n, d], &device);
        let k = normal_tensor(&mut rng, [1, h, n, d], &device);
        let v = normal_tensor(&mut rng, [1, h, n, d], &device);
        for (name, implementation) in [
            (
                "chunked",
                Implementation::Chunked {
                    block_size: config.block_size,
                },
            ),
            ("auto", Implementation::Auto),
            ("naive", Implementation::Naive),
        ] {
            let need = 3 * (h * n * n * 4) as u64;
            if name == "naive" && need > config.naive_limit_bytes {
                memory.push(MemoryRow {
                    path: name.into(),
                    n,
                    seconds: None,
                    peak_mib: None,
                    takes: None,
                    skipped: Some(format!(
                        "its scores, weights and softmax temporaries would need ≈ {:.1} GiB (limit {:.0} GiB)",
                        need as f64 / (1u64 << 30) as f64,
                        config.naive_limit_bytes as f64 / (1u64 << 30) as f64
                    )),
                });
                done += 1;
                continue;
            }
            let attn = module(implementation)?;
            let takes = Some(path_taken(&attn, &q, &k, &v)?);
            let t = Instant::now();
            let (r, peak) = measure_peak(|| run_once(Some(&attn), &q, &k, &v, false));
            r?;
            let secs = t.elapsed().as_secs_f64();
            done += 1;
            let line = format!(
                "memory {name} n={n}: {secs:.1} s, peak +{:.0} MiB",
                peak.map_or(f64::NAN, |p| p as f64 / (1u64 << 20) as f64)
            );
            progress.update(done, &line);
            progress.println(&line);
            memory.push(MemoryRow {
                path: name.into(),
                n,
                seconds: Some(secs),
                peak_mib: peak.map(|p| p as f64 / (1u64 << 20) as f64),
                skipped: None,
                takes,
            });
        }
    }
    progress.finish("done");
    let mut auto_ratio = Vec::new();
    let mut auto_ratio_paired = Vec::new();
    for mode in ["forward", "forward+backward"] {
        for &n in &config.ns {
            let cell = |p: &str| {
                rows.iter()
                    .find(|r| r.mode == mode && r.n == n && r.path == p)
            };
            let others: Vec<&BenchRow> = ["naive", "chunked", "fused", "cpu_kernel", "baseline"]
                .iter()
                .filter_map(|p| cell(p))
                .collect();
            if let Some(auto) = cell("auto") {
                let best_other = others
                    .iter()
                    .map(|r| r.median_ms)
                    .fold(f64::INFINITY, f64::min);
                auto_ratio.push((mode.to_string(), n, auto.median_ms / best_other));
                let paired = others
                    .iter()
                    .map(|other| {
                        let ratios: Vec<f64> = auto
                            .times_ms
                            .iter()
                            .zip(&other.times_ms)
                            .map(|(a, o)| a / o)
                            .collect();
                        median(&ratios)
                    })
                    .fold(0.0, f64::max);
                auto_ratio_paired.push((mode.to_string(), n, paired));
            }
        }
    }
    Ok(BenchReport {
        backend: backend.name.clone(),
        config: config.clone(),
        rows,
        memory,
        auto_ratio,
        auto_ratio_paired,
    })
}

/// The Markdown tables of a report.
pub fn markdown(r: &BenchReport) -> String {
    let mut s = format!(
        "## Benchmark on {} (b = {}, h = {}, d = {}; median of {} to {} runs after a warm-up, \
         the paths taking turns in an order that rotates each round, more runs until each path has run {} ms)\n\n",
        r.backend,
        r.config.b,
        r.config.h,
        r.config.d,
        r.config.reps,
        r.config.max_reps,
        r.config.min_total_ms
    );
    for mode in ["forward", "forward+backward"] {
        s.push_str(&format!("### {mode}: median ms (GFLOP/s)\n\n"));
        let mut headers = vec!["n".to_string()];
        headers.extend(paths(r.config.block_size).iter().map(|p| p.0.to_string()));
        headers.push("auto / best other (medians)".into());
        headers.push("auto / best other (paired)".into());
        let hs: Vec<&str> = headers.iter().map(|x| x.as_str()).collect();
        let rows: Vec<Vec<String>> = r
            .config
            .ns
            .iter()
            .map(|&n| {
                let mut row = vec![n.to_string()];
                for (p, _) in paths(r.config.block_size) {
                    row.push(
                        r.rows
                            .iter()
                            .find(|x| x.mode == mode && x.n == n && x.path == p)
                            .map_or("–".into(), |x| {
                                let takes = match (&x.takes, p) {
                                    (Some(t), "auto") => format!(" → {t}"),
                                    _ => String::new(),
                                };
                                format!("{} ({}){takes}", f(x.median_ms, 1), f(x.gflops, 1))
                            }),
                    );
                }
                for ratios in [&r.auto_ratio, &r.auto_ratio_paired] {
                    row.push(
                        ratios
                            .iter()
                            .find(|(m, nn, _)| m == mode && *nn == n)
                            .map_or("–".into(), |x| f(x.2, 2)),
                    );
                }
                row
            })
            .collect();
        s.push_str(&md_table(&hs, &rows));
        s.push('\n');
    }
    s.push_str("### Peak memory added by one run (MiB)\n\n");
    let mut headers = vec!["mode".to_string(), "n".to_string()];
    headers.extend(paths(r.config.block_size).iter().map(|p| p.0.to_string()));
    let hs: Vec<&str> = headers.iter().map(|x| x.as_str()).collect();
    let mut rows = Vec::new();
    for mode in ["forward", "forward+backward"] {
        for &n in &r.config.ns {
            let mut row = vec![mode.to_string(), n.to_string()];
            for (p, _) in paths(r.config.block_size) {
                row.push(
                    r.rows
                        .iter()
                        .find(|x| x.mode == mode && x.n == n && x.path == p)
                        .and_then(|x| x.peak_mib)
                        .map_or("n/a".into(), |m| f(m, 0)),
                );
            }
            rows.push(row);
        }
    }
    s.push_str(&md_table(&hs, &rows));
    s.push_str("\n### Inference memory sweep (b = 1)\n\n");
    s.push_str(&md_table(
        &[
            "path",
            "n",
            "takes",
            "time (s)",
            "peak memory added (MiB)",
            "note",
        ],
        &r.memory
            .iter()
            .map(|m| {
                vec![
                    m.path.clone(),
                    m.n.to_string(),
                    m.takes.clone().unwrap_or_else(|| "–".into()),
                    m.seconds.map_or("–".into(), |x| f(x, 2)),
                    m.peak_mib.map_or("–".into(), |x| f(x, 0)),
                    m.skipped.clone().unwrap_or_default(),
                ]
            })
            .collect::<Vec<_>>(),
    ));
    s
}

/// Writes `bench.json`, `BENCH.md` and `bench_<mode>.png` under the output folder.
pub fn write(r: &BenchReport, ctx: &LabContext) -> Result<Vec<String>, LabError> {
    std::fs::create_dir_all(&ctx.out_dir).map_err(|e| LabError::io(&ctx.out_dir, e))?;
    let json = ctx.out_dir.join(format!("bench_{}.json", r.backend));
    std::fs::write(&json, serde_json::to_string_pretty(r).unwrap_or_default())
        .map_err(|e| LabError::io(&json, e))?;
    let md = ctx.out_dir.join(format!("BENCH_{}.md", r.backend));
    std::fs::write(&md, markdown(r)).map_err(|e| LabError::io(&md, e))?;
    let mut files = vec![json.display().to_string(), md.display().to_string()];
    for mode in ["forward", "forward+backward"] {
        let name = format!("bench_{}_{}.png", r.backend, mode.replace('+', "_"));
        line_plot(
            &ctx.out_dir.join(&name),
            &LinePlot {
                title: format!(
                    "Attention {mode} on {} (b={}, h={}, d={})",
                    r.backend, r.config.b, r.config.h, r.config.d
                ),
                x_label: "n = m".into(),
                y_label: "GFLOP/s".into(),
                log_x: true,
                log_y: false,
                series: paths(r.config.block_size)
                    .iter()
                    .map(|(p, _)| {
                        Series::line(
                            *p,
                            r.rows
                                .iter()
                                .filter(|x| x.mode == mode && x.path == *p)
                                .map(|x| (x.n as f64, x.gflops))
                                .collect(),
                        )
                    })
                    .collect(),
            },
        )?;
        files.push(ctx.out_dir.join(name).display().to_string());
    }
    Ok(files)
}
