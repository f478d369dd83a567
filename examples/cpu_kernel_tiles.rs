//! Times the CPU attention kernel on host data (no Burn tensors, no host copies) for several
//! tile sizes, forward and backward, to tune `cpu_kernel::{QUERY_BLOCK, KEY_BLOCK}` and
//! `cpu_kernel::BACKWARD_TILES`, and to see how much of the module's time is the kernel itself.
//!
//! ```sh
//! cargo run --release --example cpu_kernel_tiles            # n = 1024
//! cargo run --release --example cpu_kernel_tiles -- 512 4096
//! ```
//!
//! How long on 2 cores: not measured as a whole; 15 rounds of every tile setting's forward and
//! backward at each n.
//!
//! b = 4, h = 8, d = 64 (the `sdpa bench` sizes), inputs from a seeded N(0, 1); the tile sizes
//! take turns in each round, and each gets the median of its rounds.

use std::time::Instant;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use sdpa::cpu_kernel::AttentionDims;
use sdpa::cpu_kernel::{
    BackwardInputs, BackwardOutputs, KernelShape, Masking, Tiles, attention_f32_tiled,
    try_backward, try_forward,
};

/// Rounds per size; every tile setting runs once per round.
const ROUNDS: usize = 15;

fn main() -> anyhow::Result<()> {
    // Buffers kept on the heap, as in the `sdpa` binary (src/allocator.rs).
    sdpa::tune_allocator();
    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("arguments are sizes n = m: {e}"))?;
    let ns = if ns.is_empty() { vec![1024] } else { ns };
    let tiles: Vec<Tiles> = [32, 64, 128, 256]
        .iter()
        .flat_map(|&query_block| {
            [128, 256, 512].map(|key_block| Tiles {
                query_block,
                key_block,
            })
        })
        .collect();
    let backward_tiles: Vec<Tiles> = [32, 64, 128]
        .iter()
        .flat_map(|&query_block| {
            [64, 128, 256].map(|key_block| Tiles {
                query_block,
                key_block,
            })
        })
        .collect();
    let (b, h, d) = (4, 8, 64);
    println!(
        "cpu_kernel tiles: b = {b}, h = {h}, d = {d}, seed 7, {ROUNDS} rounds, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for n in ns {
        let shape = KernelShape {
            dims: AttentionDims {
                batch: b,
                n_heads: h,
                n_kv_heads: h,
                n,
                m: n,
                d_k: d,
                d_v: d,
            },
            scale: 1.0 / (d as f32).sqrt(),
            causal_offset: None,
            softcap: None,
            window: None,
        };
        let len = b * h * n * d;
        let mut normal = || -> Vec<f32> {
            (0..len)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect::<Vec<f32>>()
        };
        let (q, k, v) = (normal(), normal(), normal());
        let mut out = vec![0.0f32; len];
        let mut times = vec![Vec::new(); tiles.len()];
        for round in 0..=ROUNDS {
            for (t, times) in tiles.iter().zip(times.iter_mut()) {
                let start = Instant::now();
                attention_f32_tiled(&shape, *t, &q, &k, &v, &mut out);
                // Round 0 is the warm-up.
                if round > 0 {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
        }
        let flop = 4.0 * (b * h * n * n * d) as f64;
        println!("\nforward, n = m = {n}: median ms (GFLOP/s)");
        table(&tiles, &mut times, flop);

        // The backward pass alone (8·b·h·n²·d flops), from one forward's output and log-sum-exp.
        let mut lse = vec![0.0f32; b * h * n];
        try_forward(
            &shape,
            Tiles::default(),
            &Masking::default(),
            &q,
            &k,
            &v,
            &mut out,
            Some(&mut lse),
        )?;
        let grad_out = normal();
        let (mut dq, mut dk, mut dv) = (vec![0.0; len], vec![0.0; len], vec![0.0; len]);
        let mut times = vec![Vec::new(); backward_tiles.len()];
        for round in 0..=ROUNDS {
            for (t, times) in backward_tiles.iter().zip(times.iter_mut()) {
                let start = Instant::now();
                try_backward(
                    &shape,
                    *t,
                    &Masking::default(),
                    BackwardInputs {
                        q: &q,
                        k: &k,
                        v: &v,
                        out: &out,
                        grad_out: &grad_out,
                        lse: &lse,
                    },
                    BackwardOutputs {
                        grad_q: &mut dq,
                        grad_k: &mut dk,
                        grad_v: &mut dv,
                        grad_scores: None,
                    },
                )?;
                if round > 0 {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
        }
        println!("\nbackward, n = m = {n}: median ms (GFLOP/s)");
        table(&backward_tiles, &mut times, 2.0 * flop);
    }
    Ok(())
}

/// Prints a Markdown table of median ms (GFLOP/s), one row per query block.
fn table(tiles: &[Tiles], times: &mut [Vec<f64>], flop: f64) {
    let width = tiles
        .iter()
        .filter(|t| t.query_block == tiles[0].query_block)
        .count();
    let header: Vec<String> = tiles[..width]
        .iter()
        .map(|t| t.key_block.to_string())
        .collect();
    println!("| query block \\ key block | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(width));
    for (row, chunk) in times.chunks_mut(width).enumerate() {
        let cells: Vec<String> = chunk
            .iter_mut()
            .map(|t| {
                t.sort_by(f64::total_cmp);
                let median = t[t.len() / 2];
                format!("{:.1} ({:.0})", median * 1e3, flop / median / 1e9)
            })
            .collect();
        println!(
            "| {} | {} |",
            tiles[row * width].query_block,
            cells.join(" | ")
        );
    }
}
