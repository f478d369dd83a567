//! Tests of the bf16 tile products against an f64 product on every instruction set this
//! machine has, the rounding of f32 operands and the choice of the instruction set.

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
/// multiple of 32 (odd, too), row counts past the register blocks, transposed operands, a left
/// operand read in place (bf16, even depth) or rounded (f32, row-major or transposed),
/// overwrite and accumulate, on every instruction set this machine has.
#[test]
fn the_bf16_product_matches_an_f64_product_of_the_same_bf16_values() {
    for &isa in Bf16Isa::available() {
        for (case_idx, (m, k, n)) in [
            (1, 1, 1),
            (5, 3, 7),
            (16, 32, 16),
            (17, 33, 31),
            (33, 64, 50),
            (7, 64, 65),
            (64, 96, 256),
            (13, 130, 64),
        ]
        .into_iter()
        .enumerate()
        {
            let a = values(m * k, 2 * case_idx as u64);
            // a stored transposed too ([k, m]), and as f32.
            let a_t: Vec<bf16> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
            let a32: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
            let a32_t: Vec<f32> = a_t.iter().map(|x| x.to_f32()).collect();
            // b stored transposed ([n, k]) and row-major ([k, n]).
            let b_t = values(n * k, 2 * case_idx as u64 + 1);
            let b: Vec<bf16> = (0..k * n).map(|idx| b_t[(idx % n) * k + idx / n]).collect();
            let lhs = View::rows(&a, m, k, k);
            let want = reference(&lhs, &View::transposed(&b_t, k, n, k));
            let start: Vec<f32> = (0..m * n).map(|idx| idx as f32 * 0.25).collect();
            let rhs_views = [
                ("rhs transposed", View::transposed(&b_t, k, n, k)),
                ("rhs rows", View::rows(&b, k, n, n)),
            ];
            for (rhs_name, rhs) in rhs_views {
                for accumulate in [false, true] {
                    let check = |dst: &[f32], lhs_name: &str| {
                        for (idx, (&got, &exact)) in dst.iter().zip(&want).enumerate() {
                            let base = if accumulate { start[idx] as f64 } else { 0.0 };
                            let expected = base + 0.5 * exact;
                            // f32 sums of k exact products: a few f32 roundings of the
                            // magnitudes.
                            let bound = 1e-6 * (k as f64) * 4.0 + 1e-6 * expected.abs();
                            assert!(
                                (got as f64 - expected).abs() <= bound,
                                "[{m}, {k}] x [{k}, {n}] {lhs_name}, {rhs_name}, accumulate \
                                 {accumulate} ({isa:?}): entry {idx} {got} vs {expected}"
                            );
                        }
                    };
                    let mut dst = start.clone();
                    product_bf16(&mut dst, n, lhs, rhs, accumulate, 0.5, isa);
                    check(&dst, "lhs bf16 rows");
                    let mut dst = start.clone();
                    let lhs_t = View::transposed(&a_t, m, k, m);
                    product_bf16(&mut dst, n, lhs_t, rhs, accumulate, 0.5, isa);
                    check(&dst, "lhs bf16 transposed");
                    let mut dst = start.clone();
                    product_bf16(
                        &mut dst,
                        n,
                        View::rows(&a32, m, k, k),
                        rhs,
                        accumulate,
                        0.5,
                        isa,
                    );
                    check(&dst, "lhs f32 rows");
                    let mut dst = start.clone();
                    let lhs32_t = View::transposed(&a32_t, m, k, m);
                    product_bf16(&mut dst, n, lhs32_t, rhs, accumulate, 0.5, isa);
                    check(&dst, "lhs f32 transposed");
                }
            }
        }
    }
}

/// A destination wider than the product: the columns past it are never written.
#[test]
fn the_bf16_product_writes_only_its_block_of_a_wider_destination() {
    for &isa in Bf16Isa::available() {
        let (m, k, n, stride) = (9, 20, 21, 40);
        let a = values(m * k, 5);
        let b = values(k * n, 6);
        let mut dst = vec![-7.0f32; (m - 1) * stride + n + 3];
        product_bf16(
            &mut dst,
            stride,
            View::rows(&a, m, k, k),
            View::rows(&b, k, n, n),
            true,
            1.0,
            isa,
        );
        for (idx, &x) in dst.iter().enumerate() {
            if idx % stride >= n || idx >= (m - 1) * stride + n {
                assert_eq!(
                    x, -7.0,
                    "{isa:?}: entry {idx} outside the block was written"
                );
            }
        }
    }
}

#[test]
fn f32_operands_are_rounded_to_bf16_before_the_product() {
    for &isa in Bf16Isa::available() {
        // 1 + 2⁻¹⁰ is not a bf16 value (7 fraction bits): it rounds to 1; 1 + 3·2⁻⁸ is halfway
        // between two bf16 values and rounds to the even one, 1 + 2⁻⁶.
        for (x, rounded) in [
            (1.0f32 + 1.0 / 1024.0, 1.0f32),
            (1.0 + 3.0 / 256.0, 1.0 + 1.0 / 64.0),
        ] {
            let a = [x; 34];
            let b = [bf16::from_f32(1.0); 34];
            let mut dst = [0.0f32; 1];
            product_bf16(
                &mut dst,
                1,
                View::rows(&a, 1, 34, 34),
                View::rows(&b, 34, 1, 1),
                false,
                1.0,
                isa,
            );
            assert_eq!(dst[0], 34.0 * rounded, "{isa:?}: {x}");
        }
    }
}

#[test]
fn the_isas_are_those_the_cpu_reports_and_the_fastest_is_taken() {
    let reported = crate::paths::cpu::features::cpu_features();
    let available = Bf16Isa::available();
    assert_eq!(available[0], Bf16Isa::Portable);
    let avx512 = ["avx512f", "avx512bw", "avx512_bf16"]
        .iter()
        .all(|f| reported.contains(f));
    assert_eq!(
        available.contains(&Bf16Isa::Avx512Bf16),
        avx512,
        "{reported:?}"
    );
    let amx = reported.contains(&"amx_tile") && reported.contains(&"amx_bf16");
    if !amx || amx_switched_off() {
        assert!(!available.contains(&Bf16Isa::Amx));
    } else if cfg!(target_os = "linux") {
        // Linux grants the tile state to a process that asks (kernel 5.16 on).
        assert!(available.contains(&Bf16Isa::Amx));
    }
    if std::env::var("SDPA_BF16_ISA").is_err() {
        // No other test forces an ISA while this one reads the machine's own choice.
        let _serial = forcing::unforced();
        assert_eq!(Some(&Bf16Isa::current()), available.iter().max());
        assert_eq!(bf16_product_isa(), Bf16Isa::current().name());
    }
    // A zero-depth product is an empty sum.
    for &isa in available {
        let mut dst = [3.0f32; 6];
        let (a, b): ([bf16; 0], [bf16; 0]) = ([], []);
        product_bf16(
            &mut dst,
            3,
            View::rows(&a, 2, 0, 0),
            View::rows(&b, 0, 3, 3),
            true,
            1.0,
            isa,
        );
        assert_eq!(dst, [3.0; 6], "{isa:?}");
        product_bf16(
            &mut dst,
            3,
            View::rows(&a, 2, 0, 0),
            View::rows(&b, 0, 3, 3),
            false,
            1.0,
            isa,
        );
        assert_eq!(dst, [0.0; 6], "{isa:?}");
    }
}

#[test]
fn a_forced_isa_is_the_one_the_products_take_until_its_guard_drops() {
    for &isa in Bf16Isa::available() {
        let guard = forcing::force(isa);
        assert_eq!(Bf16Isa::current(), isa);
        assert_eq!(PackedRhs::new(View::rows(&[1.0f32; 4], 2, 2, 2)).isa, isa);
        drop(guard);
    }
}

/// Every position of a run is rounded the same way (the 16-wide body and the tail), normal
/// values to nearest even; an interleave with a shorter second run pads it with zeros.
#[test]
fn rounding_runs_treat_every_position_alike() {
    for len in [1, 15, 16, 17, 33, 40] {
        let src: Vec<f32> = (0..len)
            .map(|i| {
                if i % 3 == 0 {
                    1e-39 // an f32 subnormal
                } else {
                    1.0 + i as f32 / 1024.0
                }
            })
            .collect();
        let mut dst = vec![0u16; len];
        round::round_run(&src, &mut dst);
        for (i, (&x, &bits)) in src.iter().zip(&dst).enumerate() {
            if i % 3 == 0 {
                assert_eq!(bits, dst[0], "len {len}: the subnormal at {i}");
            } else {
                assert_eq!(bits, bf16::from_f32(x).to_bits(), "len {len}: {x} at {i}");
            }
        }
        let second = &src[..len / 2];
        let mut pairs_out = vec![u16::MAX; 2 * len];
        round::round_interleaved(&src, second, &mut pairs_out);
        for i in 0..len {
            assert_eq!(pairs_out[2 * i], dst[i], "len {len}: first at {i}");
            let want = if i < second.len() { dst[i] } else { 0 };
            assert_eq!(pairs_out[2 * i + 1], want, "len {len}: second at {i}");
        }
    }
}
