//! The CPU's own ceiling for the kernel's tile products: loops of independent `VFMADD231PS zmm`
//! (f32) and `VDPBF16PS zmm` (bf16 pairs) on one core, and on every core of the pool at once, in
//! GFLOP/s (an FMA is 2 flops, a pair dot product into a lane 4). No memory is touched, so this is
//! the bound no product can pass; the kernel's GFLOP/s in `docs/bench/` are read against it.
//!
//! ```sh
//! cargo run --release --example cpu_peak
//! ```
//!
//! How long on 2 cores: not measured: 20 million iterations of each loop, on one core and then on
//! every core.
//!
//! Prints nothing but a note on CPUs without AVX-512 (the f32 line) or AVX512_BF16 (the bf16
//! line).

use std::time::Instant;

/// Independent accumulators per loop (more than the instructions' latency × throughput).
const CHAINS: usize = 12;
/// A peak loop: its name, whether this CPU runs it, and the loop (GFLOP/s on this thread).
#[cfg(target_arch = "x86_64")]
type Loop = (&'static str, bool, fn() -> f64);

/// Loop iterations per timing.
const ITERATIONS: usize = 20_000_000;

fn main() {
    sdpa::tune_allocator();
    let threads = sdpa::cpu_kernel::threads();
    println!(
        "CPU features: {}; {threads} threads",
        sdpa::cpu_kernel::cpu_features().join(", ")
    );
    #[cfg(target_arch = "x86_64")]
    {
        let have = |f: &str| sdpa::cpu_kernel::cpu_features().contains(&f);
        let kinds: &[Loop] = &[
            (
                "f32 FMA (VFMADD231PS zmm)",
                have("avx512f"),
                x86::fma_gflops,
            ),
            (
                "bf16 pairs (VDPBF16PS zmm)",
                have("avx512f") && have("avx512_bf16"),
                x86::dpbf16_gflops,
            ),
        ];
        for &(name, available, measure) in kinds {
            if !available {
                println!("{name}: not on this CPU");
                continue;
            }
            let one = (0..3).map(|_| measure()).fold(0.0f64, f64::max);
            // One loop per thread, all at once.
            let all: f64 = (0..3)
                .map(|_| {
                    std::thread::scope(|scope| {
                        let loops: Vec<_> = (0..threads).map(|_| scope.spawn(measure)).collect();
                        loops
                            .into_iter()
                            .map(|l| l.join().unwrap_or(0.0))
                            .sum::<f64>()
                    })
                })
                .fold(0.0f64, f64::max);
            println!("{name}: {one:.0} GFLOP/s on one core, {all:.0} on {threads} threads");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("the peak loops are written for x86-64 only");
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m512, __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps,
        _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps,
    };

    use super::{CHAINS, ITERATIONS, Instant};

    /// GFLOP/s of the FMA loop on this thread.
    pub fn fma_gflops() -> f64 {
        // SAFETY: called only where the CPU reports AVX-512F (`main` checks).
        let (seconds, sink) = unsafe { fma_loop() };
        std::hint::black_box(sink);
        (ITERATIONS * CHAINS * 16 * 2) as f64 / seconds / 1e9
    }

    /// GFLOP/s of the bf16 pair loop on this thread.
    pub fn dpbf16_gflops() -> f64 {
        // SAFETY: called only where the CPU reports AVX-512F and AVX512_BF16 (`main` checks).
        let (seconds, sink) = unsafe { dpbf16_loop() };
        std::hint::black_box(sink);
        (ITERATIONS * CHAINS * 16 * 4) as f64 / seconds / 1e9
    }

    #[target_feature(enable = "avx512f")]
    fn fma_loop() -> (f64, f32) {
        let mut acc: [__m512; CHAINS] = [_mm512_setzero_ps(); CHAINS];
        // Values opaque to the compiler, so that the loop is not folded away.
        let a = _mm512_set1_ps(std::hint::black_box(1.0));
        let b = _mm512_set1_ps(std::hint::black_box(1e-30));
        let start = Instant::now();
        for _ in 0..ITERATIONS {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(a, b, *x);
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        (seconds, acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum())
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    fn dpbf16_loop() -> (f64, f32) {
        let mut acc: [__m512; CHAINS] = [_mm512_setzero_ps(); CHAINS];
        // bf16 1.0 pairs against tiny pairs, opaque to the compiler.
        let a = _mm512_set1_epi32(std::hint::black_box(0x3f80_3f80));
        let b = _mm512_set1_epi32(std::hint::black_box(0x0001_0001));
        let start = Instant::now();
        for _ in 0..ITERATIONS {
            for x in acc.iter_mut() {
                *x = dot_pairs(*x, a, b);
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        (seconds, acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum())
    }

    /// `VDPBF16PS` on two vectors of 32 bf16 values held as integer vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn dot_pairs(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        // SAFETY: __m512i and __m512bh are both 512 bits of plain data.
        let (a, b) = unsafe {
            (
                core::mem::transmute::<__m512i, __m512bh>(a),
                core::mem::transmute::<__m512i, __m512bh>(b),
            )
        };
        _mm512_dpbf16_ps(acc, a, b)
    }
}
