//! Quantiles of the distributions the intervals use: Student's t (exact, by bisection on its
//! tail mass) and the standard normal.

/// The two-sided 95% critical value of Student's t with `df` degrees of freedom (exact table
/// up to 30, then interpolated in 1/df towards the normal 1.96).
pub fn t_critical_95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        // t(df) ≈ z + (z³ + z) / (4 df): exact to 3 decimals from df = 30 on.
        _ => {
            let z = 1.959_964;
            z + (z * z * z + z) / (4.0 * df as f64)
        }
    }
}

/// The two-sided 90% critical value of Student's t (the one-sided 5% point), as
/// [`t_critical_95`] is for 95%: what TOST's 90% interval needs.
pub fn t_critical_90(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771,
        1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706,
        1.703, 1.701, 1.699, 1.697,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        _ => {
            let z = 1.644_854;
            z + (z * z * z + z) / (4.0 * df as f64)
        }
    }
}

/// P(|T| < t) for Student's t with `df` degrees of freedom, t ≥ 0: the finite sums for integer
/// df of Abramowitz & Stegun 26.7.3–4 in θ = atan(t/√df) (exact up to rounding).
fn t_two_sided_mass(t: f64, df: usize) -> f64 {
    let theta = (t / (df as f64).sqrt()).atan();
    let (sin, cos2) = (theta.sin(), theta.cos().powi(2));
    // Σ of the series' terms: each the previous times cos²θ · (k)/(k + 1) for the odd case
    // (2/3, 4/5, …) and (k − 1)/k for the even one (1/2, 3/4, …).
    let mut term = 1.0;
    let mut sum = 1.0;
    if df % 2 == 1 {
        if df == 1 {
            return 2.0 * theta / std::f64::consts::PI;
        }
        let mut k = 2.0;
        for _ in 0..(df - 3) / 2 {
            term *= cos2 * k / (k + 1.0);
            sum += term;
            k += 2.0;
        }
        2.0 / std::f64::consts::PI * (theta + sin * theta.cos() * sum)
    } else {
        let mut k = 1.0;
        for _ in 0..(df - 2) / 2 {
            term *= cos2 * k / (k + 1.0);
            sum += term;
            k += 2.0;
        }
        sin * sum
    }
}

/// The quantile of Student's t with `df` degrees of freedom at probability `p` (0 < p < 1):
/// the exact distribution function for integer df (Abramowitz & Stegun 26.7.3–4), inverted by
/// bisection to machine precision.
pub fn t_quantile(p: f64, df: usize) -> f64 {
    if df == 0 || !(p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    let mass = 2.0 * p - 1.0;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t_two_sided_mass(hi, df) < mass {
        hi *= 2.0;
        if hi > 1e12 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_two_sided_mass(mid, df) < mass {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-15 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// The standard normal quantile Φ⁻¹(p) for 0 < p < 1 (Acklam's rational approximation,
/// relative error < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    if !(0.0..1.0).contains(&p) || p == 0.0 {
        return f64::NAN;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// The standard normal distribution function Φ(x) (Abramowitz & Stegun 7.1.26 for erf, absolute
/// error < 1.5e-7: enough for power calculations).
pub fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[cfg(test)]
mod normal_cdf_tests {
    use super::*;

    #[test]
    fn normal_cdf_inverts_the_quantile() {
        for p in [0.001, 0.1, 0.5, 0.657, 0.9, 0.975] {
            assert!((normal_cdf(normal_quantile(p)) - p).abs() < 1e-6, "{p}");
        }
    }
}
