//! The scaled dot-product attention module, softmax(QKᵀ·scale + M)·V: its configuration, and a
//! forward pass that validates the call, lets [`paths`](crate::paths) choose a path and runs it.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::{AttentionInput, AttentionOutput, validate_input};
use crate::mask::mask_for_keys;
use crate::paths::{self, call::Call, kind::Implementation, kind::Path};
use crate::types::{AttentionDims, CausalAlignment, ScalePolicy, validate_softcap};

/// Configuration of [`ScaledDotProductAttention`].
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
    /// Logit soft-capping (Gemma 2): the scaled scores s become `c · tanh(s / c)` before the bias
    /// is added and any mask takes effect (Burn's `module::attention` order). `None` by default:
    /// the article's attention has no cap.
    #[config(default = "None")]
    pub softcap: Option<f64>,
}

impl ScaledDotProductAttentionConfig {
    /// Builds the module, or says which setting is out of range.
    pub fn try_init(&self) -> Result<ScaledDotProductAttention, AttentionError> {
        self.scale.validate()?;
        if let Some(softcap) = self.softcap {
            validate_softcap(softcap)?;
        }
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
            softcap: self.softcap,
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
        let call = self.call(input)?;
        let path = paths::resolve(self.implementation, &call)?;
        paths::run(path, call)
    }

    /// The path a call would take (after validating it), without running it.
    pub fn path(&self, input: &AttentionInput) -> Result<Path, AttentionError> {
        paths::resolve(self.implementation, &self.call(input.clone())?)
    }

    /// The path a call with these sizes takes: see [`path`](Self::path), which also validates.
    pub fn resolve(
        &self,
        input: &AttentionInput,
        dims: &AttentionDims,
    ) -> Result<Path, AttentionError> {
        let call = Call {
            dims: *dims,
            ..self.call(input.clone())?
        };
        paths::resolve(self.implementation, &call)
    }

    /// The combined boolean mask of a call (padding, user mask, causal mask, −∞ bias entries),
    /// expanded to `[b, h, n, m]`, or `None` when nothing is masked.
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

    /// Validates `input` and resolves the module's settings for it.
    fn call(&self, input: AttentionInput) -> Result<Call, AttentionError> {
        let dims = validate_input(&input)?;
        // The fields are public: check the scale at every call, in the f32 the kernels use.
        self.scale.validate()?;
        let factor = self.scale_factor(dims.d_k);
        if !((factor as f32).is_finite() && (factor as f32) > 0.0) {
            return Err(AttentionError::InvalidScale(factor));
        }
        if let Some(softcap) = self.softcap {
            validate_softcap(softcap)?;
        }
        let dropout_active = self.dropout.prob > 0.0
            && self.dropout.training.is_enabled()
            && input.query.device().is_autodiff();
        Ok(Call {
            scale: factor,
            dims,
            alignment: self.causal_alignment,
            softcap: self.softcap,
            dropout: dropout_active.then(|| self.dropout.clone()),
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
        crate::read_back("context", t).unwrap()
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
    fn auto_on_flex_takes_the_cpu_kernel_and_naive_for_weights() {
        let device = Device::flex();
        let in_place = crate::cpu_kernel::runs_in_place(&device);
        let q = Tensor::<4>::zeros([1, 2, 3, 4], &device);
        let kv = Tensor::<4>::zeros([1, 2, 256, 4], &device);
        let input = AttentionInput::new(q.clone(), kv.clone(), kv);
        let attn = ScaledDotProductAttentionConfig::new().init();
        // One block of keys (256): the CPU kernel, in place or on host copies.
        assert_eq!(attn.path(&input).unwrap(), Path::CpuKernel);
        // Fewer keys, or a mask: the kernel in place; without the extension, Flex's kernel.
        let short = AttentionInput::new(q.clone(), q.clone(), q.clone());
        let masked = input
            .clone()
            .mask(Tensor::<4, Bool>::full([1, 1, 1, 256], false, &device));
        let padded = input
            .clone()
            .padding_mask(Tensor::<2, Bool>::full([1, 256], false, &device));
        let elsewhere = if in_place {
            Path::CpuKernel
        } else {
            Path::Fused
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
            Ok(path) => assert!(in_place && path == Path::CpuKernel),
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
            Path::Naive
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
        for implementation in [
            Implementation::Naive,
            Implementation::Chunked { block_size: 2 },
            Implementation::Fused,
        ] {
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
