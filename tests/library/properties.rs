//! Property tests over random shapes, masks, biases, scales and head groupings, against the
//! float64 reference in `reference.rs`.

use burn::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, RngSeed};
use sdpa::{
    AttentionInput, CausalAlignment, Implementation, ScalePolicy, ScaledDotProductAttentionConfig,
    Window,
};

use crate::common::{
    bool4, cpu_devices, implementations, lcg_values, max_abs_diff, tensor4, values,
};
use crate::reference::{Problem, attention};

/// Everything needed to build one random problem.
#[derive(Debug, Clone)]
struct Spec {
    b: usize,
    h_kv: usize,
    group: usize,
    n: usize,
    m: usize,
    d_k: usize,
    d_v: usize,
    seed: u64,
    mask_kind: u8,
    bias: bool,
    causal: u8,
    scale_kind: u8,
    /// 0: no soft-cap; else the cap 0.5 · kind.
    softcap_kind: u8,
    /// 0: no window; else (left, right) from the seed's bits.
    window_kind: u8,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        (1..=2usize, 1..=2usize, 1..=3usize, 1..=5usize, 1..=6usize),
        (1..=8usize, 1..=5usize, any::<u64>()),
        (0..4u8, any::<bool>(), 0..3u8, 0..3u8),
        (0..3u8, 0..3u8),
    )
        .prop_map(
            |(
                (b, h_kv, group, n, m),
                (d_k, d_v, seed),
                (mask_kind, bias, causal, scale_kind),
                (softcap_kind, window_kind),
            )| {
                Spec {
                    b,
                    h_kv,
                    group,
                    n,
                    m,
                    d_k,
                    d_v,
                    seed,
                    mask_kind,
                    bias,
                    causal,
                    scale_kind,
                    softcap_kind,
                    window_kind,
                }
            },
        )
}

fn build(s: &Spec) -> (Problem, ScalePolicy) {
    let h = s.h_kv * s.group;
    let mut vals = lcg_values(s.seed, 4096).into_iter().cycle();
    let mut take = |len: usize| -> Vec<f64> { (&mut vals).take(len).collect() };
    let q = take(s.b * h * s.n * s.d_k);
    let k = take(s.b * s.h_kv * s.m * s.d_k);
    let v = take(s.b * s.h_kv * s.m * s.d_v);
    // The leading axes of the mask/bias broadcast or not, chosen from the seed's bits.
    let bshape = |bits: u64| -> [usize; 4] {
        [
            if bits & 1 == 0 { s.b } else { 1 },
            if bits & 2 == 0 { h } else { 1 },
            if bits & 4 == 0 { s.n } else { 1 },
            s.m,
        ]
    };
    let mask = match s.mask_kind {
        0 => None,
        kind => {
            let shape = bshape(s.seed >> 3);
            let len: usize = shape.iter().product();
            // kind 3 masks most keys, so that fully masked rows are common.
            let threshold = if kind == 3 { 1.0 } else { -0.5 };
            let data = take(len).into_iter().map(|x| x < threshold).collect();
            Some((shape, data))
        }
    };
    let bias = s.bias.then(|| {
        let shape = bshape(s.seed >> 7);
        let len: usize = shape.iter().product();
        (shape, take(len))
    });
    let causal = match s.causal {
        0 => None,
        1 => Some(CausalAlignment::TopLeft),
        _ => Some(CausalAlignment::BottomRight),
    };
    let scale = match s.scale_kind {
        0 => ScalePolicy::InvSqrtDk,
        1 => ScalePolicy::Unscaled,
        _ => ScalePolicy::Fixed(0.37),
    };
    // Windows: one-sided or two-sided, some narrow enough to leave rows without a key.
    let side = |bits: u64| match bits % 4 {
        0 => None,
        w => Some(w as usize - 1),
    };
    let window = (s.window_kind != 0).then(|| Window::new(side(s.seed >> 11), side(s.seed >> 13)));
    let problem = Problem {
        b: s.b,
        h,
        h_kv: s.h_kv,
        n: s.n,
        m: s.m,
        d_k: s.d_k,
        d_v: s.d_v,
        q,
        k,
        v,
        mask,
        bias,
        causal,
        scale: scale.factor(s.d_k),
        softcap: (s.softcap_kind != 0).then_some(0.5 * s.softcap_kind as f64),
        window,
    };
    (problem, scale)
}

/// Runs the module on a problem: (context, weights).
fn run(p: &Problem, scale: ScalePolicy, device: &Device) -> (Vec<f64>, Vec<f64>) {
    let (ctx, w) = run_with(p, scale, device, Implementation::Naive);
    (ctx, w.expect("naive returns weights"))
}

/// Runs the module with an implementation: (context, weights if it returns them).
fn run_with(
    p: &Problem,
    scale: ScalePolicy,
    device: &Device,
    implementation: Implementation,
) -> (Vec<f64>, Option<Vec<f64>>) {
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(scale)
        .with_causal_alignment(p.causal.unwrap_or_default())
        .with_implementation(implementation)
        .with_softcap(p.softcap)
        .init();
    let mut input = AttentionInput::new(
        tensor4(&p.q, [p.b, p.h, p.n, p.d_k], device),
        tensor4(&p.k, [p.b, p.h_kv, p.m, p.d_k], device),
        tensor4(&p.v, [p.b, p.h_kv, p.m, p.d_v], device),
    );
    if implementation == Implementation::Naive {
        input = input.need_weights();
    }
    if let Some((shape, data)) = &p.mask {
        input = input.mask(bool4(data, *shape, device));
    }
    if let Some((shape, data)) = &p.bias {
        input = input.bias(tensor4(data, *shape, device));
    }
    if p.causal.is_some() {
        input = input.causal();
    }
    if let Some(window) = p.window {
        input = input.window(window.left, window.right);
    }
    let out = attn.forward(input);
    (values(out.context), out.weights.map(values))
}

/// The gradients of sum(context · grad_out) for q, k, v and the bias (empty without one) on an
/// autodiff device, through `implementation`.
fn gradients(
    p: &Problem,
    scale: ScalePolicy,
    device: &Device,
    grad_out: &[f64],
    implementation: Implementation,
) -> [Vec<f64>; 4] {
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(scale)
        .with_causal_alignment(p.causal.unwrap_or_default())
        .with_implementation(implementation)
        .with_softcap(p.softcap)
        .init();
    let q = tensor4(&p.q, [p.b, p.h, p.n, p.d_k], device).require_grad();
    let k = tensor4(&p.k, [p.b, p.h_kv, p.m, p.d_k], device).require_grad();
    let v = tensor4(&p.v, [p.b, p.h_kv, p.m, p.d_v], device).require_grad();
    let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone());
    if let Some((shape, data)) = &p.mask {
        input = input.mask(bool4(data, *shape, device));
    }
    let bias = p
        .bias
        .as_ref()
        .map(|(shape, data)| tensor4(data, *shape, device).require_grad());
    if let Some(bias) = &bias {
        input = input.bias(bias.clone());
    }
    if p.causal.is_some() {
        input = input.causal();
    }
    if let Some(window) = p.window {
        input = input.window(window.left, window.right);
    }
    let out = attn.forward(input);
    let g = tensor4(grad_out, [p.b, p.h, p.n, p.d_v], device);
    let grads = (out.context * g).sum().backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).expect("a gradient"));
    [
        grad(&q),
        grad(&k),
        grad(&v),
        bias.as_ref().map(grad).unwrap_or_default(),
    ]
}

/// The row statistics of `implementation` on a problem, `[entropy, max_prob, visible_keys,
/// max_logit, lse, logit_mean, logit_std]` each `[b·h·n]`, or None when the path refuses the
/// call (Fused and top-left alignment with n != m).
fn row_stats_with(
    p: &Problem,
    scale: ScalePolicy,
    device: &Device,
    implementation: Implementation,
) -> Option<[Vec<f64>; 7]> {
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(scale)
        .with_causal_alignment(p.causal.unwrap_or_default())
        .with_implementation(implementation)
        .with_softcap(p.softcap)
        .init();
    let mut input = AttentionInput::new(
        tensor4(&p.q, [p.b, p.h, p.n, p.d_k], device),
        tensor4(&p.k, [p.b, p.h_kv, p.m, p.d_k], device),
        tensor4(&p.v, [p.b, p.h_kv, p.m, p.d_v], device),
    )
    .need_row_stats();
    if let Some((shape, data)) = &p.mask {
        input = input.mask(bool4(data, *shape, device));
    }
    if let Some((shape, data)) = &p.bias {
        input = input.bias(tensor4(data, *shape, device));
    }
    if p.causal.is_some() {
        input = input.causal();
    }
    if let Some(window) = p.window {
        input = input.window(window.left, window.right);
    }
    let stats = attn.try_forward(input).ok()?.row_stats.expect("asked for");
    Some([
        values(stats.entropy),
        values(stats.max_prob),
        values(stats.visible_keys),
        values(stats.max_logit),
        values(stats.lse),
        values(stats.logit_mean),
        values(stats.logit_std),
    ])
}

/// Whether two statistics agree: equal infinities, both NaN, or within 1e-4 + 1e-3 relative.
fn same_stat(got: f64, want: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want.is_infinite() {
        got == want
    } else {
        (got - want).abs() <= 1e-4 + 1e-3 * want.abs()
    }
}

fn config() -> PropConfig {
    PropConfig {
        cases: 48,
        rng_seed: RngSeed::Fixed(20261129),
        failure_persistence: None,
        ..PropConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The module agrees with the float64 reference (f32 compute: 1e-4 abs + 1e-3 rel).
    #[test]
    fn agrees_with_f64_reference(s in spec()) {
        let (p, scale) = build(&s);
        let (want_ctx, want_w) = attention(&p);
        for (backend, device) in cpu_devices() {
            let (ctx, w) = run(&p, scale, &device);
            for (name, got, want) in [("context", &ctx, &want_ctx), ("weights", &w, &want_w)] {
                for (g, x) in got.iter().zip(want.iter()) {
                    prop_assert!(g.is_finite(), "{backend}: {name} has a non-finite value");
                    prop_assert!((g - x).abs() <= 1e-4 + 1e-3 * x.abs(),
                        "{backend}: {name} differs: got {g}, want {x} ({s:?})");
                }
            }
        }
    }

    /// The chunked path (any block size) and the automatic path (fused where it applies) agree
    /// with the float64 reference too.
    #[test]
    fn chunked_and_auto_agree_with_f64_reference(s in spec(), block in 1..5usize) {
        let (p, scale) = build(&s);
        let (want_ctx, _) = attention(&p);
        for (backend, device) in cpu_devices() {
            for implementation in [Implementation::Chunked { block_size: block }, Implementation::Auto] {
                let (ctx, _) = run_with(&p, scale, &device, implementation);
                for (g, x) in ctx.iter().zip(want_ctx.iter()) {
                    prop_assert!(g.is_finite(), "{backend} {implementation:?}: non-finite context");
                    prop_assert!((g - x).abs() <= 1e-4 + 1e-3 * x.abs(),
                        "{backend} {implementation:?}: got {g}, want {x} ({s:?})");
                }
            }
        }
    }

    /// The CPU kernel agrees with the float64 reference on every random problem: shapes,
    /// scales, masks and biases broadcast or not, both causal alignments with n != m, rows with
    /// no visible key, grouped-query heads.
    #[test]
    fn cpu_kernel_agrees_with_f64_reference(s in spec()) {
        let (p, scale) = build(&s);
        let (want_ctx, _) = attention(&p);
        for (backend, device) in cpu_devices() {
            let (ctx, _) = run_with(&p, scale, &device, Implementation::CpuKernel);
            for (g, x) in ctx.iter().zip(want_ctx.iter()) {
                prop_assert!(g.is_finite(), "{backend}: non-finite context");
                prop_assert!((g - x).abs() <= 1e-4 + 1e-3 * x.abs(),
                    "{backend}: got {g}, want {x} ({s:?})");
            }
        }
    }

    /// The CPU kernel's own backward pass gives the naive path's autodiff gradients for q, k, v
    /// and a bias that needs one, on the same random problems (where the kernel runs in place).
    #[test]
    fn cpu_kernel_gradients_agree_with_naive(s in spec()) {
        let (p, scale) = build(&s);
        let grad_out = lcg_values(s.seed ^ 0x9e37, p.b * p.h * p.n * p.d_v);
        for (backend, device) in cpu_devices() {
            if !sdpa::cpu_kernel::runs_in_place(&device) {
                continue;
            }
            let device = device.autodiff();
            let kernel = gradients(&p, scale, &device, &grad_out, Implementation::CpuKernel);
            let naive = gradients(&p, scale, &device, &grad_out, Implementation::Naive);
            for (name, got, want) in ["dq", "dk", "dv", "dbias"].iter().zip(&kernel).zip(&naive).map(|((n, g), w)| (n, g, w)) {
                prop_assert_eq!(got.len(), want.len());
                for (g, x) in got.iter().zip(want) {
                    prop_assert!(g.is_finite(), "{backend}: {name} has a non-finite value");
                    prop_assert!((g - x).abs() <= 1e-4 + 1e-3 * x.abs(),
                        "{backend}: {name} differs: got {g}, want {x} ({s:?})");
                }
            }
        }
    }

    /// The row statistics of every path (the chunked one at any block size, Fused where it
    /// serves the call, the CPU kernel, Auto) agree with the float64 reference: the entropy,
    /// largest weight and visible keys of the reference weights; the largest logit, log-sum-exp
    /// and logit mean and std of the naive path (checked against its own scores in f64 by
    /// `row_stats.rs` and the golden cases). Masks that hide most keys make rows without a key
    /// common.
    #[test]
    fn row_stats_of_every_path_agree_with_f64_reference(s in spec(), block in 1..5usize) {
        let (p, scale) = build(&s);
        let (_, want_w) = attention(&p);
        let mut want_rows = [Vec::new(), Vec::new(), Vec::new()];
        for row in want_w.chunks(p.m) {
            want_rows[0].push(row.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum::<f64>());
            want_rows[1].push(row.iter().cloned().fold(0.0, f64::max));
            want_rows[2].push(row.iter().filter(|&&x| x > 0.0).count() as f64);
        }
        let names = ["entropy", "max_prob", "visible_keys", "max_logit", "lse", "logit_mean", "logit_std"];
        for (backend, device) in cpu_devices() {
            let naive = row_stats_with(&p, scale, &device, Implementation::Naive).expect("naive serves all");
            for implementation in implementations(block, &device) {
                let Some(got) = row_stats_with(&p, scale, &device, implementation) else {
                    prop_assert!(implementation == Implementation::Fused, "{backend} {implementation:?} refused");
                    continue;
                };
                for (idx, name) in names.iter().enumerate() {
                    let want = if idx < 3 { &want_rows[idx] } else { &naive[idx] };
                    for (row, (g, w)) in got[idx].iter().zip(want).enumerate() {
                        prop_assert!(same_stat(*g, *w),
                            "{backend} {implementation:?}: {name} of row {row}: got {g}, want {w} ({s:?})");
                    }
                }
            }
        }
    }

    /// Every row of the weights sums to 1, or to 0 when no key is visible.
    #[test]
    fn rows_sum_to_one_or_zero(s in spec()) {
        let (p, scale) = build(&s);
        let (_, want_w) = attention(&p);
        for (backend, device) in cpu_devices() {
            let (_, w) = run(&p, scale, &device);
            for (row, want_row) in w.chunks(p.m).zip(want_w.chunks(p.m)) {
                let sum: f64 = row.iter().sum();
                let expected = if want_row.iter().all(|&x| x == 0.0) { 0.0 } else { 1.0 };
                prop_assert!((sum - expected).abs() < 1e-5, "{backend}: row sums to {sum}, want {expected}");
                if expected == 0.0 {
                    prop_assert!(row.iter().all(|&x| x == 0.0), "{backend}: masked row not exactly zero");
                }
            }
        }
    }

    /// The article's experiment 2: with a causal mask, multiplying the values after position
    /// `pos` by 100 leaves the outputs at positions <= pos unchanged and changes later ones.
    #[test]
    fn causal_outputs_ignore_the_future(s in spec(), pos_frac in 0.0..1.0f64) {
        let mut s = s;
        s.m = s.n.max(2);
        s.n = s.m;
        s.causal = 1;
        s.mask_kind = 0;
        s.bias = false;
        let (p, scale) = build(&s);
        let pos = ((p.n - 1) as f64 * pos_frac) as usize; // 0 ..= n-2
        let mut p2 = p.clone();
        for bi in 0..p.b { for kv in 0..p.h_kv { for j in (pos + 1)..p.m { for e in 0..p.d_v {
            p2.v[((bi * p.h_kv + kv) * p.m + j) * p.d_v + e] *= 100.0;
        }}}}
        // How much the later outputs must move: the float64 reference says.
        let (r1, _) = attention(&p);
        let (r2, _) = attention(&p2);
        for (backend, device) in cpu_devices() {
            let (c1, _) = run(&p, scale, &device);
            let (c2, _) = run(&p2, scale, &device);
            let mut early = 0.0f64;
            for (idx, (a, b)) in c1.iter().zip(&c2).enumerate() {
                let i = (idx / p.d_v) % p.n;
                if i <= pos {
                    early = early.max((a - b).abs());
                } else {
                    let (got, want) = (b - a, r2[idx] - r1[idx]);
                    prop_assert!((got - want).abs() <= 1e-3 + 1e-3 * want.abs(),
                        "{backend}: later output {idx} moved by {got}, the reference by {want}");
                }
            }
            prop_assert!(early == 0.0, "{backend}: earlier outputs changed by {early}");
        }
        // And the change is visible somewhere: the last row sees every modified value.
        let moved = r1.iter().zip(&r2).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        prop_assert!(moved > 0.0, "the reference did not move at all");
    }

    /// Permuting keys and values (and the mask's and bias's key axis) together leaves the
    /// output unchanged.
    #[test]
    fn key_value_permutation_invariance(s in spec(), rot in 1..6usize) {
        let mut s = s;
        s.causal = 0;
        // A window depends on key positions: permuting keys moves it.
        s.window_kind = 0;
        let (p, scale) = build(&s);
        let perm: Vec<usize> = (0..p.m).map(|j| (j * (2 * rot + 1) + rot) % p.m).collect();
        let is_perm = { let mut q = perm.clone(); q.sort(); q == (0..p.m).collect::<Vec<_>>() };
        prop_assume!(is_perm);
        let mut p2 = p.clone();
        for bi in 0..p.b { for kv in 0..p.h_kv { for (j, &pj) in perm.iter().enumerate() {
            for d in 0..p.d_k { p2.k[((bi * p.h_kv + kv) * p.m + j) * p.d_k + d] = p.k[((bi * p.h_kv + kv) * p.m + pj) * p.d_k + d]; }
            for e in 0..p.d_v { p2.v[((bi * p.h_kv + kv) * p.m + j) * p.d_v + e] = p.v[((bi * p.h_kv + kv) * p.m + pj) * p.d_v + e]; }
        }}}
        if let Some((shape, data)) = &p.mask {
            let mut d2 = data.clone();
            for (row, row2) in data.chunks(p.m).zip(d2.chunks_mut(p.m)) { for (j, &pj) in perm.iter().enumerate() { row2[j] = row[pj]; } }
            p2.mask = Some((*shape, d2));
        }
        if let Some((shape, data)) = &p.bias {
            let mut d2 = data.clone();
            for (row, row2) in data.chunks(p.m).zip(d2.chunks_mut(p.m)) { for (j, &pj) in perm.iter().enumerate() { row2[j] = row[pj]; } }
            p2.bias = Some((*shape, d2));
        }
        for (backend, device) in cpu_devices() {
            let (c1, _) = run(&p, scale, &device);
            let (c2, _) = run(&p2, scale, &device);
            let diff = max_abs_diff(&c1, &c2);
            prop_assert!(diff < 1e-5, "{backend}: permutation changed the output by {diff}");
        }
    }
}
