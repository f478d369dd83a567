//! `why-softmax`'s rows, claims and section.

use serde::Serialize;

use super::{DrawValues, METHODS, WhySoftmaxConfig, WhySoftmaxResult};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source, interval_below, show};
use crate::experiment::{Analysis, Measured};
use crate::stats::{Estimate, exponent_ci, mean_ci};

/// The d the n-sweep is read at.
pub const D_REF: usize = 64;
/// The n selectivity is read at.
pub const N_REF: usize = 256;

/// One (method, n, d, scaling) over its draws.
#[derive(Debug, Clone, Serialize)]
pub struct WhySoftmaxRow {
    /// Weighting.
    pub method: String,
    /// Keys.
    pub n: usize,
    /// q/k dimension.
    pub d: usize,
    /// Scores ÷ √d.
    pub scaled: bool,
    /// Output std per draw.
    pub output_std: Vec<f64>,
    /// Its mean and interval.
    pub output_std_ci: Estimate,
    /// Largest |mean row sum − 1| over draws.
    pub weight_sum_error: f64,
    /// Effective keys per draw (normalized weightings).
    pub effective_keys: Vec<f64>,
    /// Its mean and interval.
    pub effective_keys_ci: Option<Estimate>,
    /// Entropy per draw (normalized weightings).
    pub entropies: Vec<f64>,
    /// Its mean and interval.
    pub entropy: Option<Estimate>,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct WhySoftmaxData {
    /// Value width.
    pub d_v: usize,
    /// Draws per cell.
    pub draws: usize,
    /// Keys swept.
    pub ns: Vec<usize>,
    /// Every row.
    pub rows: Vec<WhySoftmaxRow>,
    /// Fitted n-exponent of the output std per weighting (d = D_REF, scaled).
    pub exponents: Vec<(String, Estimate)>,
}

fn row(c: &WhySoftmaxConfig, method: usize, scaled: bool, draws: &[DrawValues]) -> WhySoftmaxRow {
    let stds: Vec<f64> = draws.iter().map(|v| v.output_std).collect();
    let eff: Vec<f64> = draws.iter().filter_map(|v| v.effective_keys).collect();
    let ent: Vec<f64> = draws.iter().filter_map(|v| v.entropy).collect();
    WhySoftmaxRow {
        method: METHODS[method].into(),
        n: c.n,
        d: c.d,
        scaled,
        output_std_ci: mean_ci(&stds),
        output_std: stds,
        weight_sum_error: draws
            .iter()
            .map(|v| (v.weight_sum - 1.0).abs())
            .fold(0.0, f64::max),
        effective_keys_ci: (!eff.is_empty()).then(|| mean_ci(&eff)),
        effective_keys: eff,
        entropy: (!ent.is_empty()).then(|| mean_ci(&ent)),
        entropies: ent,
    }
}

fn n_exponent(rows: &[WhySoftmaxRow], method: &str, d: usize, scaled: bool) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.method == method && r.d == d && r.scaled == scaled)
        .flat_map(|r| r.output_std.iter().map(move |s| (r.n as f64, *s)))
        .unzip();
    exponent_ci(&xs, &ys)
}

/// Rows and claims.
pub fn analyze(cells: &[Measured<WhySoftmaxConfig, WhySoftmaxResult>]) -> Analysis<WhySoftmaxData> {
    let mut rows = Vec::new();
    for c in cells {
        for (mi, per_scaling) in c.result.values.iter().enumerate() {
            for (si, draws) in per_scaling.iter().enumerate() {
                rows.push(row(&c.config, mi, si == 1, draws));
            }
        }
    }
    let exponents = METHODS
        .iter()
        .map(|m| (m.to_string(), n_exponent(&rows, m, D_REF, true)))
        .collect();
    let mut ns: Vec<usize> = cells.iter().map(|c| c.config.n).collect();
    ns.sort();
    ns.dedup();
    let first = cells.first().map(|c| &c.config);
    let data = WhySoftmaxData {
        d_v: first.map_or(0, |c| c.d_v),
        draws: first.map_or(0, |c| c.draws),
        ns,
        rows,
        exponents,
    };
    Analysis::new(claims(&data), data)
}

/// What softmax adds: selectivity, which unscaled logits push further as d grows.
fn selectivity_claims(rows: &[WhySoftmaxRow]) -> Vec<Claim> {
    let mut claims = Vec::new();
    let d_max = rows.iter().map(|r| r.d).max().unwrap_or(0);
    let cell = |scaled: bool| {
        rows.iter()
            .find(|r| r.method == METHODS[0] && r.n == N_REF && r.d == d_max && r.scaled == scaled)
            .and_then(|r| r.effective_keys_ci)
    };
    if let (Some(raw), Some(scaled)) = (cell(false), cell(true)) {
        claims.push(Claim::decided(
            "softmax-selects",
            Source::Lab,
            format!(
                "what softmax adds is selectivity: larger logits (unscaled, d = {d_max}) concentrate each row on fewer keys"
            ),
            "effective keys 1/Σp²: the unscaled interval entirely below the scaled one",
            format!("unscaled {}, scaled {} (n = {N_REF})", show(raw), show(scaled)),
            interval_below(raw, scaled),
        ));
    }
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.method == METHODS[0] && r.n == N_REF && !r.scaled)
        .flat_map(|r| r.effective_keys.iter().map(move |e| (r.d as f64, *e)))
        .unzip();
    claims.push(Claim::below(
        "unscaled-selectivity-grows-with-d",
        Source::Lab,
        format!(
            "with unscaled scores, the effective number of keys falls as d grows (n = {N_REF})"
        ),
        "fitted d-exponent of softmax's effective keys, raw scores",
        exponent_ci(&xs, &ys),
        0.0,
    ));
    claims
}

/// The claims.
pub fn claims(data: &WhySoftmaxData) -> Vec<Claim> {
    let rows = &data.rows;
    let exp = |method: &str| n_exponent(rows, method, D_REF, true);
    let bounded: Vec<Condition> = [false, true]
        .into_iter()
        .map(|scaled| {
            let cells: Vec<&WhySoftmaxRow> =
                rows.iter().filter(|r| r.method == METHODS[0] && r.scaled == scaled).collect();
            let worst_std = cells.iter().map(|r| r.output_std_ci.hi).fold(0.0, f64::max);
            let worst_sum = cells.iter().map(|r| r.weight_sum_error).fold(0.0, f64::max);
            Condition {
                label: if scaled { "scores ÷ √d" } else { "raw scores (std √d)" }.into(),
                measured: format!(
                    "largest upper end of the output std {worst_std:.3}, largest |row sum − 1| {worst_sum:.1e} over {} cells",
                    cells.len()
                ),
                outcome: Outcome::of(Some(worst_std <= 1.0 && worst_sum <= 1e-5)),
            }
        })
        .collect();
    let mut claims = vec![
        Claim::per_condition(
            "softmax-budget",
            Source::Article(&article::SOFTMAX_BUDGET),
            "softmax weights sum to 1 and nothing is amplified: the output's std never exceeds the values' (1), whatever n, d or the logits' size",
            "in every (n, d) cell: |row sum − 1| ≤ 1e−5 and the 95% interval of the output std at or below 1",
            bounded,
        )
        .cannot_fail(
            "softmax's rows sum to 1 by definition, and a weighted average of unit-variance values \
             has std at most 1: only a bug could fail it",
        ),
        Claim::above(
            "raw-explodes",
            Source::Article(&article::RAW_WEIGHTS_UNCONTROLLED),
            "raw dot products as weights let the output's scale grow without control as the number of keys grows",
            "fitted n-exponent of the output std, raw dot products",
            exp(METHODS[1]),
            0.0,
        ),
        Claim::below(
            "divide-by-n-vanishes",
            Source::Lab,
            "dividing the dot products by n instead makes the output vanish as n grows",
            "fitted n-exponent of the output std, dot products / n",
            exp(METHODS[2]),
            0.0,
        ),
        Claim::in_range(
            "softmax-averages-like-1-over-sqrt-n",
            Source::Lab,
            "with std-1 logits softmax is close to a uniform average: its output std decays like 1/√n (band ±0.1), as an average of n independent unit values must",
            "fitted n-exponent of the output std, softmax",
            exp(METHODS[0]),
            -0.6,
            -0.4,
        ),
    ];
    claims.extend(selectivity_claims(rows));
    claims
}
