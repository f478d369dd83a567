//! Every experiment of the lab, in report order. The registry does nothing else.

use crate::experiment::Experiment;
use crate::experiments::*;

/// Every experiment, in report order.
pub fn all_experiments() -> Vec<&'static dyn Experiment> {
    vec![
        &dot_std::DotStd,
        &saturation::Saturation,
        &attention_saturation::AttentionSaturation,
        &gradients::Gradients,
        &training::Training,
        &training_confirm::TrainingConfirm,
        &training_confirm2::TrainingConfirm2,
        &training_variants::TrainingVariants,
        &logit_control::LogitControl,
        &compare::Compare,
        &attention_map::AttentionMap,
        &masks::Masks,
        &why_softmax::WhySoftmax,
        &complexity::Complexity,
    ]
}

/// The experiment with this name.
pub fn find_experiment(name: &str) -> Option<&'static dyn Experiment> {
    all_experiments().into_iter().find(|e| e.name() == name)
}
