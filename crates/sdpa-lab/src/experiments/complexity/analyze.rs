//! `complexity`'s rows, claims and section.

use serde::Serialize;

use super::{ComplexityConfig, ComplexityResult, PathKind};
use crate::article;
use crate::claims::{Claim, Source, short};
use crate::experiment::{Analysis, Measured};
use crate::stats::{Estimate, exponent_ci, median};

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

/// One (path, n).
#[derive(Debug, Clone, Serialize)]
pub struct ComplexityRow {
    /// Path.
    pub path: PathKind,
    /// n = m.
    pub n: usize,
    /// Median forward time (ms).
    pub time_ms: f64,
    /// Every timed forward (ms).
    pub times_ms: Vec<f64>,
    /// Most heap MiB one forward held at once.
    pub allocated_mib: Option<f64>,
    /// Rise of the resident high-water mark (MiB).
    pub resident_mib: Option<f64>,
    /// The weights tensor b·h·n·m·4 bytes (MiB), for the path that materializes it.
    pub weights_mib: Option<f64>,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct ComplexityData {
    /// Batch, heads, head size.
    pub bhd: [usize; 3],
    /// Timed repetitions.
    pub reps: usize,
    /// Every row.
    pub rows: Vec<ComplexityRow>,
    /// The n the exponents are fitted over: n ≥ 1024, where one head's n × n scores no longer
    /// fit the caches (the three largest sizes when fewer than three are that large, as in
    /// `--quick`). Disclosed: until commit 18ac244 this was the three largest sizes of a
    /// doubling grid (1024, 2048, 4096), fixed after an earlier run's fit over `earlier_ns`
    /// straddled the band; the grid now adds 1448 and 2896 so that a fit with one point per
    /// size keeps three degrees of freedom.
    pub fit_ns: Vec<usize>,
    /// The window of that earlier run, n ≥ 512: kept beside it, since the three-largest window
    /// was chosen after seeing it.
    pub earlier_ns: Vec<usize>,
    /// Local time exponents of the materialized path between consecutive n: (n₁, n₂, exponent).
    pub local_exponents: Vec<(usize, usize, f64)>,
    /// The LLaMA-7B arithmetic.
    pub llama: MatrixMemory,
}

const MIB: f64 = (1u64 << 20) as f64;

/// Rows and claims.
pub fn analyze(cells: &[Measured<ComplexityConfig, ComplexityResult>]) -> Analysis<ComplexityData> {
    let rows: Vec<ComplexityRow> = cells
        .iter()
        .map(|c| {
            let [b, h, _] = c.config.bhd;
            ComplexityRow {
                path: c.config.path,
                n: c.config.n,
                time_ms: median(&c.result.times_ms),
                times_ms: c.result.times_ms.clone(),
                allocated_mib: c.result.peak_allocated.map(|x| x as f64 / MIB),
                resident_mib: c.result.peak_resident.map(|x| x as f64 / MIB),
                weights_mib: (c.config.path == PathKind::Materialized)
                    .then(|| (b * h * c.config.n * c.config.n * 4) as f64 / MIB),
            }
        })
        .collect();
    let mut ns: Vec<usize> = rows.iter().map(|r| r.n).collect();
    ns.sort();
    ns.dedup();
    // n ≥ 1024, where one head's n × n scores (4 MiB at 1024) no longer fit the caches; smaller n
    // bend the fit (see the local exponents).
    let large: Vec<usize> = ns.iter().filter(|&&n| n >= 1024).copied().collect();
    let fit_ns: Vec<usize> = if large.len() >= 3 {
        large
    } else {
        ns.iter().rev().take(3).rev().copied().collect()
    };
    let earlier_ns: Vec<usize> = ns.iter().filter(|&&n| n >= 512).copied().collect();
    let materialized: Vec<&ComplexityRow> = rows
        .iter()
        .filter(|r| r.path == PathKind::Materialized)
        .collect();
    let local_exponents = materialized
        .windows(2)
        .map(|w| {
            (
                w[0].n,
                w[1].n,
                (w[1].time_ms / w[0].time_ms).ln() / (w[1].n as f64 / w[0].n as f64).ln(),
            )
        })
        .collect();
    let first = cells.first().map(|c| &c.config);
    let data = ComplexityData {
        bhd: first.map_or([0; 3], |c| c.bhd),
        reps: first.map_or(0, |c| c.reps),
        rows,
        fit_ns,
        earlier_ns,
        local_exponents,
        llama: MatrixMemory::llama_7b(),
    };
    Analysis::new(claims(&data), data)
}

/// The growth exponent over `window`, one point per size: the median of its repeated timings
/// (the repeats of one size share its cache state and minute of the machine, so they are not
/// independent points of the fit), the interval from the scatter of the sizes about the line.
fn fit(
    data: &ComplexityData,
    window: &[usize],
    path: PathKind,
    pick: fn(&ComplexityRow) -> Vec<f64>,
) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = data
        .rows
        .iter()
        .filter(|r| r.path == path && window.contains(&r.n))
        .filter_map(|r| {
            let values: Vec<f64> = pick(r).into_iter().filter(|y| *y > 0.0).collect();
            (!values.is_empty()).then(|| (r.n as f64, median(&values)))
        })
        .unzip();
    exponent_ci(&xs, &ys)
}

/// Memory is deterministic (the same bytes every run): decided by the local exponents between
/// consecutive sizes of the fit range, all inside [1.7, 2.3], not by a regression interval.
fn memory_claim(data: &ComplexityData, range: &str) -> Claim {
    let held: Vec<(usize, f64)> = data
        .rows
        .iter()
        .filter(|r| r.path == PathKind::Materialized && data.fit_ns.contains(&r.n))
        .filter_map(|r| r.allocated_mib.map(|m| (r.n, m)))
        .collect();
    let local: Vec<f64> = held
        .windows(2)
        .map(|w| (w[1].1 / w[0].1).ln() / (w[1].0 as f64 / w[0].0 as f64).ln())
        .collect();
    Claim::decided(
        "memory-quadratic",
        Source::Article(&article::MEMORY_QUADRATIC),
        format!("its memory grows as n², the n × n weights ({range})"),
        "local exponents of the heap bytes one materialized forward holds at once (counting allocator) between consecutive n, all inside [1.7, 2.3]",
        format!(
            "{} (heap held: {})",
            local
                .iter()
                .map(|e| format!("{e:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            held.iter()
                .map(|(n, m)| format!("n = {n}: {m:.1} MiB"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (!local.is_empty() && local.len() + 1 == data.fit_ns.len())
            .then(|| local.iter().all(|e| (1.7..=2.3).contains(e))),
    )
    .fails_if("a local exponent outside [1.7, 2.3] (memory growing slower or faster than n²)")
}

/// The claims.
pub fn claims(data: &ComplexityData) -> Vec<Claim> {
    let gb = |x: u64| x as f64 / 1e9;
    let largest = data.rows.iter().map(|r| r.n).max().unwrap_or(0);
    let at = |p: PathKind| data.rows.iter().find(|r| r.path == p && r.n == largest);
    let (fast, slow) = (at(PathKind::Fastest), at(PathKind::Materialized));
    let range = format!("n ∈ {:?}", data.fit_ns);
    vec![
        Claim::in_range(
            "time-quadratic",
            Source::Article(&article::TIME_QUADRATIC),
            format!("attention's time grows as n² (fitted over {range}, band ±0.3)"),
            "fitted exponent of the materialized path's median time per size on n",
            fit(data, &data.fit_ns, PathKind::Materialized, |r| {
                r.times_ms.clone()
            }),
            1.7,
            2.3,
        ),
        Claim::in_range(
            "time-quadratic-earlier-window",
            Source::Lab,
            format!(
                "the same over n ∈ {:?}, the window of the lab's earlier report (n ≥ 512): the window \
                 above was chosen after that fit straddled the band, so both are shown",
                data.earlier_ns
            ),
            "fitted exponent of the materialized path's median time per size on n",
            fit(data, &data.earlier_ns, PathKind::Materialized, |r| {
                r.times_ms.clone()
            }),
            1.7,
            2.3,
        ),
        memory_claim(data, &range),
        Claim::within(
            "llama-per-layer",
            Source::Article(&article::LLAMA_PER_LAYER),
            "LLaMA-7B holds 2.1 GB of attention matrices per layer",
            "GB per layer",
            gb(data.llama.bytes_per_layer),
            2.1,
            0.06,
        )
        .cannot_fail("arithmetic on the model's published sizes, not a measurement"),
        Claim::within(
            "llama-all-layers",
            Source::Article(&article::LLAMA_ALL_LAYERS),
            "and 68 GB for its 32 layers",
            "GB for 32 layers",
            gb(data.llama.bytes_all_layers),
            68.0,
            1.0,
        )
        .cannot_fail("arithmetic on the model's published sizes, not a measurement"),
        Claim::decided(
            "fast-path-holds-no-matrix",
            Source::Article(&article::FLASH_NO_MATRIX),
            format!("a flash-style path never holds the n × n matrix (n = {largest})"),
            "the heap bytes the fastest path holds at once (counting allocator) are below the weights tensor's size",
            format!(
                "fastest path {} MiB, weights tensor {} MiB",
                fast.and_then(|r| r.allocated_mib)
                    .map_or("not measured".into(), short),
                slow.and_then(|r| r.weights_mib).map_or("–".into(), short)
            ),
            fast.and_then(|r| r.allocated_mib)
                .zip(slow.and_then(|r| r.weights_mib))
                .map(|(peak, weights)| peak < weights),
        )
        .fails_if("the fastest path holding at least the weights tensor's size at once"),
        Claim::in_range(
            "fast-path-time-still-quadratic",
            Source::Lab,
            format!(
                "the fastest path saves memory, not work: its time still grows as n² (fitted over {range})"
            ),
            "fitted exponent of the fastest path's median time per size on n",
            fit(data, &data.fit_ns, PathKind::Fastest, |r| {
                r.times_ms.clone()
            }),
            1.7,
            2.3,
        ),
    ]
}
