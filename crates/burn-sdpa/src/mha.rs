//! Multi-head attention built on [`ScaledDotProductAttention`], with optional QK-norm
//! ([`QkNorm`]); cached decoding is in `cache/`.

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig, RotaryEncoding};
use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::{AttentionInput, AttentionOutput};
use crate::module::{ScaledDotProductAttention, ScaledDotProductAttentionConfig};
use crate::options::{AttentionOptions, option_setters};
use crate::qk_norm::{HeadNorm, QkNorm};
use crate::rope::{RopeConfig, rotate_rows};
use crate::rows::linear_rows;
use crate::vocabulary::AttentionPath;

/// Configuration of [`MultiHeadSdpa`].
///
/// ```
/// use burn::prelude::*;
/// use burn_sdpa::{MultiHeadSdpaInput, MultiHeadSdpaConfig};
/// let device = Device::flex();
/// let mha = MultiHeadSdpaConfig::new(64, 8)
///     .with_n_kv_heads(Some(2))   // grouped-query attention
///     .init(&device);
/// let x = Tensor::<3>::zeros([2, 10, 64], &device);
/// let out = mha.forward(MultiHeadSdpaInput::self_attn(x).causal());
/// assert_eq!(out.context.dims(), [2, 10, 64]);
/// ```
#[derive(Config, Debug)]
pub struct MultiHeadSdpaConfig {
    /// Model width: the size of the input and output features.
    pub d_model: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads; `None` means `n_heads` (plain multi-head attention), 1 is
    /// multi-query attention, anything dividing `n_heads` is grouped-query attention.
    pub n_kv_heads: Option<usize>,
    /// Query/key size per head; `None` means `d_model / n_heads`. Set it to sweep d_k at a fixed
    /// model width.
    pub d_k: Option<usize>,
    /// Value size per head; `None` means d_k (the usual choice). Set it to keep the value path
    /// fixed while d_k changes.
    pub d_v: Option<usize>,
    /// Scale, soft-cap, dropout, causal alignment and implementation of the attention core.
    #[config(default = "AttentionOptions::new()")]
    pub options: AttentionOptions,
    /// Whether the four projections have biases (true by default, like burn-nn).
    #[config(default = true)]
    pub bias: bool,
    /// Initializer of the projection weights (burn-nn's Linear default).
    #[config(
        default = "Initializer::KaimingUniform { gain: 0.5773502691896258, fan_out_only: false }"
    )]
    pub initializer: Initializer,
    /// Initializer of the query and key projection weights only; `None` uses `initializer`.
    pub qk_initializer: Option<Initializer>,
    /// A learnable normalization of every query and key head before the scores (ViT-22B,
    /// OLMo 2); none by default, as in the article.
    #[config(default = "QkNorm::None")]
    pub qk_norm: QkNorm,
    /// A learned temperature: the scores are multiplied by `exp(θ)` with θ a learnable scalar
    /// starting at `ln(initial factor)`, on top of the scale policy (CLIP's learned logit scale).
    /// `None` by default: the scale is fixed.
    #[config(default = "None")]
    pub learned_temperature: Option<f64>,
    /// Rotary positions of queries and keys (after QK-norm); none by default.
    #[config(default = "None")]
    pub rope: Option<RopeConfig>,
    /// Learned attention sinks: one logit per query head in every row's softmax denominator
    /// (gpt-oss; see [`AttentionInput::sinks`]), starting at 0. `false` by default.
    #[config(default = false)]
    pub sinks: bool,
}

option_setters!(MultiHeadSdpaConfig);

impl MultiHeadSdpaConfig {
    /// The number of key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Checks the sizes and returns d_k per head.
    pub fn validate(&self) -> Result<usize, AttentionError> {
        if self.d_v == Some(0) {
            return Err(AttentionError::InvalidConfig {
                field: "d_v",
                value: "0".into(),
                reason: "must be > 0".into(),
            });
        }
        if let Some(t) = self.learned_temperature
            && !(t.is_finite() && t > 0.0 && (t.ln() as f32).is_finite())
        {
            return Err(AttentionError::InvalidConfig {
                field: "learned_temperature",
                value: t.to_string(),
                reason: "the initial factor must be finite and > 0".into(),
            });
        }
        let invalid = |field, value: usize, reason: &str| AttentionError::InvalidConfig {
            field,
            value: value.to_string(),
            reason: reason.to_string(),
        };
        if self.d_model == 0 {
            return Err(invalid("d_model", 0, "must be > 0"));
        }
        if self.n_heads == 0 {
            return Err(invalid("n_heads", 0, "must be > 0"));
        }
        let n_kv = self.kv_heads();
        if n_kv == 0 {
            return Err(invalid("n_kv_heads", 0, "must be > 0"));
        }
        if !self.n_heads.is_multiple_of(n_kv) {
            return Err(AttentionError::HeadGrouping {
                n_heads: self.n_heads,
                n_kv_heads: n_kv,
            });
        }
        let d_k = match self.d_k {
            Some(0) => return Err(invalid("d_k", 0, "must be > 0")),
            Some(d_k) => d_k,
            None if !self.d_model.is_multiple_of(self.n_heads) => {
                return Err(invalid(
                    "d_model",
                    self.d_model,
                    &format!(
                        "is not divisible by n_heads = {}; set d_k explicitly",
                        self.n_heads
                    ),
                ));
            }
            None => self.d_model / self.n_heads,
        };
        self.options.validate()?;
        if let Some(rope) = &self.rope {
            rope.validate(d_k)?;
        }
        Ok(d_k)
    }

    /// Builds the layer, or says which setting is wrong.
    pub fn try_init(&self, device: &Device) -> Result<MultiHeadSdpa, AttentionError> {
        let d_k = self.validate()?;
        let d_v = self.d_v.unwrap_or(d_k);
        let n_kv = self.kv_heads();
        let attention = ScaledDotProductAttentionConfig::new()
            .with_options(self.options.clone())
            .try_init()?;
        // Refused here, before any parameter is made, rather than at the first call.
        self.options.precision.check_device(device)?;
        let qk_init = self
            .qk_initializer
            .clone()
            .unwrap_or(self.initializer.clone());
        let linear = |d_in, d_out, init: &Initializer| {
            LinearConfig::new(d_in, d_out)
                .with_bias(self.bias)
                .with_initializer(init.clone())
                .init(device)
        };
        Ok(MultiHeadSdpa {
            query: linear(self.d_model, self.n_heads * d_k, &qk_init),
            key: linear(self.d_model, n_kv * d_k, &qk_init),
            value: linear(self.d_model, n_kv * d_v, &self.initializer),
            output: linear(self.n_heads * d_v, self.d_model, &self.initializer),
            query_norm: self.qk_norm.init(d_k, device),
            key_norm: self.qk_norm.init(d_k, device),
            log_temperature: self
                .learned_temperature
                .map(|t| Initializer::Constant { value: t.ln() }.init([1], device)),
            rope: self.rope.as_ref().map(|rope| rope.init(d_k, device)),
            sinks: self
                .sinks
                .then(|| Initializer::Zeros.init([self.n_heads], device)),
            attention,
            d_model: self.d_model,
            n_heads: self.n_heads,
            n_kv_heads: n_kv,
            d_k,
            d_v,
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// With the message of [`try_init`](Self::try_init)'s error when a setting is wrong.
    pub fn init(&self, device: &Device) -> MultiHeadSdpa {
        self.try_init(device).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Multi-head (and grouped-query) attention: project, split into heads, attend with
/// [`ScaledDotProductAttention`], merge the heads, project back.
#[derive(Module, Debug)]
pub struct MultiHeadSdpa {
    /// Query projection `d_model -> n_heads · d_k`.
    pub query: Linear,
    /// Key projection `d_model -> n_kv_heads · d_k`.
    pub key: Linear,
    /// Value projection `d_model -> n_kv_heads · d_v`.
    pub value: Linear,
    /// Output projection `n_heads · d_v -> d_model`.
    pub output: Linear,
    /// QK-norm of the query heads, if configured.
    pub query_norm: Option<HeadNorm>,
    /// QK-norm of the key heads, if configured.
    pub key_norm: Option<HeadNorm>,
    /// The learned temperature θ (scores times `exp(θ)`), if configured.
    pub log_temperature: Option<Param<Tensor<1>>>,
    /// Rotary positions of queries and keys, if configured.
    pub rope: Option<RotaryEncoding>,
    /// The learned attention sinks `[n_heads]`, if configured.
    pub sinks: Option<Param<Tensor<1>>>,
    /// The attention core.
    pub attention: ScaledDotProductAttention,
    /// Model width.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Query/key size per head.
    pub d_k: usize,
    /// Value size per head.
    pub d_v: usize,
}

/// The inputs of [`MultiHeadSdpa`]: query `[b, n, d_model]`, key and value
/// `[b, m, d_model]`, with the masks and options of every attention call (see
/// [`AttentionInput`]).
pub type MultiHeadSdpaInput = AttentionInput<3>;

impl AttentionInput<3> {
    /// Self-attention: query, key and value are all `x` `[b, s, d_model]`.
    pub fn self_attn(x: Tensor<3>) -> Self {
        Self::new(x.clone(), x.clone(), x)
    }
}

/// The outputs of [`MultiHeadSdpa`]: the context `[b, n, d_model]`, and the weights,
/// scores and combined mask `[b, h, n, m]` when asked for (see [`AttentionOutput`]).
pub type MultiHeadSdpaOutput = AttentionOutput<3>;

impl MultiHeadSdpa {
    /// Splits `[b, s, heads · size]` into `[b, heads, s, size]`.
    fn split_heads(x: Tensor<3>, heads: usize, size: usize) -> Tensor<4> {
        let [b, s, _] = x.dims();
        // [b, s, heads·size] -> [b, s, heads, size] -> [b, heads, s, size]
        x.reshape([b, s, heads, size]).swap_dims(1, 2)
    }

    /// The learned temperature's current factor `exp(θ)`, if the layer has one.
    pub fn temperature(&self) -> Option<Tensor<1>> {
        self.log_temperature.as_ref().map(|t| t.val().exp())
    }

    /// Checks the input's shapes and returns the projected heads: query `[b, h, n, d_k]`, key
    /// `[b, h_kv, m, d_k]` and value `[b, h_kv, m, d_v]`, the query and key normalized when
    /// QK-norm is on (the learned temperature, if any, is applied later, to the scores).
    ///
    /// # Shapes
    /// - query: `[b, n, d_model]`; key and value: `[b, m, d_model]`
    /// - returns `[b, h, n, d_k]`, `[b, h_kv, m, d_k]`, `[b, h_kv, m, d_v]`
    pub fn project_heads(
        &self,
        input: &MultiHeadSdpaInput,
    ) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>), AttentionError> {
        self.project_heads_at(input, 0)
    }

    /// [`project_heads`](Self::project_heads) for tokens at positions `start ..` (what rotary
    /// positions, if configured, encode; cached decoding passes the tokens seen before).
    ///
    /// # Shapes
    /// - as [`project_heads`](Self::project_heads)
    pub fn project_heads_at(
        &self,
        input: &MultiHeadSdpaInput,
        start: usize,
    ) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>), AttentionError> {
        self.project_heads_rows(input, &[start], None)
    }

    /// [`project_heads_at`](Self::project_heads_at) with one start per batch row (or one for
    /// all): cached decoding of sequences of different lengths, where row r holds `counts[r]`
    /// tokens followed by padding (see `rope::rotate_rows`).
    pub(crate) fn project_heads_rows(
        &self,
        input: &MultiHeadSdpaInput,
        starts: &[usize],
        counts: Option<&[usize]>,
    ) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>), AttentionError> {
        let [b, _, d_q] = input.query.dims();
        let [b_k, m, d_key] = input.key.dims();
        let [b_v, m_v, d_v] = input.value.dims();
        for (what, dims, d) in [
            ("query", input.query.dims(), d_q),
            ("key", input.key.dims(), d_key),
            ("value", input.value.dims(), d_v),
        ] {
            if d != self.d_model || dims.contains(&0) {
                return Err(AttentionError::Shape {
                    what,
                    expected: format!("[b, s, d_model = {}] with no empty axis", self.d_model),
                    got: dims.to_vec(),
                });
            }
        }
        if b_k != b || b_v != b || m_v != m {
            return Err(AttentionError::Shape {
                what: "key/value",
                expected: format!("[b = {b}, m, d_model] for both, with the same m"),
                got: vec![b_k, m, d_key, b_v, m_v, d_v],
            });
        }
        let (h, h_kv) = (self.n_heads, self.n_kv_heads);
        let project = |linear: &Linear, x: &Tensor<3>| linear_rows(linear, x.clone());
        let mut query = Self::split_heads(project(&self.query, &input.query), h, self.d_k);
        let mut key = Self::split_heads(project(&self.key, &input.key), h_kv, self.d_k);
        let value = Self::split_heads(project(&self.value, &input.value), h_kv, self.d_v);
        if let Some(norm) = &self.query_norm {
            query = norm.forward(query);
        }
        if let Some(norm) = &self.key_norm {
            key = norm.forward(key);
        }
        if let Some(rope) = &self.rope {
            // Queries sit where the causal mask and ALiBi place them: query i at key position
            // i + offset (offset m − n under the default bottom-right alignment, 0 top-left).
            // Rotary scores depend on the difference of positions only, so a negative offset
            // (n > m, bottom-right) moves the keys forward instead of the queries back.
            let n = input.query.dims()[1];
            let offset = self.attention.causal_alignment.offset(n, m);
            let shifted = |by: i64| -> Vec<usize> {
                starts
                    .iter()
                    .map(|&s| s + by.max(0).unsigned_abs() as usize)
                    .collect()
            };
            query = rotate_rows(rope, query, &shifted(offset), counts)?;
            key = rotate_rows(rope, key, &shifted(-offset), counts)?;
        }
        Ok((query, key, value))
    }

    /// Attends heads from [`project_heads`](Self::project_heads) with the input's masks and
    /// options (the input's own tensors are not read again), merges the heads and projects back:
    /// [`try_forward`](Self::try_forward) is the two in a row. A caller that also needs the
    /// projected heads (to watch the query and key scales while training, say) gets them without
    /// a second projection.
    ///
    /// # Shapes
    /// - query `[b, h, n, d_k]`, key `[b, h_kv, m, d_k]`, value `[b, h_kv, m, d_v]`
    /// - context `[b, n, d_model]`
    pub fn attend(
        &self,
        input: MultiHeadSdpaInput,
        query: Tensor<4>,
        key: Tensor<4>,
        value: Tensor<4>,
    ) -> Result<MultiHeadSdpaOutput, AttentionError> {
        let [b, _, n, _] = query.dims();
        let query = match self.temperature() {
            // exp(θ)·q·kᵀ: one factor for every head, [1] -> [1, 1, 1, 1]
            Some(factor) => query * factor.reshape([1, 1, 1, 1]),
            None => query,
        };
        let input = self.core_input(input, query, key, value)?;
        let out = self.attention.try_forward(input)?;
        // [b, h, n, d_v] -> [b, n, h, d_v] -> [b, n, h·d_v]
        let context = out
            .context
            .swap_dims(1, 2)
            .reshape([b, n, self.n_heads * self.d_v]);
        Ok(MultiHeadSdpaOutput {
            context: linear_rows(&self.output, context),
            weights: out.weights,
            scores: out.scores,
            mask: out.mask,
            lse: out.lse,
            row_stats: out.row_stats,
        })
    }

    /// Applies multi-head attention, or says which input does not fit.
    ///
    /// # Shapes
    /// - query: `[b, n, d_model]`; key and value: `[b, m, d_model]`
    /// - padding mask: `[b, m]`; mask and bias: `[b|1, h|1, n|1, m]`
    /// - context: `[b, n, d_model]`; weights and scores: `[b, h, n, m]`
    pub fn try_forward(
        &self,
        input: MultiHeadSdpaInput,
    ) -> Result<MultiHeadSdpaOutput, AttentionError> {
        let (query, key, value) = self.project_heads(&input)?;
        self.attend(input, query, key, value)
    }

    /// The path the layer's attention takes for `input` (after validating it), without running
    /// the attention: `CpuKernel` on Flex and NdArray, `CubeKernel` or `CubeTensorCores` on a
    /// CubeCL backend with the `cube` feature, `Naive` where the weights are asked for (see
    /// [`ScaledDotProductAttention::path`](crate::ScaledDotProductAttention::path)). It projects
    /// the input, as a call does.
    ///
    /// ```
    /// use burn::prelude::*;
    /// use burn_sdpa::{MultiHeadSdpaConfig, MultiHeadSdpaInput};
    /// let device = Device::flex();
    /// let mha = MultiHeadSdpaConfig::new(32, 4).init(&device);
    /// let x = Tensor::<3>::zeros([2, 8, 32], &device);
    /// println!("{}", mha.path(&MultiHeadSdpaInput::self_attn(x.clone()).causal()).unwrap());
    /// let weights = MultiHeadSdpaInput::self_attn(x).need_weights();
    /// assert_eq!(mha.path(&weights).unwrap().to_string(), "naive");
    /// ```
    pub fn path(&self, input: &MultiHeadSdpaInput) -> Result<AttentionPath, AttentionError> {
        let (query, key, value) = self.project_heads(input)?;
        let input = self.core_input(input.clone(), query, key, value)?;
        self.attention.path(&input)
    }

    /// The attention core's input: the heads with `input`'s masks and options, and the layer's
    /// learned sinks (refused beside an input's own).
    fn core_input(
        &self,
        input: MultiHeadSdpaInput,
        query: Tensor<4>,
        key: Tensor<4>,
        value: Tensor<4>,
    ) -> Result<AttentionInput, AttentionError> {
        let mut input = input.with_tensors(query, key, value);
        if let Some(sinks) = &self.sinks {
            if input.sinks.is_some() {
                return Err(AttentionError::InvalidConfig {
                    field: "sinks",
                    value: "an input's sinks".into(),
                    reason: "the layer has its own learned sinks; give the input none".into(),
                });
            }
            input.sinks = Some(sinks.val());
        }
        Ok(input)
    }

    /// Applies multi-head attention.
    ///
    /// # Shapes
    /// - query: `[b, n, d_model]`; key and value: `[b, m, d_model]`
    /// - padding mask: `[b, m]`; mask and bias: `[b|1, h|1, n|1, m]`
    /// - context: `[b, n, d_model]`; weights and scores: `[b, h, n, m]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(&self, input: MultiHeadSdpaInput) -> MultiHeadSdpaOutput {
        self.try_forward(input).unwrap_or_else(|e| panic!("{e}"))
    }
}
