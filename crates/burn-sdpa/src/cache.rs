//! Cached decoding for the multi-head layer: the projected keys and values of the tokens seen so
//! far are kept, so that each new token costs one query against the cache instead of a forward
//! pass over the whole prefix.

use burn::prelude::*;

use crate::error::AttentionError;
use crate::mha::{MhaInput, MhaOutput, MultiHeadAttention};
use crate::types::Window;

/// The keys and values of the tokens a [`MultiHeadAttention`] has decoded so far, after the
/// projections (and QK-norm): keys `[b, h_kv, t, d_k]`, values `[b, h_kv, t, d_v]`.
///
/// [`MhaCache::new`] keeps every token; [`MhaCache::sliding`] keeps the last `window` ones and
/// makes each query see only them (with the window's band, so that a cached decode equals the
/// full forward with [`AttentionInput::window`](crate::AttentionInput::window)`(window − 1, 0)`).
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::{MhaCache, MhaInput, MultiHeadAttentionConfig};
/// let device = Device::flex();
/// let mha = MultiHeadAttentionConfig::new(16, 4).init(&device);
/// let mut cache = MhaCache::new();
/// for _ in 0..3 {
///     let token = Tensor::<3>::zeros([1, 1, 16], &device); // [b, 1, d_model]
///     let out = mha.forward_cache(MhaInput::self_attn(token).causal(), &mut cache);
///     assert_eq!(out.context.dims(), [1, 1, 16]);
/// }
/// assert_eq!(cache.len(), 3);
/// ```
#[derive(Debug, Clone, Default)]
pub struct MhaCache {
    key: Option<Tensor<4>>,
    value: Option<Tensor<4>>,
    window: Option<usize>,
    seen: usize,
}

impl MhaCache {
    /// A cache that keeps every token.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sliding-window cache: each query sees itself and the `window − 1` tokens before it,
    /// and the cache holds at most `window` tokens between calls (Mistral-style local
    /// attention). A window of 0 is treated as 1.
    pub fn sliding(window: usize) -> Self {
        Self {
            window: Some(window.max(1)),
            ..Self::default()
        }
    }

    /// Tokens decoded so far (including those a sliding cache has dropped).
    pub fn len(&self) -> usize {
        self.seen
    }

    /// Whether nothing was decoded yet.
    pub fn is_empty(&self) -> bool {
        self.seen == 0
    }

    /// Tokens the cache holds now.
    pub fn cached(&self) -> usize {
        self.key.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// The window of a sliding cache.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Forgets every token (and keeps the window).
    pub fn clear(&mut self) {
        *self = Self {
            window: self.window,
            ..Self::default()
        };
    }

    /// The cached keys and values followed by new ones `[b, h_kv, t, d]`, checking that they
    /// belong to the same batch, heads and device. The cache itself is not changed (see
    /// [`commit`](Self::commit)).
    fn extended(
        &self,
        key: Tensor<4>,
        value: Tensor<4>,
    ) -> Result<(Tensor<4>, Tensor<4>), AttentionError> {
        let (Some(old_key), Some(old_value)) = (&self.key, &self.value) else {
            return Ok((key, value));
        };
        let (old, new) = (old_key.dims(), key.dims());
        if old[0] != new[0] || old[1] != new[1] || old[3] != new[3] {
            return Err(AttentionError::Shape {
                what: "cached decoding input",
                expected: format!(
                    "keys [b = {}, h_kv = {}, t, d_k = {}] like the cache's",
                    old[0], old[1], old[3]
                ),
                got: new.to_vec(),
            });
        }
        if old_key.device() != key.device() || old_key.is_autodiff() != key.is_autodiff() {
            return Err(AttentionError::DeviceMismatch {
                query: format!("{:?}", key.device()),
                other: "cache",
                other_device: format!("{:?}", old_key.device()),
            });
        }
        // [b, h_kv, cached, d] ++ [b, h_kv, t, d] -> [b, h_kv, cached + t, d]
        Ok((
            Tensor::cat(vec![old_key.clone(), key], 2),
            Tensor::cat(vec![old_value.clone(), value], 2),
        ))
    }

    /// Stores the keys and values of [`extended`](Self::extended) after a successful call with
    /// `t` new tokens, keeping the last `window` of a sliding cache.
    fn commit(&mut self, key: Tensor<4>, value: Tensor<4>, t: usize) {
        self.seen += t;
        let total = key.dims()[2];
        // Keep what the next call's queries may see: the last `window` tokens.
        let keep = self.window.map_or(total, |w| w.min(total));
        if keep < total {
            self.key = Some(key.slice(s![.., .., total - keep.., ..]));
            self.value = Some(value.slice(s![.., .., total - keep.., ..]));
        } else {
            self.key = Some(key);
            self.value = Some(value);
        }
    }
}

impl MultiHeadAttention {
    /// Cached decoding: attends the new tokens `x` `[b, t, d_model]` (the input's query; its key
    /// and value must be the same tokens) to every token in `cache` and to themselves, then
    /// appends their keys and values to the cache. Ask for `.causal()` when t > 1: the causal
    /// mask is aligned bottom-right, so the new tokens see the cache and the new tokens before
    /// them. Masks and biases, if any, cover all the keys attended (cached + t).
    ///
    /// Decoding a sequence token by token gives the last rows of the full causal forward over
    /// it, to float tolerance (tested).
    ///
    /// # Shapes
    /// - input: query = key = value `[b, t, d_model]`
    /// - context: `[b, t, d_model]`
    pub fn try_forward_cache(
        &self,
        input: MhaInput,
        cache: &mut MhaCache,
    ) -> Result<MhaOutput, AttentionError> {
        let dims = [input.query.dims(), input.key.dims(), input.value.dims()];
        if dims[0] != dims[1] || dims[0] != dims[2] {
            return Err(AttentionError::Shape {
                what: "cached decoding input",
                expected: "query, key and value of the same tokens [b, t, d_model]".into(),
                got: dims.concat(),
            });
        }
        if cache.window.is_some() && input.window.is_some() {
            return Err(AttentionError::InvalidConfig {
                field: "window",
                value: format!("{:?}", input.window),
                reason: "a sliding-window cache sets the window itself".into(),
            });
        }
        // The new tokens follow every token seen so far (rotary positions, if configured).
        let (query, key, value) = self.project_heads_at(&input, cache.len())?;
        let t = key.dims()[2];
        let (key, value) = cache.extended(key, value)?;
        let mut input = input;
        if let Some(window) = cache.window {
            input.window = Some(Window::new(Some(window - 1), None));
        }
        // A call that fails (a mask that does not fit, say) leaves the cache as it was.
        let out = self.attend(input, query, key.clone(), value.clone())?;
        cache.commit(key, value, t);
        Ok(out)
    }

    /// Cached decoding: see [`try_forward_cache`](Self::try_forward_cache).
    ///
    /// # Panics
    /// With the message of [`try_forward_cache`](Self::try_forward_cache)'s error.
    pub fn forward_cache(&self, input: MhaInput, cache: &mut MhaCache) -> MhaOutput {
        self.try_forward_cache(input, cache)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}
