//! burn-nn's `TransformerDecoder` as a drop-in layer: self-attention, cross-attention over the
//! encoder's memory and the feed-forward, with burn-nn's fields (so its records load) and its
//! autoregressive cache.

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

/// Configuration of [`TransformerDecoder`]: burn-nn's fields and defaults, plus this crate's
/// optional attention options.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::nn::transformer::{TransformerDecoderConfig, TransformerDecoderInput};
/// # let device = Device::flex();
/// let decoder = TransformerDecoderConfig::new(32, 64, 4, 2).init(&device);
/// let target = Tensor::<3>::zeros([2, 5, 32], &device);
/// let memory = Tensor::<3>::zeros([2, 7, 32], &device);
/// let y = decoder.forward(TransformerDecoderInput::new(target, memory).causal());
/// assert_eq!(y.dims(), [2, 5, 32]);
/// ```
#[derive(Config, Debug)]
pub struct TransformerDecoderConfig {
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
    /// Layer norm before each block (pre-LN). Default: false
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

impl TransformerDecoderConfig {
    /// The config of each attention of a layer.
    fn mha(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_initializer(self.initializer.clone())
            .with_dropout(self.dropout)
            .with_quiet_softmax(self.quiet_softmax)
            .with_n_kv_heads(self.n_kv_heads)
            .with_attention(self.attention.clone())
            .with_rope(self.rope.clone())
    }

    /// Builds the decoder, or says which setting is wrong.
    pub fn try_init(&self, device: &Device) -> Result<TransformerDecoder, AttentionError> {
        self.mha().validate()?;
        let layers = (0..self.n_layers)
            .map(|_| TransformerDecoderLayer::try_new(self, device))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TransformerDecoder {
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

    /// Builds the decoder.
    ///
    /// # Panics
    /// With the message of [`try_init`](Self::try_init)'s error when a setting is wrong.
    pub fn init(&self, device: &Device) -> TransformerDecoder {
        self.try_init(device).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// burn-nn's transformer decoder, field for field (so its records load).
#[derive(Module, Debug)]
pub struct TransformerDecoder {
    /// The layers.
    pub layers: Vec<TransformerDecoderLayer>,
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

/// The input of [`TransformerDecoder`]: burn-nn's (target `[b, n, d_model]` with its
/// `target_mask_pad [b, n]` and `target_mask_attn [b, n, n]`, memory `[b, m, d_model]` with its
/// `memory_mask_pad [b, m]` and `memory_mask_attn [b, n, m]`; true = masked), plus a causal
/// flag for the self-attention.
#[derive(Debug, Clone)]
pub struct TransformerDecoderInput {
    target: Tensor<3>,
    target_mask_pad: Option<Tensor<2, Bool>>,
    target_mask_attn: Option<Tensor<3, Bool>>,
    memory: Tensor<3>,
    memory_mask_pad: Option<Tensor<2, Bool>>,
    memory_mask_attn: Option<Tensor<3, Bool>>,
    causal: bool,
}

impl TransformerDecoderInput {
    /// The target `[b, n, d_model]` and the encoder's memory `[b, m, d_model]`.
    pub fn new(target: Tensor<3>, memory: Tensor<3>) -> Self {
        Self {
            target,
            target_mask_pad: None,
            target_mask_attn: None,
            memory,
            memory_mask_pad: None,
            memory_mask_attn: None,
            causal: false,
        }
    }

    /// The memory's padding mask `[b, m]`.
    pub fn memory_mask_pad(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.memory_mask_pad = Some(mask_pad);
        self
    }

    /// The cross-attention mask `[b, n, m]`.
    pub fn memory_mask_attn(mut self, mask_attn: Tensor<3, Bool>) -> Self {
        self.memory_mask_attn = Some(mask_attn);
        self
    }

    /// The target's padding mask `[b, n]`.
    pub fn target_mask_pad(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.target_mask_pad = Some(mask_pad);
        self
    }

    /// The self-attention mask `[b, n, n]`.
    pub fn target_mask_attn(mut self, mask_attn: Tensor<3, Bool>) -> Self {
        self.target_mask_attn = Some(mask_attn);
        self
    }

    /// Extra: causal self-attention without an `[n, n]` mask.
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// Extra: the target `[b, n, d_model]` (after [`TransformerDecoderLayer::forward`], the
    /// layer's output).
    pub fn target(&self) -> &Tensor<3> {
        &self.target
    }

    /// The self-attention input of `x` (the target's rows) with the target's masks.
    fn self_attention(&self, x: Tensor<3>) -> MhaInput {
        let mut input = MhaInput::self_attn(x);
        if let Some(mask) = &self.target_mask_pad {
            input = input.mask_pad(mask.clone());
        }
        if let Some(mask) = &self.target_mask_attn {
            input = input.mask_attn(mask.clone());
        }
        if self.causal {
            input = input.causal();
        }
        input
    }

    /// The cross-attention input of `x` over the memory with the memory's masks.
    fn cross_attention(&self, x: Tensor<3>) -> MhaInput {
        let mut input = MhaInput::new(x, self.memory.clone(), self.memory.clone());
        if let Some(mask) = &self.memory_mask_pad {
            input = input.mask_pad(mask.clone());
        }
        if let Some(mask) = &self.memory_mask_attn {
            input = input.mask_attn(mask.clone());
        }
        input
    }
}

/// One decoder layer, burn-nn's fields (so its records load).
#[derive(Module, Debug)]
pub struct TransformerDecoderLayer {
    /// Cross-attention over the memory.
    pub cross_attn: MultiHeadAttention,
    /// Self-attention over the target.
    pub self_attn: MultiHeadAttention,
    /// Position-wise feed-forward network (burn-nn's own).
    pub pwff: PositionWiseFeedForward,
    /// After the self-attention (post-LN), or before the cross-attention (pre-LN).
    pub norm_1: LayerNorm,
    /// After the cross-attention (post-LN), or before the feed-forward (pre-LN).
    pub norm_2: LayerNorm,
    /// After the feed-forward (post-LN), or before the self-attention (pre-LN), as in burn-nn.
    pub norm_3: LayerNorm,
    /// Dropout on each residual branch.
    pub dropout: Dropout,
    /// Pre-LN.
    pub norm_first: bool,
    /// The layer norms' epsilon (not in the records).
    #[module(skip)]
    pub layer_norm_eps: f64,
}

impl TransformerDecoderLayer {
    /// One layer of `config` (burn-nn's `TransformerDecoderLayer::new`), or says which setting
    /// is wrong.
    pub fn try_new(
        config: &TransformerDecoderConfig,
        device: &Device,
    ) -> Result<Self, AttentionError> {
        let mha = config.mha();
        let norm = || {
            LayerNormConfig::new(config.d_model)
                .with_epsilon(config.layer_norm_eps)
                .init(device)
        };
        // burn-nn's order of initialization (self-attention first).
        let self_attn = mha.try_init(device)?;
        let cross_attn = mha.try_init(device)?;
        Ok(Self {
            cross_attn,
            self_attn,
            norm_1: norm(),
            norm_2: norm(),
            norm_3: norm(),
            pwff: PositionWiseFeedForwardConfig::new(config.d_model, config.d_ff)
                .with_initializer(config.initializer.clone())
                .with_dropout(config.dropout)
                .with_activation(config.activation.clone())
                .init(device),
            dropout: DropoutConfig::new(config.dropout).init(),
            norm_first: config.norm_first,
            layer_norm_eps: config.layer_norm_eps,
        })
    }

    /// One layer of `config`, as burn-nn's `TransformerDecoderLayer::new`.
    ///
    /// # Panics
    /// With the message of [`try_new`](Self::try_new)'s error when a setting is wrong.
    pub fn new(config: &TransformerDecoderConfig, device: &Device) -> Self {
        Self::try_new(config, device).unwrap_or_else(|e| panic!("{e}"))
    }

    /// burn-nn's layer forward: the input with its target replaced by the layer's output.
    ///
    /// # Shapes
    /// - target: `[b, n, d_model]`; memory: `[b, m, d_model]`
    ///
    /// # Panics
    /// When a mask does not fit (as [`TransformerDecoder::try_forward`] says).
    pub fn forward(&self, mut input: TransformerDecoderInput) -> TransformerDecoderInput {
        let target = self
            .try_forward_with(
                input.target.clone(),
                |r| Ok(self.self_attn.try_forward(input.self_attention(r))?.context),
                |r| {
                    Ok(self
                        .cross_attn
                        .try_forward(input.cross_attention(r))?
                        .context)
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        input.target = target;
        input
    }
}

/// The two attention caches of one decoder layer.
#[derive(Debug, Clone)]
struct LayerCache {
    self_attn: MhaCache,
    cross_attn: MhaCache,
}

impl TransformerDecoderLayer {
    /// The layer on target rows `x` `[b, t, d_model]`, its two attentions given as functions of
    /// their (normalized or raw) inputs, with burn-nn's order of norms, residuals and dropouts.
    fn try_forward_with(
        &self,
        x: Tensor<3>,
        self_attend: impl FnOnce(Tensor<3>) -> Result<Tensor<3>, AttentionError>,
        cross_attend: impl FnOnce(Tensor<3>) -> Result<Tensor<3>, AttentionError>,
    ) -> Result<Tensor<3>, AttentionError> {
        let norm = |layer: &LayerNorm, x: Tensor<3>| norm(layer, x, self.layer_norm_eps);
        let residual = if self.norm_first {
            norm(&self.norm_3, x.clone())
        } else {
            x.clone()
        };
        let mut x = x + self.dropout.forward(self_attend(residual)?);
        let residual = if self.norm_first {
            norm(&self.norm_1, x.clone())
        } else {
            x = norm(&self.norm_1, x);
            x.clone()
        };
        let mut x = x + self.dropout.forward(cross_attend(residual)?);
        let residual = if self.norm_first {
            norm(&self.norm_2, x.clone())
        } else {
            x = norm(&self.norm_2, x);
            x.clone()
        };
        let mut x = x + self.dropout.forward(feed_forward(&self.pwff, residual));
        if !self.norm_first {
            x = norm(&self.norm_3, x);
        }
        Ok(x)
    }
}

/// burn-nn's decoder cache for autoregressive inference (see
/// [`TransformerDecoder::forward_autoregressive_inference`]).
#[derive(Debug, Clone)]
pub struct TransformerDecoderAutoregressiveCache {
    layers: Vec<LayerCache>,
    answered: Answered,
}

impl TransformerDecoder {
    /// Applies every layer.
    ///
    /// # Shapes
    /// - target: `[b, n, d_model]`; memory: `[b, m, d_model]`; returns `[b, n, d_model]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(&self, input: TransformerDecoderInput) -> Tensor<3> {
        self.try_forward(input).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Applies every layer, or says which input does not fit.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    pub fn try_forward(&self, input: TransformerDecoderInput) -> Result<Tensor<3>, AttentionError> {
        let mut x = input.target.clone();
        for layer in &self.layers {
            x = layer.try_forward_with(
                x,
                |r| {
                    Ok(layer
                        .self_attn
                        .try_forward(input.self_attention(r))?
                        .context)
                },
                |r| {
                    Ok(layer
                        .cross_attn
                        .try_forward(input.cross_attention(r))?
                        .context)
                },
            )?;
        }
        Ok(x)
    }

    /// An empty cache for [`forward_autoregressive_inference`](Self::forward_autoregressive_inference).
    pub fn new_autoregressive_cache(&self) -> TransformerDecoderAutoregressiveCache {
        TransformerDecoderAutoregressiveCache {
            layers: self
                .layers
                .iter()
                .map(|_| LayerCache {
                    self_attn: MhaCache::autoregressive(),
                    cross_attn: MhaCache::memory(),
                })
                .collect(),
            answered: Answered::default(),
        }
    }

    /// burn-nn's autoregressive inference: the target holds the whole sequence so far; only
    /// the rows past the previous call's go through the layers (their keys and values join the
    /// self-attention caches; the memory's keys and values are computed once), and the output
    /// of every row is returned. Equals [`forward`](Self::forward) when the self-attention is
    /// causal.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    ///
    /// # Panics
    /// With the message of [`try_forward_autoregressive_inference`](Self::try_forward_autoregressive_inference)'s error.
    pub fn forward_autoregressive_inference(
        &self,
        input: TransformerDecoderInput,
        cache: &mut TransformerDecoderAutoregressiveCache,
    ) -> Tensor<3> {
        self.try_forward_autoregressive_inference(input, cache)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`forward_autoregressive_inference`](Self::forward_autoregressive_inference), or says
    /// which input does not fit the cache.
    pub fn try_forward_autoregressive_inference(
        &self,
        input: TransformerDecoderInput,
        cache: &mut TransformerDecoderAutoregressiveCache,
    ) -> Result<Tensor<3>, AttentionError> {
        let [b, n, d_model] = input.target.dims();
        let start = cache.answered.rows();
        if !cache.answered.continued_by(b, n) || cache.layers.len() != self.layers.len() {
            return Err(AttentionError::Shape {
                what: "cached decoder target",
                expected: format!(
                    "[b (the cache's), n ≥ {start}, d_model] into a cache of {} layers",
                    self.layers.len()
                ),
                got: vec![b, n, d_model],
            });
        }
        // The new rows: [b, n, d] -> [b, n − start, d]; the masks' rows likewise.
        let rows = |mask: Tensor<3, Bool>| mask.slice(s![.., start..n, ..]);
        let mut x = input.target.clone().slice(s![.., start..n, ..]);
        let input = TransformerDecoderInput {
            target_mask_attn: input.target_mask_attn.clone().map(rows),
            memory_mask_attn: input.memory_mask_attn.clone().map(rows),
            ..input
        };
        // The caches are written only once every layer has succeeded.
        let mut layers = cache.layers.clone();
        for (layer, layer_cache) in self.layers.iter().zip(&mut layers) {
            let LayerCache {
                self_attn,
                cross_attn,
            } = layer_cache;
            x = layer.try_forward_with(
                x,
                |r| {
                    Ok(layer
                        .self_attn
                        .try_forward_rows(input.self_attention(r), self_attn)?
                        .context)
                },
                |r| {
                    Ok(layer
                        .cross_attn
                        .try_forward_rows(input.cross_attention(r), cross_attn)?
                        .context)
                },
            )?;
        }
        cache.layers = layers;
        Ok(cache.answered.append(x))
    }
}
