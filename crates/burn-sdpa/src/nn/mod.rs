//! Drop-in replacements for burn-nn's attention layers: the same config names and defaults, the
//! same input and output fields, the same parameter names (a record saved from
//! `burn::nn::attention::MultiHeadAttention` or `burn::nn::transformer::TransformerEncoder` loads
//! unchanged), computed by this crate's [`ScaledDotProductAttention`](crate::ScaledDotProductAttention)
//! so that `Auto`'s fused kernels serve them. Changing the `use` line is the whole change:
//!
//! ```
//! use burn::prelude::*;
//! // use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
//! use burn_sdpa::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
//! let device = Device::flex();
//! let encoder = TransformerEncoderConfig::new(64, 128, 4, 2).init(&device);
//! let x = Tensor::<3>::zeros([2, 10, 64], &device);
//! let y = encoder.forward(TransformerEncoderInput::new(x));
//! assert_eq!(y.dims(), [2, 10, 64]);
//! ```
//!
//! A training step, forward, backward and an Adam step, and the path the attention took
//! (dropout off: burn-nn's default 0.1 keeps training off the fused kernel):
//!
//! ```
//! use burn::optim::{AdamConfig, GradientsParams};
//! use burn::prelude::*;
//! use burn::tensor::Distribution;
//! use burn_sdpa::nn::attention::{MhaInput, MultiHeadAttentionConfig};
//! let device = Device::flex().autodiff(); // a training device
//! // With burn-nn's default dropout (0.1) training would take a materializing path instead.
//! let mha = MultiHeadAttentionConfig::new(64, 4).with_dropout(0.0).init(&device);
//! let mut optim = AdamConfig::new().init();
//! let x = Tensor::<3>::random([2, 128, 64], Distribution::Default, &device); // [b, n, d_model]
//! let input = MhaInput::self_attn(x).causal();
//! // cpu_kernel on Flex with burn-sdpa's `flex` feature; naive if the weights are asked for
//! // (`need_weights()`), naive or chunked(N) if dropout is on.
//! println!("attention path: {}", mha.path(&input).unwrap());
//! let y = mha.forward(input).context; // [b, n, d_model]
//! let loss = y.powi_scalar(2).mean();
//! let grads = loss.backward();
//! let d_query = mha.query.weight.grad(&grads).unwrap(); // what the optimizer step reads
//! assert_eq!(d_query.dims(), [64, 64]);
//! let grads = GradientsParams::from_grads(grads, &mha);
//! let mha = optim.step(1e-3, mha, grads); // one Adam step: the layer with updated weights
//! assert_eq!(mha.query.weight.dims(), [64, 64]);
//! ```
//!
//! What differs from burn-nn, on purpose:
//! - [`attention::MhaOutput::weights`] is an `Option`, `None` unless asked for with
//!   [`attention::MhaInput::need_weights`]: computing them would keep every call on the
//!   materializing path.
//! - With dropout on (training, p > 0) the layers take a materializing path (`Naive`, or
//!   `Chunked` for long sequences), whose dropout draws its own masks: the same seed does not
//!   give burn-nn's masks, and the weights returned are taken before dropout (burn-nn's after);
//!   a row whose keys are all masked gets the plain mean of the values, without dropout.
//! - The configs have optional extras burn-nn lacks (grouped-query heads, rotary positions and
//!   the module's [`AttentionOptions`](crate::AttentionOptions): scale, soft-cap, implementation,
//!   precision); left at their defaults, the layers compute what burn-nn's compute.
//! - The autoregressive caches take any number of new rows per call (burn-nn's one), and a
//!   failed call leaves them as they were; with `need_weights`, a cached call returns the new
//!   rows' weights only.
//!
//! What is matched although it is odd (see the semantics table of the README): masked keys get
//! burn-nn's `min_float` (−10⁴ by default) rather than −∞, so a query whose keys are all masked
//! averages every value uniformly (this crate's own layers give a zero row); with
//! `norm_first`, the encoder normalizes the attention's input with `norm_2` and the feed-forward's
//! with `norm_1`, as burn-nn does.

pub mod attention;
pub mod transformer;

use burn::prelude::*;

/// What burn-nn's autoregressive calls (the whole sequence so far each time) have been answered
/// with: every row's output, `[b, rows, d_model]`. The attention, encoder and decoder caches keep
/// one each.
#[derive(Debug, Clone, Default)]
pub(crate) struct Answered {
    output: Option<Tensor<3>>,
}

impl Answered {
    /// Rows answered so far.
    pub(crate) fn rows(&self) -> usize {
        self.output.as_ref().map_or(0, |o| o.dims()[1])
    }

    /// Whether a call with `b` sequences of `s` positions continues these rows: as many
    /// sequences (once there are rows) and no fewer positions.
    pub(crate) fn continued_by(&self, b: usize, s: usize) -> bool {
        s >= self.rows() && self.output.as_ref().is_none_or(|o| o.dims()[0] == b)
    }

    /// Appends the new rows' outputs `[b, t, d_model]`: every row's output.
    pub(crate) fn append(&mut self, new: Tensor<3>) -> Tensor<3> {
        let output = match self.output.take() {
            Some(old) => Tensor::cat(vec![old, new], 1),
            None => new,
        };
        self.output = Some(output.clone());
        output
    }
}
