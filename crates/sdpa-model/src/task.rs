//! Synthetic tasks that only content-based attention solves, generated in process from a seed.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// Which task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// The article's experiment 3 as a task: `2k` tokens whose second half is a random
    /// permutation of the (distinct) first half; for each position of the second half, predict
    /// the index of its twin in the first half.
    #[default]
    Match,
    /// Associative recall: `k` (key, value) token pairs followed by one of the keys; predict its
    /// value.
    Recall,
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskKind::Match => "match",
            TaskKind::Recall => "recall",
        })
    }
}

impl FromStr for TaskKind {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "match" => Ok(TaskKind::Match),
            "recall" => Ok(TaskKind::Recall),
            other => Err(ModelError::invalid(
                "task",
                other,
                "expected `match` or `recall`",
            )),
        }
    }
}

/// Task size.
#[derive(Config, Debug)]
pub struct TaskConfig {
    /// Which task.
    #[config(default = "TaskKind::Match")]
    pub kind: TaskKind,
    /// Match: half the sequence length (tokens to match). Recall: number of key/value pairs.
    /// 8 keeps a run under a minute on two CPU cores while leaving 8! orderings to learn from.
    #[config(default = 8)]
    pub k: usize,
    /// Vocabulary size. 64 tokens make the k = 8 distinct tokens of a sequence mostly new ones.
    #[config(default = 64)]
    pub vocab: usize,
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// `[seq_len]` token ids.
    pub tokens: Vec<i64>,
    /// `[n_targets]` class ids, for the positions in [`TaskConfig::target_range`].
    pub targets: Vec<i64>,
}

/// A batch of examples on a device.
#[derive(Debug, Clone)]
pub struct TaskBatch {
    /// `[b, seq_len]`
    pub tokens: Tensor<2, Int>,
    /// `[b, n_targets]`
    pub targets: Tensor<2, Int>,
    /// The positions whose outputs are scored.
    pub target_range: Range<usize>,
}

impl TaskConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.k < 2 {
            return Err(ModelError::invalid("k", self.k, "must be at least 2"));
        }
        // Sequences are 2k (+ 1) long: k must leave room for that.
        if self.k > (usize::MAX - 1) / 2 {
            return Err(ModelError::invalid(
                "k",
                self.k,
                &format!(
                    "the sequence length 2k + 1 overflows; k must be at most {}",
                    (usize::MAX - 1) / 2
                ),
            ));
        }
        let min_vocab = match self.kind {
            TaskKind::Match => self.k,
            TaskKind::Recall => 2 * self.k,
        };
        if self.vocab < min_vocab {
            return Err(ModelError::invalid(
                "vocab",
                self.vocab,
                &format!(
                    "the {} task with k = {} needs at least {min_vocab} tokens",
                    self.kind, self.k
                ),
            ));
        }
        Ok(())
    }

    /// Length of a sequence.
    pub fn seq_len(&self) -> usize {
        // Saturating: an oversized k is refused by `validate`, never wrapped to a short length.
        match self.kind {
            TaskKind::Match => self.k.saturating_mul(2),
            TaskKind::Recall => self.k.saturating_mul(2).saturating_add(1),
        }
    }

    /// Number of classes the model predicts among.
    pub fn n_classes(&self) -> usize {
        match self.kind {
            TaskKind::Match => self.k,
            TaskKind::Recall => self.vocab,
        }
    }

    /// The positions whose outputs are scored.
    pub fn target_range(&self) -> Range<usize> {
        match self.kind {
            TaskKind::Match => self.k..2 * self.k,
            TaskKind::Recall => 2 * self.k..2 * self.k + 1,
        }
    }

    /// The accuracy of guessing uniformly at random.
    pub fn chance_accuracy(&self) -> f64 {
        match self.kind {
            TaskKind::Match => 1.0 / self.k as f64,
            // The value is one of the k values in the sequence.
            TaskKind::Recall => 1.0 / self.k as f64,
        }
    }

    /// Draws one sequence.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> Example {
        let k = self.k;
        match self.kind {
            TaskKind::Match => {
                // k distinct tokens: a partial Fisher-Yates shuffle of the vocabulary.
                let mut vocab: Vec<i64> = (0..self.vocab as i64).collect();
                let (first, _) = vocab.partial_shuffle(rng, k);
                let first = first.to_vec();
                let mut perm: Vec<usize> = (0..k).collect();
                perm.shuffle(rng);
                let mut tokens = first.clone();
                tokens.extend(perm.iter().map(|&p| first[p]));
                Example {
                    tokens,
                    targets: perm.iter().map(|&p| p as i64).collect(),
                }
            }
            TaskKind::Recall => {
                // Keys come from the lower half of the vocabulary, values from the upper half.
                let half = self.vocab / 2;
                let mut keys: Vec<i64> = (0..half as i64).collect();
                let (keys, _) = keys.partial_shuffle(rng, k);
                let keys = keys.to_vec();
                let values: Vec<i64> = (0..k)
                    .map(|_| rng.random_range(half as i64..self.vocab as i64))
                    .collect();
                let query = rng.random_range(0..k);
                let mut tokens = Vec::with_capacity(2 * k + 1);
                for (key, value) in keys.iter().zip(&values) {
                    tokens.push(*key);
                    tokens.push(*value);
                }
                tokens.push(keys[query]);
                Example {
                    tokens,
                    targets: vec![values[query]],
                }
            }
        }
    }

    /// Draws a batch of `batch_size` sequences onto `device`.
    pub fn batch(&self, rng: &mut ChaCha8Rng, batch_size: usize, device: &Device) -> TaskBatch {
        let examples: Vec<Example> = (0..batch_size).map(|_| self.sample(rng)).collect();
        self.collate(&examples, device)
    }

    /// Stacks examples into a batch.
    pub fn collate(&self, examples: &[Example], device: &Device) -> TaskBatch {
        let b = examples.len();
        let s = examples.first().map_or(0, |e| e.tokens.len());
        let t = examples.first().map_or(0, |e| e.targets.len());
        let tokens: Vec<i64> = examples
            .iter()
            .flat_map(|e| e.tokens.iter().copied())
            .collect();
        let targets: Vec<i64> = examples
            .iter()
            .flat_map(|e| e.targets.iter().copied())
            .collect();
        TaskBatch {
            tokens: Tensor::from_data(TensorData::new(tokens, [b, s]), device),
            targets: Tensor::from_data(TensorData::new(targets, [b, t]), device),
            target_range: self.target_range(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn match_second_half_is_a_permutation_with_twin_targets() {
        let cfg = TaskConfig::new().with_k(6).with_vocab(10);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let ex = cfg.sample(&mut rng);
            assert_eq!(ex.tokens.len(), 12);
            let (first, second) = ex.tokens.split_at(6);
            let mut a = first.to_vec();
            a.sort();
            a.dedup();
            assert_eq!(a.len(), 6, "first half has duplicates: {first:?}");
            let mut b = second.to_vec();
            b.sort();
            assert_eq!(a, b, "second half is not a permutation of the first");
            for (i, &t) in ex.targets.iter().enumerate() {
                assert_eq!(
                    first[t as usize], second[i],
                    "target does not index the twin"
                );
            }
            assert!(ex.tokens.iter().all(|&t| (0..10).contains(&t)));
        }
    }

    #[test]
    fn recall_query_is_one_of_the_keys_and_target_its_value() {
        let cfg = TaskConfig::new()
            .with_kind(TaskKind::Recall)
            .with_k(4)
            .with_vocab(20);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..200 {
            let ex = cfg.sample(&mut rng);
            assert_eq!(ex.tokens.len(), 9);
            let keys: Vec<i64> = ex.tokens[..8].iter().step_by(2).copied().collect();
            let mut distinct = keys.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 4, "duplicate keys {keys:?}");
            let q = ex.tokens[8];
            let pos = keys.iter().position(|&k| k == q).expect("query is a key");
            assert_eq!(ex.targets, vec![ex.tokens[2 * pos + 1]]);
            assert!(keys.iter().all(|&k| k < 10) && ex.targets[0] >= 10);
        }
    }

    #[test]
    fn same_seed_same_sequences() {
        let cfg = TaskConfig::new();
        let a: Vec<Example> = {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            (0..5).map(|_| cfg.sample(&mut rng)).collect()
        };
        let b: Vec<Example> = {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            (0..5).map(|_| cfg.sample(&mut rng)).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn invalid_sizes_are_rejected() {
        assert!(TaskConfig::new().with_k(1).validate().is_err());
        let e = TaskConfig::new()
            .with_k(8)
            .with_vocab(4)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("vocab = 4"), "{e}");
        let e = TaskConfig::new()
            .with_kind(TaskKind::Recall)
            .with_k(8)
            .with_vocab(10)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("16"), "{e}");
    }
}
