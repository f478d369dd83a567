//! `sdpa bench`: the attention paths against each other and against a hand-written
//! matmul/softmax/matmul baseline, forward and forward+backward, unmasked and with a padding
//! mask, plus inference and training memory sweeps.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the sizes, the paths, one timed cell, the timing grid and Auto's ratios |
//! | `sweeps.rs` | the memory sweeps (b = 1, long sequences) |
//! | `report.rs` | the Markdown tables, the JSON file and the plots |

mod report;
mod sweeps;

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn_sdpa::{
    AttentionInput, Implementation, ScaledDotProductAttention, ScaledDotProductAttentionConfig,
};
use sdpa_model::Progress;
use serde::Serialize;

use crate::context::{LabBackend, LabError, normal_tensor};
use crate::memory::measure_peak;
use crate::stats::median;
pub use report::{markdown, write};
pub use sweeps::MemoryRow;

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
    /// The modes timed, by [`Mode::name`] (all four by default).
    pub modes: Vec<String>,
    /// Keys hidden at the end of every batch element in the padded modes, as a fraction of m
    /// (1/8: a batch of sequences padded to a common length).
    pub padded_fraction: f64,
    /// Sequence lengths of the inference memory sweep (b = 1).
    pub memory_ns: Vec<usize>,
    /// Sequence lengths of the training (forward + backward) memory sweep (b = 1).
    pub training_memory_ns: Vec<usize>,
    /// A path that materializes n×n tensors is skipped in the memory sweeps once they would
    /// exceed this many bytes.
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
                modes: Mode::ALL.map(|m| m.name().to_string()).to_vec(),
                padded_fraction: 0.125,
                memory_ns: vec![256, 512],
                training_memory_ns: vec![256],
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
                modes: Mode::ALL.map(|m| m.name().to_string()).to_vec(),
                padded_fraction: 0.125,
                memory_ns: vec![1024, 2048, 4096, 8192, 16384, 32768],
                training_memory_ns: vec![1024, 4096, 16384],
                naive_limit_bytes: 12 << 30,
            }
        }
    }
}

/// A timed mode: forward or forward + backward, with or without the padding mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Forward + backward on an autodiff device.
    pub backward: bool,
    /// With a padding mask hiding [`BenchConfig::padded_fraction`] of the keys.
    pub padded: bool,
}

impl Mode {
    /// The four modes, in report order.
    pub const ALL: [Mode; 4] = [
        Mode {
            backward: false,
            padded: false,
        },
        Mode {
            backward: true,
            padded: false,
        },
        Mode {
            backward: false,
            padded: true,
        },
        Mode {
            backward: true,
            padded: true,
        },
    ];

    /// As written in the report: `forward`, `forward+backward`, `forward, padded`, ...
    pub fn name(self) -> &'static str {
        match (self.backward, self.padded) {
            (false, false) => "forward",
            (true, false) => "forward+backward",
            (false, true) => "forward, padded",
            (true, true) => "forward+backward, padded",
        }
    }

    /// Flops per (b·h·n·m·d): 4 forward, 12 forward + backward (the dense count, also for the
    /// padded modes, so that their GFLOP/s compare with the unmasked ones at equal work asked).
    fn flops_per_element(self) -> f64 {
        if self.backward { 12.0 } else { 4.0 }
    }
}

/// One timed cell.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// `auto`, `naive`, `chunked`, `fused`, `cpu_kernel` or `baseline`.
    pub path: String,
    /// [`Mode::name`].
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
    /// The path the module actually took (`None` for the baseline).
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
    /// Inference memory sweep.
    pub memory: Vec<MemoryRow>,
    /// Training (forward + backward) memory sweep.
    pub training_memory: Vec<MemoryRow>,
    /// For each (mode, n): Auto's median time over the smallest median of the other paths.
    pub auto_ratio: Vec<(String, usize, f64)>,
    /// For each (mode, n): the largest, over the other paths p, of the median over rounds of
    /// auto_i / p_i, where round i ran every path once, one after the other. Pairing runs that
    /// are seconds apart cancels the slow spells of a shared machine.
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

/// The paths that can run a mode: all of them, but the baseline takes no mask.
pub fn paths_for(block_size: usize, padded: bool) -> Vec<(&'static str, Option<Implementation>)> {
    paths(block_size)
        .into_iter()
        .filter(|(_, implementation)| !(padded && implementation.is_none()))
        .collect()
}

/// The inputs of one cell: q, k, v `[b, h, n, d]` and, in the padded modes, the padding mask
/// `[b, n]` hiding the last `fraction` of every batch element's keys.
#[derive(Debug, Clone)]
pub struct Cell {
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    padding: Option<Tensor<2, Bool>>,
}

impl Cell {
    /// Draws a cell on `device`.
    pub fn new(
        rng: &mut rand_chacha::ChaCha8Rng,
        shape: [usize; 4],
        padded: Option<f64>,
        device: &Device,
    ) -> Self {
        let [b, _, n, _] = shape;
        let padding = padded.map(|fraction| {
            let visible = n - ((n as f64 * fraction).round() as usize).min(n - 1);
            let lengths = Tensor::<1, Int>::full([b], visible as i64, device);
            burn_sdpa::mask::padding_mask_from_lengths(lengths, n)
        });
        Self {
            q: normal_tensor(rng, shape, device),
            k: normal_tensor(rng, shape, device),
            v: normal_tensor(rng, shape, device),
            padding,
        }
    }

    fn input(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> AttentionInput {
        let input = AttentionInput::new(q, k, v);
        match &self.padding {
            Some(padding) => input.padding_mask(padding.clone()),
            None => input,
        }
    }
}

/// The path `attn` takes for a cell, as it prints: `naive`, `chunked(B)`, `fused`, `cpu_kernel`.
fn path_taken(attn: &ScaledDotProductAttention, cell: &Cell) -> Result<String, LabError> {
    let input = cell.input(cell.q.clone(), cell.k.clone(), cell.v.clone());
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

/// Runs one path on a cell, forward or forward + backward, and waits for the device.
pub fn run_once(
    attn: Option<&ScaledDotProductAttention>,
    cell: &Cell,
    backward: bool,
) -> Result<(), LabError> {
    let leaf = |t: &Tensor<4>| {
        if backward {
            t.clone().require_grad()
        } else {
            t.clone()
        }
    };
    let (q, k, v) = (leaf(&cell.q), leaf(&cell.k), leaf(&cell.v));
    let out = match attn {
        Some(a) => {
            a.try_forward(cell.input(q.clone(), k.clone(), v.clone()))?
                .context
        }
        None => baseline(q.clone(), k.clone(), v.clone()),
    };
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

/// Times every path of one (mode, n) cell: a warm-up each, then rounds in which every path runs
/// once, until each has enough runs; then one more run each for its peak memory.
fn time_cell(
    config: &BenchConfig,
    mode: Mode,
    n: usize,
    cell: &Cell,
    mut report: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, LabError> {
    let attns = paths_for(config.block_size, mode.padded)
        .iter()
        .map(|(name, implementation)| Ok((*name, implementation.map(module).transpose()?)))
        .collect::<Result<Vec<_>, LabError>>()?;
    for (_, attn) in &attns {
        run_once(attn.as_ref(), cell, mode.backward)?; // warm-up
    }
    // Round-robin over the paths, so that a slow spell of the machine hits all of them,
    // starting each round one path later, so that no path always runs first (right after the
    // previous round's last path freed its memory).
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
            run_once(attns[path_idx].1.as_ref(), cell, mode.backward)?;
            times[path_idx].push(t.elapsed().as_secs_f64() * 1e3);
        }
        round += 1;
    }
    let (b, h, d) = (config.b, config.h, config.d);
    let mut rows = Vec::new();
    for ((name, attn), times) in attns.iter().zip(times) {
        let (r, peak) = measure_peak(|| run_once(attn.as_ref(), cell, mode.backward));
        r?;
        let flop = mode.flops_per_element() * (b * h * n * n * d) as f64;
        let med = median(&times);
        let row = BenchRow {
            path: name.to_string(),
            mode: mode.name().into(),
            n,
            median_ms: med,
            times_ms: times,
            gflops: flop / (med * 1e-3) / 1e9,
            peak_mib: peak.map(|p| p as f64 / (1u64 << 20) as f64),
            takes: attn.as_ref().map(|a| path_taken(a, cell)).transpose()?,
        };
        report(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// Where a benchmark writes, and how it shows progress.
#[derive(Debug, Clone)]
pub struct BenchContext {
    /// How progress is shown.
    pub progress: sdpa_model::ProgressMode,
    /// The seed of the inputs.
    pub seed: u64,
    /// Where the tables and plots go.
    pub out_dir: std::path::PathBuf,
}

/// Runs the benchmark on one backend.
pub fn run_bench(
    backend: &LabBackend,
    config: &BenchConfig,
    ctx: &BenchContext,
) -> Result<BenchReport, LabError> {
    let (b, h, d) = (config.b, config.h, config.d);
    let modes: Vec<Mode> = Mode::ALL
        .into_iter()
        .filter(|m| config.modes.iter().any(|name| name == m.name()))
        .collect();
    let cells: usize = modes
        .iter()
        .map(|m| paths_for(config.block_size, m.padded).len())
        .sum();
    let total = (config.ns.len() * cells
        + (config.memory_ns.len() + config.training_memory_ns.len()) * 3) as u64;
    let progress = Progress::new(ctx.progress, &format!("bench {}", backend.name), 0, total);
    let mut done = 0;
    let mut rows = Vec::new();
    let mut rng = crate::context::rng(ctx.seed, 5);
    for &n in &config.ns {
        for &mode in &modes {
            let device = if mode.backward {
                backend.device.clone().autodiff()
            } else {
                backend.device.clone()
            };
            let padded = mode.padded.then_some(config.padded_fraction);
            let cell = Cell::new(&mut rng, [b, h, n, d], padded, &device);
            rows.extend(time_cell(config, mode, n, &cell, |row| {
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
            })?);
        }
    }
    let mut line = |text: String| {
        done += 1;
        progress.update(done, &text);
        progress.println(&text);
    };
    let memory = sweeps::sweep(backend, config, false, &mut rng, &mut line)?;
    let training_memory = sweeps::sweep(backend, config, true, &mut rng, &mut line)?;
    progress.finish("done");
    let (auto_ratio, auto_ratio_paired) = auto_ratios(&rows, &config.ns);
    Ok(BenchReport {
        backend: backend.name.clone(),
        config: config.clone(),
        rows,
        memory,
        training_memory,
        auto_ratio,
        auto_ratio_paired,
    })
}

/// Auto's ratios to the fastest other path of every (mode, n): of medians, and paired.
type Ratios = Vec<(String, usize, f64)>;

fn auto_ratios(rows: &[BenchRow], ns: &[usize]) -> (Ratios, Ratios) {
    let mut medians = Vec::new();
    let mut paired = Vec::new();
    for mode in Mode::ALL.map(Mode::name) {
        for &n in ns {
            let cell = |p: &str| {
                rows.iter()
                    .find(|r| r.mode == mode && r.n == n && r.path == p)
            };
            let others: Vec<&BenchRow> = ["naive", "chunked", "fused", "cpu_kernel", "baseline"]
                .iter()
                .filter_map(|p| cell(p))
                .collect();
            let Some(auto) = cell("auto") else { continue };
            let best_other = others
                .iter()
                .map(|r| r.median_ms)
                .fold(f64::INFINITY, f64::min);
            medians.push((mode.to_string(), n, auto.median_ms / best_other));
            let worst_pair = others
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
            paired.push((mode.to_string(), n, worst_pair));
        }
    }
    (medians, paired)
}
