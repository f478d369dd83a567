//! Tests of the claims, outcomes and verdicts.
use super::*;

fn estimate(value: f64, lo: f64, hi: f64) -> Estimate {
    Estimate {
        value,
        lo,
        hi,
        n: 10,
        ci90: None,
    }
}

#[test]
fn intervals_decide_or_abstain() {
    let c = |e| Claim::below("x", Source::Lab, "x < 0", "x", e, 0.0).outcome;
    assert_eq!(c(estimate(-1.0, -1.5, -0.5)), Outcome::Holds);
    assert_eq!(c(estimate(1.0, 0.5, 1.5)), Outcome::Fails);
    assert_eq!(c(estimate(0.1, -0.5, 0.7)), Outcome::Undecided);
    assert_eq!(c(estimate(0.1, f64::NAN, f64::NAN)), Outcome::Undecided);
    let a = |e| Claim::above("x", Source::Lab, "x > 0", "x", e, 0.0).outcome;
    assert_eq!(a(estimate(1.0, 0.5, 1.5)), Outcome::Holds);
    assert_eq!(a(estimate(-1.0, -1.5, -0.5)), Outcome::Fails);
}

#[test]
fn equivalence_reads_the_90_percent_interval() {
    // 95% interval pokes out of the band, 90% interval is inside: equivalent (TOST).
    let e = Estimate {
        ci90: Some((0.96, 1.04)),
        ..estimate(1.0, 0.94, 1.06)
    };
    assert_eq!(inside(e, 0.95, 1.05), Some(true));
    assert_eq!(inside(estimate(1.0, 0.94, 1.06), 0.95, 1.05), None);
    assert_eq!(inside(estimate(2.0, 1.9, 2.1), 0.95, 1.05), Some(false));
}

#[test]
fn conditions_combine() {
    use Outcome::*;
    assert_eq!(Outcome::across(&[Holds, Holds]), Holds);
    assert_eq!(Outcome::across(&[Fails, Fails]), Fails);
    assert_eq!(Outcome::across(&[Holds, Fails]), Conditional);
    assert_eq!(Outcome::across(&[Holds, Undecided]), Undecided);
    assert_eq!(Outcome::across(&[Holds, Fails, Undecided]), Conditional);
    assert_eq!(Outcome::across(&[]), Undecided);
    // Fails wherever it is decided and never holds: it fails (it was "undecided").
    assert_eq!(
        Outcome::across(&[Fails, Undecided, Fails, Undecided, Fails]),
        Fails
    );
    assert_eq!(Outcome::across(&[Undecided, Undecided]), Undecided);
    assert_eq!(Outcome::across(&[Conditional, Undecided]), Conditional);
    assert_eq!(Outcome::across(&[Conditional, Holds]), Conditional);
}

#[test]
fn a_claim_over_conditions_counts_them() {
    use Outcome::*;
    let condition = |outcome| Condition {
        label: "c".into(),
        measured: String::new(),
        outcome,
    };
    let claim = Claim::per_condition(
        "x",
        Source::Lab,
        "s",
        "check",
        [Fails, Undecided, Fails, Holds, Undecided, Undecided]
            .into_iter()
            .map(condition)
            .collect(),
    );
    let tally = claim.tally().unwrap();
    assert_eq!((tally.holds, tally.fails, tally.undecided), (1, 2, 3));
    assert_eq!(claim.outcome, Conditional);
    assert_eq!(
        claim.outcome_text(),
        "**conditional** (holds in 1, fails in 2, undecided in 3 of 6 conditions)"
    );
    let once = Claim::decided("y", Source::Lab, "s", "c", "m", Some(true));
    assert_eq!(once.tally(), None);
    assert_eq!(once.outcome_text(), "**holds**");
}

#[test]
fn verdicts_follow_the_articles_claims_alone() {
    static Q: Quote = Quote {
        section: "§1",
        zh: "",
        en: "",
    };
    let article = |o| claim(Source::Article(&Q), o);
    let lab = |o| claim(Source::Lab, o);
    use Outcome::*;
    let v = Verdict::from_claims;
    assert_eq!(v(&[article(Holds), lab(Holds)]), Verdict::Reproduced);
    // The lab's own hypotheses never change the verdict on the article.
    assert_eq!(v(&[article(Holds), lab(Fails)]), Verdict::Reproduced);
    assert_eq!(v(&[article(Holds), lab(Undecided)]), Verdict::Reproduced);
    assert_eq!(v(&[article(Fails), lab(Holds)]), Verdict::NotSupported);
    assert_eq!(
        v(&[article(Holds), article(Fails), lab(Holds)]),
        Verdict::PartlySupported
    );
    assert_eq!(
        v(&[article(Conditional), article(Fails)]),
        Verdict::PartlySupported
    );
    assert_eq!(v(&[article(Conditional), lab(Fails)]), Verdict::Conditional);
    assert_eq!(v(&[article(Holds), article(Undecided)]), Verdict::Undecided);
    assert_eq!(v(&[lab(Holds)]), Verdict::LabOnly);
    assert_eq!(
        lab_summary(&[article(Holds), lab(Fails)]),
        "0 of 1 claims hold; failed: c"
    );
    assert_eq!(article_summary(&[lab(Holds)]), "no claim of the article");
}

/// A bare claim of `source` with `outcome`.
fn claim(source: Source, outcome: Outcome) -> Claim {
    Claim {
        id: "c".into(),
        source,
        statement: String::new(),
        check: String::new(),
        measured: String::new(),
        outcome,
        conditions: Vec::new(),
        conjunction: false,
        cannot_fail: None,
        fails_if: None,
    }
}

#[test]
fn a_part_is_decided_by_its_counted_whole_sentence() {
    static WHOLE: Quote = Quote {
        section: "Q1",
        zh: "训练完全失效或极慢。",
        en: "",
    };
    static HALF: Quote = Quote {
        section: "Q1",
        zh: "训练完全失效或极慢。（完全失效）",
        en: "",
    };
    use Outcome::*;
    // The «or» holds through its other half; the undecided half does not make the experiment
    // undecided while the whole sentence's row counts.
    let both = [
        claim(Source::Article(&WHOLE), Holds),
        claim(Source::Article(&HALF), Undecided),
    ];
    assert_eq!(Verdict::from_claims(&both), Verdict::Reproduced);
    // Without a counted whole row, the part counts.
    let whole_uncounted = [
        claim(Source::Article(&WHOLE), Holds).cannot_fail("rests on the budget"),
        claim(Source::Article(&HALF), Fails),
    ];
    assert_eq!(
        Verdict::from_claims(&whole_uncounted),
        Verdict::NotSupported
    );
}

#[test]
fn a_sentence_of_parts_fails_when_one_part_fails() {
    let part = |outcome| Condition {
        label: "part".into(),
        measured: "m".into(),
        outcome,
    };
    use Outcome::*;
    let claim = |parts: Vec<Outcome>| {
        Claim::all_of(
            "c",
            Source::Lab,
            "s",
            "check",
            parts.into_iter().map(part).collect(),
        )
    };
    assert_eq!(claim(vec![Holds, Fails]).outcome, Fails);
    assert_eq!(claim(vec![Holds, Holds]).outcome, Holds);
    assert_eq!(claim(vec![Holds, Undecided]).outcome, Undecided);
    assert_eq!(claim(vec![Undecided, Fails]).outcome, Fails);
    assert_eq!(claim(vec![]).outcome, Undecided);
    // Its tally counts parts, not conditions.
    assert!(
        claim(vec![Holds, Fails])
            .outcome_text()
            .ends_with("of 2 parts)")
    );
}
