//! Criterion benchmarks of the main attention cases, so that regressions show in `cargo bench`.
//! The full sweep with GFLOP/s, memory and plots is `sdpa bench`.

use burn::prelude::*;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sdpa::lab::bench::{forward_path, module, paths_for};
use sdpa::lab::context::normal_tensor;

fn attention(c: &mut Criterion) {
    let device = Device::flex();
    let (b, h, d) = (4, 8, 64);
    let mut group = c.benchmark_group("attention forward (flex, b=4, h=8, d=64)");
    group.sample_size(10);
    for n in [256usize, 1024] {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let q = normal_tensor(&mut rng, [b, h, n, d], &device);
        let k = normal_tensor(&mut rng, [b, h, n, d], &device);
        let v = normal_tensor(&mut rng, [b, h, n, d], &device);
        for (name, implementation) in paths_for(256, false) {
            let attn = implementation
                .map(module)
                .transpose()
                .expect("valid config");
            group.bench_with_input(BenchmarkId::new(name, n), &n, |bench, _| {
                bench.iter(|| {
                    forward_path(attn.as_ref(), q.clone(), k.clone(), v.clone())
                        .expect("valid input")
                        .slice(s![0..1, 0..1, 0..1, 0..1])
                        .into_data()
                })
            });
        }
    }
    group.finish();
}

fn attention_backward(c: &mut Criterion) {
    // Training: the autodiff device, where Auto takes the CPU kernel and its own backward pass.
    let device = Device::flex().autodiff();
    let (b, h, d, n) = (4, 8, 64, 512);
    let mut group = c.benchmark_group("attention forward+backward (flex, b=4, h=8, d=64)");
    group.sample_size(10);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let q = normal_tensor(&mut rng, [b, h, n, d], &device).require_grad();
    let k = normal_tensor(&mut rng, [b, h, n, d], &device).require_grad();
    let v = normal_tensor(&mut rng, [b, h, n, d], &device).require_grad();
    for (name, implementation) in paths_for(256, false) {
        let attn = implementation
            .map(module)
            .transpose()
            .expect("valid config");
        group.bench_with_input(BenchmarkId::new(name, n), &n, |bench, _| {
            bench.iter(|| {
                let out = forward_path(attn.as_ref(), q.clone(), k.clone(), v.clone())
                    .expect("valid input");
                let grads = out.sum().backward();
                q.grad(&grads)
                    .map(|g| g.slice(s![0..1, 0..1, 0..1, 0..1]).into_data())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, attention, attention_backward);
criterion_main!(benches);
