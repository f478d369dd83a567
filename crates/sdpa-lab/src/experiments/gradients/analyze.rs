//! `gradients`' rows, paired ratios and claims.

use serde::Serialize;

use super::{DrawValues, GradientsConfig, GradientsResult};
use crate::experiment::{BackendValues, Measured, Plan};
use crate::experiments::training_confirm2::design::PREMISE_MIN_D_K_UNIT_ENTRIES;
use crate::stats::{Estimate, bonferroni_level, exponent_ci, mean_ci, mean_interval};

/// "Almost zero" (Q1: 梯度几乎为 0): the unscaled Jacobian at most a tenth of the scaled one —
/// an order of magnitude, fixed before any run.
pub const ALMOST_ZERO_RATIO: f64 = 0.1;

/// One (design, backend, d, scaling) over its draws.
#[derive(Debug, Clone, Serialize)]
pub struct GradientRow {
    /// d_v of the design.
    pub d_v_fixed: bool,
    /// Backend.
    pub backend: String,
    /// d.
    pub d: usize,
    /// Scaled by 1/√d.
    pub scaled: bool,
    /// Mean max p.
    pub max_p: Estimate,
    /// ‖J‖_F per row.
    pub jacobian_norm: Estimate,
    /// RMS ∂L/∂scores.
    pub rms_ds: Estimate,
    /// Share of keys receiving gradient.
    pub share_keys: Estimate,
    /// RMS ∂L/∂Q.
    pub rms_dq: Estimate,
    /// RMS ∂L/∂K.
    pub rms_dk: Estimate,
    /// RMS ∂L/∂V.
    pub rms_dv: Estimate,
    /// Largest |autodiff − analytic| per-row ‖J‖ on the first draw.
    pub jacobian_check: Option<f64>,
}

/// Paired ratios unscaled / scaled, per (design, d), primary backend.
#[derive(Debug, Clone, Serialize)]
pub struct RatioRow {
    /// d_v fixed (primary design) or d_v = d.
    pub d_v_fixed: bool,
    /// d.
    pub d: usize,
    /// ‖J‖ unscaled / scaled, mean over draws, with a family-wise 95% interval (Bonferroni over
    /// the key sweep's (m, d) that meet the premise: the conditions its claims count).
    pub jacobian: Estimate,
    /// RMS ∂L/∂Q unscaled / scaled.
    pub query: Estimate,
    /// RMS ∂L/∂s unscaled / scaled.
    pub scores: Estimate,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct GradientsData {
    /// Queries = keys.
    pub n: usize,
    /// Draws per cell.
    pub draws: usize,
    /// Query rows of the Jacobian check.
    pub jacobian_rows: usize,
    /// The primary backend.
    pub primary: String,
    /// Every row.
    pub rows: Vec<GradientRow>,
    /// The paired ratios.
    pub ratios: Vec<RatioRow>,
    /// Growth exponents on d of the unscaled RMS ∂L/∂Q and ∂L/∂s: (d_v fixed, d_v = d).
    pub exponents: Vec<(String, Estimate, Estimate)>,
    /// Where the unscaled ‖J‖ crosses the scaled one (log-interpolated d), if it does, with a
    /// 95% percentile bootstrap interval (draws resampled within each d; NaN ends when fewer
    /// than half the resamples cross).
    pub crossover_d: Option<Estimate>,
    /// The primary design's ‖J‖ ratio per number of keys m (the main cells' m and the sweep's).
    pub by_keys: Vec<KeysRow>,
    /// The crossover per number of keys m, as [`GradientsData::crossover_d`].
    pub crossover_by_keys: Vec<(usize, Option<Estimate>)>,
    /// Every draw of every cell, both scalings side by side (the paired values behind every
    /// interval: `gradients_draws.csv`).
    pub per_draw: Vec<DrawRow>,
}

/// One draw of one cell: the unscaled and scaled values measured on the same inputs.
#[derive(Debug, Clone, Serialize)]
pub struct DrawRow {
    /// The design the cell belongs to (its id's first part: `dv64` d_v fixed, `dv=d` d_v = d,
    /// `sweep` the key sweep). At d = 64 the two main designs run the same configuration on
    /// the same draws, so their rows repeat each other's values.
    pub design: String,
    /// d_v.
    pub d_v: usize,
    /// Backend.
    pub backend: String,
    /// Keys (and queries) per row.
    pub m: usize,
    /// d.
    pub d: usize,
    /// The draw's index.
    pub draw: usize,
    /// Unscaled.
    pub unscaled: DrawValues,
    /// Scaled by 1/√d.
    pub scaled: DrawValues,
}

impl GradientsData {
    /// The numbers of keys of the key sweep, increasing (`by_keys` is ordered by m).
    pub fn key_counts(&self) -> Vec<usize> {
        let mut ms: Vec<usize> = self.by_keys.iter().map(|r| r.m).collect();
        ms.dedup();
        ms
    }
}

/// The paired ‖J‖ ratio at one (m, d) of the primary design (d_v fixed), primary backend.
#[derive(Debug, Clone, Serialize)]
pub struct KeysRow {
    /// Keys (= queries).
    pub m: usize,
    /// d.
    pub d: usize,
    /// ‖J‖ unscaled / scaled, mean over draws, with a family-wise 95% interval (Bonferroni over
    /// the key sweep's (m, d) that meet the premise: the conditions its claims count).
    pub jacobian: Estimate,
    /// Every draw's unscaled ‖J‖ (the shrink-with-d fit reads them).
    pub unscaled_draws: Vec<f64>,
    /// RMS ∂L/∂Q unscaled / scaled, mean over draws (paired per draw), with the same
    /// family-wise interval as `jacobian`.
    pub query: Estimate,
}

fn row(c: &GradientsConfig, scaled: bool, draws: &[DrawValues], check: Option<f64>) -> GradientRow {
    let ci = |pick: fn(&DrawValues) -> f64| mean_ci(&draws.iter().map(pick).collect::<Vec<_>>());
    GradientRow {
        // The primary design's cells are the ones with the Jacobian check.
        d_v_fixed: c.jacobian_rows.is_some(),
        backend: c.backend.clone(),
        d: c.d,
        scaled,
        max_p: ci(|v| v.max_p),
        jacobian_norm: ci(|v| v.jacobian_norm),
        rms_ds: ci(|v| v.rms_ds),
        share_keys: ci(|v| v.share_keys),
        rms_dq: ci(|v| v.rms_dq),
        rms_dk: ci(|v| v.rms_dk),
        rms_dv: ci(|v| v.rms_dv),
        jacobian_check: check,
    }
}

/// The cells of a run.
pub(super) type Cells = [Measured<GradientsConfig, GradientsResult>];

/// The cells of one design (d_v fixed: the ones with the Jacobian check) on the primary backend.
pub(super) fn primary_design<'a>(
    cells: &'a Cells,
    primary: &'a str,
    fixed: bool,
) -> impl Iterator<Item = &'a Measured<GradientsConfig, GradientsResult>> {
    cells.iter().filter(move |c| {
        c.config.backend == primary
            && !c.config.m_sweep
            && (c.config.jacobian_rows.is_some() == fixed)
    })
}

/// The primary design's cells at every number of keys (main cells and the sweep's), primary
/// backend, grouped by m in increasing order.
fn by_m<'a>(
    cells: &'a Cells,
    primary: &'a str,
) -> Vec<(usize, Vec<&'a Measured<GradientsConfig, GradientsResult>>)> {
    let mut groups: Vec<(usize, Vec<&Measured<GradientsConfig, GradientsResult>>)> = Vec::new();
    let of_design = cells.iter().filter(|c| {
        c.config.backend == primary && (c.config.m_sweep || c.config.jacobian_rows.is_some())
    });
    for c in of_design {
        match groups.iter_mut().find(|(m, _)| *m == c.config.n) {
            Some((_, g)) => g.push(c),
            None => groups.push((c.config.n, vec![c])),
        }
    }
    groups.sort_by_key(|(m, _)| *m);
    for (_, g) in &mut groups {
        g.sort_by_key(|c| c.config.d);
    }
    groups
}

/// Every draw's paired ‖J‖ ratio unscaled / scaled of one cell.
fn jacobian_ratios(r: &GradientsResult) -> Vec<f64> {
    r.unscaled
        .iter()
        .zip(&r.scaled)
        .map(|(u, s)| u.jacobian_norm / s.jacobian_norm)
        .collect()
}

fn exponent(cells: &Cells, primary: &str, fixed: bool, pick: fn(&DrawValues) -> f64) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = primary_design(cells, primary, fixed)
        .flat_map(|c| {
            c.result
                .unscaled
                .iter()
                .map(move |v| (c.config.d as f64, pick(v)))
        })
        .unzip();
    exponent_ci(&xs, &ys)
}

fn ratios(cells: &Cells, primary: &str) -> Vec<RatioRow> {
    let mut out = Vec::new();
    for fixed in [true, false] {
        for c in primary_design(cells, primary, fixed) {
            let r = &c.result;
            let ratio = |pick: fn(&DrawValues) -> f64| {
                mean_ci(
                    &r.unscaled
                        .iter()
                        .zip(&r.scaled)
                        .map(|(u, s)| pick(u) / pick(s))
                        .collect::<Vec<_>>(),
                )
            };
            out.push(RatioRow {
                d_v_fixed: fixed,
                d: c.config.d,
                jacobian: ratio(|v| v.jacobian_norm),
                query: ratio(|v| v.rms_dq),
                scores: ratio(|v| v.rms_ds),
            });
        }
    }
    out
}

/// The d where a curve of mean ‖J‖ ratios over d crosses 1, interpolated on log d (the first
/// crossing from above).
fn crossing(points: &[(usize, f64)]) -> Option<f64> {
    points.windows(2).find_map(|w| {
        let ((da, ra), (db, rb)) = (w[0], w[1]);
        let (ya, yb) = (ra.ln(), rb.ln());
        (ya >= 0.0 && yb < 0.0).then(|| {
            let (xa, xb) = ((da as f64).ln(), (db as f64).ln());
            (xa + (xb - xa) * ya / (ya - yb)).exp()
        })
    })
}

/// Bootstrap resamples of the crossover's interval, and the stream's seed.
const CROSSOVER_BOOTSTRAP: (usize, u64) = (2000, 11);

/// The crossover of the primary design's paired ‖J‖ ratios (per d, one per draw), with its
/// bootstrap interval.
fn crossover(cells: &Cells, primary: &str) -> Option<Estimate> {
    crossover_of(
        &primary_design(cells, primary, true)
            .map(|c| (c.config.d, jacobian_ratios(&c.result)))
            .collect::<Vec<_>>(),
    )
}

/// The crossover of paired ‖J‖ ratios given per d (in increasing d), with its bootstrap
/// interval.
fn crossover_of(per_d: &[(usize, Vec<f64>)]) -> Option<Estimate> {
    use rand::{Rng, SeedableRng};
    let value = crossing(
        &per_d
            .iter()
            .map(|(d, v)| (*d, crate::stats::mean(v)))
            .collect::<Vec<_>>(),
    )?;
    let (resamples, seed) = CROSSOVER_BOOTSTRAP;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut found: Vec<f64> = (0..resamples)
        .filter_map(|_| {
            let curve: Vec<(usize, f64)> = per_d
                .iter()
                .map(|(d, v)| {
                    let m = (0..v.len())
                        .map(|_| v[rng.random_range(0..v.len())])
                        .sum::<f64>()
                        / v.len() as f64;
                    (*d, m)
                })
                .collect();
            crossing(&curve)
        })
        .collect();
    found.sort_by(f64::total_cmp);
    let (lo, hi) = if found.len() * 2 < resamples {
        (f64::NAN, f64::NAN)
    } else {
        let at = |q: f64| found[((q * found.len() as f64) as usize).min(found.len() - 1)];
        (at(0.025), at(0.975))
    };
    Some(Estimate {
        value,
        lo,
        hi,
        n: per_d.first().map_or(0, |(_, v)| v.len()),
        ci90: None,
    })
}

/// The first draw's values of every cell on every backend (the same inputs).
pub(super) fn cross_backend(cells: &Cells) -> Vec<BackendValues> {
    let mut out: Vec<BackendValues> = Vec::new();
    for c in cells.iter().filter(|c| c.config.jacobian_rows.is_some()) {
        for (scaled, draws) in [(true, &c.result.scaled), (false, &c.result.unscaled)] {
            let Some(first) = draws.first() else { continue };
            for (name, value) in [
                ("‖J‖", first.jacobian_norm),
                ("RMS ∂L/∂Q", first.rms_dq),
                ("RMS ∂L/∂s", first.rms_ds),
            ] {
                let quantity = format!(
                    "{name}, d = {}, {}",
                    c.config.d,
                    if scaled { "scaled" } else { "unscaled" }
                );
                match out.iter_mut().find(|b| b.quantity == quantity) {
                    Some(b) => b.values.push((c.config.backend.clone(), value)),
                    None => out.push(BackendValues {
                        quantity,
                        values: vec![(c.config.backend.clone(), value)],
                        floor: 0.0,
                    }),
                }
            }
        }
    }
    out
}

/// Rows and paired ratios (the claims are decided from them in `claims.rs`).
pub fn data(plan: &Plan, cells: &Cells) -> GradientsData {
    let primary = plan.primary().to_string();
    let mut rows = Vec::new();
    for c in cells.iter().filter(|c| !c.config.m_sweep) {
        let (s, u) = c.result.jacobian_check.unzip();
        rows.push(row(&c.config, true, &c.result.scaled, s));
        rows.push(row(&c.config, false, &c.result.unscaled, u));
    }
    let ratios = ratios(cells, &primary);
    let exponents = vec![
        (
            "RMS ∂L/∂Q, unscaled".to_string(),
            exponent(cells, &primary, true, |v| v.rms_dq),
            exponent(cells, &primary, false, |v| v.rms_dq),
        ),
        (
            "RMS ∂L/∂s, unscaled".to_string(),
            exponent(cells, &primary, true, |v| v.rms_ds),
            exponent(cells, &primary, false, |v| v.rms_ds),
        ),
    ];
    let groups = by_m(cells, &primary);
    // The family of the family-wise intervals: the conditions the claims count, where q and k
    // meet the premise (the rows below it are shown with the same intervals).
    let n_conditions: usize = groups
        .iter()
        .flat_map(|(_, g)| g.iter())
        .filter(|c| c.config.d >= PREMISE_MIN_D_K_UNIT_ENTRIES)
        .count();
    let level = bonferroni_level(0.95, n_conditions.max(1));
    let by_keys = groups
        .iter()
        .flat_map(|(m, g)| {
            g.iter().map(move |c| KeysRow {
                m: *m,
                d: c.config.d,
                jacobian: {
                    let x = jacobian_ratios(&c.result);
                    let (lo, hi) = mean_interval(&x, level);
                    Estimate {
                        lo,
                        hi,
                        ..mean_ci(&x)
                    }
                },
                unscaled_draws: c.result.unscaled.iter().map(|v| v.jacobian_norm).collect(),
                query: {
                    let x: Vec<f64> = c
                        .result
                        .unscaled
                        .iter()
                        .zip(&c.result.scaled)
                        .map(|(u, s)| u.rms_dq / s.rms_dq)
                        .collect();
                    let (lo, hi) = mean_interval(&x, level);
                    Estimate {
                        lo,
                        hi,
                        ..mean_ci(&x)
                    }
                },
            })
        })
        .collect();
    let crossover_by_keys = groups
        .iter()
        .map(|(m, g)| {
            let per_d: Vec<(usize, Vec<f64>)> = g
                .iter()
                .map(|c| (c.config.d, jacobian_ratios(&c.result)))
                .collect();
            (*m, crossover_of(&per_d))
        })
        .collect();
    let per_draw = cells
        .iter()
        .flat_map(|c| {
            c.result
                .unscaled
                .iter()
                .zip(&c.result.scaled)
                .enumerate()
                .map(|(draw, (u, s))| DrawRow {
                    design: c.id.split('/').next().unwrap_or_default().to_string(),
                    d_v: c.config.d_v,
                    backend: c.config.backend.clone(),
                    m: c.config.n,
                    d: c.config.d,
                    draw,
                    unscaled: *u,
                    scaled: *s,
                })
        })
        .collect();
    let first = cells.iter().find(|c| !c.config.m_sweep).map(|c| &c.config);
    GradientsData {
        per_draw,
        by_keys,
        crossover_by_keys,
        n: first.map_or(0, |c| c.n),
        draws: first.map_or(0, |c| c.draws),
        jacobian_rows: first.and_then(|c| c.jacobian_rows).unwrap_or(0),
        primary: primary.clone(),
        crossover_d: crossover(cells, &primary),
        rows,
        ratios,
        exponents,
    }
}
