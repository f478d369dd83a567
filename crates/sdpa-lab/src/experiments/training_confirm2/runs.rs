//! One run of the second confirmatory experiment, flattened: the rows its CSV file holds, the
//! rows the analysis reads (from measured cells, or from the committed measurement, which the
//! default report analyses without running it again).

use sdpa_model::QkInit;
use serde::{Deserialize, Serialize};

use super::design::NEAR_CHANCE_ACCURACY;
use crate::experiments::training::Role;
use crate::experiments::training::Run;
use crate::experiments::training::analyze::stuck_below;
use crate::measures::training::{Arm, init_name};

/// The committed measurement: `training_confirm2_runs.csv` of the run `report --long` made,
/// copied here (an empty file holds the header only).
pub const COMMITTED: &str = include_str!("../../../assets/confirm2/runs.csv");

/// The commit that fixed the design ([`design`](super::design)), before any run.
pub const DESIGNED_IN: &str = "37b200a";
/// The commit whose binary measured [`COMMITTED`] (`sdpa exp training-confirm-2 --long`).
pub const MEASURED_AT: &str = "7ca383b";

/// The CSV header.
pub const HEADER: &str =
    "role,init,d_k,arm,seed,lr,budget,steps_to_target,final_accuracy,initial_logit_std";

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Tuning or test.
    pub tuning: bool,
    /// Initialization.
    pub init: QkInit,
    /// d_k.
    pub d_k: usize,
    /// 1/√d_k (`true`) or no scaling.
    pub scaled: bool,
    /// Seed.
    pub seed: u64,
    /// Learning rate.
    pub lr: f64,
    /// Budget.
    pub budget: usize,
    /// Steps to 99% (`None`: never within the budget).
    pub steps: Option<usize>,
    /// Held-out accuracy at the end (NaN: diverged).
    pub final_accuracy: f64,
    /// Starting logit std.
    pub initial_logit_std: f64,
    /// Stuck near chance: never at 99%, and below the accuracy of «fails completely» or
    /// diverged.
    pub near_chance: bool,
}

impl Row {
    /// A measured cell's row.
    pub fn of(r: &Run) -> Self {
        let s = &r.config.spec;
        Self {
            tuning: r.config.role == Role::Tuning,
            init: s.init,
            d_k: s.d_k,
            scaled: s.arm == Arm::Scaled,
            seed: s.seed,
            lr: s.lr,
            budget: s.budget,
            steps: r.result.steps_to_target,
            final_accuracy: r.result.final_accuracy,
            initial_logit_std: r.result.initial.logit_std,
            near_chance: near_chance(r.result.steps_to_target, r.result.final_accuracy),
        }
    }

    /// Its CSV line.
    pub fn line(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{}",
            if self.tuning { "tuning" } else { "test" },
            init_name(self.init),
            self.d_k,
            if self.scaled { "scaled" } else { "none" },
            self.seed,
            self.lr,
            self.budget,
            self.steps.map_or(String::new(), |s| s.to_string()),
            self.final_accuracy,
            self.initial_logit_std
        )
    }
}

/// Stuck near chance: never at 99%, and ending below [`NEAR_CHANCE_ACCURACY`] or diverged
/// (NaN accuracy). One rule for measured cells and committed rows alike, the one `training`'s
/// «fails completely» uses ([`stuck_below`]).
pub fn near_chance(steps: Option<usize>, final_accuracy: f64) -> bool {
    stuck_below(steps, final_accuracy, NEAR_CHANCE_ACCURACY)
}

/// The rows of a CSV file written by [`Row::line`] under [`HEADER`]; a malformed line is an
/// error naming it.
pub fn parse(csv: &str) -> Result<Vec<Row>, String> {
    let mut lines = csv.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!("the header is not «{HEADER}»"));
    }
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        let bad = |what: &str| format!("line {}: {what}", i + 2);
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 10 {
            return Err(bad("wrong number of fields"));
        }
        let steps = if f[7].is_empty() {
            None
        } else {
            Some(f[7].parse().map_err(|_| bad("steps_to_target"))?)
        };
        let final_accuracy: f64 = f[8].parse().map_err(|_| bad("final_accuracy"))?;
        out.push(Row {
            tuning: match f[0] {
                "tuning" => true,
                "test" => false,
                _ => return Err(bad("role")),
            },
            init: match f[1] {
                "unit" => QkInit::Unit,
                "default" => QkInit::Default,
                _ => return Err(bad("init")),
            },
            d_k: f[2].parse().map_err(|_| bad("d_k"))?,
            scaled: match f[3] {
                "scaled" => true,
                "none" => false,
                _ => return Err(bad("arm")),
            },
            seed: f[4].parse().map_err(|_| bad("seed"))?,
            lr: f[5].parse().map_err(|_| bad("lr"))?,
            budget: f[6].parse().map_err(|_| bad("budget"))?,
            steps,
            final_accuracy,
            initial_logit_std: f[9].parse().map_err(|_| bad("initial_logit_std"))?,
            near_chance: near_chance(steps, final_accuracy),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reads_back_as_written() {
        let r = Row {
            tuning: false,
            init: QkInit::Unit,
            d_k: 64,
            scaled: false,
            seed: 80_042,
            lr: 0.003,
            budget: 1500,
            steps: None,
            final_accuracy: f64::NAN,
            initial_logit_std: 7.5,
            near_chance: true,
        };
        let text = format!("{HEADER}\n{}\n", r.line());
        let back = parse(&text).expect("parses");
        assert_eq!(back.len(), 1);
        assert!(back[0].near_chance && back[0].final_accuracy.is_nan());
        assert_eq!(back[0].line(), r.line());
    }

    #[test]
    fn the_committed_file_parses() {
        parse(COMMITTED).expect("the committed runs parse");
    }

    /// The design commit comes before the measuring commit, and the committed runs arrived
    /// after both (checked where `git` and this repository's history are at hand).
    #[test]
    fn the_design_predates_the_runs_in_git_log() {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let Some(first_runs) = git(&[
            "log",
            "--format=%h",
            "--diff-filter=M",
            "--reverse",
            "--",
            "assets/confirm2/runs.csv",
        ]) else {
            eprintln!("no git history here: not checked");
            return;
        };
        let Some(first_runs) = first_runs.lines().next().map(str::to_string) else {
            eprintln!("no commit has changed the runs yet: not checked");
            return;
        };
        // A shallow clone may lack the older commits: nothing to check against then.
        if git(&["cat-file", "-e", &format!("{DESIGNED_IN}^{{commit}}")]).is_none() {
            eprintln!("{DESIGNED_IN} is not in this clone's history: not checked");
            return;
        }
        let ancestor = |a: &str, b: &str| {
            std::process::Command::new("git")
                .args(["merge-base", "--is-ancestor", a, b])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(ancestor(DESIGNED_IN, MEASURED_AT));
        assert!(ancestor(MEASURED_AT, &first_runs), "{first_runs}");
        assert_ne!(
            git(&["rev-parse", DESIGNED_IN]),
            git(&["rev-parse", &first_runs])
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        let text = format!("{HEADER}\ntest,unit,64,none,1,0.1,1500,,0.2,x\n");
        assert_eq!(parse(&text).unwrap_err(), "line 2: initial_logit_std");
    }
}
