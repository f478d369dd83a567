//! Best-of-N GFLOP/s of gemm 0.19's f32 product `C = A · B` (row-major, C overwritten) at the
//! CPU kernel's tile sizes (single-threaded, as the kernel calls it) and at 2048³ (the ceiling,
//! single-threaded and on 2 threads). Build with and without `--features v4` to compare the
//! AVX-512 microkernels with the AVX2+FMA ones; the header says which were compiled in.

use std::time::Instant;

use gemm::{Parallelism, gemm};

/// Best GFLOP/s of `reps` products `[m, k] · [k, n]`.
fn gflops(m: usize, k: usize, n: usize, parallelism: Parallelism, reps: usize) -> f64 {
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let mut c = vec![0.0f32; m * n];
    let mut best = f64::MAX;
    for _ in 0..reps {
        let start = Instant::now();
        // SAFETY: a, b and c hold exactly [m, k], [k, n] and [m, n] row-major values, c is
        // borrowed mutably and aliases neither input.
        unsafe {
            gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * (m * n * k) as f64 / best / 1e9
}

fn main() {
    println!(
        "gemm 0.19 f32, x86-v4 microkernels compiled in: {}; CPU has avx512f: {}",
        cfg!(feature = "v4"),
        std::arch::is_x86_feature_detected!("avx512f")
    );
    println!("| m × k × n | threads | GFLOP/s (best) |");
    println!("|---|---|---|");
    let cells = [
        (2048, 2048, 2048, 2, 5),
        (2048, 2048, 2048, 1, 3),
        // the forward's tiles: scores [256, d] · [d, 256], then P [256, 256] · V [256, d]
        (256, 64, 256, 1, 400),
        (256, 256, 64, 1, 400),
        (256, 32, 256, 1, 400),
        (256, 256, 32, 1, 400),
        // the backward's tiles
        (128, 64, 128, 1, 1000),
        (128, 128, 64, 1, 1000),
    ];
    for (m, k, n, threads, reps) in cells {
        let parallelism = if threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        println!(
            "| {m} × {k} × {n} | {threads} | {:.0} |",
            gflops(m, k, n, parallelism, reps)
        );
    }
}
