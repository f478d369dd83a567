//! burn-nn's `MultiHeadAttention` as a drop-in layer: its config, fields and records, computed by
//! [`ScaledDotProductAttention`].

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Gelu, Initializer, Linear, LinearConfig, RotaryEncoding};
use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::AttentionInput;
use crate::mask::causal_mask;
use crate::module::ScaledDotProductAttention;
use crate::options::AttentionOptions;
use crate::rope::{RopeConfig, rotate_rows};
use crate::rows::linear_rows;
use crate::types::Softmax;
use crate::vocabulary::AttentionPath;

mod cache;

pub use cache::MhaCache;

// burn-nn's mask helpers, so that `use burn::nn::attention::{..}` lines switch unchanged.
pub use burn::nn::attention::{
    GeneratePaddingMask, SeqLengthOption, generate_autoregressive_mask, generate_padding_mask,
};

/// Configuration of [`MultiHeadAttention`]: burn-nn's fields and defaults, plus this crate's
/// optional extras.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::nn::attention::{MhaInput, MultiHeadAttentionConfig};
/// # let device = Device::flex();
/// let mha = MultiHeadAttentionConfig::new(32, 4).with_dropout(0.0).init(&device);
/// let x = Tensor::<3>::zeros([2, 5, 32], &device);
/// let out = mha.forward(MhaInput::self_attn(x));
/// assert_eq!(out.context.dims(), [2, 5, 32]);
/// assert!(out.weights.is_none());
/// ```
#[derive(Config, Debug)]
pub struct MultiHeadAttentionConfig {
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// The dropout rate on the attention weights. Default: 0.1 (burn-nn's).
    #[config(default = 0.1)]
    pub dropout: f64,
    /// The score masked keys take in burn-nn. Default: −1.0e4. The drop-in layer hides masked
    /// keys, which equals burn-nn wherever the visible scores exceed it by more than 100 (the
    /// masked weights are then below e^−100); it must be ≤ −100.
    #[config(default = -1.0e4)]
    pub min_float: f64,
    /// Quiet softmax (a zero logit in every row's denominator, see
    /// [`Softmax::Quiet`](crate::Softmax)).
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// The initializer of the four projections.
    #[config(
        default = "Initializer::KaimingUniform { gain: 0.5773502691896258, fan_out_only: false }"
    )]
    pub initializer: Initializer,
    /// Enable bias for the key [`Linear`] layer.
    #[config(default = true)]
    pub key_bias: bool,
    /// Enable bias for the value [`Linear`] layer.
    #[config(default = true)]
    pub value_bias: bool,
    /// Enable bias for the query [`Linear`] layer.
    #[config(default = true)]
    pub query_bias: bool,
    /// Enable bias for the output [`Linear`] layer.
    #[config(default = true)]
    pub output_bias: bool,
    /// Extra (not in burn-nn): key/value heads for grouped-query attention; `None` is `n_heads`.
    /// The key and value projections then have `n_kv_heads · d_k` outputs.
    pub n_kv_heads: Option<usize>,
    /// Extra (not in burn-nn): the attention core's scale, soft-cap, causal alignment,
    /// implementation and precision; `None` is burn-nn's computation on `Auto`'s fastest path.
    /// Its dropout and softmax must stay at their defaults: the fields above set them.
    pub attention: Option<AttentionOptions>,
    /// Extra (not in burn-nn): rotary positions of queries and keys (query i at position i, key j
    /// at j; cached calls continue at the positions the cache has seen, so that cached decoding
    /// equals the full forward). Its tables are not parameters: records stay burn-nn's.
    pub rope: Option<RopeConfig>,
}

impl MultiHeadAttentionConfig {
    /// Checks the sizes and options and returns (d_k, key/value heads).
    pub fn validate(&self) -> Result<(usize, usize), AttentionError> {
        let invalid = |field: &'static str, value: String, reason: &str| {
            Err(AttentionError::InvalidConfig {
                field,
                value,
                reason: reason.into(),
            })
        };
        if self.n_heads == 0 || !self.d_model.is_multiple_of(self.n_heads) {
            return invalid(
                "n_heads",
                self.n_heads.to_string(),
                &format!("must be > 0 and divide d_model = {}", self.d_model),
            );
        }
        let n_kv = self.n_kv_heads.unwrap_or(self.n_heads);
        if n_kv == 0 || !self.n_heads.is_multiple_of(n_kv) {
            return Err(AttentionError::HeadGrouping {
                n_heads: self.n_heads,
                n_kv_heads: n_kv,
            });
        }
        if self.min_float.is_nan() || self.min_float > -100.0 {
            return invalid(
                "min_float",
                self.min_float.to_string(),
                "must be ≤ −100: the drop-in layer hides masked keys, which equals burn-nn's fill \
                 only when the filled score is far below every visible one",
            );
        }
        let options = self.options();
        options.validate()?;
        if let Some(given) = &self.attention
            && (given.dropout != 0.0 || given.softmax != Softmax::Standard)
        {
            return invalid(
                "attention",
                format!("dropout {}, softmax {:?}", given.dropout, given.softmax),
                "set the dropout and quiet softmax with the config's own `dropout` and \
                 `quiet_softmax` fields",
            );
        }
        let d_k = self.d_model / self.n_heads;
        if let Some(rope) = &self.rope {
            rope.validate(d_k)?;
        }
        Ok((d_k, n_kv))
    }

    /// The attention core's options: `attention` (or the defaults) with the config's dropout
    /// and softmax.
    fn options(&self) -> AttentionOptions {
        let options = self.attention.clone().unwrap_or_else(AttentionOptions::new);
        AttentionOptions {
            dropout: self.dropout,
            softmax: if self.quiet_softmax {
                Softmax::Quiet
            } else {
                Softmax::Standard
            },
            ..options
        }
    }

    /// Builds the layer, or says which setting is wrong.
    pub fn try_init(&self, device: &Device) -> Result<MultiHeadAttention, AttentionError> {
        let (d_k, n_kv) = self.validate()?;
        let linear = |d_out: usize, bias: bool| {
            LinearConfig::new(self.d_model, d_out)
                .with_initializer(self.initializer.clone())
                .with_bias(bias)
                .init(device)
        };
        let options = self.options();
        Ok(MultiHeadAttention {
            query: linear(self.d_model, self.query_bias),
            key: linear(n_kv * d_k, self.key_bias),
            value: linear(n_kv * d_k, self.value_bias),
            output: linear(self.d_model, self.output_bias),
            dropout: DropoutConfig::new(self.dropout).init(),
            activation: Gelu::new(),
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_k,
            min_float: self.min_float,
            quiet_softmax: self.quiet_softmax,
            n_kv_heads: n_kv,
            options,
            rope: self.rope.as_ref().map(|rope| rope.init(d_k, device)),
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// With the message of [`try_init`](Self::try_init)'s error when a setting is wrong.
    pub fn init(&self, device: &Device) -> MultiHeadAttention {
        self.try_init(device).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// burn-nn's multi-head attention, field for field (so its records load), computed by
/// [`ScaledDotProductAttention`].
#[derive(Module, Debug)]
pub struct MultiHeadAttention {
    /// Query projection `d_model -> d_model`.
    pub query: Linear,
    /// Key projection `d_model -> n_kv_heads · d_k`.
    pub key: Linear,
    /// Value projection `d_model -> n_kv_heads · d_k`.
    pub value: Linear,
    /// Output projection `d_model -> d_model`.
    pub output: Linear,
    /// Dropout on the attention weights (training, autodiff devices).
    pub dropout: Dropout,
    /// burn-nn's field (its layer never applies it); kept so that records match.
    pub activation: Gelu,
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// Size of the key and query vectors.
    pub d_k: usize,
    /// burn-nn's masked score (see [`MultiHeadAttentionConfig::min_float`]).
    pub min_float: f64,
    /// Quiet softmax.
    pub quiet_softmax: bool,
    /// Key/value heads (not in burn-nn's records: rebuilt from the config).
    #[module(skip)]
    pub n_kv_heads: usize,
    /// The attention core's options (not in burn-nn's records: rebuilt from the config).
    #[module(skip)]
    pub options: AttentionOptions,
    /// Rotary positions, if configured (their tables are constants, not in the records).
    pub rope: Option<RotaryEncoding>,
}

/// The inputs of [`MultiHeadAttention`]: burn-nn's `MhaInput` (query `[b, n, d_model]`, key and
/// value `[b, m, d_model]`, `mask_pad [b, m]` and `mask_attn [b, n, m]`, true = masked), plus
/// this crate's options.
#[derive(Debug, Clone)]
pub struct MhaInput {
    inner: AttentionInput<3>,
    mask_attn: Option<Tensor<3, Bool>>,
}

impl MhaInput {
    /// Self-attention: query, key and value are all `tensor` `[b, s, d_model]`.
    pub fn self_attn(tensor: Tensor<3>) -> Self {
        Self::new(tensor.clone(), tensor.clone(), tensor)
    }

    /// Query `[b, n, d_model]`, key and value `[b, m, d_model]`.
    pub fn new(query: Tensor<3>, key: Tensor<3>, value: Tensor<3>) -> Self {
        Self {
            inner: AttentionInput::new(query, key, value),
            mask_attn: None,
        }
    }

    /// The padding mask `[b, m]`, true = padding.
    pub fn mask_pad(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.inner = self.inner.padding_mask(mask_pad);
        self
    }

    /// The attention mask `[b, n, m]`, true = masked.
    pub fn mask_attn(mut self, mask_attn: Tensor<3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }

    /// Extra: causal masking on the layer's alignment, without an `[n, m]` mask (the fused
    /// kernels skip the hidden tiles).
    pub fn causal(mut self) -> Self {
        self.inner = self.inner.causal();
        self
    }

    /// Extra: also return the attention weights `[b, h, n, m]` (the materializing path).
    pub fn need_weights(mut self) -> Self {
        self.inner = self.inner.need_weights();
        self
    }

    /// Extra: any other option of this crate's input (windows, segments, ALiBi, sinks, ...).
    pub fn with(mut self, f: impl FnOnce(AttentionInput<3>) -> AttentionInput<3>) -> Self {
        self.inner = f(self.inner);
        self
    }
}

/// The outputs of [`MultiHeadAttention`].
#[derive(Debug, Clone)]
pub struct MhaOutput {
    /// `[b, h, n, m]`, when asked for with [`MhaInput::need_weights`] (burn-nn always returns
    /// them; here they would keep every call off the fused kernels).
    pub weights: Option<Tensor<4>>,
    /// `[b, n, d_model]`.
    pub context: Tensor<3>,
}

impl MultiHeadAttention {
    /// Applies the layer.
    ///
    /// # Shapes
    /// - query: `[b, n, d_model]`; key and value: `[b, m, d_model]`
    /// - mask_pad: `[b, m]`; mask_attn: `[b, n, m]`
    /// - context: `[b, n, d_model]`; weights: `[b, h, n, m]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(&self, input: MhaInput) -> MhaOutput {
        self.try_forward(input).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Applies the layer, or says which input does not fit.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    pub fn try_forward(&self, input: MhaInput) -> Result<MhaOutput, AttentionError> {
        let (input, query, key, value) = self.prepare(input)?;
        self.attend(input, query, key, value)
    }

    /// The path the layer's attention takes for `input` (after validating it), without running
    /// the attention: the path `forward` takes for this input on the layer's device, autodiff
    /// included (`CpuKernel` on Flex and NdArray, `CubeKernel` or `CubeTensorCores` on a CubeCL
    /// backend with the `cube` feature; `Naive` where the weights are asked for; `Naive`, or
    /// `Chunked` for long sequences, on a training device with dropout on, burn-nn's default
    /// 0.1). It projects the input, as a call does.
    ///
    /// ```
    /// use burn::prelude::*;
    /// use burn_sdpa::nn::attention::{MhaInput, MultiHeadAttentionConfig};
    /// let device = Device::flex();
    /// let mha = MultiHeadAttentionConfig::new(32, 4).init(&device);
    /// let x = Tensor::<3>::zeros([2, 8, 32], &device);
    /// println!("{}", mha.path(&MhaInput::self_attn(x.clone())).unwrap()); // e.g. "cpu_kernel"
    /// let weights = MhaInput::self_attn(x).need_weights();
    /// assert_eq!(mha.path(&weights).unwrap().to_string(), "naive");
    /// ```
    pub fn path(&self, input: &MhaInput) -> Result<AttentionPath, AttentionError> {
        let (input, query, key, value) = self.prepare(input.clone())?;
        self.core().path(&input.with_tensors(query, key, value))
    }

    /// Checks the input, folds `mask_attn` into it and projects the heads: the input with its
    /// masks, query `[b, h, n, d_k]`, key and value `[b, h_kv, m, d_k]` (rotated when the layer
    /// has rotary positions).
    fn prepare(
        &self,
        input: MhaInput,
    ) -> Result<(AttentionInput<3>, Tensor<4>, Tensor<4>, Tensor<4>), AttentionError> {
        let MhaInput {
            inner: mut input,
            mask_attn,
        } = input;
        let [b, n, d_q] = input.query.dims();
        let [b_k, m, d_key] = input.key.dims();
        let d_v = input.value.dims()[2];
        if d_q != self.d_model || d_key != self.d_model || d_v != self.d_model || b_k != b {
            return Err(AttentionError::Shape {
                what: "query/key/value",
                expected: format!("[b, s, d_model = {}], one batch size", self.d_model),
                got: [input.query.dims(), input.key.dims(), input.value.dims()].concat(),
            });
        }
        if let Some(mask) = mask_attn {
            if mask.dims() != [b, n, m] {
                return Err(AttentionError::Shape {
                    what: "mask_attn",
                    expected: format!("[b, n, m] = [{b}, {n}, {m}]"),
                    got: mask.dims().to_vec(),
                });
            }
            // [b, n, m] -> [b, 1, n, m]
            input = input.mask(mask.unsqueeze_dim(1));
        }
        let query = self.heads(&self.query, input.query.clone(), self.n_heads);
        let key = self.heads(&self.key, input.key.clone(), self.n_kv_heads);
        let value = self.heads(&self.value, input.value.clone(), self.n_kv_heads);
        // Query i at position i, key j at j (a cached call continues at the cache's positions).
        let query = self.rotate(query, 0)?;
        let key = self.rotate(key, 0)?;
        Ok((input, query, key, value))
    }

    /// `x` `[b, heads, s, d_k]` rotated as positions `start..start + s` when the layer has rotary
    /// positions.
    pub(super) fn rotate(&self, x: Tensor<4>, start: usize) -> Result<Tensor<4>, AttentionError> {
        match &self.rope {
            Some(rope) => rotate_rows(rope, x, &[start], None),
            None => Ok(x),
        }
    }

    /// `x` `[b, s, d_model]` projected by `linear` and split into `count` heads,
    /// `[b, count, s, d_k]`.
    pub(super) fn heads(&self, linear: &Linear, x: Tensor<3>, count: usize) -> Tensor<4> {
        let [b, s, _] = x.dims();
        // [b, s, count·d_k] -> [b, s, count, d_k] -> [b, count, s, d_k]
        linear_rows(linear, x)
            .reshape([b, s, count, self.d_k])
            .swap_dims(1, 2)
    }

    /// Attends the projected heads (query `[b, h, n, d_k]`, key and value `[b, h_kv, m, d_k]`)
    /// with the masks and options of `input`, burn-nn's rule for rows with no visible key, and
    /// the output projection.
    pub(super) fn attend(
        &self,
        input: AttentionInput<3>,
        query: Tensor<4>,
        key: Tensor<4>,
        value: Tensor<4>,
    ) -> Result<MhaOutput, AttentionError> {
        let (h, h_kv, d_k) = (self.n_heads, self.n_kv_heads, self.d_k);
        let [b, _, n, _] = query.dims();
        let m = key.dims()[2];
        let all_hidden = self.rows_without_a_key(&input, b, n, m)?;
        let core = self.core();
        let out = core.try_forward(input.with_tensors(query, key, value.clone()))?;
        let mut context = out.context;
        let mut weights = out.weights;
        if let Some(all_hidden) = all_hidden {
            // burn-nn's rows whose keys are all masked: every key at min_float, so the weights
            // are uniform and the context is the mean value.
            let group = h / h_kv;
            // [b, h_kv, m, d_k] -> [b, h_kv, 1, d_k] -> [b, h_kv, g, 1, d_k] -> [b, h, 1, d_k]
            let mean = value
                .mean_dim(2)
                .unsqueeze_dim::<5>(2)
                .expand([b, h_kv, group, 1, d_k])
                .reshape([b, h, 1, d_k]);
            context = context.mask_where(
                all_hidden.clone().expand([b, h, n, d_k]),
                mean.expand([b, h, n, d_k]),
            );
            weights = weights.map(|w| {
                let uniform = w.ones_like().div_scalar(m as f64);
                w.mask_where(all_hidden.expand([b, h, n, m]), uniform)
            });
        }
        // [b, h, n, d_k] -> [b, n, h, d_k] -> [b, n, d_model]
        let context = context.swap_dims(1, 2).reshape([b, n, self.d_model]);
        Ok(MhaOutput {
            weights,
            context: linear_rows(&self.output, context),
        })
    }

    /// The attention core: the layer's options with its own dropout module (whose training
    /// flag follows the layer's).
    fn core(&self) -> ScaledDotProductAttention {
        let options = &self.options;
        ScaledDotProductAttention {
            scale: options.scale,
            causal_alignment: options.causal_alignment,
            implementation: options.implementation,
            softcap: options.softcap,
            precision: options.precision,
            // burn-nn's public field, read at each call as burn-nn reads it.
            softmax: if self.quiet_softmax {
                Softmax::Quiet
            } else {
                Softmax::Standard
            },
            dropout: self.dropout.clone(),
        }
    }

    /// `[b, 1, n, 1]`, true for each query whose keys the padding mask, the mask and the causal
    /// flag hide all (burn-nn gives them uniform weights: its masks fill −10⁴); `None` when the
    /// layer's softmax is quiet (burn-nn's quiet softmax gives them zero weights, as this crate
    /// does) or nothing is masked. Rows emptied by this crate's extras (windows, segments) keep
    /// this crate's zero rows.
    fn rows_without_a_key(
        &self,
        input: &AttentionInput<3>,
        b: usize,
        n: usize,
        m: usize,
    ) -> Result<Option<Tensor<4, Bool>>, AttentionError> {
        if self.quiet_softmax {
            return Ok(None);
        }
        if let Some(pad) = &input.padding_mask
            && pad.dims() != [b, m]
        {
            return Err(AttentionError::Shape {
                what: "mask_pad",
                expected: format!("[b, m] = [{b}, {m}]"),
                got: pad.dims().to_vec(),
            });
        }
        let device = input.query.device();
        let alignment = self.options.causal_alignment;
        let (pad, mask) = (input.padding_mask.clone(), input.mask.clone());
        Ok(match (pad, mask, input.causal) {
            (None, None, _) => None,
            (Some(pad), None, true) => {
                // Query i sees keys j ≤ i + offset: it sees none when the first key that is not
                // padding lies beyond, O(b·n) without an [n, m] mask.
                // [b, m] -> [b, 1]: the first open key (m when all are padding).
                let first_open = Tensor::<1, Int>::arange(0..m as i64, &device)
                    .reshape([1, m])
                    .expand([b, m])
                    .mask_fill(pad, m as i64)
                    .min_dim(1);
                let offset = alignment.offset(n, m);
                // [n] -> [1, n]: the last key each query may see.
                let last =
                    Tensor::<1, Int>::arange(offset..n as i64 + offset, &device).reshape([1, n]);
                // [b, 1] > [1, n] -> [b, n] -> [b, 1, n, 1]
                Some(
                    first_open
                        .expand([b, n])
                        .greater(last.expand([b, n]))
                        .reshape([b, 1, n, 1]),
                )
            }
            (pad, mask, causal) => {
                // [b, m] -> [b, 1, 1, m] -> [b, 1, n, m]
                let mut hidden = pad.map(|p| p.reshape([b, 1, 1, m]).expand([b, 1, n, m]));
                for extra in [
                    mask,
                    causal.then(|| {
                        // [n, m] -> [1, 1, n, m] -> [b, 1, n, m]
                        causal_mask(n, m, alignment, &device)
                            .reshape([1, 1, n, m])
                            .expand([b, 1, n, m])
                    }),
                ]
                .into_iter()
                .flatten()
                {
                    hidden = Some(match hidden {
                        Some(h) => h.bool_or(extra),
                        None => extra,
                    });
                }
                // [b, 1, n, m] -> [b, 1, n, 1]
                hidden.map(|h| h.bool_not().any_dim(3).bool_not())
            }
        })
    }
}
