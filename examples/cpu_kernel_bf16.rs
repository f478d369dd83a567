//! Times the CPU attention kernel on bf16 host data against the same kernel on f32, forward
//! and backward (no Burn tensors, no host copies), and prints which tile products the bf16
//! kernel ran with (`amx` where the CPU has AMX-BF16 and the OS grants its tile state,
//! `avx512_bf16` where it has AVX512_BF16, `portable` otherwise; `SDPA_BF16_ISA=avx512_bf16` or
//! `=portable` caps the choice).
//!
//! ```sh
//! cargo run --release --example cpu_kernel_bf16            # n = 1024
//! cargo run --release --example cpu_kernel_bf16 -- 512 2048
//! cargo run --release --example cpu_kernel_bf16 -- b=64 h=2 d=32 512   # the model's shape
//! cargo run --release --example cpu_kernel_bf16 -- only=bf16            # one type (to profile it)
//! ```
//!
//! How long on 2 cores: not measured as a whole; 9 rounds of each type's forward and backward at
//! each n (at n 1024 a call takes 17 to 91 ms on 2 cores of an AMD EPYC Zen 5,
//! `docs/bench/BENCH_cpu.md`).
//!
//! b = 4, h = 8, d = 64 by default (the `sdpa bench` sizes), inputs from a seeded N(0, 1) rounded to bf16
//! (the f32 run reads the same values); the two types take turns in each round, the order
//! swapped every round, and each gets the median of its rounds.

use std::time::Instant;

use burn::tensor::bf16;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use sdpa::AttentionError;
use sdpa::cpu_kernel::AttentionDims;
use sdpa::cpu_kernel::{
    BACKWARD_TILES, BackwardInputs, BackwardOutputs, KernelShape, Masking, Tiles, bf16_product_isa,
    cpu_features, threads, try_backward, try_backward_bf16, try_forward, try_forward_bf16,
};

/// Timed rounds per size (after one warm-up round).
const ROUNDS: usize = 9;

/// Host buffers of one size, in both types.
struct Data {
    shape: KernelShape,
    q: (Vec<f32>, Vec<bf16>),
    k: (Vec<f32>, Vec<bf16>),
    v: (Vec<f32>, Vec<bf16>),
    grad_out: (Vec<f32>, Vec<bf16>),
}

fn main() -> anyhow::Result<()> {
    // Buffers kept on the heap, as in the `sdpa` binary (src/allocator.rs).
    sdpa::tune_allocator();
    // Arguments: sizes n = m, and `b=B`, `h=H`, `d=D` for the other sizes.
    let (mut b, mut h, mut d) = (4, 8, 64);
    // Which types run: [f32, bf16].
    let mut runs = [true, true];
    let mut ns = Vec::new();
    for arg in std::env::args().skip(1) {
        let parse = |text: &str| {
            text.parse::<usize>().map_err(|e| {
                anyhow::anyhow!("`{arg}`: arguments are n, b=B, h=H, d=D or only=f32|bf16 ({e})")
            })
        };
        match arg.split_once('=') {
            Some(("b", value)) => b = parse(value)?,
            Some(("h", value)) => h = parse(value)?,
            Some(("d", value)) => d = parse(value)?,
            Some(("only", "f32")) => runs = [true, false],
            Some(("only", "bf16")) => runs = [false, true],
            _ => ns.push(parse(&arg)?),
        }
    }
    let ns = if ns.is_empty() { vec![1024] } else { ns };
    println!(
        "cpu_kernel f32 vs bf16: b = {b}, h = {h}, d = {d}, seed 7, {ROUNDS} rounds, {} threads; \
         CPU features: {}; bf16 tile products: {}",
        threads(),
        cpu_features().join(", "),
        bf16_product_isa()
    );
    println!("\n| n | mode | f32 ms (GFLOP/s) | bf16 ms (GFLOP/s) | f32 / bf16 |");
    println!("|---|---|---|---|---|");
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
        let mut normal = || {
            let values: Vec<bf16> = (0..len)
                .map(|_| bf16::from_f32(StandardNormal.sample(&mut rng)))
                .collect();
            (values.iter().map(|x| x.to_f32()).collect(), values)
        };
        let data = Data {
            shape,
            q: normal(),
            k: normal(),
            v: normal(),
            grad_out: normal(),
        };
        // [f32, bf16] × [forward, forward + backward]
        let mut times = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        for round in 0..=ROUNDS {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for dtype_idx in order.into_iter().filter(|&idx| runs[idx]) {
                let (forward, both) = time(&data, dtype_idx == 1)?;
                // Round 0 is the warm-up.
                if round > 0 {
                    times[dtype_idx][0].push(forward);
                    times[dtype_idx][1].push(both);
                }
            }
        }
        let flop = 4.0 * (b * h * n * n * d) as f64;
        for (mode_idx, (mode, flop)) in [("forward", flop), ("forward + backward", 3.0 * flop)]
            .into_iter()
            .enumerate()
        {
            let f32_ms = median(&mut times[0][mode_idx]);
            let bf16_ms = median(&mut times[1][mode_idx]);
            println!(
                "| {n} | {mode} | {:.1} ({:.0}) | {:.1} ({:.0}) | {:.2}× |",
                f32_ms * 1e3,
                flop / f32_ms / 1e9,
                bf16_ms * 1e3,
                flop / bf16_ms / 1e9,
                f32_ms / bf16_ms
            );
        }
    }
    Ok(())
}

/// The kernel's forward pass on one storage type (`try_forward` or `try_forward_bf16`).
type Forward<T> = fn(
    &KernelShape,
    Tiles,
    &Masking<'_>,
    &[T],
    &[T],
    &[T],
    &mut [T],
    Option<&mut [f32]>,
) -> Result<(), AttentionError>;

/// The kernel's backward pass on one storage type (`try_backward` or `try_backward_bf16`).
type Backward<T> = fn(
    &KernelShape,
    Tiles,
    &Masking<'_>,
    BackwardInputs<'_, T>,
    BackwardOutputs<'_>,
) -> Result<(), AttentionError>;

/// Seconds of one forward pass and of one forward + backward pass, in f32 or in bf16.
fn time(data: &Data, in_bf16: bool) -> anyhow::Result<(f64, f64)> {
    let (q, k, v, grad_out) = (&data.q, &data.k, &data.v, &data.grad_out);
    if in_bf16 {
        let inputs = [&q.1[..], &k.1, &v.1, &grad_out.1];
        time_as(
            &data.shape,
            inputs,
            bf16::ZERO,
            try_forward_bf16,
            try_backward_bf16,
        )
    } else {
        let inputs = [&q.0[..], &k.0, &v.0, &grad_out.0];
        time_as(&data.shape, inputs, 0.0f32, try_forward, try_backward)
    }
}

/// [`time`] on `[q, k, v, grad_out]` stored in `T`.
fn time_as<T: Copy>(
    shape: &KernelShape,
    [q, k, v, grad_out]: [&[T]; 4],
    zero: T,
    forward_pass: Forward<T>,
    backward_pass: Backward<T>,
) -> anyhow::Result<(f64, f64)> {
    let d = shape.dims;
    let len = d.batch * d.n_heads * d.n * d.d_v;
    let mut lse = vec![0.0f32; d.batch * d.n_heads * d.n];
    let (mut dq, mut dk, mut dv) = (vec![0.0; len], vec![0.0; len], vec![0.0; len]);
    let masking = &Masking::default();
    let tiles = Tiles::for_keys(d.m);
    let start = Instant::now();
    let mut out = vec![zero; len];
    forward_pass(shape, tiles, masking, q, k, v, &mut out, Some(&mut lse))?;
    let forward = start.elapsed().as_secs_f64();
    let inputs = BackwardInputs {
        q,
        k,
        v,
        out: &out,
        grad_out,
        lse: &lse,
    };
    let outputs = BackwardOutputs {
        grad_q: &mut dq,
        grad_k: &mut dk,
        grad_v: &mut dv,
        grad_scores: None,
    };
    backward_pass(shape, BACKWARD_TILES, masking, inputs, outputs)?;
    Ok((forward, start.elapsed().as_secs_f64()))
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    // NaN for a type that did not run (`only=`).
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}
