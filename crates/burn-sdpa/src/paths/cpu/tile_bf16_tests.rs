//! Tests of the bf16 tile products against an f64 product, the rounding of f32 operands and
//! the choice of the AMX path.

use super::*;
use crate::paths::cpu::reference::data;

/// Seeded bf16-exact values in [−2, 2].
fn values(len: usize, seed: u64) -> Vec<bf16> {
    data(len, seed).into_iter().map(bf16::from_f32).collect()
}

/// The product in f64 of bf16 operands read through the views' element accessors.
fn reference(lhs: &View<'_, bf16>, rhs: &View<'_, bf16>) -> Vec<f64> {
    let (m, k, n) = (lhs.rows_len(), lhs.cols_len(), rhs.cols_len());
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| lhs.at(i, p).to_f64() * rhs.at(p, j).to_f64())
                .sum();
        }
    }
    out
}

/// Every size class of the packing: below one tile, one tile, odd tile counts, depth not a
/// multiple of 32, transposed operands, overwrite and accumulate.
#[test]
fn the_bf16_product_matches_an_f64_product_of_the_same_bf16_values() {
    for (case_idx, (m, k, n)) in [
        (1, 1, 1),
        (5, 3, 7),
        (16, 32, 16),
        (17, 33, 31),
        (33, 64, 50),
        (64, 96, 256),
    ]
    .into_iter()
    .enumerate()
    {
        let a = values(m * k, 2 * case_idx as u64);
        // b stored transposed: [n, k].
        let b_t = values(n * k, 2 * case_idx as u64 + 1);
        let lhs = View::rows(&a, m, k, k);
        let rhs = View::transposed(&b_t, k, n, k);
        let want = reference(&lhs, &rhs);
        let start: Vec<f32> = (0..m * n).map(|idx| idx as f32 * 0.25).collect();
        for accumulate in [false, true] {
            let mut dst = start.clone();
            product_bf16(&mut dst, n, lhs, rhs, accumulate, 0.5);
            for (idx, (&got, &exact)) in dst.iter().zip(&want).enumerate() {
                let base = if accumulate { start[idx] as f64 } else { 0.0 };
                let expected = base + 0.5 * exact;
                // f32 sums of k exact products: a few f32 roundings of the magnitudes.
                let bound = 1e-6 * (k as f64) * 4.0 + 1e-6 * expected.abs();
                assert!(
                    (got as f64 - expected).abs() <= bound,
                    "[{m}, {k}] x [{k}, {n}] accumulate {accumulate} ({}): entry {idx} {got} vs {expected}",
                    bf16_product_isa()
                );
            }
        }
    }
}

#[test]
fn f32_operands_are_rounded_to_bf16_before_the_product() {
    // 1 + 2⁻¹⁰ is not a bf16 value (7 fraction bits): it rounds to 1.
    let a = [1.0f32 + 1.0 / 1024.0; 4];
    let b = [bf16::from_f32(1.0); 4];
    let mut dst = [0.0f32; 1];
    product_bf16(
        &mut dst,
        1,
        View::rows(&a, 1, 4, 4),
        View::rows(&b, 4, 1, 1),
        false,
        1.0,
    );
    assert_eq!(dst[0], 4.0);
}

#[test]
fn the_isa_is_amx_exactly_when_the_cpu_reports_it_and_it_is_not_switched_off() {
    let reported = crate::paths::cpu::simd::cpu_features();
    let has = reported.contains(&"amx_tile") && reported.contains(&"amx_bf16");
    if !has || amx_switched_off() {
        assert_eq!(bf16_product_isa(), "portable");
    } else if cfg!(target_os = "linux") {
        // Linux grants the tile state to a process that asks (kernel 5.16 on).
        assert_eq!(bf16_product_isa(), "amx");
    }
}
