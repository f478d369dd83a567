//! The learning rate of each parameter: one rate for the model, and a factor on the attention's
//! query and key projections when the configuration asks for one (`TrainConfig::qk_lr_factor`).

use burn::lr_scheduler::module_lr_scheduler::{ModuleLearningRate, ModuleLrScheduler};
use burn::module::ParamGroup;

use super::config::TrainConfig;
use crate::model::AttentionModel;

/// The learning rate of every parameter: `lr`, and `lr · qk_lr_factor` for the attention's query
/// and key projections (weights and biases) when that factor is not 1.
pub(super) fn learning_rate(config: &TrainConfig, model: &AttentionModel) -> ModuleLearningRate {
    let mut rates = ModuleLrScheduler::new(config.lr);
    if config.qk_lr_factor != 1.0 {
        let ids = model
            .blocks
            .iter()
            .flat_map(|b| [&b.attention.query, &b.attention.key])
            .flat_map(|l| std::iter::once(l.weight.id).chain(l.bias.as_ref().map(|b| b.id)))
            .collect();
        rates = rates.with_group(ParamGroup::from_ids(ids), config.lr * config.qk_lr_factor);
    }
    rates.step()
}
