//! burn-nn's `TransformerEncoder` as a drop-in layer: its config, fields and records, with the
//! attention of [`MultiHeadAttention`] and the CPU backends' row ops for the layer norms and
//! linear layers.

use burn::module::Module;
use burn::nn::activation::ActivationConfig;
use burn::nn::transformer::{PositionWiseFeedForward, PositionWiseFeedForwardConfig};
use burn::nn::{Dropout, DropoutConfig, Initializer, LayerNorm, LayerNormConfig};
use burn::prelude::*;

use super::{feed_forward, norm};
use crate::error::AttentionError;
use crate::nn::Answered;
use crate::nn::attention::{MhaCache, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use crate::options::AttentionOptions;
use crate::rope::RopeConfig;

/// Configuration of [`TransformerEncoder`]: burn-nn's fields and defaults, plus this crate's
/// optional attention options.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
/// # let device = Device::flex();
/// let encoder = TransformerEncoderConfig::new(32, 64, 4, 2).init(&device);
/// let x = Tensor::<3>::zeros([2, 6, 32], &device);
/// let mask_pad = Tensor::<2, Bool>::full([2, 6], false, &device);
/// let y = encoder.forward(TransformerEncoderInput::new(x).mask_pad(mask_pad));
/// assert_eq!(y.dims(), [2, 6, 32]);
/// ```
#[derive(Config, Debug)]
pub struct TransformerEncoderConfig {
    /// The size of the model.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// The dropout rate. Default: 0.1
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Layer norm before the attention and the feed-forward (pre-LN). Default: false
    #[config(default = false)]
    pub norm_first: bool,
    /// Quiet softmax in the attention. Default: false
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// The initializer of the parameters.
    #[config(
        default = "Initializer::KaimingUniform { gain: 0.5773502691896258, fan_out_only: false }"
    )]
    pub initializer: Initializer,
    /// The feed-forward's activation. Default: Gelu
    #[config(default = "ActivationConfig::Gelu")]
    pub activation: ActivationConfig,
    /// The layer norms' epsilon. Default: 1e-5
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
    /// Extra (not in burn-nn): key/value heads for grouped-query attention.
    pub n_kv_heads: Option<usize>,
    /// Extra (not in burn-nn): the attention core's options (see
    /// [`MultiHeadAttentionConfig::attention`]).
    pub attention: Option<AttentionOptions>,
    /// Extra (not in burn-nn): rotary positions in every attention (see
    /// [`MultiHeadAttentionConfig::rope`]).
    pub rope: Option<RopeConfig>,
}

impl TransformerEncoderConfig {
    /// The config of each layer's attention.
    fn mha(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_initializer(self.initializer.clone())
            .with_dropout(self.dropout)
            .with_quiet_softmax(self.quiet_softmax)
            .with_n_kv_heads(self.n_kv_heads)
            .with_attention(self.attention.clone())
            .with_rope(self.rope.clone())
    }

    /// Builds the encoder, or says which setting is wrong.
    pub fn try_init(&self, device: &Device) -> Result<TransformerEncoder, AttentionError> {
        self.mha().validate()?;
        let layers = (0..self.n_layers)
            .map(|_| TransformerEncoderLayer::try_new(self, device))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TransformerEncoder {
            layers,
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            n_layers: self.n_layers,
            dropout: self.dropout,
            norm_first: self.norm_first,
            quiet_softmax: self.quiet_softmax,
        })
    }

    /// Builds the encoder.
    ///
    /// # Panics
    /// With the message of [`try_init`](Self::try_init)'s error when a setting is wrong.
    pub fn init(&self, device: &Device) -> TransformerEncoder {
        self.try_init(device).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// burn-nn's transformer encoder, field for field (so its records load).
#[derive(Module, Debug)]
pub struct TransformerEncoder {
    /// The layers.
    pub layers: Vec<TransformerEncoderLayer>,
    /// The size of the model.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// The dropout rate.
    pub dropout: f64,
    /// Pre-LN.
    pub norm_first: bool,
    /// Quiet softmax.
    pub quiet_softmax: bool,
}

/// The input of [`TransformerEncoder`]: burn-nn's (`tensor [b, s, d_model]`, `mask_pad [b, s]`,
/// `mask_attn [b, s, s]`, true = masked), plus a causal flag.
#[derive(Debug, Clone)]
pub struct TransformerEncoderInput {
    tensor: Tensor<3>,
    mask_pad: Option<Tensor<2, Bool>>,
    mask_attn: Option<Tensor<3, Bool>>,
    causal: bool,
}

impl TransformerEncoderInput {
    /// The input `[b, s, d_model]`.
    pub fn new(tensor: Tensor<3>) -> Self {
        Self {
            tensor,
            mask_pad: None,
            mask_attn: None,
            causal: false,
        }
    }

    /// The padding mask `[b, s]`, true = padding.
    pub fn mask_pad(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// The attention mask `[b, s, s]`, true = masked.
    pub fn mask_attn(mut self, mask_attn: Tensor<3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }

    /// Extra: causal self-attention without an `[s, s]` mask (what burn-nn's
    /// `generate_autoregressive_mask` builds; the fused kernels skip the hidden tiles).
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }
}

impl TransformerEncoder {
    /// Applies every layer.
    ///
    /// # Shapes
    /// - tensor: `[b, s, d_model]`; mask_pad: `[b, s]`; mask_attn: `[b, s, s]`
    /// - returns `[b, s, d_model]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(&self, input: TransformerEncoderInput) -> Tensor<3> {
        self.try_forward(input).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Applies every layer, or says which input does not fit.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    pub fn try_forward(&self, input: TransformerEncoderInput) -> Result<Tensor<3>, AttentionError> {
        let mut x = input.tensor.clone();
        for layer in &self.layers {
            x = layer.try_forward(x, &input)?;
        }
        Ok(x)
    }
}

/// One encoder layer, burn-nn's fields (so its records load).
#[derive(Module, Debug)]
pub struct TransformerEncoderLayer {
    /// Self-attention.
    pub mha: MultiHeadAttention,
    /// Position-wise feed-forward network (burn-nn's own).
    pub pwff: PositionWiseFeedForward,
    /// After the attention (post-LN), or before the feed-forward (pre-LN).
    pub norm_1: LayerNorm,
    /// After the feed-forward (post-LN), or before the attention (pre-LN), as in burn-nn.
    pub norm_2: LayerNorm,
    /// Dropout on each residual branch.
    pub dropout: Dropout,
    /// Pre-LN.
    pub norm_first: bool,
    /// The layer norms' epsilon (burn-nn keeps it private in `LayerNorm`; not in the records).
    #[module(skip)]
    pub layer_norm_eps: f64,
}

impl TransformerEncoderLayer {
    /// One layer of `config` (burn-nn's `TransformerEncoderLayer::new`), or says which setting
    /// is wrong.
    pub fn try_new(
        config: &TransformerEncoderConfig,
        device: &Device,
    ) -> Result<Self, AttentionError> {
        let norm = || {
            LayerNormConfig::new(config.d_model)
                .with_epsilon(config.layer_norm_eps)
                .init(device)
        };
        Ok(Self {
            mha: config.mha().try_init(device)?,
            pwff: PositionWiseFeedForwardConfig::new(config.d_model, config.d_ff)
                .with_initializer(config.initializer.clone())
                .with_dropout(config.dropout)
                .with_activation(config.activation.clone())
                .init(device),
            norm_1: norm(),
            norm_2: norm(),
            dropout: DropoutConfig::new(config.dropout).init(),
            norm_first: config.norm_first,
            layer_norm_eps: config.layer_norm_eps,
        })
    }

    /// One layer of `config`, as burn-nn's `TransformerEncoderLayer::new`.
    ///
    /// # Panics
    /// With the message of [`try_new`](Self::try_new)'s error when a setting is wrong.
    pub fn new(config: &TransformerEncoderConfig, device: &Device) -> Self {
        Self::try_new(config, device).unwrap_or_else(|e| panic!("{e}"))
    }

    /// burn-nn's layer forward: `input` `[b, s, d_model]` with its padding `[b, s]` and attention
    /// `[b, s, s]` masks.
    ///
    /// # Shapes
    /// - input: `[b, s, d_model]`; returns `[b, s, d_model]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(
        &self,
        input: Tensor<3>,
        mask_pad: Option<Tensor<2, Bool>>,
        mask_attn: Option<Tensor<3, Bool>>,
    ) -> Tensor<3> {
        let masks = TransformerEncoderInput {
            tensor: input.clone(),
            mask_pad,
            mask_attn,
            causal: false,
        };
        self.try_forward(input, &masks)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The layer on `x` `[b, s, d_model]` with the masks of `input`.
    ///
    /// # Shapes
    /// - x: `[b, s, d_model]`; returns `[b, s, d_model]`
    pub fn try_forward(
        &self,
        x: Tensor<3>,
        input: &TransformerEncoderInput,
    ) -> Result<Tensor<3>, AttentionError> {
        self.try_forward_with(x, |residual| {
            Ok(self.mha.try_forward(input.attention(residual))?.context)
        })
    }

    /// The layer on new rows `x` `[b, t, d_model]` whose keys and values join `cache` (the masks
    /// of `input` cover every key; its `mask_attn` has the new rows only).
    fn try_forward_rows(
        &self,
        x: Tensor<3>,
        input: &TransformerEncoderInput,
        cache: &mut MhaCache,
    ) -> Result<Tensor<3>, AttentionError> {
        self.try_forward_with(x, |residual| {
            Ok(self
                .mha
                .try_forward_rows(input.attention(residual), cache)?
                .context)
        })
    }

    /// The layer around `attend` (the self-attention of the normalized or raw residual
    /// stream), with burn-nn's order of norms, residuals and dropouts.
    fn try_forward_with(
        &self,
        x: Tensor<3>,
        attend: impl FnOnce(Tensor<3>) -> Result<Tensor<3>, AttentionError>,
    ) -> Result<Tensor<3>, AttentionError> {
        let norm = |layer: &LayerNorm, x: Tensor<3>| norm(layer, x, self.layer_norm_eps);
        let residual = if self.norm_first {
            norm(&self.norm_2, x.clone())
        } else {
            x.clone()
        };
        let residual = attend(residual)?;
        let mut x = x + self.dropout.forward(residual);
        let residual = if self.norm_first {
            norm(&self.norm_1, x.clone())
        } else {
            x = norm(&self.norm_1, x);
            x.clone()
        };
        let residual = feed_forward(&self.pwff, residual);
        let mut x = x + self.dropout.forward(residual);
        if !self.norm_first {
            x = norm(&self.norm_2, x);
        }
        Ok(x)
    }
}

impl TransformerEncoderInput {
    /// The self-attention input of `x` with these masks.
    fn attention(&self, x: Tensor<3>) -> MhaInput {
        let mut attention = MhaInput::self_attn(x);
        if let Some(mask_pad) = &self.mask_pad {
            attention = attention.mask_pad(mask_pad.clone());
        }
        if let Some(mask_attn) = &self.mask_attn {
            attention = attention.mask_attn(mask_attn.clone());
        }
        if self.causal {
            attention = attention.causal();
        }
        attention
    }
}

/// burn-nn's encoder cache for autoregressive inference (see
/// [`TransformerEncoder::forward_autoregressive_inference`]).
#[derive(Debug, Clone)]
pub struct TransformerEncoderAutoregressiveCache {
    layers: Vec<MhaCache>,
    answered: Answered,
}

impl TransformerEncoder {
    /// An empty cache for [`forward_autoregressive_inference`](Self::forward_autoregressive_inference).
    pub fn new_autoregressive_cache(&self) -> TransformerEncoderAutoregressiveCache {
        TransformerEncoderAutoregressiveCache {
            layers: self
                .layers
                .iter()
                .map(|_| MhaCache::autoregressive())
                .collect(),
            answered: Answered::default(),
        }
    }

    /// burn-nn's autoregressive inference: `input` holds the whole sequence so far and its
    /// masks; only the rows past the previous call's go through the layers (their keys and
    /// values join each layer's cache), and the output of every row is returned. Equals
    /// [`forward`](Self::forward) when the attention is causal (a causal `mask_attn`, or
    /// [`TransformerEncoderInput::causal`]).
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    ///
    /// # Panics
    /// With the message of [`try_forward_autoregressive_inference`](Self::try_forward_autoregressive_inference)'s error.
    pub fn forward_autoregressive_inference(
        &self,
        input: TransformerEncoderInput,
        cache: &mut TransformerEncoderAutoregressiveCache,
    ) -> Tensor<3> {
        self.try_forward_autoregressive_inference(input, cache)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`forward_autoregressive_inference`](Self::forward_autoregressive_inference), or says
    /// which input does not fit the cache.
    pub fn try_forward_autoregressive_inference(
        &self,
        input: TransformerEncoderInput,
        cache: &mut TransformerEncoderAutoregressiveCache,
    ) -> Result<Tensor<3>, AttentionError> {
        let [b, s, d_model] = input.tensor.dims();
        let start = cache.answered.rows();
        if !cache.answered.continued_by(b, s) || cache.layers.len() != self.layers.len() {
            return Err(AttentionError::Shape {
                what: "cached encoder input",
                expected: format!(
                    "[b (the cache's), s ≥ {start}, d_model] into a cache of {} layers",
                    self.layers.len()
                ),
                got: vec![b, s, d_model],
            });
        }
        // [b, s, d] -> [b, s − start, d]; [b, s, s] -> [b, s − start, s]
        let mut x = input.tensor.clone().slice(s![.., start..s, ..]);
        let rows_input = TransformerEncoderInput {
            mask_attn: input
                .mask_attn
                .clone()
                .map(|mask| mask.slice(s![.., start..s, ..])),
            ..input
        };
        // The caches are written only once every layer has succeeded.
        let mut layers = cache.layers.clone();
        for (layer, layer_cache) in self.layers.iter().zip(&mut layers) {
            x = layer.try_forward_rows(x, &rows_input, layer_cache)?;
        }
        cache.layers = layers;
        Ok(cache.answered.append(x))
    }
}
