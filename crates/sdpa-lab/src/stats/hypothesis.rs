//! Exact tests for paired designs and multiplicity: the binomial tail, McNemar's exact test, the
//! sign test, Holm's step-down correction, distribution-free median intervals and the TOST
//! decision for equivalence.

use super::Estimate;

/// ln C(n, k).
fn ln_choose(n: usize, k: usize) -> f64 {
    ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k)
}

/// ln n! (exact sum below 256, Stirling's series above: relative error < 1e-15 there).
fn ln_factorial(n: usize) -> f64 {
    if n < 256 {
        (2..=n).map(|i| (i as f64).ln()).sum()
    } else {
        let x = n as f64;
        x * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI * x).ln() + 1.0 / (12.0 * x)
            - 1.0 / (360.0 * x * x * x)
    }
}

/// P(X ≤ k) for X ~ Binomial(n, p).
pub fn binomial_cdf(k: usize, n: usize, p: f64) -> f64 {
    if k >= n {
        return 1.0;
    }
    if p <= 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return 0.0;
    }
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    (0..=k)
        .map(|i| (ln_choose(n, i) + i as f64 * lp + (n - i) as f64 * lq).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The two-sided exact p-value of `a` against `b` successes out of `a + b` fair coin flips:
/// 2 · P(X ≤ min(a, b)) for X ~ Binomial(a + b, 1/2), capped at 1 (1 when there are no flips).
pub fn two_sided_binomial(a: usize, b: usize) -> f64 {
    let n = a + b;
    if n == 0 {
        return 1.0;
    }
    (2.0 * binomial_cdf(a.min(b), n, 0.5)).min(1.0)
}

/// McNemar's exact test on the discordant pairs of a paired binary outcome: `b` pairs where
/// only the first arm had the event, `c` where only the second had it. Two-sided p-value.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    two_sided_binomial(b, c)
}

/// The sign test on paired comparisons: `first` pairs where the first arm did better, `second`
/// where the second did (ties are dropped before calling). Two-sided exact p-value.
pub fn sign_test(first: usize, second: usize) -> f64 {
    two_sided_binomial(first, second)
}

/// Holm's step-down adjusted p-values (family-wise error control), in the input order.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![0.0; m];
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// The median of `values` with a distribution-free interval from order statistics: the
/// largest k with 2·P(Bin(n, ½) ≤ k − 1) ≤ 1 − level gives [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] (coverage at least
/// `level`). Values may be ±∞ (a censored run ranked last or first); an end that is infinite
/// means the interval is open on that side. Too few values for the level: NaN ends.
pub fn median_ci(values: &[f64], level: f64) -> Estimate {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let value = super::median(&v);
    let k = median_rank(n, level);
    // k order statistics can be dropped from each end; 0 means none: no interval.
    let (lo, hi) = if k == 0 {
        (f64::NAN, f64::NAN)
    } else {
        (v[k - 1], v[n - k])
    };
    Estimate {
        value,
        lo,
        hi,
        n,
        ci90: None,
    }
}

/// How many order statistics a distribution-free interval for the median of `n` values at
/// `level` drops from each end (0: too few values for any interval).
fn median_rank(n: usize, level: f64) -> usize {
    let alpha = 1.0 - level;
    let mut k = 0;
    while k < n / 2 && 2.0 * binomial_cdf(k, n, 0.5) <= alpha {
        k += 1;
    }
    k
}

/// The median of values known only within bounds (`(lo, hi)` per value, the value inside:
/// exact values have `lo == hi`, a value censored above has `hi = +∞`, one censored below `lo =
/// 0` or −∞), with a conservative order-statistics interval at `level`: its lower end is the
/// order statistic of the lower bounds and its upper end that of the upper bounds that the
/// exact interval ([`median_ci`]) would take (sorting keeps l₍ₖ₎ ≤ x₍ₖ₎ ≤ u₍ₖ₎), so it covers the
/// true values' median at least as often. Returns the estimate, whose `value` is the median of
/// the lower bounds (the sample median is at least this), and the median of the upper bounds
/// (it is at most this). A pair with a NaN bound is left out whole.
pub fn bounded_median_ci(bounds: &[(f64, f64)], level: f64) -> (Estimate, f64) {
    let kept: Vec<(f64, f64)> = bounds
        .iter()
        .copied()
        .filter(|(lo, hi)| !lo.is_nan() && !hi.is_nan())
        .collect();
    let mut lo: Vec<f64> = kept.iter().map(|b| b.0).collect();
    let mut hi: Vec<f64> = kept.iter().map(|b| b.1).collect();
    lo.sort_by(|a, b| a.total_cmp(b));
    hi.sort_by(|a, b| a.total_cmp(b));
    let n = kept.len();
    let k = median_rank(n, level);
    let (ci_lo, ci_hi) = if k == 0 {
        (f64::NAN, f64::NAN)
    } else {
        (lo[k - 1], hi[n - k])
    };
    (
        Estimate {
            value: super::median(&lo),
            lo: ci_lo,
            hi: ci_hi,
            n,
            ci90: None,
        },
        super::median(&hi),
    )
}

/// The decision of an equivalence claim ("A is as good as B within ±margin") by two one-sided
/// tests, read from the difference's interval at level 1 − 2α (90% for α = 5% per side):
/// equivalent (`Some(true)`) when it lies inside (−margin, margin); not equivalent
/// (`Some(false)`) when it lies entirely beyond one end (the difference exceeds the margin at
/// level α); undecided (`None`) otherwise, including an interval that only partly leaves the
/// margin.
pub fn tost(interval: (f64, f64), margin: f64) -> Option<bool> {
    let (lo, hi) = interval;
    if lo.is_nan() || hi.is_nan() {
        return None;
    }
    if lo > -margin && hi < margin {
        Some(true)
    } else if lo > margin || hi < -margin {
        // Not equivalent only when the interval lies strictly beyond a margin: an end on the
        // margin itself cannot exclude a difference of exactly the margin.
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_median_covers_the_exact_one_and_opens_where_values_are_censored() {
        let exact: Vec<f64> = (1..=20).map(f64::from).collect();
        let bounds: Vec<(f64, f64)> = exact.iter().map(|&x| (x, x)).collect();
        let (e, upper) = bounded_median_ci(&bounds, 0.95);
        let want = median_ci(&exact, 0.95);
        assert_eq!(
            (e.value, e.lo, e.hi, upper),
            (want.value, want.lo, want.hi, want.value)
        );
        // The six largest only known to be at least themselves: the lower end and the value
        // stay, the upper end and the upper median open up to ∞ only if they reach them.
        let censored: Vec<(f64, f64)> = exact
            .iter()
            .map(|&x| (x, if x > 14.0 { f64::INFINITY } else { x }))
            .collect();
        let (c, c_upper) = bounded_median_ci(&censored, 0.95);
        assert_eq!((c.value, c.lo), (want.value, want.lo));
        assert!(c.hi >= want.hi && c_upper >= want.value);
        // A pair with a NaN bound is dropped whole (not its bounds one by one).
        let mut with_nan = bounds.clone();
        with_nan.push((f64::NAN, 5.0));
        assert_eq!(bounded_median_ci(&with_nan, 0.95).0.n, 20);
    }

    #[test]
    fn binomial_tails_and_exact_tests() {
        // P(Bin(10, ½) ≤ 2) = 56/1024.
        assert!((binomial_cdf(2, 10, 0.5) - 56.0 / 1024.0).abs() < 1e-15);
        // scipy.stats.binomtest(1, 9).pvalue = 0.0390625 (2 · 10/512)
        assert!((mcnemar_exact(1, 8) - 0.0390625).abs() < 1e-12);
        assert!((sign_test(8, 1) - 0.0390625).abs() < 1e-12);
        // scipy.stats.binomtest(0, 10).pvalue = 0.001953125
        assert!((mcnemar_exact(0, 10) - 0.001953125).abs() < 1e-12);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(5, 5), 1.0);
        // scipy.stats.binomtest(3, 20).pvalue = 0.0025768280029296875
        assert!((sign_test(3, 17) - 0.0025768280029296875).abs() < 1e-12);
        // Large n goes through Stirling: scipy.stats.binom.cdf(180, 400, 0.5) = 0.025520111564574.
        assert!((binomial_cdf(180, 400, 0.5) - 0.025_520_111_564_574).abs() < 1e-9);
    }

    #[test]
    fn holm_adjusts_step_down() {
        // statsmodels multipletests([0.01, 0.04, 0.03, 0.005], method="holm")
        // -> [0.03, 0.06, 0.06, 0.02]
        let adj = holm(&[0.01, 0.04, 0.03, 0.005]);
        for (a, want) in adj.iter().zip([0.03, 0.06, 0.06, 0.02]) {
            assert!((a - want).abs() < 1e-12, "{adj:?}");
        }
        assert_eq!(holm(&[0.5, 0.9]), vec![1.0, 1.0]);
    }

    #[test]
    fn median_interval_from_order_statistics() {
        // n = 20 at 90%: 2·P(Bin(20, ½) ≤ 5) = 0.0414 ≤ 0.10 < 2·P(≤ 6) = 0.1153: k = 6,
        // [x₍₆₎, x₍₁₅₎].
        let v: Vec<f64> = (1..=20).map(|i| i as f64).collect();
        let e = median_ci(&v, 0.90);
        assert_eq!((e.value, e.lo, e.hi), (10.5, 6.0, 15.0));
        // Censored values ranked last (+∞) keep the interval finite while few are censored...
        let mut c = v.clone();
        c[19] = f64::INFINITY;
        c[18] = f64::INFINITY;
        assert_eq!(median_ci(&c, 0.90).hi, 15.0);
        // ...and open it when many are.
        let many: Vec<f64> = (0..20)
            .map(|i| if i < 8 { i as f64 } else { f64::INFINITY })
            .collect();
        assert_eq!(median_ci(&many, 0.90).hi, f64::INFINITY);
        assert!(median_ci(&[1.0, 2.0], 0.95).lo.is_nan());
    }

    #[test]
    fn tost_decides_equivalence() {
        assert_eq!(tost((-10.0, 20.0), 50.0), Some(true));
        // Entirely beyond the margin: the difference exceeds it.
        assert_eq!(tost((60.0, 260.0), 50.0), Some(false));
        assert_eq!(tost((-f64::INFINITY, -50.5), 50.0), Some(false));
        // An end on the margin is not beyond it.
        assert_eq!(tost((-f64::INFINITY, -50.0), 50.0), None);
        assert_eq!(tost((50.0, 90.0), 50.0), None);
        // Significantly different from 0 but partly inside the margin: undecided.
        assert_eq!(tost((20.0, f64::INFINITY), 30.0), None);
        assert_eq!(tost((-30.0, 90.0), 50.0), None);
        assert_eq!(tost((f64::NAN, 1.0), 50.0), None);
    }
}
