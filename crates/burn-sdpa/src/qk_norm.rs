//! QK-norm: a learnable normalization of every query and key head before the scores
//! (ViT-22B, OLMo 2, Gemma 3), which bounds the logits' size whatever the projections learn —
//! the modern answer to the logit growth that 1/√d_k only corrects at initialization.

use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// Which normalization the multi-head layer applies to each query and key head (over its d_k
/// features, with one learnable gain, and for LayerNorm a bias, shared across heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum QkNorm {
    /// No normalization (the article's attention).
    #[default]
    None,
    /// LayerNorm per head (ViT-22B): zero mean, unit variance, then gain and bias.
    LayerNorm,
    /// RMSNorm per head (OLMo 2, Gemma 3): unit root-mean-square, then gain.
    RmsNorm,
}

impl QkNorm {
    /// The layer for heads of `d_k` features, or `None` for [`QkNorm::None`].
    pub fn init(&self, d_k: usize, device: &Device) -> Option<HeadNorm> {
        match self {
            QkNorm::None => None,
            QkNorm::LayerNorm => Some(HeadNorm::LayerNorm(LayerNormConfig::new(d_k).init(device))),
            QkNorm::RmsNorm => Some(HeadNorm::RmsNorm(RmsNormConfig::new(d_k).init(device))),
        }
    }
}

/// A learnable normalization over the last axis (d_k) of `[b, heads, s, d_k]` heads.
#[derive(Module, Debug)]
pub enum HeadNorm {
    /// LayerNorm over d_k.
    LayerNorm(LayerNorm),
    /// RMSNorm over d_k.
    RmsNorm(RmsNorm),
}

impl HeadNorm {
    /// Normalizes every head vector.
    ///
    /// # Shapes
    /// - heads: `[b, heads, s, d_k]` -> `[b, heads, s, d_k]`
    pub fn forward(&self, heads: Tensor<4>) -> Tensor<4> {
        match self {
            HeadNorm::LayerNorm(norm) => norm.forward(heads),
            HeadNorm::RmsNorm(norm) => norm.forward(heads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    #[test]
    fn normalized_heads_have_unit_size_whatever_their_scale() {
        let device = Device::flex();
        device.seed(4);
        let x = Tensor::<4>::random([2, 3, 5, 16], Distribution::Normal(0.0, 30.0), &device);
        for (kind, want_mean) in [(QkNorm::LayerNorm, Some(0.0)), (QkNorm::RmsNorm, None)] {
            let norm = kind.init(16, &device).expect("a layer");
            let y = norm.forward(x.clone());
            // At initialization (gain 1, bias 0) every head vector has mean square 1 (RMSNorm)
            // or variance 1 and mean 0 (LayerNorm).
            let mean_square: Vec<f32> =
                crate::util::read_back("ms", y.clone().powf_scalar(2.0).mean_dim(3)).unwrap();
            assert!(
                mean_square.iter().all(|v| (v - 1.0).abs() < 1e-3),
                "{kind:?}"
            );
            if let Some(want) = want_mean {
                let means: Vec<f32> = crate::util::read_back("mean", y.mean_dim(3)).unwrap();
                assert!(means.iter().all(|m| (m - want).abs() < 1e-4), "{kind:?}");
            }
        }
        assert!(QkNorm::None.init(16, &device).is_none());
    }
}
