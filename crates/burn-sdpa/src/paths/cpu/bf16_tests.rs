//! The kernel on bf16 data against the f64 reference on the same (bf16-exact) values: the
//! output and every gradient within [`ROUNDINGS`] bf16 unit roundoffs of the largest reference
//! value of its tensor (the rule of the CubeCL kernel's half-precision tests), through the tile
//! products of every instruction set this machine has (portable, AVX512_BF16, AMX).

use burn::tensor::bf16;

use super::backward::{BACKWARD_TILES, BackwardInputs, BackwardOutputs, try_backward_bf16};
use super::kernel::try_forward_bf16;
use super::masking::Masking;
use super::reference::{self, data, maskings, shape};
use super::shape::{KernelShape, Tiles};
use super::tile_bf16::{Bf16Isa, forcing};

/// bf16's unit roundoff, 2⁻⁸.
const U_BF16: f64 = 1.0 / 256.0;
/// The tolerance, fixed before the run: one rounding of the stored output, the weights and
/// their gradient rounded to bf16 where they multiply, and the rounded output read back in
/// D = rowsum(dO ∘ O); 4 leaves room for all of them.
const ROUNDINGS: f64 = 4.0;

/// Seeded values rounded to bf16, and the same values as f32.
fn bf16_exact(len: usize, seed: u64) -> (Vec<bf16>, Vec<f32>) {
    let values: Vec<bf16> = data(len, seed).into_iter().map(bf16::from_f32).collect();
    let widened = values.iter().map(|x| x.to_f32()).collect();
    (values, widened)
}

/// The largest |got − want| over the largest |want| (∞ when a value is not finite: a NaN left
/// in an output the kernel never wrote must fail, and `max` would skip it).
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    if got.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |a, x| a.max(x.abs())).max(1e-30);
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
    err / scale
}

/// [`check_isa`] on every instruction set this machine has.
fn check(s: KernelShape, masking: &Masking<'_>, tiles: Tiles, what: &str) {
    for &isa in Bf16Isa::available() {
        let _forced = forcing::force(isa);
        check_isa(s, masking, tiles, what, isa.name());
    }
}

fn check_isa(s: KernelShape, masking: &Masking<'_>, tiles: Tiles, what: &str, isa: &str) {
    let d = s.dims;
    let (q, q32) = bf16_exact(d.batch * d.n_heads * d.n * d.d_k, 21);
    let (k, k32) = bf16_exact(d.batch * d.n_kv_heads * d.m * d.d_k, 22);
    let (v, v32) = bf16_exact(d.batch * d.n_kv_heads * d.m * d.d_v, 23);
    let (grad_out, grad_out32) = bf16_exact(d.batch * d.n_heads * d.n * d.d_v, 24);
    let mut out = vec![bf16::from_f32(f32::NAN); grad_out.len()];
    let mut lse = vec![0.0; d.batch * d.n_heads * d.n];
    try_forward_bf16(&s, tiles, masking, &q, &k, &v, &mut out, Some(&mut lse)).unwrap();
    let (want_out, _, _) = reference::forward(&s, masking, &q32, &k32, &v32);
    let out32: Vec<f32> = out.iter().map(|x| x.to_f32()).collect();
    let assert_within = |name: &str, got: &[f32], want: &[f64]| {
        let err = relative_error(got, want);
        println!(
            "{what} {tiles:?} ({isa}): {name} {:.2} roundings",
            err / U_BF16
        );
        assert!(
            err <= ROUNDINGS * U_BF16,
            "{what} {tiles:?} ({isa}): {name} is {:.2} bf16 roundings from the reference",
            err / U_BF16
        );
    };
    assert_within("output", &out32, &want_out);

    let mut grad_q = vec![f32::NAN; q.len()];
    let mut grad_k = vec![f32::NAN; k.len()];
    let mut grad_v = vec![f32::NAN; v.len()];
    try_backward_bf16(
        &s,
        tiles,
        masking,
        BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            grad_out: &grad_out,
            lse: &lse,
        },
        BackwardOutputs {
            grad_q: &mut grad_q,
            grad_k: &mut grad_k,
            grad_v: &mut grad_v,
            grad_scores: None,
        },
    )
    .unwrap();
    let want = reference::backward(&s, masking, &q32, &k32, &v32, &grad_out32);
    assert_within("dq", &grad_q, &want.q);
    assert_within("dk", &grad_k, &want.k);
    assert_within("dv", &grad_v, &want.v);
}

#[test]
fn bf16_outputs_and_gradients_are_within_a_few_roundings_of_the_reference() {
    for (n, m) in [(1, 1), (5, 300), (70, 40), (130, 260)] {
        for offset in [None, Some(m as i64 - n as i64)] {
            for tiles in [
                BACKWARD_TILES,
                Tiles {
                    query_block: 7,
                    key_block: 33,
                },
            ] {
                let what = format!("n {n} m {m} causal {offset:?}");
                check(shape(n, m, offset), &Masking::default(), tiles, &what);
            }
        }
    }
}

#[test]
fn bf16_gradients_of_keys_and_queries_no_tile_reaches_are_zero() {
    // Top-left causal with m > n: the keys past n are hidden from every query, so their key
    // tiles get no product (zeroed at the end of the task, not first); a window of 3 keys
    // leaves query blocks that see none of a key range.
    let top_left = shape(5, 300, Some(0));
    check(
        top_left,
        &Masking::default(),
        BACKWARD_TILES,
        "top-left n 5 m 300",
    );
    let mut windowed = shape(130, 260, Some(130));
    windowed.window = Some((crate::types::Window::new(Some(3), Some(0)), 130));
    check(
        windowed,
        &Masking::default(),
        Tiles {
            query_block: 16,
            key_block: 32,
        },
        "window 3",
    );
}

#[test]
fn masked_and_biased_bf16_calls_are_within_a_few_roundings_of_the_reference() {
    let s = shape(70, 90, None);
    for (idx, test_masking) in maskings(&s.dims).iter().enumerate() {
        check(
            s,
            &test_masking.masking(),
            BACKWARD_TILES,
            &format!("masking {idx}"),
        );
    }
}

#[test]
fn bf16_calls_at_a_full_tile_head_size_are_within_a_few_roundings_of_the_reference() {
    // d = 64: two full 32-value depth tiles per row, as in the model's heads.
    let mut s = shape(200, 180, Some(-20));
    s.dims.d_k = 64;
    s.dims.d_v = 64;
    s.scale = 0.125;
    check(s, &Masking::default(), Tiles::default(), "d 64");
}
