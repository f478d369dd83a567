//! Time-to-event statistics for runs that may not finish: the Kaplan–Meier estimator with
//! Greenwood's variance, and its median with the Brookmeyer–Crowley interval (the times where
//! the log(−log) pointwise 95% band of S(t) crosses ½, as R's `survfit(conf.type = "log-log")`
//! and lifelines compute it). A run that never reaches the target is *censored* at its budget:
//! it says "longer than this", and it is never averaged as a number.

use serde::{Deserialize, Serialize};

/// One run: the step it reached the target, or the step it was stopped without reaching it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The step of the event, or of the censoring.
    pub time: f64,
    /// Whether the target was reached at `time` (false: censored there).
    pub reached: bool,
}

/// One step of the Kaplan–Meier curve, at an event time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KmPoint {
    /// The event time.
    pub time: f64,
    /// Runs still running just before it.
    pub at_risk: usize,
    /// Runs that reached the target at it.
    pub events: usize,
    /// S(t): the share of runs that have not reached the target by it.
    pub survival: f64,
    /// Lower end of the 95% log(−log) pointwise interval of S(t).
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
}

/// The Kaplan–Meier curve of `obs`, one point per distinct event time (95% bands).
pub fn kaplan_meier(obs: &[Observation]) -> Vec<KmPoint> {
    kaplan_meier_at(obs, 0.95)
}

/// The Kaplan–Meier curve of `obs` with pointwise bands at `level`.
pub fn kaplan_meier_at(obs: &[Observation], level: f64) -> Vec<KmPoint> {
    let z = crate::stats::normal_quantile(1.0 - (1.0 - level) / 2.0);
    let mut times: Vec<f64> = obs.iter().filter(|o| o.reached).map(|o| o.time).collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times.dedup();
    let mut survival = 1.0f64;
    let mut greenwood = 0.0f64;
    let mut out = Vec::with_capacity(times.len());
    for t in times {
        let at_risk = obs.iter().filter(|o| o.time >= t).count();
        let events = obs.iter().filter(|o| o.reached && o.time == t).count();
        let (n, d) = (at_risk as f64, events as f64);
        survival *= 1.0 - d / n;
        if at_risk > events {
            greenwood += d / (n * (n - d));
        }
        let (lo, hi) = if survival <= 0.0 {
            (0.0, 0.0)
        } else if survival >= 1.0 {
            (1.0, 1.0)
        } else {
            // θ = ln(−ln S), se(θ) = √Greenwood / |ln S|; S^{exp(±z·se)}
            let se = greenwood.sqrt() / survival.ln().abs();
            (
                survival.powf((z * se).exp()),
                survival.powf((-z * se).exp()),
            )
        };
        out.push(KmPoint {
            time: t,
            at_risk,
            events,
            survival,
            lo,
            hi,
        });
    }
    out
}

/// A median time to the target with its 95% interval; `None` means "not reached within the
/// runs' budget" (the median or that end of the interval lies beyond the longest run).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KmMedian {
    /// The median: the first time S(t) ≤ ½ (the usual inf{t : S(t) ≤ ½}).
    pub value: Option<f64>,
    /// Lower end: the first time the lower band is ≤ ½.
    pub lo: Option<f64>,
    /// Upper end: the first time the upper band is ≤ ½.
    pub hi: Option<f64>,
    /// Runs.
    pub n: usize,
    /// Runs that never reached the target.
    pub censored: usize,
}

impl KmMedian {
    /// `value [lo, hi]`, with `> budget` for an end that was not reached.
    pub fn show(&self, budget: f64) -> String {
        let end = |x: Option<f64>| x.map_or(format!("> {budget}"), |v| format!("{v}"));
        format!("{} [{}, {}]", end(self.value), end(self.lo), end(self.hi))
    }
}

/// The Kaplan–Meier median of `obs` with its Brookmeyer–Crowley 95% interval.
pub fn km_median(obs: &[Observation]) -> KmMedian {
    km_median_at(obs, 0.95)
}

/// The Kaplan–Meier median of `obs` with its Brookmeyer–Crowley interval at `level`.
pub fn km_median_at(obs: &[Observation], level: f64) -> KmMedian {
    let curve = kaplan_meier_at(obs, level);
    let first =
        |f: &dyn Fn(&KmPoint) -> f64| curve.iter().find(|p| f(p) <= 0.5 + 1e-12).map(|p| p.time);
    KmMedian {
        value: first(&|p| p.survival),
        lo: first(&|p| p.lo),
        hi: first(&|p| p.hi),
        n: obs.len(),
        censored: obs.iter().filter(|o| !o.reached).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(data: &[(f64, bool)]) -> Vec<Observation> {
        data.iter()
            .map(|&(time, reached)| Observation { time, reached })
            .collect()
    }

    #[test]
    fn survival_curve_by_hand() {
        // 6 runs: events at 10, 20, 20, 40; censored at 30 and 50.
        let o = obs(&[
            (10.0, true),
            (20.0, true),
            (20.0, true),
            (30.0, false),
            (40.0, true),
            (50.0, false),
        ]);
        let km = kaplan_meier(&o);
        let s: Vec<f64> = km.iter().map(|p| p.survival).collect();
        // 5/6, 5/6 · 3/5 = 1/2, 1/2 · 1/2 = 1/4
        assert!((s[0] - 5.0 / 6.0).abs() < 1e-12);
        assert!((s[1] - 0.5).abs() < 1e-12);
        assert!((s[2] - 0.25).abs() < 1e-12);
        assert_eq!(km_median(&o).value, Some(20.0));
        assert_eq!(km_median(&o).censored, 2);
    }

    #[test]
    fn a_median_beyond_the_budget_is_not_a_number() {
        let o = obs(&[(30.0, true), (300.0, false), (300.0, false), (300.0, false)]);
        let m = km_median(&o);
        assert_eq!(m.value, None);
        assert_eq!(m.hi, None);
        assert_eq!(m.show(300.0), "> 300 [30, > 300]");
    }

    #[test]
    fn median_interval_matches_lifelines() {
        // lifelines 0.30.3 KaplanMeierFitter on these 20 runs (6 censored at 300):
        // median_survival_times(confidence_interval_) = [60, inf]; the band at t = 60 is
        // [0.450546, 0.852518]. S(100) = 0.5 exactly: the median is 100 by the usual definition
        // inf{t : S(t) ≤ ½} (lifelines takes S(t) < ½ and says 110; R averages them: 105).
        let mut data: Vec<(f64, bool)> = [
            30.0, 40.0, 40.0, 50.0, 60.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 150.0, 200.0,
        ]
        .iter()
        .map(|&t| (t, true))
        .collect();
        data.extend([(300.0, false); 6]);
        let o = obs(&data);
        let m = km_median(&o);
        assert_eq!((m.value, m.lo, m.hi), (Some(100.0), Some(60.0), None));
        let at60 = kaplan_meier(&o)[3];
        assert_eq!(at60.time, 60.0);
        assert!((at60.lo - 0.450_546).abs() < 1e-6 && (at60.hi - 0.852_518).abs() < 1e-6);
    }
}
