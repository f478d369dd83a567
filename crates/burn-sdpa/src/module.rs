//! The scaled dot-product attention module: softmax(QKᵀ·scale + M)·V.

use core::ops::Range;
use std::borrow::Cow;

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};

use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use crate::paths::auto::{AutoRequest, BackendFamily, auto_path};
use crate::paths::chunked::chunked_attention;
use crate::paths::cpu::kernel::{self as cpu_kernel, KernelShape, Tiles};
use crate::error::AttentionError;
use crate::mask::{broadcast_or, causal_mask_for_keys};

/// How the scores QKᵀ are scaled before the softmax.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub enum ScalePolicy {
    /// Multiply by 1/√d_k (Vaswani et al.): keeps the logits' standard deviation near 1 when the
    /// query and key components have unit variance.
    #[default]
    InvSqrtDk,
    /// No scaling (the factor is 1): the logits' standard deviation grows like √d_k.
    Unscaled,
    /// Multiply by this factor; it must be finite and positive.
    Fixed(f64),
}

impl ScalePolicy {
    /// The factor that multiplies QKᵀ for a given d_k.
    pub fn factor(&self, d_k: usize) -> f64 {
        match self {
            ScalePolicy::InvSqrtDk => 1.0 / (d_k as f64).sqrt(),
            ScalePolicy::Unscaled => 1.0,
            ScalePolicy::Fixed(s) => *s,
        }
    }

    /// Checks that a fixed scale is finite and positive.
    pub fn validate(&self) -> Result<(), AttentionError> {
        match self {
            ScalePolicy::Fixed(s) if !(s.is_finite() && *s > 0.0) => {
                Err(AttentionError::InvalidScale(*s))
            }
            _ => Ok(()),
        }
    }
}

/// Which keys a causal query may see when the number of queries n differs from the number of
/// keys m. For n = m both alignments are the usual lower-triangular mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CausalAlignment {
    /// Key j is hidden from query i when j > i + (m − n): the last query sees every key.
    /// This is what Burn's `attention`, FlashAttention and KV-cache decoding use.
    #[default]
    BottomRight,
    /// Key j is hidden from query i when j > i: the first query sees the first key.
    /// This is PyTorch's `is_causal=True`.
    TopLeft,
}

impl CausalAlignment {
    /// The diagonal offset: key j is hidden from query i when j > i + offset.
    pub fn offset(&self, n: usize, m: usize) -> i64 {
        match self {
            CausalAlignment::BottomRight => m as i64 - n as i64,
            CausalAlignment::TopLeft => 0,
        }
    }
}

/// Which computation path the module takes. All paths have the same semantics (masks, bias,
/// causal alignment, grouped-query heads, zero output for fully masked rows); they differ in speed
/// and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Implementation {
    /// Pick the fastest correct path for the request, the backend and the autodiff state (see
    /// [`ScaledDotProductAttention::resolve`] for the rule and the measurements behind it).
    #[default]
    Auto,
    /// Materialize the scores and weights `[b, h, n, m]`; the only path that can return the
    /// weights.
    Naive,
    /// Online softmax over blocks of `block_size` keys, in Burn tensor ops: O(n · block_size)
    /// memory for inference, works on every backend and under autodiff.
    Chunked {
        /// Keys per block.
        block_size: usize,
    },
    /// Delegate to `burn::tensor::module::attention` (Flex's tiled CPU kernel, CubeCL's flash
    /// kernel, the fallback under autodiff). Cannot return weights or apply dropout, and only
    /// knows bottom-right causal alignment.
    Fused,
    /// This crate's query-blocked flash kernel for CPU inference ([`crate::cpu_kernel`]): `f32`,
    /// no mask or bias (causal with either alignment is fine), no autodiff (it has no backward
    /// pass), no weights, no dropout. It reads the tensors on the host, so it belongs on CPU
    /// backends.
    CpuKernel,
}

/// The path an attention call actually takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Path {
    /// See [`Implementation::Naive`].
    Naive,
    /// See [`Implementation::Chunked`].
    Chunked(usize),
    /// See [`Implementation::Fused`].
    Fused,
    /// See [`Implementation::CpuKernel`].
    CpuKernel,
}

/// Configuration of [`ScaledDotProductAttention`].
///
/// ```
/// use burn_sdpa::{CausalAlignment, ScalePolicy, ScaledDotProductAttentionConfig};
/// let attn = ScaledDotProductAttentionConfig::new()
///     .with_scale(ScalePolicy::InvSqrtDk)
///     .with_dropout(0.0)
///     .with_causal_alignment(CausalAlignment::BottomRight)
///     .init();
/// ```
#[derive(Config, Debug)]
pub struct ScaledDotProductAttentionConfig {
    /// The scale policy; 1/√d_k by default, as in "Attention Is All You Need".
    #[config(default = "ScalePolicy::InvSqrtDk")]
    pub scale: ScalePolicy,
    /// Dropout on the attention weights, active only in training on autodiff devices.
    /// 0 by default: most modern models train attention without it.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Alignment of the causal mask when n ≠ m; bottom-right by default, like Burn and
    /// FlashAttention (it is what a KV cache needs).
    #[config(default = "CausalAlignment::BottomRight")]
    pub causal_alignment: CausalAlignment,
    /// The computation path; `Auto` picks the fastest correct one.
    #[config(default = "Implementation::Auto")]
    pub implementation: Implementation,
}

impl ScaledDotProductAttentionConfig {
    /// Builds the module, or says which setting is out of range.
    pub fn try_init(&self) -> Result<ScaledDotProductAttention, AttentionError> {
        self.scale.validate()?;
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return Err(AttentionError::InvalidDropout(self.dropout));
        }
        if let Implementation::Chunked { block_size: 0 } = self.implementation {
            return Err(AttentionError::InvalidConfig {
                field: "implementation",
                value: "Chunked { block_size: 0 }".into(),
                reason: "the block size must be > 0".into(),
            });
        }
        Ok(ScaledDotProductAttention {
            scale: self.scale,
            causal_alignment: self.causal_alignment,
            implementation: self.implementation,
            dropout: DropoutConfig::new(self.dropout).init(),
        })
    }

    /// Builds the module.
    ///
    /// # Panics
    /// With the message of [`try_init`](Self::try_init)'s error when a setting is out of range.
    pub fn init(&self) -> ScaledDotProductAttention {
        self.try_init().unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Scaled dot-product attention, softmax(QKᵀ·scale + M)·V, with explicit semantics:
///
/// - masks are boolean with **true = masked out**, broadcast to `[b, h, n, m]`;
/// - an additive bias is added to the *scaled* scores (a bias of −∞ masks like a `true`);
/// - causal masking follows the configured [`CausalAlignment`];
/// - a query row with no visible key gets **zero** context and weights (never NaN) and zero
///   gradients;
/// - key/value may have fewer heads than the query (grouped-query attention): query head i uses
///   key/value head `i / (h / h_kv)`;
/// - the softmax subtracts the row maximum, so logits of any size are safe.
///
/// The module has no parameters; dropout (if any) is a [`Dropout`] sub-module, so
/// [`Module::valid`] switches it off.
#[derive(Module, Debug)]
pub struct ScaledDotProductAttention {
    /// The scale policy.
    #[module(skip)]
    pub scale: ScalePolicy,
    /// The causal alignment used when the input asks for causal masking.
    #[module(skip)]
    pub causal_alignment: CausalAlignment,
    /// The computation path.
    #[module(skip)]
    pub implementation: Implementation,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
}

/// The inputs of one attention call, built fluently.
///
/// ```
/// # use burn::prelude::*;
/// # use burn_sdpa::AttentionInput;
/// # let device = Device::flex();
/// let q = Tensor::<4>::zeros([1, 2, 3, 4], &device);
/// let k = Tensor::<4>::zeros([1, 2, 5, 4], &device);
/// let v = Tensor::<4>::zeros([1, 2, 5, 6], &device);
/// let input = AttentionInput::new(q, k, v).causal().need_weights();
/// ```
#[derive(Debug, Clone)]
pub struct AttentionInput {
    /// `[b, h, n, d_k]`
    pub query: Tensor<4>,
    /// `[b, h_kv, m, d_k]`
    pub key: Tensor<4>,
    /// `[b, h_kv, m, d_v]`
    pub value: Tensor<4>,
    /// `[b|1, h|1, n|1, m]`, true = masked out.
    pub mask: Option<Tensor<4, Bool>>,
    /// `[b|1, h|1, n|1, m]`, added to the scaled scores.
    pub bias: Option<Tensor<4>>,
    /// Apply a causal mask with the module's alignment.
    pub causal: bool,
    /// Return the attention weights.
    pub need_weights: bool,
    /// Return the scaled scores (plus bias, before masking), e.g. for logit statistics.
    pub need_scores: bool,
}

impl AttentionInput {
    /// Query `[b, h, n, d_k]`, key `[b, h_kv, m, d_k]`, value `[b, h_kv, m, d_v]`.
    pub fn new(query: Tensor<4>, key: Tensor<4>, value: Tensor<4>) -> Self {
        Self {
            query,
            key,
            value,
            mask: None,
            bias: None,
            causal: false,
            need_weights: false,
            need_scores: false,
        }
    }

    /// A boolean mask, true = masked out, broadcastable to `[b, h, n, m]` (replaces an earlier
    /// one; combine masks with [`broadcast_or`] or the helpers in [`mask`](crate::mask)).
    pub fn mask(mut self, mask: Tensor<4, Bool>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// An additive bias (e.g. ALiBi, relative positions, or a float mask with −∞), broadcastable
    /// to `[b, h, n, m]`, added to the scaled scores (replaces an earlier one).
    pub fn bias(mut self, bias: Tensor<4>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Causal masking with the module's [`CausalAlignment`].
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// Also return the attention weights `[b, h, n, m]`.
    pub fn need_weights(mut self) -> Self {
        self.need_weights = true;
        self
    }

    /// Also return the scaled scores `[b, h, n, m]` (with the bias, before masking).
    pub fn need_scores(mut self) -> Self {
        self.need_scores = true;
        self
    }
}

/// The result of an attention call.
#[derive(Debug, Clone)]
pub struct AttentionOutput {
    /// `[b, h, n, d_v]`
    pub context: Tensor<4>,
    /// `[b, h, n, m]`: the softmax probabilities before dropout, if asked for. Masked keys and
    /// fully masked rows are exactly 0.
    pub weights: Option<Tensor<4>>,
    /// `[b, h, n, m]`: the scaled scores plus bias, before masking, if asked for.
    pub scores: Option<Tensor<4>>,
    /// `[b, h, n, m]`: the combined mask that was applied (user mask, causal mask, −∞ bias
    /// entries), true = masked out; `None` when nothing was masked.
    pub mask: Option<Tensor<4, Bool>>,
}

/// The validated sizes of an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Number of queries.
    pub n: usize,
    /// Number of keys.
    pub m: usize,
    /// Query/key feature size.
    pub d_k: usize,
    /// Value feature size.
    pub d_v: usize,
}

impl AttentionDims {
    /// The shape of the scores and weights, `[b, h, n, m]`.
    pub fn scores_shape(&self) -> [usize; 4] {
        [self.batch, self.n_heads, self.n, self.m]
    }
}

/// Checks that a mask or bias of `shape` broadcasts to the scores' shape `[b, h, n, m]`.
pub(crate) fn check_broadcast(
    tensor: &'static str,
    shape: [usize; 4],
    scores: [usize; 4],
) -> Result<(), AttentionError> {
    let leading_ok = (0..3).all(|i| shape[i] == 1 || shape[i] == scores[i]);
    if leading_ok && shape[3] == scores[3] {
        Ok(())
    } else {
        Err(AttentionError::NotBroadcastable {
            tensor,
            shape,
            scores,
        })
    }
}

/// Checks the shapes of an attention call and returns its sizes.
pub fn validate_input(input: &AttentionInput) -> Result<AttentionDims, AttentionError> {
    let q = input.query.dims();
    let k = input.key.dims();
    let v = input.value.dims();
    for (name, shape) in [("query", q), ("key", k), ("value", v)] {
        if shape.contains(&0) {
            return Err(AttentionError::EmptyAxis {
                tensor: name,
                shape: shape.to_vec(),
            });
        }
    }
    if q[0] != k[0] || q[0] != v[0] {
        return Err(AttentionError::BatchMismatch {
            query: q,
            key: k,
            value: v,
        });
    }
    if k[1] != v[1] || k[2] != v[2] {
        return Err(AttentionError::KeyValueMismatch { key: k, value: v });
    }
    if q[3] != k[3] {
        return Err(AttentionError::DkMismatch { query: q, key: k });
    }
    if !q[1].is_multiple_of(k[1]) {
        return Err(AttentionError::HeadGrouping {
            n_heads: q[1],
            n_kv_heads: k[1],
        });
    }
    let dims = AttentionDims {
        batch: q[0],
        n_heads: q[1],
        n_kv_heads: k[1],
        n: q[2],
        m: k[2],
        d_k: q[3],
        d_v: v[3],
    };
    if let Some(mask) = &input.mask {
        check_broadcast("mask", mask.dims(), dims.scores_shape())?;
    }
    if let Some(bias) = &input.bias {
        check_broadcast("bias", bias.dims(), dims.scores_shape())?;
    }
    Ok(dims)
}

/// The most negative finite value of a float dtype: what masked scores are filled with before
/// the softmax (they are zeroed again after it, so the value never reaches the output).
pub fn most_negative(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MIN,
        DType::F16 => -65504.0,
        DType::BF16 => -3.389_531_4e38,
        _ => f32::MIN as f64,
    }
}

/// The mask of the keys `keys` of a call, `[b|1, h|1, n|1, keys.len()]` (broadcastable to the
/// scores of those keys), or `None` when nothing there is masked: the user mask's columns, the
/// causal part and the −∞ entries of `bias` (the bias of the same keys). The naive path asks for
/// all keys, the chunked path for one block at a time.
pub(crate) fn mask_for_keys(
    input: &AttentionInput,
    dims: &AttentionDims,
    alignment: CausalAlignment,
    keys: Range<usize>,
    bias: Option<&Tensor<4>>,
) -> Option<Tensor<4, Bool>> {
    let device = input.query.device();
    let mut mask = input.mask.clone().map(|mask| {
        if keys.len() == dims.m {
            mask
        } else {
            mask.slice(s![.., .., .., keys.clone()])
        }
    });
    if input.causal {
        // [n, len] -> [1, 1, n, len]
        let causal =
            causal_mask_for_keys(dims.n, dims.m, keys.clone(), alignment, &device).unsqueeze();
        mask = Some(match mask {
            Some(prev) => broadcast_or(prev, causal),
            None => causal,
        });
    }
    if let Some(bias) = bias {
        // A −∞ bias entry is a mask entry: treat it as one so that a row whose bias is −∞
        // everywhere gives zeros, not NaN.
        let neg_inf = bias.clone().is_inf().bool_and(bias.clone().lower_elem(0.0));
        mask = Some(match mask {
            Some(prev) => broadcast_or(prev, neg_inf),
            None => neg_inf,
        });
    }
    mask
}

impl ScaledDotProductAttention {
    /// The factor that multiplies QKᵀ for a given d_k.
    pub fn scale_factor(&self, d_k: usize) -> f64 {
        self.scale.factor(d_k)
    }

    /// Applies attention, or returns an [`AttentionError`] naming the shapes that do not fit.
    ///
    /// # Shapes
    /// - query: `[b, h, n, d_k]`
    /// - key: `[b, h_kv, m, d_k]`, with `h % h_kv == 0`
    /// - value: `[b, h_kv, m, d_v]`
    /// - mask (bool, true = masked out) and bias: `[b|1, h|1, n|1, m]`
    /// - context: `[b, h, n, d_v]`; weights and scores: `[b, h, n, m]`
    pub fn try_forward(&self, input: AttentionInput) -> Result<AttentionOutput, AttentionError> {
        let dims = validate_input(&input)?;
        match self.resolve(&input, &dims)? {
            Path::Naive => Ok(self.forward_naive(input, dims)),
            Path::Chunked(block_size) => {
                let scale = self.scale_factor(dims.d_k);
                let dropout = self.dropout_active(&input).then_some(&self.dropout);
                Ok(AttentionOutput {
                    context: chunked_attention(
                        input,
                        dims,
                        scale,
                        self.causal_alignment,
                        block_size,
                        dropout,
                    ),
                    weights: None,
                    scores: None,
                    mask: None,
                })
            }
            Path::Fused => Ok(AttentionOutput {
                context: self.forward_fused(input, dims),
                weights: None,
                scores: None,
                mask: None,
            }),
            Path::CpuKernel => Ok(AttentionOutput {
                context: self.forward_cpu_kernel(input, dims)?,
                weights: None,
                scores: None,
                mask: None,
            }),
        }
    }

    /// Whether dropout changes this call's weights (training flag on, p > 0, autodiff input).
    fn dropout_active(&self, input: &AttentionInput) -> bool {
        self.dropout.prob > 0.0
            && self.dropout.training.is_enabled()
            && input.query.device().is_autodiff()
    }

    /// Why the fused path cannot serve this call, if it cannot.
    fn fused_blocker(&self, input: &AttentionInput, dims: &AttentionDims) -> Option<&'static str> {
        if input.need_weights || input.need_scores {
            Some("it cannot return the weights or scores")
        } else if self.dropout_active(input) {
            Some("it has no dropout")
        } else if input.causal
            && self.causal_alignment == CausalAlignment::TopLeft
            && dims.n != dims.m
        {
            Some("it only knows bottom-right causal alignment (n != m here)")
        } else {
            None
        }
    }

    /// Why the CPU kernel cannot serve this call, if it cannot.
    fn cpu_kernel_blocker(&self, input: &AttentionInput) -> Option<&'static str> {
        let f32_data = [&input.query, &input.key, &input.value]
            .iter()
            .all(|t| t.dtype() == DType::F32);
        if input.need_weights || input.need_scores {
            Some("it cannot return the weights or scores")
        } else if input.query.device().is_autodiff() {
            Some("it has no backward pass (use Chunked or Auto under autodiff)")
        } else if input.mask.is_some() || input.bias.is_some() {
            Some("it takes no mask or bias, only causal masking")
        } else if !f32_data {
            Some("it computes on f32 data only")
        } else {
            None
        }
    }

    /// The path a call takes.
    ///
    /// Explicit implementations are honoured or rejected with [`AttentionError::Unsupported`]
    /// (e.g. weights asked of `Chunked` or `Fused`). `Auto` takes `Naive` when the weights or
    /// scores are asked for (only it has them); otherwise it follows the measured rule of
    /// [`crate::auto`]: by backend ([`BackendFamily`]), autodiff state, number of keys and
    /// size of the scores.
    pub fn resolve(
        &self,
        input: &AttentionInput,
        dims: &AttentionDims,
    ) -> Result<Path, AttentionError> {
        let unsupported = |implementation: &str, reason: &str| AttentionError::Unsupported {
            implementation: implementation.to_string(),
            reason: reason.to_string(),
        };
        match self.implementation {
            Implementation::Naive => Ok(Path::Naive),
            Implementation::Chunked { block_size } => {
                if input.need_weights || input.need_scores {
                    Err(unsupported(
                        "Chunked",
                        "it cannot return the weights or scores",
                    ))
                } else {
                    Ok(Path::Chunked(block_size))
                }
            }
            Implementation::Fused => match self.fused_blocker(input, dims) {
                Some(reason) => Err(unsupported("Fused", reason)),
                None => Ok(Path::Fused),
            },
            Implementation::CpuKernel => match self.cpu_kernel_blocker(input) {
                Some(reason) => Err(unsupported("CpuKernel", reason)),
                None => Ok(Path::CpuKernel),
            },
            Implementation::Auto => {
                if input.need_weights || input.need_scores {
                    return Ok(Path::Naive);
                }
                let device = input.query.device();
                let [b, h, n, m] = dims.scores_shape();
                Ok(auto_path(AutoRequest {
                    family: BackendFamily::of(&device),
                    autodiff: device.is_autodiff(),
                    n_keys: m,
                    scores_bytes: (b * h * n * m * input.query.dtype().size()) as u64,
                    fused_ok: self.fused_blocker(input, dims).is_none(),
                    cpu_kernel_ok: self.cpu_kernel_blocker(input).is_none(),
                }))
            }
        }
    }

    /// Runs [`crate::cpu_kernel`] on the host copies of q, k and v.
    fn forward_cpu_kernel(
        &self,
        input: AttentionInput,
        dims: AttentionDims,
    ) -> Result<Tensor<4>, AttentionError> {
        let AttentionDims {
            batch,
            n_heads,
            n,
            m,
            d_k,
            d_v,
            ..
        } = dims;
        let shape = KernelShape {
            dims,
            scale: self.scale_factor(d_k) as f32,
            causal_offset: input.causal.then(|| self.causal_alignment.offset(n, m)),
        };
        let device = input.query.device();
        let ndarray = BackendFamily::of(&device) == BackendFamily::NdArray;
        let to_host = |t: Tensor<4>| {
            if ndarray {
                // NdArray's `into_data` walks a shared or permuted array element by element
                // (≈ 40 ms per 2^20 values here); after an elementwise op (a uniquely owned
                // array) and a reshape (standard layout) it hands the buffer over, 5–15× faster.
                let [d0, d1, d2, d3] = t.dims();
                t.mul_scalar(1.0).reshape([d0 * d1, d2, d3]).into_data()
            } else {
                t.into_data()
            }
        };
        let (q, k, v) = (
            to_host(input.query),
            to_host(input.key),
            to_host(input.value),
        );
        let mut out = vec![0.0f32; batch * n_heads * n * d_v];
        cpu_kernel::try_attention_f32_tiled(
            &shape,
            Tiles::default(),
            &host(&q)?,
            &host(&k)?,
            &host(&v)?,
            &mut out,
        )?;
        Ok(Tensor::from_data(
            TensorData::new(out, [batch, n_heads, n, d_v]),
            &device,
        ))
    }

    /// Delegates to `burn::tensor::module::attention`.
    fn forward_fused(&self, input: AttentionInput, dims: AttentionDims) -> Tensor<4> {
        let AttentionDims {
            batch: b,
            n_heads: h,
            n_kv_heads: h_kv,
            n,
            m,
            d_k,
            d_v,
        } = dims;
        let group = h / h_kv;
        let expand_heads = |t: Tensor<4>, d: usize| {
            if group == 1 {
                t
            } else {
                // [b, h_kv, m, d] -> [b, h_kv, 1, m, d] -> [b, h_kv, g, m, d] -> [b, h, m, d]
                t.unsqueeze_dim::<5>(2)
                    .expand([b, h_kv, group, m, d])
                    .reshape([b, h, m, d])
            }
        };
        let key = expand_heads(input.key, d_k);
        let value = expand_heads(input.value, d_v);
        let shape = [b, h, n, m];
        let options = AttentionModuleOptions {
            // An explicit scale disables CubeCL's flash kernel: pass None for the default one.
            scale: match self.scale {
                ScalePolicy::InvSqrtDk => None,
                other => Some(other.factor(d_k)),
            },
            softcap: None,
            is_causal: input.causal,
        };
        attention(
            input.query,
            key,
            value,
            input.mask.map(|m| m.expand(shape)),
            input.bias.map(|b| b.expand(shape)),
            options,
        )
    }

    /// Applies attention.
    ///
    /// # Shapes
    /// - query: `[b, h, n, d_k]`
    /// - key: `[b, h_kv, m, d_k]`, with `h % h_kv == 0`
    /// - value: `[b, h_kv, m, d_v]`
    /// - mask (bool, true = masked out) and bias: `[b|1, h|1, n|1, m]`
    /// - context: `[b, h, n, d_v]`; weights and scores: `[b, h, n, m]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error when the shapes do not fit.
    pub fn forward(&self, input: AttentionInput) -> AttentionOutput {
        self.try_forward(input).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The combined boolean mask of a call (user mask, causal mask, −∞ bias entries), expanded to
    /// `[b, h, n, m]`, or `None` when nothing is masked.
    pub fn combined_mask(
        &self,
        input: &AttentionInput,
        dims: &AttentionDims,
    ) -> Option<Tensor<4, Bool>> {
        mask_for_keys(
            input,
            dims,
            self.causal_alignment,
            0..dims.m,
            input.bias.as_ref(),
        )
        .map(|m| m.expand(dims.scores_shape()))
    }

    /// The plain path: materializes the scores and weights `[b, h, n, m]`.
    fn forward_naive(&self, input: AttentionInput, dims: AttentionDims) -> AttentionOutput {
        let AttentionDims {
            batch: b,
            n_heads: h,
            n_kv_heads: h_kv,
            n,
            m,
            d_k,
            d_v,
        } = dims;
        let group = h / h_kv;
        let mask = self.combined_mask(&input, &dims);
        let scale = self.scale_factor(d_k);

        let mut query = input.query;
        if scale != 1.0 {
            // Scaling Q (n·d_k elements) is cheaper than scaling the scores (n·m elements).
            query = query.mul_scalar(scale);
        }
        // Query heads g·i .. g·(i+1) share kv head i, so grouping them is a reshape:
        // [b, h, n, d_k] -> [b, h_kv, g·n, d_k]
        let query = query.reshape([b, h_kv, group * n, d_k]);
        // [b, h_kv, g·n, d_k] @ [b, h_kv, d_k, m] -> [b, h_kv, g·n, m] -> [b, h, n, m]
        let mut scores = query.matmul(input.key.transpose()).reshape([b, h, n, m]);
        if let Some(bias) = input.bias {
            scores = scores + bias;
        }
        let scores_out = input.need_scores.then(|| scores.clone());

        let weights = match &mask {
            Some(mask) => {
                let fill = most_negative(scores.dtype());
                // Masked keys get the most negative finite value, so they vanish from the
                // softmax of a row that has a visible key; a row with none becomes uniform and is
                // zeroed right after, which also makes its gradient exactly zero.
                softmax(scores.mask_fill(mask.clone(), fill), 3).mask_fill(mask.clone(), 0.0)
            }
            None => softmax(scores, 3),
        };
        let dropped = self.dropout.forward(weights.clone());
        // [b, h, n, m] -> [b, h_kv, g·n, m] @ [b, h_kv, m, d_v] -> [b, h_kv, g·n, d_v]
        let context = dropped
            .reshape([b, h_kv, group * n, m])
            .matmul(input.value)
            // -> [b, h, n, d_v]
            .reshape([b, h, n, d_v]);

        AttentionOutput {
            context,
            weights: input.need_weights.then_some(weights),
            scores: scores_out,
            mask,
        }
    }
}

/// The values of host data as f32, read in place; copied only when the bytes are not aligned
/// for f32.
fn host(data: &TensorData) -> Result<Cow<'_, [f32]>, AttentionError> {
    match data.as_slice::<f32>() {
        Ok(values) => Ok(Cow::Borrowed(values)),
        Err(_) => data
            .clone()
            .try_into_vec::<f32>()
            .map(Cow::Owned)
            .map_err(|e| AttentionError::Unsupported {
                implementation: "CpuKernel".to_string(),
                reason: format!("its input is not f32 data ({e:?})"),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, TensorData};

    fn values(t: Tensor<4>) -> Vec<f32> {
        t.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn scale_policies() {
        assert_eq!(ScalePolicy::InvSqrtDk.factor(64), 0.125);
        assert_eq!(ScalePolicy::Unscaled.factor(64), 1.0);
        assert_eq!(ScalePolicy::Fixed(0.3).factor(64), 0.3);
        assert!(ScalePolicy::Fixed(0.0).validate().is_err());
        assert_eq!(CausalAlignment::BottomRight.offset(2, 5), 3);
        assert_eq!(CausalAlignment::TopLeft.offset(2, 5), 0);
    }

    #[test]
    fn fully_masked_row_is_zero_on_every_path() {
        let device = Device::flex();
        device.seed(0);
        let q = Tensor::<4>::random([1, 1, 3, 4], Distribution::Default, &device);
        let k = Tensor::<4>::random([1, 1, 5, 4], Distribution::Default, &device);
        let v = Tensor::<4>::random([1, 1, 5, 2], Distribution::Default, &device);
        // Row 1 sees nothing.
        let mut m = vec![false; 15];
        m[5..10].iter_mut().for_each(|x| *x = true);
        let mask = Tensor::<4, Bool>::from_data(TensorData::new(m, [1, 1, 3, 5]), &device);
        for implementation in [
            Implementation::Naive,
            Implementation::Chunked { block_size: 2 },
            Implementation::Fused,
            Implementation::Auto,
        ] {
            let attn = ScaledDotProductAttentionConfig::new()
                .with_implementation(implementation)
                .init();
            let out = attn
                .forward(AttentionInput::new(q.clone(), k.clone(), v.clone()).mask(mask.clone()));
            let ctx = values(out.context);
            assert_eq!(&ctx[2..4], &[0.0, 0.0], "{implementation:?}");
            assert!(ctx.iter().all(|x| x.is_finite()), "{implementation:?}");
        }
    }

    #[test]
    fn auto_on_flex_inference_takes_the_kernels_and_naive_for_weights() {
        let device = Device::flex();
        // One block of keys (256): the CPU kernel; fewer keys: Flex's own kernel.
        let q = Tensor::<4>::zeros([1, 2, 3, 4], &device);
        let kv = Tensor::<4>::zeros([1, 2, 256, 4], &device);
        let input = AttentionInput::new(q.clone(), kv.clone(), kv);
        let attn = ScaledDotProductAttentionConfig::new().init();
        let dims = validate_input(&input).unwrap();
        assert_eq!(attn.resolve(&input, &dims).unwrap(), Path::CpuKernel);
        let short = AttentionInput::new(q.clone(), q.clone(), q.clone());
        let short_dims = validate_input(&short).unwrap();
        assert_eq!(attn.resolve(&short, &short_dims).unwrap(), Path::Fused);
        let masked = input
            .clone()
            .mask(Tensor::<4, Bool>::full([1, 1, 1, 256], false, &device));
        assert_eq!(attn.resolve(&masked, &dims).unwrap(), Path::Fused);
        // Explicitly asked, the CPU kernel names what it cannot do.
        let kernel = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::CpuKernel)
            .init();
        let e = kernel.resolve(&masked, &dims).unwrap_err();
        assert!(e.to_string().contains("no mask or bias"), "{e}");
        let autodiff = Tensor::<4>::zeros([1, 2, 3, 4], &device.clone().autodiff());
        let training = AttentionInput::new(autodiff.clone(), autodiff.clone(), autodiff);
        let e = kernel.resolve(&training, &short_dims).unwrap_err();
        assert!(e.to_string().contains("no backward pass"), "{e}");
        assert_eq!(
            attn.resolve(&input.clone().need_weights(), &dims).unwrap(),
            Path::Naive
        );
        let chunked = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Chunked { block_size: 8 })
            .init();
        let e = chunked.resolve(&input.need_weights(), &dims).unwrap_err();
        assert!(matches!(e, AttentionError::Unsupported { .. }), "{e:?}");
        let e = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Chunked { block_size: 0 })
            .try_init()
            .unwrap_err();
        assert!(e.to_string().contains("block size"), "{e}");
    }

    #[test]
    fn grouped_query_heads_use_their_kv_head() {
        // Two query heads share one kv head: with identical queries they give identical outputs.
        let device = Device::flex();
        device.seed(1);
        let q1 = Tensor::<4>::random([1, 1, 3, 4], Distribution::Default, &device);
        let q = Tensor::cat(vec![q1.clone(), q1], 1);
        let k = Tensor::<4>::random([1, 1, 5, 4], Distribution::Default, &device);
        let v = Tensor::<4>::random([1, 1, 5, 2], Distribution::Default, &device);
        let out = ScaledDotProductAttentionConfig::new()
            .init()
            .forward(AttentionInput::new(q, k, v));
        let ctx = values(out.context);
        assert_eq!(&ctx[..6], &ctx[6..]);
    }
}
