//! `training-confirm-2`'s section: the design in brief, the chosen rates, the hypotheses under
//! both rate schemes, each condition, and the CSV of every run (tuning and test).

use super::analyze::{Confirm2Data, SchemeResult, premise_words};
use super::design::{HALF_ALPHA, RateScheme};
use super::hypotheses::Decided;
use super::runs::HEADER;
use crate::claims::show_p;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::measures::training::init_name;

fn end(x: Option<f64>) -> String {
    x.map_or("∞".into(), |v| format!("{v:.2}"))
}

/// One scheme's pooled row: (scheme, 1a, 1b, 1, 2, 3).
fn scheme_row(s: &SchemeResult) -> Vec<String> {
    let d = &s.pooled;
    let o = d.outcomes;
    vec![
        s.scheme.name().into(),
        format!(
            "{} of {} stuck near chance [{:.2}, {:.2}]; {} more never at 99% ({})",
            d.near_chance.count,
            d.near_chance.n,
            d.near_chance.lo,
            d.near_chance.hi,
            d.never_not_stuck,
            o[0].label()
        ),
        format!(
            "{} [{}, {}], {} censored ({})",
            end(d.ratio.km.value),
            end(d.ratio.km.lo),
            end(d.ratio.km.hi),
            d.ratio.km.censored,
            o[1].label()
        ),
        format!("**{}**", o[2].label()),
        format!(
            "{} vs {}, p = {} ({})",
            d.stuck.yes,
            d.stuck.no,
            show_p(d.stuck.p),
            o[3].label()
        ),
        format!(
            "{} vs {}, p = {} ({})",
            d.later.yes,
            d.later.no,
            show_p(d.later.p),
            o[4].label()
        ),
    ]
}

fn condition_row(
    scheme: RateScheme,
    (init, d_k): (sdpa_model::QkInit, usize),
    d: &Decided,
) -> Vec<String> {
    let (m, lo, hi, n) = d.finished_ratio;
    vec![
        scheme.slug().into(),
        format!("{} init d_k {d_k}", init_name(init)),
        d.pairs.to_string(),
        format!("{} / {}", d.near_chance.count, d.never_not_stuck),
        d.scaled_never.to_string(),
        format!(
            "{} [{}, {}]",
            end(d.ratio.km.value),
            end(d.ratio.km.lo),
            end(d.ratio.km.hi)
        ),
        if n == 0 {
            "–".into()
        } else {
            format!("{m:.2} [{lo:.2}, {hi:.2}] (n = {n})")
        },
    ]
}

/// The section.
pub fn render(data: &Confirm2Data, canvas: &mut Canvas) -> Result<String, LabError> {
    let mut out = format!(
        "**Design** (committed before any of these runs, `experiments/training_confirm2/design.rs`): \
         the conditions where the unscaled logits start at least as spread as in the article's own \
         example ({}); {} test seeds per condition, budget {} steps; each arm's learning rate tuned \
         for this budget on {} seeds of its own per rate, and one rate shared by both arms; the \
         article's sentence decided at {:.1}% per half.\n\n",
        premise_words(&data.sizes),
        data.sizes.seeds,
        data.sizes.budget,
        data.sizes.tuning_seeds,
        HALF_ALPHA * 100.0,
    );
    if let Some(why) = &data.missing {
        out.push_str(&format!("**Not analysed**: {why}.\n"));
        return Ok(out);
    }
    out.push_str(if data.measured_here {
        "Measured by this run.\n\n"
    } else {
        "Not measured by this run: the committed measurement (`crates/sdpa-lab/assets/confirm2/runs.csv`), analysed by this code.\n\n"
    });
    let rates: Vec<Vec<String>> = data
        .chosen
        .iter()
        .map(|c| {
            vec![
                format!("{} init d_k {}", init_name(c.init), c.d_k),
                c.own_scaled.to_string(),
                c.own_unscaled.to_string(),
                format!("{} (regret {:.2}×)", c.shared, c.shared_regret),
                if c.at_edge { "yes".into() } else { "no".into() },
            ]
        })
        .collect();
    out.push_str("**The rates the tuning chose**\n\n");
    out.push_str(&md_table(
        &[
            "condition",
            "1/√d_k's own",
            "unscaled own",
            "shared",
            "a rate at the grid's edge",
        ],
        &rates,
    ));
    out.push_str("\n**The hypotheses, pooled over the conditions**\n\n");
    let rows: Vec<Vec<String>> = data.schemes.iter().map(scheme_row).collect();
    out.push_str(&md_table(
        &[
            "learning rates",
            "1a «fails completely» (97.5%)",
            "1b «extremely slow»: median ratio (97.5%)",
            "1 (primary) the sentence",
            "2 stuck more often",
            "3 later",
        ],
        &rows,
    ));
    out.push_str("\n**Each condition** (described, not tested)\n\n");
    let per: Vec<Vec<String>> = data
        .schemes
        .iter()
        .flat_map(|s| {
            s.per_condition
                .iter()
                .map(|(c, d)| condition_row(s.scheme, *c, d))
        })
        .collect();
    out.push_str(&md_table(
        &[
            "rates",
            "condition",
            "pairs",
            "unscaled stuck near chance / never at 99% otherwise",
            "scaled never at 99%",
            "Kaplan–Meier median ratio (97.5%)",
            "median ratio where both finished (95%)",
        ],
        &per,
    ));
    let lines: Vec<String> = data.rows.iter().map(|r| r.line()).collect();
    canvas.csv("training_confirm2_runs.csv", HEADER, &lines)?;
    out.push_str("\nEvery run, tuning and test: `training_confirm2_runs.csv`.\n");
    Ok(out)
}
