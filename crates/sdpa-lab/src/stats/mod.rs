//! Statistics: descriptive helpers and intervals here; quantiles in [`distributions`], exact
//! tests for paired designs in [`hypothesis`], time-to-event statistics for runs that may not
//! finish in [`survival`].

pub mod distributions;
pub mod hypothesis;
pub mod survival;

pub use distributions::{normal_cdf, normal_quantile, t_critical_90, t_critical_95, t_quantile};

/// Mean.
pub fn mean(x: &[f64]) -> f64 {
    if x.is_empty() {
        return f64::NAN;
    }
    x.iter().sum::<f64>() / x.len() as f64
}

/// Sample standard deviation (n − 1 in the denominator, like `torch.std`).
pub fn std(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return f64::NAN;
    }
    let m = mean(x);
    (x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

/// Least-squares slope and intercept of y on x.
pub fn linear_fit(x: &[f64], y: &[f64]) -> (f64, f64) {
    let (mx, my) = (mean(x), mean(y));
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let sxx: f64 = x.iter().map(|a| (a - mx) * (a - mx)).sum();
    let slope = sxy / sxx;
    (slope, my - slope * mx)
}

/// The growth exponent p of y ∝ x^p, fitted on log-log axes.
pub fn growth_exponent(x: &[f64], y: &[f64]) -> f64 {
    let lx: Vec<f64> = x.iter().map(|v| v.ln()).collect();
    let ly: Vec<f64> = y.iter().map(|v| v.ln()).collect();
    linear_fit(&lx, &ly).0
}

/// The level of each of `k` simultaneous two-sided intervals that together cover at
/// `family_level` (Bonferroni): 1 − (1 − family_level) / k.
pub fn bonferroni_level(family_level: f64, k: usize) -> f64 {
    1.0 - (1.0 - family_level) / k.max(1) as f64
}

/// The mean's two-sided t-interval at `level` (NaN ends below two values).
pub fn mean_interval(x: &[f64], level: f64) -> (f64, f64) {
    let n = x.len();
    if n < 2 {
        return (f64::NAN, f64::NAN);
    }
    let m = mean(x);
    let half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * std(x) / (n as f64).sqrt();
    (m - half, m + half)
}

/// A share's two-sided Wilson score interval at `level` ((0, 1) when `n` is 0).
pub fn wilson_interval(successes: usize, n: usize, level: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = normal_quantile(1.0 - (1.0 - level) / 2.0);
    let (nf, p) = (n as f64, successes as f64 / n as f64);
    let denom = 1.0 + z * z / nf;
    let centre = (p + z * z / (2.0 * nf)) / denom;
    let half = z * (p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// The two-sided critical z of `k` simultaneous comparisons at a family-wise 95% level
/// (Bonferroni): Φ⁻¹(1 − 0.025 / k).
pub fn bonferroni_z(k: usize) -> f64 {
    normal_quantile(1.0 - 0.025 / k.max(1) as f64)
}

/// A statistic with its 95% interval (and its 90% one, where the method gives it: what an
/// equivalence test at 5% per side reads).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    /// The point estimate.
    pub value: f64,
    /// Lower end of the 95% interval.
    pub lo: f64,
    /// Upper end of the 95% interval.
    pub hi: f64,
    /// Number of draws, seeds or points behind it.
    pub n: usize,
    /// The 90% interval, where the method gives one.
    #[serde(default)]
    pub ci90: Option<(f64, f64)>,
}

impl Estimate {
    /// A value with no interval (NaN ends).
    pub fn point(value: f64, n: usize) -> Self {
        Self {
            value,
            lo: f64::NAN,
            hi: f64::NAN,
            n,
            ci90: None,
        }
    }

    /// `value [lo, hi]` with `digits` decimals, the interval's ends rounded outward (so that
    /// the printed interval holds the computed one).
    pub fn show(&self, digits: usize) -> String {
        if self.lo.is_finite() && self.hi.is_finite() {
            format!(
                "{:.digits$} [{}, {}]",
                self.value,
                round_down(self.lo, digits),
                round_up(self.hi, digits)
            )
        } else {
            format!(
                "{:.digits$} (no interval from {} draws)",
                self.value, self.n
            )
        }
    }
}

/// "13% [12, 14]": a share (fractions `value`, `lo`, `hi`) in whole percent, its interval's
/// ends rounded outward.
pub fn percent(value: f64, lo: f64, hi: f64) -> String {
    format!(
        "{:.0}% [{}, {}]",
        100.0 * value,
        round_down(100.0 * lo, 0),
        round_up(100.0 * hi, 0)
    )
}

/// `x` rounded down to `digits` decimals and printed with them: an interval's lower end.
pub fn round_down(x: f64, digits: usize) -> String {
    round_toward(x, digits, f64::floor)
}

/// `x` rounded up to `digits` decimals and printed with them: an interval's upper end.
pub fn round_up(x: f64, digits: usize) -> String {
    round_toward(x, digits, f64::ceil)
}

fn round_toward(x: f64, digits: usize, f: fn(f64) -> f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let scale = 10f64.powi(digits as i32);
    // A hair of slack so that a value printed exactly (0.72 stored as 0.71999…) keeps its digits.
    let scaled = x * scale;
    let nearest = scaled.round();
    let r = if (scaled - nearest).abs() < 1e-9 * scale.max(1.0) {
        nearest
    } else {
        f(scaled)
    };
    let out = format!("{:.digits$}", r / scale);
    if out.starts_with("-") && out.trim_start_matches(['-', '0', '.']).is_empty() {
        out.trim_start_matches('-').to_string()
    } else {
        out
    }
}

/// The mean with its 95% t-interval (mean ± t · s/√n).
pub fn mean_ci(x: &[f64]) -> Estimate {
    let n = x.len();
    let m = mean(x);
    let (half, half90) = if n >= 2 {
        let se = std(x) / (n as f64).sqrt();
        (t_critical_95(n - 1) * se, t_critical_90(n - 1) * se)
    } else {
        (f64::NAN, f64::NAN)
    };
    Estimate {
        value: m,
        lo: m - half,
        hi: m + half,
        n,
        ci90: Some((m - half90, m + half90)),
    }
}

/// The difference of two means, mean(a) − mean(b), with its 95% Welch t-interval (unequal
/// variances, Welch–Satterthwaite degrees of freedom rounded down). When both samples have no
/// spread the interval is the point itself.
pub fn diff_ci(a: &[f64], b: &[f64]) -> Estimate {
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let value = mean(a) - mean(b);
    if a.len() < 2 || b.len() < 2 {
        return Estimate {
            value,
            lo: f64::NAN,
            hi: f64::NAN,
            n: a.len().min(b.len()),
            ci90: None,
        };
    }
    let (va, vb) = (std(a).powi(2) / na, std(b).powi(2) / nb);
    let se = (va + vb).sqrt();
    let (half, half90) = if se == 0.0 {
        (0.0, 0.0)
    } else {
        let df = (va + vb).powi(2) / (va * va / (na - 1.0) + vb * vb / (nb - 1.0));
        let df = df.floor().max(1.0) as usize;
        (t_critical_95(df) * se, t_critical_90(df) * se)
    };
    Estimate {
        value,
        lo: value - half,
        hi: value + half,
        n: a.len().min(b.len()),
        ci90: Some((value - half90, value + half90)),
    }
}

/// A success rate with its 95% Wilson score interval.
pub fn wilson(successes: usize, n: usize) -> Estimate {
    let (lo, hi) = wilson_interval(successes, n, 0.95);
    Estimate {
        value: if n == 0 {
            f64::NAN
        } else {
            successes as f64 / n as f64
        },
        lo,
        hi,
        n,
        ci90: Some(wilson_interval(successes, n, 0.90)),
    }
}

/// The growth exponent p of y ∝ x^p fitted on log-log axes over every point (repeated draws at
/// the same x included), with the 95% t-interval of the least-squares slope.
pub fn exponent_ci(x: &[f64], y: &[f64]) -> Estimate {
    let lx: Vec<f64> = x.iter().map(|v| v.ln()).collect();
    let ly: Vec<f64> = y.iter().map(|v| v.ln()).collect();
    let n = lx.len();
    let (slope, intercept) = linear_fit(&lx, &ly);
    let mx = mean(&lx);
    let sxx: f64 = lx.iter().map(|a| (a - mx) * (a - mx)).sum();
    let ssr: f64 = lx
        .iter()
        .zip(&ly)
        .map(|(a, b)| {
            let r = b - (intercept + slope * a);
            r * r
        })
        .sum();
    let (half, half90) = if n > 2 && sxx > 0.0 {
        let se = (ssr / (n - 2) as f64 / sxx).sqrt();
        (t_critical_95(n - 2) * se, t_critical_90(n - 2) * se)
    } else {
        (f64::NAN, f64::NAN)
    };
    Estimate {
        value: slope,
        lo: slope - half,
        hi: slope + half,
        n,
        ci90: Some((slope - half90, slope + half90)),
    }
}

/// Ranks from 1, ties sharing their mean rank (values may be +∞: they rank last).
pub fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            r[k] = mean_rank;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation of `x` and `y` with a 95% interval from Fisher's z with the
/// standard error 1.06/√(n − 3) (Fieller, Hartley & Pearson); +∞ values rank last.
pub fn spearman(x: &[f64], y: &[f64]) -> Estimate {
    let n = x.len().min(y.len());
    let rho = spearman_rho(x, y);
    if n <= 3 || !rho.is_finite() {
        return Estimate::point(rho, n);
    }
    let z = rho.clamp(-0.999_999, 0.999_999).atanh();
    let se = 1.06 / ((n - 3) as f64).sqrt();
    let end = |k: f64| (z + k * se).tanh();
    Estimate {
        value: rho,
        lo: end(-1.959_964),
        hi: end(1.959_964),
        n,
        ci90: Some((end(-1.644_854), end(1.644_854))),
    }
}

/// A percentile bootstrap interval at `level` for a statistic of clustered data: each of
/// `resamples` draws `clusters.len()` clusters with replacement (a ChaCha8 stream seeded with
/// `seed`) and evaluates `statistic` on the union of their members' indices. Clusters keep what
/// is dependent together (the runs of one seed share its batches). Draws where the statistic is
/// not finite are dropped; NaN ends when fewer than half remain.
pub fn cluster_bootstrap(
    clusters: &[Vec<usize>],
    statistic: &dyn Fn(&[usize]) -> f64,
    resamples: usize,
    seed: u64,
    level: f64,
) -> (f64, f64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut values: Vec<f64> = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let mut idx = Vec::new();
        for _ in 0..clusters.len() {
            idx.extend_from_slice(&clusters[rng.random_range(0..clusters.len())]);
        }
        let v = statistic(&idx);
        if v.is_finite() {
            values.push(v);
        }
    }
    if clusters.is_empty() || values.len() * 2 < resamples {
        return (f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    let at = |q: f64| values[((q * values.len() as f64).floor() as usize).min(values.len() - 1)];
    (at(tail), at(1.0 - tail))
}

/// Spearman's rank correlation alone (+∞ ranks last; NaN when either side has no spread).
pub fn spearman_rho(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len());
    let (rx, ry) = (ranks(&x[..n]), ranks(&y[..n]));
    let (mx, my) = (mean(&rx), mean(&ry));
    let sxy: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - mx) * (b - my)).sum();
    let sxx: f64 = rx.iter().map(|a| (a - mx).powi(2)).sum();
    let syy: f64 = ry.iter().map(|b| (b - my).powi(2)).sum();
    sxy / (sxx * syy).sqrt()
}

/// The `q`-quantile of sorted values, interpolated linearly between order statistics (NaN when
/// there are none).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (i, frac) = (pos.floor() as usize, pos.fract());
    let next = sorted[(i + 1).min(sorted.len() - 1)];
    sorted[i] + frac * (next - sorted[i])
}

/// Median.
pub fn median(x: &[f64]) -> f64 {
    if x.is_empty() {
        return f64::NAN;
    }
    let mut v = x.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn interval_ends_round_outward() {
        assert_eq!(round_down(21.68, 0), "21");
        assert_eq!(round_up(24.46, 0), "25");
        assert_eq!(round_down(0.715, 2), "0.71");
        assert_eq!(round_up(0.7301, 2), "0.74");
        // A value that is exact at the digits stays.
        assert_eq!(round_down(0.72, 2), "0.72");
        assert_eq!(round_up(6.0, 1), "6.0");
        assert_eq!(round_down(-0.4149, 2), "-0.42");
        let e = Estimate {
            value: 23.07,
            lo: 21.68,
            hi: 24.46,
            n: 10,
            ci90: None,
        };
        assert_eq!(e.show(0), "23 [21, 25]");
    }

    #[test]
    fn t_quantile_wilson_and_bonferroni_against_scipy() {
        // scipy.stats.t.ppf(p, df)
        for (p, df, want) in [
            (0.975, 19, 2.093_024_054_408_308_7),
            (0.998_75, 19, 3.481_150_847_255_481),
            (0.996_875, 19, 3.073_752_003_838_371),
            (0.995, 29, 2.756_385_903_670_605),
            (0.9999, 10, 5.693_820_101_457_592),
            (0.975, 1, 12.706_204_736_174_694),
            (0.975, 2, 4.302_652_729_749_462),
            (0.993_75, 4, 4.314_656_048_886_743),
            (0.95, 200, 1.652_508_100_910_876_9),
        ] {
            assert!(
                (t_quantile(p, df) - want).abs() < 1e-9 * want,
                "t({p}, {df})"
            );
        }
        assert!((t_quantile(0.025, 19) + 2.093_024_054_408_308_7).abs() < 1e-9);
        assert!(t_quantile(0.975, 0).is_nan());
        assert!((bonferroni_level(0.95, 8) - 0.99375).abs() < 1e-15);
        // statsmodels.stats.proportion.proportion_confint(3, 20, 0.01, "wilson")
        let (lo, hi) = wilson_interval(3, 20, 0.99);
        assert!((lo - 0.038_787_060_508_071_68).abs() < 1e-8, "{lo}");
        assert!((hi - 0.435_586_720_261_055_7).abs() < 1e-8, "{hi}");
        let w = wilson(3, 20);
        assert_eq!(wilson_interval(3, 20, 0.95), (w.lo, w.hi));
        let (a, b) = mean_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95);
        assert!(
            (b - 3.0 - 2.776 * (2.5f64 / 5.0).sqrt()).abs() < 2e-3,
            "{a} {b}"
        );
    }

    #[test]
    fn cluster_bootstrap_is_seeded_and_covers_the_statistic() {
        // y = x: every resample has ρ = 1.
        let x: Vec<f64> = (0..40).map(|i| i as f64).collect();
        let clusters: Vec<Vec<usize>> = (0..20).map(|c| vec![2 * c, 2 * c + 1]).collect();
        let rho = |idx: &[usize]| {
            let v: Vec<f64> = idx.iter().map(|&i| x[i]).collect();
            spearman_rho(&v, &v)
        };
        assert_eq!(cluster_bootstrap(&clusters, &rho, 200, 1, 0.95), (1.0, 1.0));
        // Noise: the interval holds the full-sample value, and the same seed gives the same ends.
        let noisy: Vec<f64> = (0..40).map(|i| ((i * 7919) % 13) as f64).collect();
        let stat = |idx: &[usize]| {
            let a: Vec<f64> = idx.iter().map(|&i| x[i]).collect();
            let b: Vec<f64> = idx.iter().map(|&i| noisy[i]).collect();
            spearman_rho(&a, &b)
        };
        let full = spearman_rho(&x, &noisy);
        let (lo, hi) = cluster_bootstrap(&clusters, &stat, 500, 3, 0.95);
        assert!(lo < full && full < hi, "{lo} {full} {hi}");
        assert_eq!(cluster_bootstrap(&clusters, &stat, 500, 3, 0.95), (lo, hi));
        assert!(cluster_bootstrap(&[], &stat, 10, 3, 0.95).0.is_nan());
    }

    #[test]
    fn welch_difference_interval() {
        // Equal spreads and sizes: the Welch interval is the pooled one (df = 2n − 2 = 8).
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [3.0, 4.0, 5.0, 6.0, 7.0];
        let d = diff_ci(&a, &b);
        assert_eq!(d.value, -2.0);
        let half = 2.306 * (2.5f64 / 5.0 + 2.5 / 5.0).sqrt();
        assert!((d.hi - d.value - half).abs() < 1e-9, "{d:?}");
        let same = diff_ci(&[4.0, 4.0], &[1.0, 1.0]);
        assert_eq!((same.lo, same.value, same.hi), (3.0, 3.0, 3.0));
        assert!(diff_ci(&[1.0], &[2.0, 3.0]).lo.is_nan());
    }

    use super::*;

    #[test]
    fn ranks_and_spearman() {
        assert_eq!(
            ranks(&[3.0, 1.0, 3.0, f64::INFINITY]),
            vec![2.5, 1.0, 2.5, 4.0]
        );
        // scipy.stats.spearmanr([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5]).statistic = 0.8285714
        let r = spearman(
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            &[2.0, 1.0, 4.0, 3.0, 6.0, 5.0],
        );
        assert!((r.value - 0.828_571_4).abs() < 1e-6 && r.lo < r.value && r.hi > r.value);
    }

    #[test]
    fn std_and_fit() {
        assert!((std(&[1.0, 2.0, 3.0, 4.0]) - 1.290_994_448_7).abs() < 1e-9);
        let x = [1.0, 2.0, 4.0, 8.0];
        let y: Vec<f64> = x.iter().map(|v: &f64| 3.0 * v.powi(2)).collect();
        assert!((growth_exponent(&x, &y) - 2.0).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn intervals() {
        // mean 2.5, s = 1.291, t(3) = 3.182: half-width 2.054
        let e = mean_ci(&[1.0, 2.0, 3.0, 4.0]);
        assert!(
            (e.value - 2.5).abs() < 1e-12 && (e.hi - 2.5 - 2.054).abs() < 1e-3,
            "{e:?}"
        );
        // Wilson 8/10: [0.490, 0.943]
        let w = wilson(8, 10);
        assert!(
            (w.lo - 0.490).abs() < 1e-3 && (w.hi - 0.943).abs() < 1e-3,
            "{w:?}"
        );
        assert_eq!(wilson(0, 10).lo, 0.0);
        assert!((t_critical_95(1000) - 1.962).abs() < 1e-3);
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-6);
        assert!((normal_quantile(0.001) + 3.090_232).abs() < 1e-6);
        assert!((bonferroni_z(4) - 2.497_705).abs() < 1e-5);
        // An exact power law has a zero-width interval; noise widens it around the truth.
        let x = [1.0, 2.0, 4.0, 8.0, 16.0];
        let y: Vec<f64> = x.iter().map(|v: &f64| v.powf(-0.5)).collect();
        let e = exponent_ci(&x, &y);
        assert!((e.value + 0.5).abs() < 1e-12 && (e.hi - e.lo).abs() < 1e-9);
        let noisy: Vec<f64> = y
            .iter()
            .enumerate()
            .map(|(i, v)| v * if i % 2 == 0 { 1.1 } else { 0.9 })
            .collect();
        let e = exponent_ci(&x, &noisy);
        assert!(e.lo < -0.5 && e.hi > -0.5, "{e:?}");
    }
}
