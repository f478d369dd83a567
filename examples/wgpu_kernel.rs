//! Times the CubeCL flash kernel (`cube_kernel`) against `Naive` on wgpu, forward and forward +
//! backward, at b = 4, h = 8, d = 64 (the `sdpa bench` sizes), to tune the kernel without the
//! whole bench. On a CPU-only machine wgpu runs on Mesa's lavapipe, a CPU driver: a proxy.
//!
//! ```sh
//! XDG_RUNTIME_DIR=/tmp/xdg cargo run --release --features wgpu --example wgpu_kernel -- 512 1024
//! ```
//!
//! How long on 2 cores: not measured as a whole; on lavapipe (2 cores) one forward + backward at n
//! 1024 takes about 1.2 s for the kernel and 3.7 s for `Naive` (`docs/bench/BENCH_wgpu.md`), plus
//! the shaders' first compilation.
//!
//! Arguments: sequence lengths n = m; `d=32` (or any head size) instead of 64; `kernel-only` to
//! skip `Naive`; `f16` for f16 inputs (the kernel computes in f32 and stores f16). With `SDPA_CUBE_ROWS=r` (1, 2, 4, 8, 16) the kernel gives every unit up to `r`
//! rows instead of its table's, which is how that table was measured:
//!
//! ```sh
//! for r in 1 2 4 8; do SDPA_CUBE_ROWS=$r XDG_RUNTIME_DIR=/tmp/xdg cargo run --release \
//!   --features wgpu --example wgpu_kernel -- d=128 kernel-only 1024; done
//! ```
//!
//! Inputs from a seeded N(0, 1); the paths take turns in each round; each prints the median of
//! its rounds with the minimum and maximum.

#[cfg(feature = "wgpu")]
fn main() -> anyhow::Result<()> {
    use std::time::Instant;

    use burn::prelude::*;
    use burn::tensor::Distribution;
    use sdpa::{AttentionInput, BackendKind, Implementation, ScaledDotProductAttentionConfig};

    /// Rounds per size and mode; every path runs once per round.
    const ROUNDS: usize = 5;

    let (mut ns, mut d, mut kernel_only) = (Vec::new(), 64, false);
    let mut dtype = burn::tensor::DType::F32;
    for arg in std::env::args().skip(1) {
        if arg == "kernel-only" {
            kernel_only = true;
        } else if arg == "f16" {
            dtype = burn::tensor::DType::F16;
        } else if let Some(size) = arg.strip_prefix("d=") {
            d = size
                .parse::<usize>()
                .map_err(|e| anyhow::anyhow!("d={size}: {e}"))?;
        } else {
            ns.push(arg.parse::<usize>().map_err(|e| {
                anyhow::anyhow!("{arg}: arguments are sizes n = m, d=N, kernel-only or f16 ({e})")
            })?);
        }
    }
    let ns = if ns.is_empty() { vec![512] } else { ns };
    let device = BackendKind::Wgpu.device()?.autodiff();
    device.seed(7);
    let (b, h) = (4, 8);
    let rows = std::env::var("SDPA_CUBE_ROWS").unwrap_or_else(|_| "from the table".into());
    println!(
        "wgpu kernel: b = {b}, h = {h}, d = {d}, {dtype:?}, seed 7, {ROUNDS} rounds, rows per unit {rows}"
    );
    let paths: &[Implementation] = if kernel_only {
        &[Implementation::CubeKernel]
    } else {
        &[Implementation::CubeKernel, Implementation::Naive]
    };
    for n in ns {
        let [q, k, v] = [0; 3].map(|_| {
            Tensor::<4>::random([b, h, n, d], Distribution::Normal(0.0, 1.0), &device).cast(dtype)
        });
        for backward in [false, true] {
            let mut times = vec![Vec::new(); paths.len()];
            // One untimed round compiles the shaders.
            for round in 0..=ROUNDS {
                for (path_idx, &implementation) in paths.iter().enumerate() {
                    let attention = ScaledDotProductAttentionConfig::new()
                        .with_implementation(implementation)
                        .init();
                    let leaf = |t: &Tensor<4>| {
                        if backward {
                            t.clone().require_grad()
                        } else {
                            t.clone().detach()
                        }
                    };
                    let (ql, kl, vl) = (leaf(&q), leaf(&k), leaf(&v));
                    let start = Instant::now();
                    let out = attention
                        .try_forward(AttentionInput::new(ql.clone(), kl.clone(), vl.clone()))?
                        .context;
                    if backward {
                        let grads = out.sum().backward();
                        for t in [&ql, &kl, &vl] {
                            let g = t
                                .grad(&grads)
                                .ok_or_else(|| anyhow::anyhow!("missing gradient"))?;
                            let _ = g.slice([0..1, 0..1, 0..1, 0..1]).into_data();
                        }
                    } else {
                        let _ = out.slice([0..1, 0..1, 0..1, 0..1]).into_data();
                    }
                    device
                        .sync()
                        .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))?;
                    if round > 0 {
                        times[path_idx].push(start.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            let mode = if backward {
                "forward+backward"
            } else {
                "forward"
            };
            for (path_idx, implementation) in paths.iter().enumerate() {
                let t = &mut times[path_idx];
                t.sort_by(f64::total_cmp);
                println!(
                    "n = {n:5}  {mode:16}  {:12}  {:9.1} ms  [{:.1}, {:.1}]",
                    implementation.to_string(),
                    t[t.len() / 2],
                    t[0],
                    t[t.len() - 1]
                );
            }
        }
    }
    Ok(())
}

#[cfg(not(feature = "wgpu"))]
fn main() {
    eprintln!(
        "this example needs the wgpu feature: cargo run --release --features wgpu --example wgpu_kernel"
    );
    std::process::exit(2);
}
