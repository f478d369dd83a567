//! `APPENDIX.md`: the old long report, for the reader who checks: the summary lines of every
//! experiment, the tally and ledger of the article's claims, the experiments' verdicts, the
//! cross-backend table and one section per experiment.

use std::fmt::Write as _;

use super::{ExperimentReport, Report, provenance};
use crate::claims::{Claim, Outcome, Source, Tally, claims_table, short};
use crate::experiment::BackendValues;
use crate::markdown::md_cell;

/// The ledger of the article's claims: every one, with its words, section, check and outcome.
fn ledger(s: &mut String, r: &Report) {
    let _ = writeln!(s, "## The article's claims\n");
    let _ = writeln!(
        s,
        "Each row quotes the article (its section, its words, a translation), says how the lab decides it \
         and what came out. Claims the lab adds are in each experiment's own table, never here.\n"
    );
    let _ = writeln!(
        s,
        "| section | the article says | translation | decided by | it would have failed with | outcome | experiment (verdict) |\n|---|---|---|---|---|---|---|"
    );
    for e in &r.experiments {
        for c in &e.claims {
            if let Source::Article(q) = &c.source {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | [{}](#{}) ({}) |",
                    q.section,
                    md_cell(q.zh),
                    md_cell(q.en),
                    md_cell(&c.check),
                    md_cell(&match (&c.cannot_fail, &c.fails_if) {
                        (Some(why), _) => format!("not counted: {why}"),
                        (None, Some(result)) => result.clone(),
                        (None, None) => "–".into(),
                    }),
                    md_cell(&format!(
                        "{}{}",
                        ledger_outcome(c),
                        if superseded(r, e, c) {
                            " (superseded by a later confirmatory run's row)"
                        } else {
                            ""
                        }
                    )),
                    e.name,
                    e.name,
                    e.verdict.label()
                );
            }
        }
    }
}

/// How confirmatory an experiment is: 0 for an exploratory one, 1 for `*-confirm`, n for
/// `*-confirm-n` (a later confirmatory run supersedes an earlier one).
pub(super) fn confirm_rank(name: &str) -> u32 {
    match name.find("-confirm") {
        None => 0,
        Some(i) => {
            let rest = name[i + "-confirm".len()..].trim_start_matches('-');
            if rest.is_empty() {
                1
            } else {
                rest.parse().unwrap_or(1)
            }
        }
    }
}

/// The highest confirmatory rank among the experiments that decide the sentence quoted by `q`.
fn sentence_rank(r: &Report, q: &crate::article::Quote) -> u32 {
    r.experiments
        .iter()
        .filter(|x| {
            x.claims.iter().any(
                |k| matches!(&k.source, Source::Article(kq) if sentence(kq.zh) == sentence(q.zh)),
            )
        })
        .map(|x| confirm_rank(&x.name))
        .max()
        .unwrap_or(0)
}

/// Whether a later confirmatory run also decides the sentence `c` of experiment `e` checks, so
/// that `c`'s outcome is superseded.
fn superseded(r: &Report, e: &crate::report::ExperimentReport, c: &Claim) -> bool {
    let Source::Article(q) = &c.source else {
        return false;
    };
    sentence_rank(r, q) > confirm_rank(&e.name)
}

/// A ledger row's outcome: the label and tally, and for a claim whose conditions disagree, the
/// conditions where it fails (so that a reader sees where, without opening the experiment).
fn ledger_outcome(c: &Claim) -> String {
    match c.tally() {
        Some(t) if t.fails > 0 && t.fails < t.total() => {
            let unit = if c.conjunction { "part" } else { "condition" };
            // Semicolons: a condition's label may hold commas.
            let fails = labels(c, Outcome::Fails).join("; ");
            format!("{}; the failing {unit}s: {fails}", c.outcome_text())
        }
        _ => c.outcome_text(),
    }
}

fn experiments_table(s: &mut String, r: &Report) {
    let _ = writeln!(s, "\n## Experiments\n");
    let _ = writeln!(
        s,
        "An experiment's verdict is on **the article's claims alone**: **reproduced** (every claim of the article \
         holds), **conditional** (none fails outright, some holds only under some conditions), **partly \
         supported** (some hold or hold under some conditions, some fail), **not supported** (they fail, none holds), **undecided** (none \
         fails, some could not be decided), **no article claim** (the experiment tests only the lab's own). The \
         lab's own hypotheses (its corrections and added measurements) are counted in their own column and never \
         change the verdict. A claim checked under several conditions holds when it holds in every condition, \
         fails when it fails in at least one and holds in none, is conditional when it holds in some and fails \
         in others, and is undecided otherwise.\n"
    );
    let _ = writeln!(
        s,
        "| # | experiment | verdict on the article | the article's claims | the lab's own hypotheses | cells | measure time (s) |\n|---|---|---|---|---|---|---|"
    );
    for (i, e) in r.experiments.iter().enumerate() {
        let _ = writeln!(
            s,
            "| {} | [{}](#{}) | {} | {} | {} | {} | {:.1} |",
            i + 1,
            e.name,
            e.name,
            e.verdict.label(),
            md_cell(&e.summary),
            md_cell(&e.lab),
            e.cells,
            e.measure_seconds
        );
    }
    for fail in &r.failures {
        let _ = writeln!(
            s,
            "| – | {} | **failed** | {} | – | – | – |",
            fail.name,
            md_cell(&fail.error)
        );
    }
}

fn cross_backend(s: &mut String, r: &Report) {
    let cross: Vec<(&str, &BackendValues)> = r
        .experiments
        .iter()
        .flat_map(|e| e.per_backend.iter().map(move |b| (e.name.as_str(), b)))
        .filter(|(_, b)| b.values.len() > 1)
        .collect();
    if cross.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Across backends\n");
    let _ = writeln!(
        s,
        "The same inputs on every backend; the largest relative disagreement |a − b| / max(|a|, |b|) of \
         each quantity measured on more than one.\n\n| experiment | quantity | values | largest disagreement |\n|---|---|---|---|"
    );
    for (name, b) in cross {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {:.1e} |",
            md_cell(&b.quantity),
            b.values
                .iter()
                .map(|(k, v)| format!("{k} {}", short(*v)))
                .collect::<Vec<_>>()
                .join(", "),
            b.largest_disagreement()
        );
    }
}

/// One experiment's section.
fn section(s: &mut String, e: &ExperimentReport) {
    let _ = writeln!(
        s,
        "\n<a id=\"{}\"></a>\n## {}: {}\n",
        e.name, e.name, e.title
    );
    let _ = writeln!(
        s,
        "**Verdict on the article: {}.** {}. **The lab's own hypotheses:** {}.\n",
        e.verdict.label(),
        e.summary,
        e.lab
    );
    let _ = writeln!(s, "{}", e.markdown);
    let _ = writeln!(s, "\n**Claims.**\n\n{}", claims_table(&e.claims));
    for c in e
        .claims
        .iter()
        .filter(|c| c.outcome == Outcome::Conditional)
    {
        let _ = writeln!(
            s,
            "- *{}* holds under: {}; fails under: {}.",
            c.id,
            list(c, Outcome::Holds),
            list(c, Outcome::Fails)
        );
    }
    for p in &e.plots {
        if !e.markdown.contains(p.as_str()) {
            let _ = writeln!(s, "\n![{p}]({p})");
        }
    }
    if !e.skipped.is_empty() {
        let _ = writeln!(s, "\nSkipped (with the reason):\n");
        for k in &e.skipped {
            let _ = writeln!(s, "- {k}");
        }
    }
    let _ = writeln!(
        s,
        "\n_{} cells, {:.1} s of measurement; files: {}._",
        e.cells,
        e.measure_seconds,
        e.csv
            .iter()
            .chain(&e.plots)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The appendix: the bookkeeping behind `REPORT.md`.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Appendix: every claim, every experiment\n");
    let _ = writeln!(
        s,
        "The bookkeeping behind [the report](REPORT.md): every experiment of the article *10 · Attention \
         的数学推导*, reproduced with the `burn-sdpa` module on Burn 0.22.1. Every conclusion is a claim \
         with the check that decides it; its outcome is computed from this run's numbers with thresholds \
         fixed in the code before the run (where one was chosen after runs were seen, it says so beside \
         it), and an experiment's verdict follows from its claims.\n\n{}\n",
        provenance(r)
    );
    if r.experiment("training-confirm").is_some() && r.experiment("training").is_some() {
        let _ = writeln!(
            s,
            "**Exploratory and confirmatory.** `training` came first: it tuned the learning rates and \
             shaped the analysis, so its outcomes are exploratory. `training-confirm` measured the \
             same question once more on fresh seeds with that analysis fixed beforehand, and \
             `training-confirm-2` once more with a design committed before its runs that answers \
             what a review found in the first (the premise from the article's own example, \
             learning rates tuned for its budget and one shared rate, a verdict off the budget's \
             edge). Where they answer the same sentence, the latest confirmatory answer is the \
             report's and supersedes the earlier ones (the tally below counts it); the earlier rows \
             stay in the ledger as the record of how the analysis was reached.\n"
        );
    }
    if r.run.plan.quick {
        let _ = writeln!(s, "{}\n", QUICK);
    }
    if !r.run.skipped_backends.is_empty() {
        let _ = writeln!(
            s,
            "Backends skipped: {}.\n",
            r.run.skipped_backends.join("; ")
        );
    }
    let _ = writeln!(s, "## Summary by experiment\n");
    abstract_lines(&mut s, r);
    ledger(&mut s, r);
    experiments_table(&mut s, r);
    cross_backend(&mut s, r);
    for e in &r.experiments {
        section(&mut s, e);
    }
    s
}

/// What a quick run's report says about its sizes.
pub(super) const QUICK: &str = "**Quick sizes**: fewer draws and seeds than the full design, with \
    the same claims; a claim these sizes cannot decide says *undecided*, and no verdict here should be \
    quoted as the lab's answer.";

/// The most lines the abstract holds.
const ABSTRACT_LINES: usize = 10;

/// The abstract: the experiments' headline lines (each computed from this run), then the tally
/// of the article's claims; at most [`ABSTRACT_LINES`] lines.
fn abstract_lines(s: &mut String, r: &Report) {
    // The latest confirmatory run's line first: it is the report's answer.
    let mut experiments: Vec<&ExperimentReport> = r.experiments.iter().collect();
    experiments.sort_by_key(|e| std::cmp::Reverse(confirm_rank(&e.name)));
    let mut lines: Vec<String> = experiments
        .iter()
        .flat_map(|e| e.headline.iter().cloned())
        .take(ABSTRACT_LINES - 1)
        .collect();
    lines.extend(tally_line(r));
    if lines.is_empty() {
        return;
    }
    for line in lines {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(s);
}

use crate::claims::sentence_of as sentence;

/// One sentence's outcome from its rows (each the quote it checks and its outcome): the
/// whole-sentence row's, where exactly one row quotes the sentence whole and the others are its
/// parts; several rows quoting it whole are checks of one sentence (the gradient sentence's
/// three), joined by "and" as a sentence's parts are within one claim ([`Outcome::all`]: one
/// failing check fails it); parts alone, by [`Outcome::across`].
fn sentence_outcome(base: &str, rows: &[(&str, Outcome)]) -> Outcome {
    let whole: Vec<Outcome> = rows
        .iter()
        .filter(|(zh, _)| *zh == base)
        .map(|(_, o)| *o)
        .collect();
    match whole.as_slice() {
        [one] if rows.len() > 1 => *one,
        [_, _, ..] => Outcome::all(&whole),
        _ => Outcome::across(&rows.iter().map(|(_, o)| *o).collect::<Vec<_>>()),
    }
}

/// The tally of the article's sentences, each counted once, by [`sentence_outcome`]; a claim
/// that could not have failed is left out and named.
pub(super) fn tally_line(r: &Report) -> Option<String> {
    // Where a confirmatory run decided a sentence, the rows of the latest such run alone count.
    let superseded_ids: Vec<(&str, &str)> = r
        .experiments
        .iter()
        .flat_map(|e| e.claims.iter().map(move |c| (e, c)))
        .filter(|(e, c)| superseded(r, e, c))
        .map(|(e, c)| (e.name.as_str(), c.id.as_str()))
        .collect();
    let article: Vec<&Claim> = r
        .experiments
        .iter()
        .flat_map(|e| {
            let superseded_ids = &superseded_ids;
            e.claims
                .iter()
                .filter(move |c| !superseded_ids.contains(&(e.name.as_str(), c.id.as_str())))
        })
        .filter(|c| c.source.is_article())
        .collect();
    if article.is_empty() {
        return None;
    }
    let zh = |c: &Claim| match &c.source {
        Source::Article(q) => q.zh,
        Source::Lab => "",
    };
    let mut sentences: Vec<&str> = article.iter().map(|c| sentence(zh(c))).collect();
    sentences.sort_unstable();
    sentences.dedup();
    let (mut outcomes, mut left_out) = (Vec::new(), Vec::new());
    for base in &sentences {
        let rows: Vec<&&Claim> = article
            .iter()
            .filter(|c| sentence(zh(c)) == *base)
            .collect();
        if rows.iter().any(|c| !c.counts()) {
            left_out.extend(rows.iter().map(|c| c.id.clone()));
            continue;
        }
        let quoted: Vec<(&str, Outcome)> = rows.iter().map(|c| (zh(c), c.outcome)).collect();
        outcomes.push(sentence_outcome(base, &quoted));
    }
    let t = Tally::of(&outcomes);
    let verb = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    Some(format!(
        "**The article's sentences, each counted once** (the ledger below has a row per check; a \
         sentence checked by several rows counts by its whole-sentence row where it has one; \
         several checks of one whole sentence count as its parts, so one failing check fails it; a \
         claim counts when its design let it fail, and not when \
         its verdict rests on a bound set by the budget): of {} that could have failed, {}, {}, \
         {}, {} and {}{}.",
        t.total(),
        verb(t.holds, "holds", "hold"),
        verb(t.fails, "fails", "fail"),
        verb(
            t.conditional,
            "holds only under some conditions",
            "hold only under some conditions"
        ),
        verb(
            t.undecided,
            "is undecided by this run",
            "are undecided by this run"
        ),
        verb(
            t.out_of_reach,
            "cannot be decided with this design",
            "cannot be decided with this design"
        ),
        if left_out.is_empty() {
            String::new()
        } else {
            format!(
                "; not counted (the ledger says why: they could not have failed, or rest on the budget): {}",
                left_out.join(", ")
            )
        }
    ))
}

/// The labels of a claim's conditions with this outcome.
fn labels(c: &Claim, outcome: Outcome) -> Vec<&str> {
    c.conditions
        .iter()
        .filter(|k| k.outcome == outcome)
        .map(|k| k.label.as_str())
        .collect()
}

fn list(c: &Claim, outcome: Outcome) -> String {
    let labels = labels(c, outcome);
    if labels.is_empty() {
        "—".into()
    } else {
        labels.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::{Outcome, confirm_rank, sentence_outcome};

    #[test]
    fn a_sentence_counts_by_its_whole_row_or_by_all_its_checks() {
        let base = "梯度消失";
        // A whole-sentence row beside its parts decides the sentence.
        let parts = [
            (base, Outcome::Holds),
            ("梯度消失（part 1）", Outcome::Fails),
        ];
        assert_eq!(sentence_outcome(base, &parts), Outcome::Holds);
        // Three checks quoting the sentence whole count together, not by the first row: one
        // that fails fails the sentence, as a failing part fails a sentence checked in parts.
        let checks = [
            (base, Outcome::Holds),
            (base, Outcome::Conditional),
            (base, Outcome::Fails),
        ];
        assert_eq!(sentence_outcome(base, &checks), Outcome::Fails);
        let holding = [(base, Outcome::Holds), (base, Outcome::Holds)];
        assert_eq!(sentence_outcome(base, &holding), Outcome::Holds);
        assert_eq!(
            sentence_outcome(base, &[(base, Outcome::Fails)]),
            Outcome::Fails
        );
    }

    #[test]
    fn a_later_confirmatory_run_outranks_an_earlier_one() {
        assert_eq!(confirm_rank("training"), 0);
        assert_eq!(confirm_rank("training-confirm"), 1);
        assert_eq!(confirm_rank("training-confirm-2"), 2);
        assert!(confirm_rank("training-confirm-2") > confirm_rank("training-confirm"));
    }
}
