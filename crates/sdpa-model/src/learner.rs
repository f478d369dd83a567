//! burn-train integration: the model implements [`TrainStep`] and [`InferenceStep`], so it
//! trains under Burn's own `SupervisedTraining` / `Learner` (and its dashboard), with the
//! attention's entropy and largest probability reported as metrics beside loss and accuracy.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::prelude::*;
use burn::tensor::TensorReadError;
use burn::train::metric::state::{FormatOptions, NumericMetricState};
use burn::train::metric::{
    AccuracyInput, Adaptor, ItemLazy, LossInput, Metric, MetricAttributes, MetricMetadata,
    MetricName, Numeric, NumericAttributes, NumericEntry, SerializedEntry,
};
use burn::train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};
use burn_std::ExecutionError;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::model::{AttentionModel, BatchResult};
use crate::task::{Example, TaskBatch, TaskConfig};

/// Turns generated examples into batches for burn-train's data loaders.
#[derive(Debug, Clone)]
pub struct TaskBatcher {
    /// The task the examples come from.
    pub task: TaskConfig,
}

impl Batcher<Example, TaskBatch> for TaskBatcher {
    fn batch(&self, items: Vec<Example>, device: &Device) -> TaskBatch {
        self.task.collate(&items, device)
    }
}

/// `n` examples of a task from a seed, as an in-memory dataset.
pub fn task_dataset(task: &TaskConfig, n: usize, seed: u64) -> InMemDataset<Example> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    InMemDataset::new((0..n).map(|_| task.sample(&mut rng)).collect())
}

/// A classification output that also carries the attention statistics of the batch.
pub struct AttentionClassificationOutput {
    /// Loss, logits and targets.
    pub classification: ClassificationOutput,
    /// `[1]`: mean row entropy (nats) of the first attention layer.
    pub entropy: Tensor<1>,
    /// `[1]`: mean largest probability of a row of the first attention layer.
    pub max_prob: Tensor<1>,
}

impl ItemLazy for AttentionClassificationOutput {
    fn sync(self) -> Result<Self, ExecutionError> {
        Ok(Self {
            classification: self.classification.sync()?,
            entropy: self.entropy.without_autodiff(),
            max_prob: self.max_prob.without_autodiff(),
        })
    }
}

impl Adaptor<AccuracyInput> for AttentionClassificationOutput {
    fn adapt(&self) -> AccuracyInput {
        self.classification.adapt()
    }
}

impl Adaptor<LossInput> for AttentionClassificationOutput {
    fn adapt(&self) -> LossInput {
        self.classification.adapt()
    }
}

/// The input of the attention metrics.
pub struct AttentionStatsInput {
    entropy: Tensor<1>,
    max_prob: Tensor<1>,
}

impl Adaptor<AttentionStatsInput> for AttentionClassificationOutput {
    fn adapt(&self) -> AttentionStatsInput {
        AttentionStatsInput {
            entropy: self.entropy.clone(),
            max_prob: self.max_prob.clone(),
        }
    }
}

fn to_output(r: BatchResult) -> AttentionClassificationOutput {
    let (entropy, max_prob) = match r.attention.first() {
        // The mean over every row of the first layer's statistics (a row without a key has
        // entropy and largest weight 0, as it had from the weights).
        Some(a) => (
            a.stats.entropy.clone().detach().mean(),
            a.stats.max_prob.clone().detach().mean(),
        ),
        None => {
            let device = r.loss.device();
            (Tensor::zeros([1], &device), Tensor::zeros([1], &device))
        }
    };
    AttentionClassificationOutput {
        classification: ClassificationOutput::new(r.loss, r.logits, r.targets),
        entropy,
        max_prob,
    }
}

impl TrainStep for AttentionModel {
    type Input = TaskBatch;
    type Output = AttentionClassificationOutput;

    fn step(&self, batch: TaskBatch) -> TrainOutput<AttentionClassificationOutput> {
        let r = self.forward_batch(&batch, true);
        let grads = r.loss.backward();
        TrainOutput::new(self, grads, to_output(r))
    }
}

impl InferenceStep for AttentionModel {
    type Input = TaskBatch;
    type Output = AttentionClassificationOutput;

    fn step(&self, batch: TaskBatch) -> AttentionClassificationOutput {
        to_output(self.forward_batch(&batch, true))
    }
}

/// Which attention statistic a metric reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stat {
    Entropy,
    MaxProb,
}

/// A numeric burn-train metric of the first attention layer: its mean row entropy or its mean
/// largest probability.
#[derive(Clone)]
pub struct AttentionMetric {
    name: MetricName,
    stat: Stat,
    state: NumericMetricState,
}

impl AttentionMetric {
    /// Mean row entropy of the attention weights (nats).
    pub fn entropy() -> Self {
        Self {
            name: Arc::new("Attention entropy".to_string()),
            stat: Stat::Entropy,
            state: NumericMetricState::default(),
        }
    }

    /// Mean largest attention probability of a row.
    pub fn max_prob() -> Self {
        Self {
            name: Arc::new("Attention max prob".to_string()),
            stat: Stat::MaxProb,
            state: NumericMetricState::default(),
        }
    }
}

impl Metric for AttentionMetric {
    type Input = AttentionStatsInput;

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: None,
            higher_is_better: self.stat == Stat::Entropy,
        }
        .into()
    }

    fn update(
        &mut self,
        item: &AttentionStatsInput,
        _metadata: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        let t = match self.stat {
            Stat::Entropy => item.entropy.clone(),
            Stat::MaxProb => item.max_prob.clone(),
        };
        let value = t.try_into_scalar::<f64>()?;
        self.state.update(value, 1);
        Ok(self
            .state
            .compute_update(FormatOptions::new(self.name()).precision(3)))
    }

    fn compute(&mut self) -> Result<SerializedEntry, TensorReadError> {
        Ok(self
            .state
            .compute_final(FormatOptions::new(self.name()).precision(3)))
    }

    fn clear(&mut self) {
        self.state.reset();
    }
}

impl Numeric for AttentionMetric {
    fn value(&self) -> Option<NumericEntry> {
        Some(self.state.current_value())
    }

    fn running_value(&self) -> Option<NumericEntry> {
        Some(self.state.running_value())
    }

    fn final_value(&self) -> NumericEntry {
        self.state.final_value()
    }
}
