//! The memory sweeps: one run per (path, n) at b = 1 and long sequences, inference or forward +
//! backward, with the peak resident memory the run added.

use std::time::Instant;

use burn_sdpa::Implementation;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{BenchConfig, BenchInputs, module, path_taken, run_once};
use crate::context::{LabBackend, LabError};
use crate::memory::measure_peak;

/// One cell of a memory sweep.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// `chunked`, `auto`, `naive` or `cpu_kernel`.
    pub path: String,
    /// n = m.
    pub n: usize,
    /// Time of the run (s), if it ran.
    pub seconds: Option<f64>,
    /// Peak resident memory added (MiB), if it ran.
    pub peak_mib: Option<f64>,
    /// Why it did not run.
    pub skipped: Option<String>,
    /// The path the module actually took.
    pub takes: Option<String>,
}

/// The sweep of `config.memory_ns` (inference) or `config.training_memory_ns` (forward +
/// backward) on one backend: `auto`, `chunked` and `naive` (in that order), each reporting a line
/// through `line`.
///
/// Paths that hold n×n tensors are skipped once those would exceed
/// [`BenchConfig::naive_limit_bytes`]: the naive path always, and in training the chunked path
/// too, whose autodiff graph keeps every block's weights for the backward pass.
pub(super) fn sweep(
    backend: &LabBackend,
    config: &BenchConfig,
    backward: bool,
    rng: &mut ChaCha8Rng,
    line: &mut impl FnMut(String),
) -> Result<Vec<MemoryRow>, LabError> {
    let (h, d) = (config.h, config.d);
    let ns = if backward {
        &config.training_memory_ns
    } else {
        &config.memory_ns
    };
    let kind = if backward {
        "training memory"
    } else {
        "memory"
    };
    let mut rows = Vec::new();
    for &n in ns {
        let device = if backward {
            backend.device.clone().autodiff()
        } else {
            backend.device.clone()
        };
        let cell = BenchInputs::new(rng, [1, h, n, d], None, &device).stored(config);
        // `auto` first: the resident high-water mark cannot see buffers a path reuses, so the
        // path with the smallest footprint runs before the others have grown the process's
        // (and, on wgpu, the device's memory pools') buffers.
        let chunked = Implementation::Chunked {
            block_size: config.block_size,
        };
        // The memory sweep compares the O(n) paths with the one that materializes n×n.
        for implementation in [Implementation::Auto, chunked, Implementation::Naive] {
            let name = implementation.name();
            // Scores, weights and the softmax's temporaries (and their gradients in training).
            let copies = if backward { 4 } else { 3 };
            let need = copies * (h * n * n * 4) as u64;
            let holds_scores =
                implementation == Implementation::Naive || (backward && implementation == chunked);
            if holds_scores && need > config.naive_limit_bytes {
                rows.push(MemoryRow {
                    path: name.into(),
                    n,
                    seconds: None,
                    peak_mib: None,
                    takes: None,
                    skipped: Some(format!(
                        "its n×n tensors would need ≈ {:.1} GiB (limit {:.0} GiB)",
                        need as f64 / (1u64 << 30) as f64,
                        config.naive_limit_bytes as f64 / (1u64 << 30) as f64
                    )),
                });
                line(format!("{kind} {name} n={n}: skipped"));
                continue;
            }
            let attn = module(implementation)?;
            let takes = Some(path_taken(&attn, &cell)?);
            let t = Instant::now();
            let (r, peak) = measure_peak(|| run_once(Some(&attn), &cell, backward));
            if let Err(e) = r {
                // A device that cannot hold the path's buffers (lavapipe refuses a 2 GiB buffer)
                // is a finding of the sweep, not the end of the run.
                let reason = one_line(&e.to_string());
                line(format!("{kind} {name} n={n}: failed: {reason}"));
                rows.push(MemoryRow {
                    path: name.into(),
                    n,
                    seconds: None,
                    peak_mib: None,
                    takes,
                    skipped: Some(format!("it failed on the device: {reason}")),
                });
                continue;
            }
            let secs = t.elapsed().as_secs_f64();
            let peak_mib = peak.map(|p| p as f64 / (1u64 << 20) as f64);
            line(format!(
                "{kind} {name} n={n}: {secs:.1} s, peak +{:.0} MiB",
                peak_mib.unwrap_or(f64::NAN)
            ));
            rows.push(MemoryRow {
                path: name.into(),
                n,
                seconds: Some(secs),
                peak_mib,
                skipped: None,
                takes,
            });
        }
    }
    Ok(rows)
}

/// A device's error chain on one line: its first and last (root-cause) lines, without the
/// backtrace notes.
pub(super) fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("backtrace") && !l.starts_with("Asked at"))
        .collect();
    match lines.as_slice() {
        [] => String::new(),
        [one] => (*one).to_string(),
        [first, .., last] => format!("{first} … {last}"),
    }
}
