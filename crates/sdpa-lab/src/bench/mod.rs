//! `sdpa bench`: the attention paths against each other and against a hand-written
//! matmul/softmax/matmul baseline, forward and forward+backward, unmasked and with a padding
//! mask, plus inference and training memory sweeps.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the sizes, the modes, the timing grid and Auto's ratios |
//! | `cell.rs` | one cell's inputs, the paths, one timed run |
//! | `timing.rs` | one cell timed: every path warmed up, then round-robin rounds |
//! | `sweeps.rs` | the memory sweeps (b = 1, long sequences) |
//! | `report.rs` | the Markdown tables, the JSON file and the plots |
//! | `folder.rs` | the folders the benches write into, and their manifest |

mod cell;
mod folder;
mod report;
mod sweeps;
mod timing;

use sdpa_model::Progress;
use serde::Serialize;

use burn_sdpa::{AttentionPath, BackendFamily, Implementation};

use crate::context::{LabBackend, LabError};
use crate::stats::median;
use cell::path_taken;
pub use cell::{BASELINE, BenchInputs, baseline, forward_path, module, paths, paths_for, run_once};
pub use folder::{BENCH_MANIFEST, BenchFolder};
pub use report::{file_names, markdown, write};
pub use sweeps::MemoryRow;
use timing::time_cell;

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
    /// The modes timed, by [`Mode::name`] (all six by default).
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
    /// The storage type of query, key and value: `f32`, or `bf16` / `f16` (drawn in f32, then
    /// rounded): the CPU kernel's half-precision paths on Flex; the flop counts are the same.
    pub dtype: String,
    /// The paths timed, by name (`auto`, `naive`, …); empty: every path.
    pub paths: Vec<String>,
    /// Whether each timed path runs once more for the host memory it adds
    /// ([`BenchRow::peak_mib`]); off on a GPU backend, whose tensors are not in the host's
    /// memory (the run would cost time and say nothing).
    pub peak_memory: bool,
}

impl BenchConfig {
    /// The benchmark's sizes (b = 4, h = 8, d = 64, n = m from 128 to 4096); `quick` shrinks them
    /// for a smoke run.
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
                dtype: "f32".into(),
                paths: Vec::new(),
                peak_memory: true,
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
                dtype: "f32".into(),
                paths: Vec::new(),
                peak_memory: true,
            }
        }
    }
}

impl BenchConfig {
    /// The most bytes one cell of this benchmark holds at once, about: in the timed sweep the
    /// naive path's `[b, h, n, n]` scores, weights, their gradients and the mask (6 copies) plus
    /// Q, K, V, the context and their gradients; in the memory sweeps the flash paths' O(n·d)
    /// tensors and the n×n ones up to [`naive_limit_bytes`](Self::naive_limit_bytes). `None`
    /// when the sizes overflow the arithmetic.
    pub fn memory_estimate(&self) -> Option<u64> {
        let (b, h, d) = (self.b as u128, self.h as u128, self.d as u128);
        let cell = |batch: u128, n: usize, square_cap: Option<u128>| -> Option<u128> {
            let n = n as u128;
            let square = batch
                .checked_mul(h)?
                .checked_mul(n)?
                .checked_mul(n)?
                .checked_mul(6 * 4)?;
            let square = square_cap.map_or(square, |cap| square.min(cap));
            let linear = batch
                .checked_mul(h)?
                .checked_mul(n)?
                .checked_mul(d)?
                .checked_mul(10 * 4)?;
            square.checked_add(linear)
        };
        let cap = Some(u128::from(self.naive_limit_bytes));
        let timed = self.ns.iter().map(|&n| cell(b, n, None));
        let swept = self
            .memory_ns
            .iter()
            .chain(&self.training_memory_ns)
            .map(|&n| cell(1, n, cap));
        timed
            .chain(swept)
            .try_fold(0u128, |most, c| Some(most.max(c?)))
            .map(|bytes| u64::try_from(bytes).unwrap_or(u64::MAX))
    }
}

impl BenchConfig {
    /// The bytes of the inputs of the largest timed cell as they are drawn on the host (q, k, v
    /// `[b, h, n, d]` in f32), the host's share of a cell on a GPU backend; `None` when the
    /// sizes overflow the arithmetic.
    pub fn input_bytes(&self) -> Option<u64> {
        let n = self.ns.iter().max().copied().unwrap_or(0);
        let bytes = [self.b, self.h, n, self.d, 3 * 4]
            .into_iter()
            .try_fold(1u128, |acc, x| acc.checked_mul(x as u128))?;
        u64::try_from(bytes).ok()
    }
}

/// Which keys a timed mode hides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    /// None.
    Dense,
    /// A padding mask hiding [`BenchConfig::padded_fraction`] of the keys of every batch element.
    Padded,
    /// Causal masking (n = m): the most common training case.
    Causal,
    /// [`PACKED_DOCUMENTS`] causal documents packed into each row, given as segment ids (the CPU
    /// kernel skips the tiles between documents).
    Packed,
    /// The same documents given as a dense block-diagonal `[b, 1, n, n]` bool mask (what was
    /// possible before segments): the baseline the packed mode is measured against.
    PackedAsMask,
}

/// Documents per row in the packed modes (8 documents of 128 tokens at n = 1024).
pub const PACKED_DOCUMENTS: usize = 8;

/// A timed mode: forward or forward + backward, dense, padded or causal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Forward + backward on an autodiff device.
    pub backward: bool,
    /// Which keys are hidden.
    pub masking: MaskKind,
}

impl Mode {
    /// The ten modes, in report order.
    pub const ALL: [Mode; 10] = [
        Mode {
            backward: false,
            masking: MaskKind::Dense,
        },
        Mode {
            backward: true,
            masking: MaskKind::Dense,
        },
        Mode {
            backward: false,
            masking: MaskKind::Padded,
        },
        Mode {
            backward: true,
            masking: MaskKind::Padded,
        },
        Mode {
            backward: false,
            masking: MaskKind::Causal,
        },
        Mode {
            backward: true,
            masking: MaskKind::Causal,
        },
        Mode {
            backward: false,
            masking: MaskKind::Packed,
        },
        Mode {
            backward: true,
            masking: MaskKind::Packed,
        },
        Mode {
            backward: false,
            masking: MaskKind::PackedAsMask,
        },
        Mode {
            backward: true,
            masking: MaskKind::PackedAsMask,
        },
    ];

    /// As written in the report: `forward`, `forward+backward`, `forward, padded`,
    /// `forward+backward, causal`, ...
    pub fn name(self) -> &'static str {
        match (self.backward, self.masking) {
            (false, MaskKind::Dense) => "forward",
            (true, MaskKind::Dense) => "forward+backward",
            (false, MaskKind::Padded) => "forward, padded",
            (true, MaskKind::Padded) => "forward+backward, padded",
            (false, MaskKind::Causal) => "forward, causal",
            (true, MaskKind::Causal) => "forward+backward, causal",
            (false, MaskKind::Packed) => "forward, packed",
            (true, MaskKind::Packed) => "forward+backward, packed",
            (false, MaskKind::PackedAsMask) => "forward, packed as a mask",
            (true, MaskKind::PackedAsMask) => "forward+backward, packed as a mask",
        }
    }

    /// Whether a mask hides keys (the hand-written baseline takes none).
    pub fn masked(self) -> bool {
        self.masking != MaskKind::Dense
    }

    /// Flops per (b·h·n·m·d): 4 forward, 12 forward + backward — the dense count, also for the
    /// padded modes, so that their GFLOP/s compare with the unmasked ones at equal work asked;
    /// half of it for the causal modes, the work a causal kernel must do (PyTorch's and
    /// FlashAttention's convention).
    fn flops_per_element(self) -> f64 {
        let dense = if self.backward { 12.0 } else { 4.0 };
        if self.masking == MaskKind::Causal {
            dense / 2.0
        } else if matches!(self.masking, MaskKind::Packed | MaskKind::PackedAsMask) {
            // Each query sees about half of its own document: 1 / (2 · documents) of the row.
            dense / (2.0 * PACKED_DOCUMENTS as f64)
        } else {
            dense
        }
    }
}

/// One timed cell.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// An [`Implementation::name`](burn_sdpa::Implementation::name) or [`BASELINE`].
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
    /// The CPU's SIMD features, detected at run time (`burn_sdpa::cpu_kernel::cpu_features`).
    pub cpu_features: Vec<&'static str>,
    /// What compiled the GPU backend's kernels (CUDA: PTX by LLVM, or CUDA C++ by NVRTC), as
    /// the binary that ran knows it; `None` on the CPU backends. Set by the caller.
    pub kernel_compiler: Option<String>,
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
    /// Paths that could not serve a cell, with the reason.
    pub skipped: Vec<String>,
}

/// How a benchmark shows progress, and its seed (where it writes: [`BenchFolder`]).
#[derive(Debug, Clone)]
pub struct BenchContext {
    /// How progress is shown.
    pub progress: sdpa_model::ProgressMode,
    /// The seed of the inputs.
    pub seed: u64,
}

impl BenchConfig {
    /// The modes asked for, in the order of [`Mode::ALL`].
    pub fn selected_modes(&self) -> Vec<Mode> {
        Mode::ALL
            .into_iter()
            .filter(|m| self.modes.iter().any(|name| name == m.name()))
            .collect()
    }

    /// How many (mode, path) cells one size times on a backend (`cube`: a CubeCL one): for each
    /// mode asked for, the paths asked for (all by default) that can run it. Zero: the bench
    /// would measure nothing.
    pub fn cells_per_size(&self, cube: bool) -> usize {
        self.selected_modes()
            .iter()
            .map(|m| {
                paths_for(self.block_size, m.masked(), cube)
                    .iter()
                    .filter(|(name, _)| {
                        self.paths.is_empty() || self.paths.iter().any(|p| p == name)
                    })
                    .count()
            })
            .sum()
    }
}

/// Runs the benchmark on one backend.
pub fn run_bench(
    backend: &LabBackend,
    config: &BenchConfig,
    ctx: &BenchContext,
) -> Result<BenchReport, LabError> {
    let (b, h, d) = (config.b, config.h, config.d);
    let modes = config.selected_modes();
    let cube = BackendFamily::of(&backend.device) == BackendFamily::CubeCl;
    let cells = config.cells_per_size(cube);
    let total = (config.ns.len() * cells
        + (config.memory_ns.len() + config.training_memory_ns.len()) * 3) as u64;
    let progress = Progress::new(ctx.progress, &format!("bench {}", backend.name), 0, total);
    let mut done = 0;
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut rng = crate::context::rng(ctx.seed, 5);
    for &n in &config.ns {
        for &mode in &modes {
            let device = if mode.backward {
                backend.device.clone().autodiff()
            } else {
                backend.device.clone()
            };
            let padded = (mode.masking == MaskKind::Padded).then_some(config.padded_fraction);
            let mut cell = BenchInputs::new(&mut rng, [b, h, n, d], padded, &device).stored(config);
            match mode.masking {
                MaskKind::Causal => cell = cell.causal(),
                MaskKind::Packed => cell = cell.causal().packed(PACKED_DOCUMENTS, false)?,
                MaskKind::PackedAsMask => cell = cell.causal().packed(PACKED_DOCUMENTS, true)?,
                MaskKind::Dense | MaskKind::Padded => {}
            }
            rows.extend(time_cell(config, mode, n, &cell, &mut skipped, |row| {
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
        cpu_features: burn_sdpa::cpu_kernel::cpu_features(),
        kernel_compiler: None,
        config: config.clone(),
        rows,
        memory,
        training_memory,
        auto_ratio,
        auto_ratio_paired,
        skipped,
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
            let others: Vec<&BenchRow> = AttentionPath::all(Implementation::DEFAULT_BLOCK_SIZE)
                .map(AttentionPath::name)
                .into_iter()
                .chain([BASELINE])
                .filter_map(cell)
                .collect();
            let Some(auto) = cell("auto") else { continue };
            if others.is_empty() {
                continue; // only Auto was timed
            }
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
