//! One cell of the timing grid: every path that can serve it warmed up (a path the device
//! cannot run is skipped with its reason), then timed in round-robin rounds.

use std::time::Instant;

use burn_sdpa::BackendFamily;

use super::cell::path_taken;
use super::{BenchConfig, BenchInputs, BenchRow, Mode, module, paths_for, run_once, sweeps};
use crate::context::LabError;
use crate::memory::measure_peak;
use crate::stats::median;

/// Times every path of one (mode, n) cell: a warm-up each, then rounds in which every path runs
/// once, until each has enough runs; then one more run each for its peak memory.
pub(super) fn time_cell(
    config: &BenchConfig,
    mode: Mode,
    n: usize,
    cell: &BenchInputs,
    skipped: &mut Vec<String>,
    mut report: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, LabError> {
    let mut attns = Vec::new();
    let cube = BackendFamily::of(&cell.q.device()) == BackendFamily::CubeCl;
    for (name, implementation) in paths_for(config.block_size, mode.masked(), cube) {
        if !(config.paths.is_empty() || config.paths.iter().any(|p| p == name)) {
            continue;
        }
        let attn = implementation.map(module).transpose()?;
        // A path that cannot serve the cell (the CPU kernel under autodiff on a GPU backend,
        // Fused with a top-left causal mask, ...) is skipped with its reason, not the end of
        // the bench.
        if let Some(a) = &attn
            && let Err(e) = a.path(&cell.input(cell.q.clone(), cell.k.clone(), cell.v.clone()))
        {
            skipped.push(format!("{name}, {}, n = {n}: {e}", mode.name()));
            continue;
        }
        attns.push((name, attn));
    }
    // The warm-up: a path the device cannot run (a GPU out of memory for the naive path's n×n
    // scores, a kernel the driver refuses) is skipped with the device's reason, not the end of
    // the bench, whether the runtime returns the error or panics.
    attns.retain(
        |(name, attn)| match warm_up(attn.as_ref(), cell, mode.backward) {
            Ok(()) => true,
            Err(reason) => {
                skipped.push(format!(
                    "{name}, {}, n = {n}: it failed on the device: {reason}",
                    mode.name()
                ));
                false
            }
        },
    );
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
        let peak = if config.peak_memory {
            let (r, peak) = measure_peak(|| run_once(attn.as_ref(), cell, mode.backward));
            r?;
            peak
        } else {
            None
        };
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

/// One untimed run of a path on a cell: the device's error, or the message of a panic of its
/// runtime, on one line.
fn warm_up(
    attn: Option<&burn_sdpa::ScaledDotProductAttention>,
    cell: &BenchInputs,
    backward: bool,
) -> Result<(), String> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_once(attn, cell, backward)
    }));
    match run {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(sweeps::one_line(&e.to_string())),
        Err(panic) => Err(sweeps::one_line(
            &panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the runtime panicked".into()),
        )),
    }
}
