//! `REPORT.md`: the article's four questions answered on the first screen (the text before the
//! first `## ` heading: at most [`FIRST_SCREEN_WORDS`] words, tables and images aside), the key
//! figure, a table of what the article gets right and wrong, then one screen per question; the
//! bookkeeping is in `APPENDIX.md`.

use std::fmt::Write as _;

use super::{APPENDIX, ExperimentReport, Report, appendix::QUICK};
use crate::answers::{Answer, Question};
use crate::claims::{Claim, Outcome};
use crate::experiments::training_confirm::hypotheses::Hypotheses;
use crate::experiments::training_confirm::render::hypothesis_rows;
use crate::markdown::md_cell;

/// The most words the first screen holds (whitespace-separated tokens, tables and image lines
/// aside).
pub const FIRST_SCREEN_WORDS: usize = 150;

/// The first screen's table: the article's claims that carry its argument, as (experiment,
/// claim id, the article's words in short).
const VERDICT_ROWS: [(&str, &str, &str); 9] = [
    ("dot-std", "std-grows-as-sqrt-d", "std(q·k) = √d_k"),
    (
        "saturation",
        "logit-std-8-clearly-saturated",
        "at logit std 8 (d_k 64, unscaled) softmax is clearly saturated",
    ),
    (
        "attention-saturation",
        "unscaled-is-one-hot",
        "unscaled, attention is one-hot (max p ≈ 0.999)",
    ),
    (
        "attention-saturation",
        "scaled-max-p-band",
        "scaled, max p comes back to 0.02–0.035",
    ),
    (
        "gradients",
        "jacobian-tends-to-zero",
        "saturated softmax's derivative → 0 (falls as saturation grows)",
    ),
    (
        "gradients",
        "query-gradient-vanishes",
        "so the gradients vanish",
    ),
    (
        "gradients",
        "jacobian-almost-zero",
        "at d_k 1024 softmax's gradient (its slope) is almost 0 (below 0.1× the scaled one)",
    ),
    (
        "training-confirm-2",
        "confirm2-sentence",
        "so training fails completely or is extremely slow",
    ),
    (
        "masks",
        "minus-1e9-overflows-f16",
        "a −1e9 mask overflows in half precision",
    ),
];

/// The figure under the answers: the second confirmatory run's runs at 99% by each step, else the
/// first confirmatory run's paired seeds, else the exploratory run's
/// (unit-variance q, k: the article's premise first).
const KEY_FIGURES: [&str; 4] = [
    "training_confirm2_reached.png",
    "training_confirm_paired.png",
    "training_paired_unit.png",
    "training_paired_default.png",
];

/// The terms of the first screen, explained once, right under it.
const GLOSSARY: &str = "- **d_k**: the length of the query and key vectors; **std**: standard \
     deviation, the typical size of a spread (**variance**: its square); **∝**: grows in \
     proportion to; **d_k^0.5**: √d_k, so the fitted **exponent** of std against d_k is 0.5 if the \
     spread grows like √d_k.\n\
     - **softmax**: turns a query's scores into weights that are positive and add up to 1; it \
     **saturates** when a few large scores take most of the weight, so that the weights are far \
     less spread than equal weights would be (**one-hot**, the extreme: all weight on one key); \
     **max p**: a query's largest weight; **entropy**: a measure of how spread the weights are, \
     here as a share of the **uniform** distribution's (equal weight on every key): 100% for \
     equal weights, 0 for one-hot. The key count matters: with more keys the weights spread \
     thinner.\n\
     - **logit**: a score q·k that softmax turns into a weight; **logit std**: how \
     spread the scores of one query are; **the article's example**: d_k 64 with unit-variance q \
     and k, logit std about 8 (a little less in this model at the start of training: each run's \
     screen gives its own figure).\n\
     - **softmax's slope** (its Jacobian J, size ‖J‖): how much the weights move when the scores \
     move. It is small when softmax saturates, and also when the weights spread thinly over many \
     keys (the scaled softmax over 256 keys): so the unscaled slope can be the larger one. **∂L/∂Q**: \
     the gradient reaching the queries Q (how a loss L changes with them): softmax's slope times \
     the scores' size times K, which is why it can grow while the slope shrinks; it then \
     concentrates on **fewer keys**, the few with large weights.\n\
     - **Q, K**: the queries and keys, one vector per row; **L**: the training loss (a random one \
     in the gradient measurement); **the article**: *10 · Attention 的数学推导*, the text whose \
     claims this report checks; **Burn**: the Rust deep-learning framework this lab runs on.\n\
     - **unit init**: W_Q, W_K drawn so that q and k entries have variance 1 (the article's \
     premise); **default init**: Burn's default, which gives smaller q and k.\n\
     - **arm**: one of the two versions compared, with the 1/√d_k (scaled) or without (unscaled); \
     a **pair**: one run of each arm from the same seed (same starting weights and batches); the \
     **budget**: the most training steps a run gets; **99%**: the target accuracy on held-out \
     examples (not trained on) of the model's matching task; **learning rate**: the size of each \
     training step, chosen per arm.\n\
     - **pre-registered**: the analysis was fixed and committed before the runs it judges; \
     **exploratory**: runs that shaped the analysis.\n\
     - **[a, b]**: a 95% interval: a range computed by a rule that, over many repeats of the \
     experiment, captures the true value 95 times in 100 (this one range either holds it or not; \
     a 97.5% interval captures it 97.5 times in 100: the training verdict tests each half of its \
     sentence at 2.5%); **family-wise**: intervals widened so that all of a table's intervals \
     together capture their true values 95 times in 100; **p**, in «p < 0.001»: the chance of a \
     result at least this lopsided, in either direction, if the scale made no difference (not \
     max p).\n\
     - **«extremely slow»**: at least 4× the steps to 99% (this report's reading of the article's \
     极慢; the figure's grey line); **«fails completely»**: most unscaled runs stuck near chance.\n\
     - **stuck near chance**: a run that ended below 50% held-out accuracy, nearer chance \
     (12.5%: one of 8 answers) than the target; \
     **never reached 99%**: any run that did not reach the target within its budget, stuck or \
     merely slow.\n\
     - **x [a, ∞]** (a median slowdown, **Kaplan–Meier**): the median of the paired ratios \
     (unscaled steps over scaled steps), where a pair whose unscaled run never reached 99% counts \
     as «at least the budget over its scaled twin's steps»; a is a ratio of a pair where both runs \
     finished, and ∞ means the interval is open above (too many runs never finished for an upper \
     limit); **at least a× (97.5% lower end)**: a alone. **≥ x [a, ∞]** (the earlier runs', further \
     down): x and a are lower bounds, set partly by the step budget.\n\
     - **own rate / shared rate**: each version trained at its own best learning rate, or both at \
     one learning rate chosen to be fair to both; a verdict counts only where the two agree.";

/// The first screen of a rendered `REPORT.md`: everything before its first `## ` heading.
pub fn first_screen(markdown: &str) -> &str {
    match markdown.find("\n## ") {
        Some(i) => &markdown[..i],
        None => markdown,
    }
}

/// `REPORT.md`.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Does attention need 1/√d_k?\n");
    let _ = writeln!(
        s,
        "The article: without 1/√d_k, softmax saturates, gradients vanish, training fails. \
         ([a, b]: 95% interval)\n"
    );
    for q in Question::ALL {
        let answers: Vec<&Answer> = r
            .experiments
            .iter()
            .flat_map(|e| &e.answers)
            .filter(|a| a.question == q && a.short.is_some())
            .collect();
        // A confirmatory answer, where there is one, is the answer.
        let confirmed = answers.iter().any(|a| a.confirmatory);
        let shorts: Vec<&str> = answers
            .iter()
            .filter(|a| a.confirmatory || !confirmed)
            .filter_map(|a| a.short.as_deref())
            .collect();
        let answer = if shorts.is_empty() {
            "not measured in this run.".to_string()
        } else {
            shorts.join(" ")
        };
        let _ = writeln!(s, "- **{}** {answer}", q.text());
    }
    let _ = writeln!(s);
    if let Some(figure) = key_figure(r) {
        let _ = writeln!(
            s,
            "![runs at 99% accuracy by each step, with and without √d_k]({figure})\n"
        );
    }
    verdict_table(&mut s, r);
    if r.run.plan.quick {
        let _ = writeln!(s, "*Quick sizes (not the answer).*\n");
    }
    let _ = writeln!(s, "## Words used here\n\n{GLOSSARY}\n");
    for q in Question::ALL {
        let _ = writeln!(s, "## {}\n", q.heading());
        // The confirmatory answer's screen first, then the earlier runs, latest first (the
        // second confirmatory run, the first, the exploratory one).
        let mut answers: Vec<(u32, &Answer)> = r
            .experiments
            .iter()
            .flat_map(|e| {
                e.answers
                    .iter()
                    .map(|a| (super::appendix::confirm_rank(&e.name), a))
            })
            .filter(|(_, a)| a.question == q)
            .collect();
        answers.sort_by_key(|(rank, a)| (!a.confirmatory, std::cmp::Reverse(*rank)));
        let screens: Vec<&str> = answers.iter().map(|(_, a)| a.screen.as_str()).collect();
        if screens.is_empty() {
            let _ = writeln!(s, "Not measured in this run.\n");
        }
        for screen in screens {
            let _ = writeln!(s, "{}\n", screen.trim_end());
        }
        if q == Question::Training {
            beside(&mut s, r);
        }
    }
    let _ = writeln!(s, "## How this was measured\n");
    if r.run.plan.quick {
        let _ = writeln!(s, "{QUICK}\n");
    }
    let _ = writeln!(
        s,
        "Every sentence above is computed from this run's numbers (commit `{}`); the claims \
         behind them, with the check that decides each, the article's every sentence, every \
         experiment's tables and where the numbers are kept are in [the appendix]({APPENDIX}).\n",
        r.git_commit
    );
    for f in &r.failures {
        let _ = writeln!(s, "- experiment {} **failed**: {}", f.name, f.error);
    }
    s
}

/// The confirmatory hypotheses beside the same rules applied to the exploratory run.
fn beside(s: &mut String, r: &Report) {
    let of = |name: &str| {
        r.experiment(name)
            .and_then(|e| serde_json::from_value::<Hypotheses>(e.data["hypotheses"].clone()).ok())
    };
    let (Some(confirm), exploratory) = (of("training-confirm"), of("training")) else {
        return;
    };
    let _ = writeln!(
        s,
        "**The first confirmatory run beside the exploratory one** (the exploratory runs \
         re-analysed under the first confirmatory run's rules, so its column can differ from the \
         exploratory claims in the appendix; exploratory: budget {}, {} saturated pairs; first \
         confirmatory: budget {}, {} saturated pairs; the second confirmatory run, the answer, is \
         decided by its own rules, above):\n\n| hypothesis | exploratory, re-analysed | first \
         confirmatory |\n|---|---|---|",
        exploratory
            .as_ref()
            .map_or("–".into(), |h| h.budget.to_string()),
        exploratory
            .as_ref()
            .map_or("–".into(), |h| h.pairs_saturated.to_string()),
        confirm.budget,
        confirm.pairs_saturated
    );
    let old = exploratory.as_ref().map(hypothesis_rows);
    // «Extremely slow» (row 5) and the sentence it carries (row 6) on a budget bound: shown, not
    // counted (the appendix's rule).
    let rests_on_budget = r
        .experiment("training-confirm")
        .and_then(|e| e.data["rests_on_budget"].as_bool())
        .unwrap_or(false);
    for (i, row) in hypothesis_rows(&confirm).iter().enumerate() {
        let verdict = if rests_on_budget && (i == 4 || i == 5) {
            format!("{}, on a budget bound: not counted", row[2])
        } else {
            row[2].to_string()
        };
        let then = old
            .as_ref()
            .map_or("–".to_string(), |o| format!("{} ({})", o[i][1], o[i][2]));
        let _ = writeln!(
            s,
            "| {} | {} | {} ({}) |",
            md_cell(&row[0]),
            md_cell(&then),
            md_cell(&row[1]),
            verdict
        );
    }
    let _ = writeln!(s);
}

fn key_figure(r: &Report) -> Option<&'static str> {
    let plots: Vec<&String> = r.experiments.iter().flat_map(|e| &e.plots).collect();
    KEY_FIGURES
        .into_iter()
        .find(|f| plots.iter().any(|p| p.as_str() == *f))
}

/// What the article gets right and wrong: [`VERDICT_ROWS`] that this run decided.
fn verdict_table(s: &mut String, r: &Report) {
    let rows: Vec<String> = VERDICT_ROWS
        .iter()
        .filter_map(|(experiment, id, words)| {
            let e = r.experiment(experiment)?;
            // A claim that could not have failed is no verdict: not on the first screen.
            let claim = e.claims.iter().find(|c| c.id == *id && c.counts())?;
            Some(format!(
                "| {} | {} | {} |",
                md_cell(words),
                verdict_words(claim),
                md_cell(&key_number(e, claim))
            ))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "| the article says | verdict | the number that decides it |\n|---|---|---|"
    );
    for row in rows {
        let _ = writeln!(s, "{row}");
    }
    let _ = writeln!(s);
}

/// "holds", "fails", "holds in 4, fails in 16 of 21 conditions", "undecided".
fn verdict_words(c: &Claim) -> String {
    let unit = if c.conjunction { "parts" } else { "conditions" };
    match (c.outcome, c.tally()) {
        (Outcome::Holds, _) => "**holds**".into(),
        (Outcome::Fails, Some(t)) if t.undecided + t.out_of_reach > 0 => format!(
            "**fails** in {}, undecided in {} of {} {unit}",
            t.fails,
            t.undecided + t.out_of_reach,
            t.total()
        ),
        (Outcome::Fails, _) => "**fails**".into(),
        (Outcome::Conditional, Some(t)) => {
            let open = t.undecided + t.out_of_reach;
            format!(
                "holds in {}, fails in {}{} of {} {unit}",
                t.holds + t.conditional,
                t.fails + t.conditional,
                if open > 0 {
                    format!(", undecided in {open}")
                } else {
                    String::new()
                },
                t.total(),
            )
        }
        (Outcome::Conditional, None) => "holds in some conditions".into(),
        (Outcome::Undecided, _) => "undecided".into(),
        (Outcome::OutOfReach, _) => "cannot be decided with this design".into(),
    }
}

/// The number an experiment gave for the claim, else a pointer to the appendix.
fn key_number(e: &ExperimentReport, c: &Claim) -> String {
    e.key_numbers
        .iter()
        .find(|k| k.claim_id == c.id)
        .map(|k| k.number.clone())
        .unwrap_or_else(|| format!("see [{}]({APPENDIX}#{})", e.name, e.name))
}
