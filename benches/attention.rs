//! `cargo bench`: the main attention cases on flex, so that a regression shows without the full
//! sweep (that is `sdpa bench`, with GFLOP/s, memory and plots). A plain harness on top of the
//! bench's own timing, without a benchmarking crate: criterion's dependencies change the features
//! of crates Burn depends on, which made every `cargo bench` (and `cargo test`) rebuild Burn.

use std::time::Instant;

use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sdpa::lab::bench::{BenchInputs, module, paths_for, run_once};
use sdpa::lab::stats::median;

/// Timed runs per case, after one warm-up.
const RUNS: usize = 7;

fn main() -> anyhow::Result<()> {
    // `cargo bench -- NAME` filters on the case name; `cargo test --benches` passes `--bench`.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let (b, h, d) = (4, 8, 64);
    println!("attention on flex, b = {b}, h = {h}, d = {d}: median of {RUNS} runs (ms)");
    for (backward, n) in [(false, 256), (false, 1024), (true, 512)] {
        let device = if backward {
            Device::flex().autodiff()
        } else {
            Device::flex()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
        let cell = BenchInputs::new(&mut rng, [b, h, n, d], None, &device);
        // Flex only: no CubeCL kernel.
        for (name, implementation) in paths_for(256, false, false) {
            let case = format!(
                "{} {name} n={n}",
                if backward {
                    "forward+backward"
                } else {
                    "forward"
                }
            );
            if filter.as_ref().is_some_and(|f| !case.contains(f.as_str())) {
                continue;
            }
            let attn = implementation.map(module).transpose()?;
            run_once(attn.as_ref(), &cell, backward)?;
            let times: Vec<f64> = (0..RUNS)
                .map(|_| {
                    let start = Instant::now();
                    run_once(attn.as_ref(), &cell, backward)
                        .map(|()| start.elapsed().as_secs_f64() * 1e3)
                })
                .collect::<Result<_, _>>()?;
            println!("{case:<40} {:>10.2}", median(&times));
        }
    }
    Ok(())
}
