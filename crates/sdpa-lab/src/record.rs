//! What a run was asked for: its [`RunRecord`] (`run.json` in the output folder, what
//! `--render-only` and `--merge` re-plan from) and, for a sharded run, its [`Shard`].

use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::context::LabError;
use crate::experiment::Plan;
use crate::files::write_atomic;

/// One of N shards of a run: the cells whose index is `index` mod `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// I, from 0.
    pub index: usize,
    /// N.
    pub count: usize,
}

impl Shard {
    /// Whether the cell at `position` of its stage belongs to this shard.
    pub fn owns(&self, position: usize) -> bool {
        position % self.count == self.index
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("a shard is I/N (e.g. 0/4), got `{s}`"))?;
        let parse = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("a shard is I/N with whole numbers, got `{s}`"))
        };
        let (index, count) = (parse(i)?, parse(n)?);
        if count == 0 || index >= count {
            return Err(format!("a shard I/N needs 0 ≤ I < N, got `{s}`"));
        }
        Ok(Self { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The largest `run.json` the lab reads (its own are a few hundred bytes).
const MAX_RUN_JSON: u64 = 1 << 20;

/// `run.json`: what a folder's run was asked for (what `--render-only` and `--merge` re-plan
/// from).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The plan.
    pub plan: Plan,
    /// The experiments selected, in report order.
    pub experiments: Vec<String>,
    /// The shard, for a sharded run.
    pub shard: Option<Shard>,
    /// The `sdpa-lab` version.
    pub lab: String,
    /// Backends asked for but not usable, with the reason.
    pub skipped_backends: Vec<String>,
}

impl RunRecord {
    fn path(dir: &Path) -> PathBuf {
        dir.join("run.json")
    }

    /// Reads `DIR/run.json`.
    pub fn read(dir: &Path) -> Result<Self, LabError> {
        let path = Self::path(dir);
        // A regular file of sane size: a FIFO would block, a link to /dev/zero never end.
        match fs::symlink_metadata(&path) {
            Ok(meta) if !meta.is_file() || meta.len() > MAX_RUN_JSON => {
                return Err(LabError::Usage(format!(
                    "{}: not a run record the lab wrote (not a regular file of at most {MAX_RUN_JSON} \
                     bytes)",
                    path.display()
                )));
            }
            _ => {}
        }
        let text = fs::read_to_string(&path).map_err(|e| {
            LabError::Usage(format!(
                "{}: {e} (is {} the output folder of `sdpa report`?)",
                path.display(),
                dir.display()
            ))
        })?;
        let record: Self = serde_json::from_str(&text).map_err(|e| {
            LabError::Usage(format!(
                "{}: {e}: not a run record the lab wrote (run the report again to rewrite it)",
                path.display()
            ))
        })?;
        record.validate(&path)?;
        Ok(record)
    }

    /// Checks every field read back from disk, naming the file and the field: a run record edited
    /// by hand is refused, never trusted into a panic.
    pub fn validate(&self, path: &Path) -> Result<(), LabError> {
        let bad = |field: &str, why: String| {
            Err(LabError::Usage(format!(
                "{}: field `{field}` {why} (run the report again to rewrite it)",
                path.display()
            )))
        };
        if let Some(shard) = self.shard
            && (shard.count == 0 || shard.index >= shard.count)
        {
            return bad(
                "shard",
                format!(
                    "is index {} of count {}: a shard needs 0 ≤ index < count",
                    shard.index, shard.count
                ),
            );
        }
        if self.plan.backends.is_empty() {
            return bad(
                "plan.backends",
                "is empty: a run has at least one backend".into(),
            );
        }
        if let Some(b) = self.plan.backends.iter().find(|b| b.trim().is_empty()) {
            return bad("plan.backends", format!("holds an empty name {b:?}"));
        }
        let mut backends = std::collections::HashSet::new();
        if let Some(dup) = self
            .plan
            .backends
            .iter()
            .find(|b| !backends.insert(b.as_str()))
        {
            return bad("plan.backends", format!("names `{dup}` twice"));
        }
        if self.experiments.is_empty() {
            return bad(
                "experiments",
                "is empty: a run has at least one experiment".into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = self.experiments.iter().find(|e| !seen.insert(e.as_str())) {
            return bad("experiments", format!("names `{dup}` twice"));
        }
        Ok(())
    }

    /// Writes `DIR/run.json`.
    pub fn write(&self, dir: &Path) -> Result<(), LabError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| LabError::Serialize {
            what: "run.json".into(),
            message: e.to_string(),
        })?;
        write_atomic(&Self::path(dir), text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_own_every_nth_cell() {
        let s: Shard = "1/3".parse().unwrap();
        assert_eq!(s, Shard { index: 1, count: 3 });
        assert!(s.owns(1) && s.owns(4) && !s.owns(0) && !s.owns(2));
        for bad in ["3/3", "0/0", "1", "a/2", "-1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
