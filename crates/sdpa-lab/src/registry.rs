//! Every experiment of the lab, in report order.

use crate::experiment::Experiment;
use crate::experiments::*;

/// Every experiment, in report order.
pub fn all_experiments() -> Vec<&'static dyn Experiment> {
    vec![&dot_std::DotStd, &saturation::Saturation, &attention_saturation::AttentionSaturation]
}

/// The experiment with this name.
pub fn find_experiment(name: &str) -> Option<&'static dyn Experiment> {
    all_experiments().into_iter().find(|e| e.name() == name)
}
