//! `gradients`' claims, decided on the primary backend's primary design (d_v fixed), and the
//! agreement of autodiff and of the backends on every backend of the run.

use super::FIXED_D_V;
use super::analyze::{
    ALMOST_ZERO_RATIO, Cells, GradientRow, GradientsData, KeysRow, RatioRow, primary_design,
};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source, interval_below, short, show, side};
use crate::experiment::{BackendValues, Plan};
use crate::experiments::training_confirm2::design::PREMISE_MIN_D_K_UNIT_ENTRIES;
use crate::stats::{Estimate, exponent_ci};

/// Every draw's ‖J‖ against d, one scaling, primary design and backend.
fn jacobian_points(cells: &Cells, primary: &str, scaled: bool) -> (Vec<f64>, Vec<f64>) {
    primary_design(cells, primary, true)
        .flat_map(|c| {
            let draws = if scaled {
                &c.result.scaled
            } else {
                &c.result.unscaled
            };
            draws
                .iter()
                .map(move |v| (c.config.d as f64, v.jacobian_norm))
        })
        .unzip()
}

/// The rows of the key-count sweep at `m` keys, in the order of d.
fn of_m(data: &GradientsData, m: usize) -> Vec<&KeysRow> {
    data.by_keys.iter().filter(|r| r.m == m).collect()
}

/// The article's two claims about the Jacobian, and, per number of keys m, how the unscaled one
/// changes with d and where it crosses the scaled one.
fn jacobian_claims(cells: &Cells, data: &GradientsData) -> Vec<Claim> {
    let mut claims = vec![tends_to_zero(data), vanishes(data), query_vanishes(data)];
    claims.extend(almost_zero(data));
    claims.push(crossover(data));
    claims.extend(crossover_rises_with_m(data));
    claims.push(scaled_flat(cells, data));
    claims
}

/// The key sweep's rows where q and k meet the premise (the second confirmatory design's, one
/// rule for every claim about attention without the scale): d ≥ 64, whose unscaled logits have
/// std ≥ 8 like the article's own example.
pub(super) fn premise_rows(data: &GradientsData) -> impl Iterator<Item = &KeysRow> {
    data.by_keys
        .iter()
        .filter(|r| r.d >= PREMISE_MIN_D_K_UNIT_ENTRIES)
}

/// "Where q and k meet the premise" in words.
fn premise_words() -> String {
    format!(
        "where q and k meet the premise (d ≥ {PREMISE_MIN_D_K_UNIT_ENTRIES}: unscaled logits at least as \
         spread as in the article's example; d = 16, 32 shown, not counted)"
    )
}

/// The article: the gradient through a saturated softmax vanishes. Checked where it can be
/// seen against the alternative, per (m, d) meeting the premise: is the unscaled Jacobian the
/// smaller one?
fn vanishes(data: &GradientsData) -> Claim {
    let ms = data.key_counts();
    let vanishes: Vec<Condition> = premise_rows(data)
        .map(|r| Condition {
            label: format!("m = {}, d = {}", r.m, r.d),
            measured: format!("‖J‖ unscaled / scaled {}", show(r.jacobian)),
            outcome: Outcome::of(side(r.jacobian, 1.0, true)),
        })
        .collect();
    Claim::per_condition(
        "jacobian-vanishes",
        Source::Article(&article::GRADIENT_VANISHES),
        format!(
            "without √d scaling the gradient through the softmax vanishes: the unscaled Jacobian diag(p) − ppᵀ is \
             smaller than the scaled one (m = {} keys, {})",
            ms.iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            premise_words()
        ),
        "‖J‖_F unscaled / scaled, paired per draw: its interval below 1 holds, above 1 fails, per (m, d), \
         family-wise 95% over the premise (m, d) (Bonferroni)",
        vanishes,
    )
    .fails_if("the ratio's interval above 1 in some premise (m, d), below 1 in none")
}

/// The article: at the largest d the unscaled Jacobian is almost 0 (`None` without a d_v-fixed
/// ratio).
fn almost_zero(data: &GradientsData) -> Option<Claim> {
    let fixed: Vec<&RatioRow> = data.ratios.iter().filter(|r| r.d_v_fixed).collect();
    let d_max = fixed.iter().map(|r| r.d).max().unwrap_or(0);
    let r = fixed.iter().find(|r| r.d == d_max)?;
    Some(Claim::below(
        "jacobian-almost-zero",
        Source::Article(&article::GRADIENT_ALMOST_ZERO),
        format!(
            "at d = {d_max} the unscaled softmax Jacobian is almost 0: at most {ALMOST_ZERO_RATIO} of the \
             scaled one (m = {}; threshold fixed in advance)",
            data.n
        ),
        "‖J‖ unscaled / scaled, paired per draw",
        r.jacobian,
        ALMOST_ZERO_RATIO,
    ))
}

/// The article, read where saturation holds: the softmax derivative tends to 0 as it
/// saturates. Per number of keys m, the fitted exponent of the unscaled ‖J‖ on d over the d that
/// meet the premise is below 0.
fn tends_to_zero(data: &GradientsData) -> Claim {
    let shrinks: Vec<Condition> = data
        .key_counts()
        .iter()
        .map(|&m| {
            let (xs, ys): (Vec<f64>, Vec<f64>) = of_m(data, m)
                .iter()
                .filter(|r| r.d >= PREMISE_MIN_D_K_UNIT_ENTRIES)
                .flat_map(|r| r.unscaled_draws.iter().map(move |j| (r.d as f64, *j)))
                .unzip();
            let e = exponent_ci(&xs, &ys);
            Condition {
                label: format!("m = {m}"),
                measured: format!("exponent {}", show(e)),
                outcome: Outcome::of(side(e, 0.0, true)),
            }
        })
        .collect();
    Claim::per_condition(
        "jacobian-tends-to-zero",
        Source::Article(&article::GRADIENT_VANISHES),
        format!(
            "without √d scaling the softmax derivative falls toward 0 as saturation grows ({})",
            premise_words()
        ),
        "fitted exponent of the unscaled ‖J‖_F on d over d ≥ 64: 95% interval below 0 holds, above 0 \
         fails, per m",
        shrinks,
    )
    .fails_if("the exponent's 95% interval above 0 (‖J‖ growing with saturation) for some m, below 0 for none")
}

/// The article's «gradients vanish», read at the parameters: per (m, d) meeting the premise, is
/// the gradient reaching Q smaller without the scale?
fn query_vanishes(data: &GradientsData) -> Claim {
    let conditions: Vec<Condition> = premise_rows(data)
        .map(|r| Condition {
            label: format!("m = {}, d = {}", r.m, r.d),
            measured: format!("RMS ∂L/∂Q unscaled / scaled {}", show(r.query)),
            outcome: Outcome::of(side(r.query, 1.0, true)),
        })
        .collect();
    Claim::per_condition(
        "query-gradient-vanishes",
        Source::Article(&article::GRADIENT_VANISHES),
        format!(
            "without √d scaling the gradient reaching Q (and W_Q) vanishes: it is smaller than with the \
             scale ({})",
            premise_words()
        ),
        "RMS ∂L/∂Q unscaled / scaled, paired per draw: its interval below 1 holds, above 1 fails, per \
         (m, d), family-wise 95% over the premise (m, d) (Bonferroni)",
        conditions,
    )
    .fails_if("the ratio's interval above 1 (a larger gradient without the scale) in some premise (m, d), below 1 in none")
}

/// Per number of keys m, the unscaled Jacobian is the larger one at the smallest d and the
/// smaller one at the largest (it crosses the scaled one).
fn crossover(data: &GradientsData) -> Claim {
    let crossings: Vec<Condition> = data
        .key_counts()
        .iter()
        .map(|&m| {
            let rows = of_m(data, m);
            let (a, b) = (rows.first(), rows.last());
            let crossover = data
                .crossover_by_keys
                .iter()
                .find(|(k, _)| *k == m)
                .and_then(|(_, e)| *e);
            let outcome = match (a, b) {
                (Some(a), Some(b)) => {
                    match (side(a.jacobian, 1.0, false), side(b.jacobian, 1.0, true)) {
                        (Some(true), Some(true)) => Outcome::Holds,
                        (Some(false), _) | (_, Some(false)) => Outcome::Fails,
                        _ => Outcome::Undecided,
                    }
                }
                _ => Outcome::Undecided,
            };
            Condition {
                label: format!("m = {m}"),
                measured: format!(
                    "crossover d ≈ {}; ratio {} at d = {}, {} at d = {}",
                    crossover.map_or("–".into(), |e| e.show(0)),
                    a.map_or("–".into(), |r| show(r.jacobian)),
                    a.map_or(0, |r| r.d),
                    b.map_or("–".into(), |r| show(r.jacobian)),
                    b.map_or(0, |r| r.d),
                ),
                outcome,
            }
        })
        .collect();
    Claim::per_condition(
        "jacobian-crossover",
        Source::Lab,
        "the unscaled Jacobian is larger than the scaled one at small d and smaller at large d (it crosses \
         the scaled one), per number of keys m",
        "‖J‖ ratio unscaled / scaled: its interval above 1 at the smallest d, below 1 at the largest, per m",
        crossings,
    )
}

/// Where it crosses depends on m: the crossover at the most keys against the fewest (`None`
/// unless it crosses at two numbers of keys).
fn crossover_rises_with_m(data: &GradientsData) -> Option<Claim> {
    let found: Vec<(usize, Estimate)> = data
        .crossover_by_keys
        .iter()
        .filter_map(|(m, e)| e.map(|e| (*m, e)))
        .collect();
    let (Some((m_lo, a)), Some((m_hi, b))) = (found.first(), found.last()) else {
        return None;
    };
    if m_lo == m_hi {
        return None;
    }
    Some(Claim::per_condition(
        "crossover-rises-with-m",
        Source::Lab,
        "the d at which the unscaled Jacobian falls below the scaled one grows with the number of keys m",
        "crossover d (interpolated on log d, 95% bootstrap interval over draws) at the largest m against \
         the smallest m where it crosses: holds when the two intervals are disjoint with the larger m \
         higher, fails when disjoint the other way",
        vec![Condition {
            label: format!("m = {m_lo} vs m = {m_hi}"),
            measured: format!(
                "crossover d ≈ {} at m = {m_lo}, {} at m = {m_hi}",
                a.show(0),
                b.show(0)
            ),
            outcome: if b.lo > a.hi {
                Outcome::Holds
            } else if b.hi < a.lo {
                Outcome::Fails
            } else {
                Outcome::Undecided
            },
        }],
    ))
}

/// With 1/√d the Jacobian does not depend on d: its fitted exponent within ±0.1.
fn scaled_flat(cells: &Cells, data: &GradientsData) -> Claim {
    let (sx, sy) = jacobian_points(cells, &data.primary, true);
    Claim::in_range(
        "scaled-jacobian-flat",
        Source::Lab,
        "with 1/√d the Jacobian does not depend on d",
        "fitted exponent of ‖J‖_F on d, scaled",
        exponent_ci(&sx, &sy),
        -0.1,
        0.1,
    )
}

/// What the gradient does beyond the Jacobian: which keys get it, how big it is at Q, and how
/// much of its growth was the d_v = d design.
fn gradient_claims(data: &GradientsData) -> Vec<Claim> {
    let fixed = |s: bool| -> Vec<&GradientRow> {
        data.rows
            .iter()
            .filter(|r| r.d_v_fixed && r.backend == data.primary && r.scaled == s)
            .collect()
    };
    let d_max = data.ratios.iter().map(|r| r.d).max().unwrap_or(0);
    let mut claims = Vec::new();
    if let (Some(u), Some(s)) = (
        fixed(false).into_iter().find(|r| r.d == d_max),
        fixed(true).into_iter().find(|r| r.d == d_max),
    ) {
        claims.push(Claim::decided(
            "gradient-concentrates",
            Source::Lab,
            format!("without scaling the score gradient collapses onto few keys (d = {d_max})"),
            "share of keys with |∂L/∂s| > 1e−3 of the row's largest: unscaled interval entirely below the scaled one",
            format!("unscaled {}, scaled {}", show(u.share_keys), show(s.share_keys)),
            interval_below(u.share_keys, s.share_keys),
        ));
    }
    if let Some((_, fixed_exp, equal_exp)) = data.exponents.first() {
        claims.push(Claim::decided(
            "d-v-equals-d-inflates-the-growth",
            Source::Lab,
            format!(
                "with d_v = d (the earlier design) the unscaled ∂L/∂Q grows faster with d than with d_v fixed at \
                 {FIXED_D_V}: part of its growth is g·v_j growing like √d_v, not the scaling"
            ),
            "fitted exponents of the unscaled RMS ∂L/∂Q on d: the d_v-fixed interval entirely below the d_v = d one",
            format!("d_v = {FIXED_D_V}: {}; d_v = d: {}", show(*fixed_exp), show(*equal_exp)),
            interval_below(*fixed_exp, *equal_exp),
        ));
    }
    claims
}

/// Autodiff against the analytic Jacobian on each backend, and the backends against each other
/// (only when two or more ran: "on every backend" is never claimed from one).
fn backend_claims(
    plan: &Plan,
    cells: &Cells,
    data: &GradientsData,
    per_backend: &[BackendValues],
) -> Vec<Claim> {
    let mut backends: Vec<String> = cells.iter().map(|c| c.config.backend.clone()).collect();
    backends.sort();
    backends.dedup();
    let checks: Vec<Condition> = backends
        .iter()
        .map(|b| {
            let worst = data
                .rows
                .iter()
                .filter(|r| &r.backend == b)
                .filter_map(|r| r.jacobian_check)
                .fold(0.0, f64::max);
            Condition {
                label: b.clone(),
                measured: format!("largest difference {}", short(worst)),
                outcome: Outcome::of(Some(worst <= 1e-4)),
            }
        })
        .collect();
    let mut claims = vec![Claim::per_condition(
        "autodiff-equals-analytic",
        Source::Lab,
        format!(
            "Burn's autodiff gives the analytic softmax Jacobian on {}",
            if backends.len() > 1 {
                "every backend of this run"
            } else {
                "the one backend of this run"
            }
        ),
        "largest per-row |autodiff − analytic| of ‖J‖_F ≤ 1e−4, per backend",
        checks,
    )];
    if plan.backends.len() > 1 {
        let worst = per_backend
            .iter()
            .map(BackendValues::largest_disagreement)
            .fold(0.0, f64::max);
        claims.push(Claim::decided(
            "backends-agree",
            Source::Lab,
            format!(
                "every backend measures the same gradients ({})",
                backends.join(", ")
            ),
            "largest relative disagreement of ‖J‖, RMS ∂L/∂Q and RMS ∂L/∂s on the same draw ≤ 1e−3",
            format!("largest relative disagreement {}", short(worst)),
            Some(worst <= 1e-3),
        ));
    }
    claims
}

/// Every claim of `gradients`.
pub fn claims(
    plan: &Plan,
    cells: &Cells,
    data: &GradientsData,
    per_backend: &[BackendValues],
) -> Vec<Claim> {
    let mut claims = jacobian_claims(cells, data);
    claims.extend(gradient_claims(data));
    claims.extend(backend_claims(plan, cells, data, per_backend));
    claims
}
