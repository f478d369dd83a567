//! burn-nn's transformer layers as drop-in layers (`burn::nn::transformer` → this module).

mod decoder;
mod encoder;

use burn::nn::LayerNorm;
use burn::prelude::*;

// burn-nn's own feed-forward (the drop-in layers hold it, so records match).
pub use burn::nn::transformer::{PositionWiseFeedForward, PositionWiseFeedForwardConfig};
pub use decoder::{
    TransformerDecoder, TransformerDecoderAutoregressiveCache, TransformerDecoderConfig,
    TransformerDecoderInput, TransformerDecoderLayer,
};
pub use encoder::{
    TransformerEncoder, TransformerEncoderAutoregressiveCache, TransformerEncoderConfig,
    TransformerEncoderInput, TransformerEncoderLayer,
};

use crate::rows::{layer_norm, linear_rows};

/// burn-nn's position-wise feed-forward with this crate's row-parallel linear layers.
///
/// # Shapes
/// - x: `[b, s, d_model]`; returns `[b, s, d_model]`
fn feed_forward(pwff: &PositionWiseFeedForward, x: Tensor<3>) -> Tensor<3> {
    let x = linear_rows(&pwff.linear_inner, x);
    let x = pwff.activation.forward(x);
    let x = pwff.dropout.forward(x);
    linear_rows(&pwff.linear_outer, x)
}

/// `norm` applied to `x` through this crate's layer norm (one op with its own backward pass on
/// the CPU backends), with the epsilon burn-nn's `LayerNorm` keeps private.
///
/// # Shapes
/// - x: `[b, s, d_model]`; returns `[b, s, d_model]`
fn norm(norm: &LayerNorm, x: Tensor<3>, epsilon: f64) -> Tensor<3> {
    layer_norm(
        x,
        norm.gamma.val(),
        norm.beta.as_ref().map(|b| b.val()),
        epsilon,
    )
}
