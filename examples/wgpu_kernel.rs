//! Times the CubeCL flash kernel (`cube_kernel`) against `Naive` on wgpu, forward and forward +
//! backward, at b = 4, h = 8, d = 64 (the `sdpa bench` sizes), to tune the kernel without the
//! whole bench. On a CPU-only machine wgpu runs on Mesa's lavapipe, a CPU driver: a proxy.
//!
//! ```sh
//! XDG_RUNTIME_DIR=/tmp/xdg cargo run --release --features wgpu --example wgpu_kernel -- 512 1024
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

    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("arguments are sizes n = m: {e}"))?;
    let ns = if ns.is_empty() { vec![512] } else { ns };
    let device = BackendKind::Wgpu.device()?.autodiff();
    device.seed(7);
    let (b, h, d) = (4, 8, 64);
    println!("wgpu kernel: b = {b}, h = {h}, d = {d}, seed 7, {ROUNDS} rounds");
    let paths = [Implementation::CubeKernel, Implementation::Naive];
    for n in ns {
        let [q, k, v] = [0; 3]
            .map(|_| Tensor::<4>::random([b, h, n, d], Distribution::Normal(0.0, 1.0), &device));
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
