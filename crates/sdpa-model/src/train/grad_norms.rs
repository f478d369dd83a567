//! The squared gradient norms a training step reads back: over every parameter (the divergence
//! check and the recorded norm) and over one projection's weights.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Gradients;

use crate::model::AttentionModel;

/// |g|² over every parameter, as a one-element tensor.
pub(super) fn grad_squares(model: &AttentionModel, grads: &Gradients) -> Tensor<1> {
    let mut squares = GradSquares {
        grads,
        sums: Vec::new(),
    };
    model.visit(&mut squares);
    Tensor::cat(squares.sums, 0).sum()
}

/// Sums the squared gradients of all parameters.
struct GradSquares<'a> {
    grads: &'a Gradients,
    sums: Vec<Tensor<1>>,
}

impl ModuleVisitor for GradSquares<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = param.grad(self.grads) {
            self.sums.push(g.square().sum());
        }
    }
}

/// `|t|²` as a one-element tensor (0 when there is no gradient).
pub(super) fn squared_norm(t: Option<Tensor<2>>, device: &Device) -> Tensor<1> {
    t.map(|g| g.square().sum())
        .unwrap_or_else(|| Tensor::zeros([1], device))
}
