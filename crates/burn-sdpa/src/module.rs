//! The scaled dot-product attention module, softmax(QKᵀ·scale + M)·V: its configuration, and a
//! forward pass that validates the call, lets [`paths`](crate::paths) choose a path and runs it.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::DType;

use crate::error::AttentionError;
use crate::input::{AttentionInput, AttentionOutput, validate_input};
use crate::options::{AttentionOptions, option_setters};
use crate::paths::{self, call::Call};
use crate::types::{CausalAlignment, Precision, ScalePolicy, Softmax};
use crate::vocabulary::{AttentionPath, BackendFamily, Implementation};

/// Configuration of [`ScaledDotProductAttention`]: its [`AttentionOptions`].
///
/// ```
/// use burn_sdpa::{CausalAlignment, ScalePolicy, ScaledDotProductAttentionConfig};
/// let attn = ScaledDotProductAttentionConfig::new()
///     .with_scale(ScalePolicy::InvSqrtDk)
///     .with_softcap(Some(50.0)) // Gemma 2's attention soft-cap
///     .with_dropout(0.0)
///     .with_causal_alignment(CausalAlignment::BottomRight)
///     .init();
/// ```
#[derive(Config, Debug)]
pub struct ScaledDotProductAttentionConfig {
    /// Scale, soft-cap, dropout, causal alignment and implementation.
    #[config(default = "AttentionOptions::new()")]
    pub options: AttentionOptions,
}

option_setters!(ScaledDotProductAttentionConfig);

impl ScaledDotProductAttentionConfig {
    /// Builds the module, or says which setting is out of range.
    pub fn try_init(&self) -> Result<ScaledDotProductAttention, AttentionError> {
        self.options.validate()?;
        Ok(ScaledDotProductAttention {
            scale: self.options.scale,
            causal_alignment: self.options.causal_alignment,
            implementation: self.options.implementation,
            softcap: self.options.softcap,
            precision: self.options.precision,
            softmax: self.options.softmax,
            dropout: DropoutConfig::new(self.options.dropout).init(),
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
/// - masks are boolean with **true = masked out**, broadcast to `[b, h, n, m]`; a padding mask
///   `[b, m]` hides keys from every head and query;
/// - an additive bias is added to the *scaled* (and soft-capped, when a cap is set) scores (a
///   bias of −∞ masks like a `true`);
/// - a local [`Window`](crate::Window) hides the keys outside its band around the causal diagonal;
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
    /// The logit soft-cap `c` (scores become `c · tanh(s / c)` before bias and masks), if any.
    #[module(skip)]
    pub softcap: Option<f64>,
    /// The dtype the attention computes in.
    #[module(skip)]
    pub precision: Precision,
    /// The row normalization (standard or quiet softmax).
    #[module(skip)]
    pub softmax: Softmax,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
}

impl ScaledDotProductAttention {
    /// The factor that multiplies QKᵀ for a given d_k.
    pub fn scale_factor(&self, d_k: usize) -> f64 {
        self.scale.factor(d_k)
    }

    /// Applies attention.
    ///
    /// # Shapes
    /// - query: `[b, h, n, d_k]`
    /// - key: `[b, h_kv, m, d_k]`, with `h % h_kv == 0`
    /// - value: `[b, h_kv, m, d_v]`
    /// - padding mask: `[b, m]`; mask (bool, true = masked out) and bias: `[b|1, h|1, n|1, m]`
    /// - context: `[b, h, n, d_v]`; weights and scores: `[b, h, n, m]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error when the shapes do not fit.
    pub fn forward(&self, input: AttentionInput) -> AttentionOutput {
        self.try_forward(input).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Applies attention, or returns an [`AttentionError`] naming the shapes that do not fit.
    ///
    /// # Shapes
    /// - query: `[b, h, n, d_k]`
    /// - key: `[b, h_kv, m, d_k]`, with `h % h_kv == 0`
    /// - value: `[b, h_kv, m, d_v]`
    /// - padding mask: `[b, m]`; mask (bool, true = masked out) and bias: `[b|1, h|1, n|1, m]`
    /// - context: `[b, h, n, d_v]`; weights and scores: `[b, h, n, m]`
    pub fn try_forward(&self, input: AttentionInput) -> Result<AttentionOutput, AttentionError> {
        let dtype = input.query.dtype();
        let call = self.call(input)?;
        let path = paths::resolve(self.implementation, &call)?;
        let mut out = paths::run(path, call)?;
        if out.context.dtype() != dtype {
            // Computed in another precision: the outputs in the inputs' dtype.
            out.context = out.context.cast(dtype);
            out.weights = out.weights.map(|w| w.cast(dtype));
            out.scores = out.scores.map(|s| s.cast(dtype));
            out.lse = out.lse.map(|l| l.cast(dtype));
            out.row_stats = out.row_stats.map(|r| r.cast(dtype));
        }
        Ok(out)
    }

    /// The path a call would take (after validating it), without running it: the path
    /// `forward` takes for this input on the input's device, autodiff included (dropout on a
    /// training device, or asking for the weights, keeps a call off the fused kernels). A call whose
    /// scores may overflow the dtype is reported on the chunked path it then takes instead of a
    /// kernel (`CpuKernel`, `CubeKernel`, `Fused`; see the semantics guide), which costs one
    /// read-back of a few values, as running the call does.
    pub fn path(&self, input: &AttentionInput) -> Result<AttentionPath, AttentionError> {
        paths::resolve(self.implementation, &self.call(input.clone())?)
    }

    /// Why `path` cannot serve a call (after validating it), or `None` when it can: what `Auto`
    /// saw when it passed `path` over, and what an explicit request for it would be refused
    /// with. The CubeCL kernel's reasons name the sizes and the device's limit (head sizes
    /// above 512, or a row of keys and values that does not fit the shared memory).
    ///
    /// ```
    /// use burn::prelude::*;
    /// use burn_sdpa::{AttentionInput, AttentionPath, ScaledDotProductAttentionConfig};
    /// let device = Device::flex();
    /// let x = Tensor::<4>::zeros([1, 2, 3, 8], &device);
    /// let attn = ScaledDotProductAttentionConfig::new().init();
    /// // Asking for the weights: the fused CPU kernel never forms them, Naive does.
    /// let input = AttentionInput::new(x.clone(), x.clone(), x).need_weights();
    /// let why = attn.why_not(&input, AttentionPath::CpuKernel).unwrap();
    /// assert_eq!(why.as_deref(), Some("it cannot return the weights or scores"));
    /// assert_eq!(attn.why_not(&input, AttentionPath::Naive).unwrap(), None);
    /// ```
    pub fn why_not(
        &self,
        input: &AttentionInput,
        path: AttentionPath,
    ) -> Result<Option<String>, AttentionError> {
        let call = self.call(input.clone())?;
        Ok(paths::blocker(path, &call).map(std::borrow::Cow::into_owned))
    }

    /// The module's options, as set (the fields are public: they are checked at every call).
    pub fn options(&self) -> AttentionOptions {
        AttentionOptions {
            scale: self.scale,
            softcap: self.softcap,
            dropout: self.dropout.prob,
            causal_alignment: self.causal_alignment,
            implementation: self.implementation,
            precision: self.precision,
            softmax: self.softmax,
        }
    }

    /// Validates `input` and resolves the module's settings and the device's facts for it,
    /// once per call.
    fn call(&self, mut input: AttentionInput) -> Result<Call, AttentionError> {
        let dims = validate_input(&input)?;
        if self.precision == Precision::Bf16 && input.query.dtype() != DType::BF16 {
            self.precision.check_device(&input.query.device())?;
            input = input.cast_floats(DType::BF16);
        }
        // A side of the window that reaches past every key is no bound at all: clamping it here
        // keeps every path's position arithmetic (Int tensors included) far from overflow.
        input.window = input
            .window
            .and_then(|window| window.within(dims.n, dims.m));
        let learned_sinks = input.sinks.is_some();
        if self.softmax == Softmax::Quiet {
            if input.sinks.is_some() {
                return Err(AttentionError::InvalidConfig {
                    field: "softmax",
                    value: "Quiet".into(),
                    reason: "the call also has attention sinks: quiet softmax is the sink 0 on \
                             every head, so use one or the other"
                        .into(),
                });
            }
            // The constant zero logit of every head: a sink without a gradient.
            let device = input.query.device();
            input.sinks = Some(Tensor::zeros(
                [dims.n_heads],
                (&device, input.query.dtype()),
            ));
        }
        let options = self.options();
        options.validate()?;
        let scale = options.scale_factor(dims.d_k)?;
        let device = input.query.device();
        let family = BackendFamily::of(&device);
        let autodiff = device.is_autodiff();
        let dropout_active =
            self.dropout.prob > 0.0 && self.dropout.training.is_enabled() && autodiff;
        Ok(Call {
            scale,
            dims,
            alignment: self.causal_alignment,
            softcap: self.softcap,
            dropout: dropout_active.then(|| self.dropout.clone()),
            family,
            autodiff,
            kernel_in_place: paths::cpu::in_place_on(family),
            tensor_cores: paths::has_tensor_cores(&device),
            learned_sinks,
            input,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttentionError;
    use burn::tensor::{Distribution, TensorData};

    fn values(t: Tensor<4>) -> Vec<f32> {
        crate::util::read_back("context", t).unwrap()
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
        let family = crate::BackendFamily::of(&device);
        for implementation in Implementation::all(2).filter(|i| i.runs_on(family)) {
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
    fn auto_on_flex_takes_the_cpu_kernel_and_naive_for_weights() {
        let device = Device::flex();
        let in_place = crate::cpu_kernel::runs_in_place(&device);
        let q = Tensor::<4>::zeros([1, 2, 3, 4], &device);
        let kv = Tensor::<4>::zeros([1, 2, 256, 4], &device);
        let input = AttentionInput::new(q.clone(), kv.clone(), kv);
        let attn = ScaledDotProductAttentionConfig::new().init();
        // One block of keys (256): the CPU kernel, in place or on host copies.
        assert_eq!(attn.path(&input).unwrap(), AttentionPath::CpuKernel);
        // Fewer keys, or a mask: the kernel in place; without the extension, Flex's kernel.
        let short = AttentionInput::new(q.clone(), q.clone(), q.clone());
        let masked = input
            .clone()
            .mask(Tensor::<4, Bool>::full([1, 1, 1, 256], false, &device));
        let padded = input
            .clone()
            .padding_mask(Tensor::<2, Bool>::full([1, 256], false, &device));
        let elsewhere = if in_place {
            AttentionPath::CpuKernel
        } else {
            AttentionPath::Fused
        };
        for call in [&short, &masked, &padded] {
            assert_eq!(attn.path(call).unwrap(), elsewhere);
        }
        let kernel = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::CpuKernel)
            .init();
        // Under autodiff: the kernel's own backward pass in place, else a typed refusal.
        let autodiff = Tensor::<4>::zeros([1, 2, 3, 4], &device.clone().autodiff());
        let training = AttentionInput::new(autodiff.clone(), autodiff.clone(), autodiff);
        match kernel.path(&training) {
            Ok(path) => assert!(in_place && path == AttentionPath::CpuKernel),
            Err(e) => {
                assert!(!in_place);
                assert!(e.to_string().contains("backward pass"), "{e}");
            }
        }
        // Asked for the weights, the kernel names what it cannot do, and Auto takes Naive.
        let e = kernel.path(&input.clone().need_weights()).unwrap_err();
        assert!(e.to_string().contains("weights"), "{e}");
        assert!(
            matches!(
                e,
                AttentionError::Unsupported {
                    implementation: Implementation::CpuKernel,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            attn.path(&input.clone().need_weights()).unwrap(),
            AttentionPath::Naive
        );
        let chunked = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Chunked { block_size: 8 })
            .init();
        let e = chunked.path(&input.need_weights()).unwrap_err();
        assert!(matches!(e, AttentionError::Unsupported { .. }), "{e:?}");
        assert!(
            e.to_string().contains("the chunked:8 implementation"),
            "{e}"
        );
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

    #[test]
    fn a_padding_mask_equals_the_same_keys_masked_by_hand() {
        let device = Device::flex();
        device.seed(3);
        let q = Tensor::<4>::random([2, 2, 3, 4], Distribution::Default, &device);
        let k = Tensor::<4>::random([2, 2, 5, 4], Distribution::Default, &device);
        let v = Tensor::<4>::random([2, 2, 5, 2], Distribution::Default, &device);
        let padding = Tensor::<2, Bool>::from_data(
            TensorData::new(
                vec![
                    false, false, false, true, true, false, true, false, false, false,
                ],
                [2, 5],
            ),
            &device,
        );
        let by_hand = padding.clone().reshape([2, 1, 1, 5]);
        let family = crate::BackendFamily::of(&device);
        for implementation in Implementation::all(2).filter(|i| i.runs_on(family)) {
            let attn = ScaledDotProductAttentionConfig::new()
                .with_implementation(implementation)
                .init();
            let input = AttentionInput::new(q.clone(), k.clone(), v.clone()).causal();
            let padded = values(
                attn.forward(input.clone().padding_mask(padding.clone()))
                    .context,
            );
            let masked = values(attn.forward(input.mask(by_hand.clone())).context);
            assert_eq!(padded, masked, "{implementation}");
        }
        let e = ScaledDotProductAttentionConfig::new()
            .init()
            .try_forward(AttentionInput::new(q, k, v).padding_mask(by_hand.reshape([5, 2])))
            .unwrap_err();
        assert!(e.to_string().contains("padding mask"), "{e}");
    }
}
