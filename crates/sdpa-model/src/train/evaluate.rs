//! A model's held-out loss and accuracy ([`evaluate`]).

use burn::prelude::*;
use burn_sdpa::util::read_back;

use crate::error::ModelError;
use crate::model::AttentionModel;
use crate::task::TaskBatch;

/// Held-out (loss, accuracy) of a model, averaged over the batches.
pub fn evaluate(model: &AttentionModel, batches: &[TaskBatch]) -> Result<(f64, f64), ModelError> {
    if batches.is_empty() {
        return Err(ModelError::invalid(
            "batches",
            0,
            "evaluate needs at least one batch",
        ));
    }
    let model = model.valid();
    let mut parts = Vec::new();
    for b in batches {
        let r = model.try_forward_batch(b, false)?;
        parts.push(Tensor::cat(vec![r.loss.clone(), r.accuracy()], 0));
    }
    let n = parts.len().max(1) as f64;
    // [batches, 2] -> [1, 2]: summed loss and accuracy, read back in one transfer.
    let sums: Vec<f64> = read_back("the held-out loss", Tensor::stack::<2>(parts, 0).sum_dim(0))?;
    Ok((sums[0] / n, sums[1] / n))
}
