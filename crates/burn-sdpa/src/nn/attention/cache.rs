//! burn-nn's `MhaCache` and the cached forward of the drop-in [`MultiHeadAttention`]: only the
//! rows past the cached ones are projected and attended.

use burn::prelude::*;

use super::{MhaInput, MhaOutput, MultiHeadAttention};
use crate::error::AttentionError;
use crate::nn::Answered;

/// Which keys and values a [`MhaCache`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheKind {
    /// Self-attention: each call appends the new rows' keys and values.
    Autoregressive,
    /// Cross-attention over a fixed memory: its keys and values are computed once.
    Memory,
}

/// burn-nn's attention cache for autoregressive inference (see
/// [`MultiHeadAttention::forward_cache`]).
#[derive(Debug, Clone)]
pub struct MhaCache {
    kind: CacheKind,
    key: Option<Tensor<4>>,
    value: Option<Tensor<4>>,
    answered: Answered,
    /// Query rows attended so far (the next one's rotary position).
    queries: usize,
}

impl MhaCache {
    fn of(kind: CacheKind) -> Self {
        Self {
            kind,
            key: None,
            value: None,
            answered: Answered::default(),
            queries: 0,
        }
    }

    /// A cache for self-attention over a growing sequence.
    pub fn autoregressive() -> Self {
        Self::of(CacheKind::Autoregressive)
    }

    /// A cache for cross-attention over a memory that stays the same between calls.
    pub fn memory() -> Self {
        Self::of(CacheKind::Memory)
    }

    /// burn-nn's name for [`memory`](Self::memory).
    pub fn autoregressive_cross_attention() -> Self {
        Self::memory()
    }
}

impl MultiHeadAttention {
    /// burn-nn's cached forward: the query (and, for self-attention, the key and value) hold
    /// the whole sequence so far, `[b, s, d_model]`, and the masks cover it; only the rows past
    /// those of the previous call are projected and attended (their keys and values appended to
    /// the cache, or, with [`MhaCache::memory`], the memory's computed once), and the context of
    /// every row is returned. It equals [`forward`](Self::forward) when the attention is causal
    /// (earlier rows do not see later ones), as burn-nn's does.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    ///
    /// # Panics
    /// With the message of [`try_forward_cache`](Self::try_forward_cache)'s error.
    pub fn forward_cache(&self, input: MhaInput, cache: &mut MhaCache) -> MhaOutput {
        self.try_forward_cache(input, cache)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`forward_cache`](Self::forward_cache), or says which input does not fit the cache.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    pub fn try_forward_cache(
        &self,
        input: MhaInput,
        cache: &mut MhaCache,
    ) -> Result<MhaOutput, AttentionError> {
        let [b, s, _] = input.inner.query.dims();
        let start = cache.answered.rows();
        if !cache.answered.continued_by(b, s) {
            return Err(AttentionError::Shape {
                what: "cached query",
                expected: format!(
                    "[b, s ≥ {start}, d_model], b the cache's: the cache holds {start} rows"
                ),
                got: input.inner.query.dims().to_vec(),
            });
        }
        // [b, s, d] -> [b, s − start, d]: the rows past the cached ones.
        let rows = |t: Tensor<3>| {
            let len = t.dims()[1];
            t.slice(s![.., start..len, ..])
        };
        let MhaInput {
            inner: mut rows_input,
            mask_attn,
        } = input;
        if cache.kind == CacheKind::Autoregressive
            && (rows_input.key.dims()[1] != s || rows_input.value.dims()[1] != s)
        {
            return Err(AttentionError::Shape {
                what: "cached key/value",
                expected: format!("[b, s = {s}, d_model]: a self-attention's whole sequence"),
                got: [rows_input.key.dims(), rows_input.value.dims()].concat(),
            });
        }
        if let Some(mask) = &mask_attn
            && mask.dims()[1] != s
        {
            return Err(AttentionError::Shape {
                what: "mask_attn",
                expected: format!("[b, s = {s}, m]"),
                got: mask.dims().to_vec(),
            });
        }
        rows_input.query = rows(rows_input.query);
        if cache.kind == CacheKind::Autoregressive {
            rows_input.key = rows(rows_input.key);
            rows_input.value = rows(rows_input.value);
        }
        let rows_input = MhaInput {
            inner: rows_input,
            // [b, s, m] -> [b, s − start, m]
            mask_attn: mask_attn.map(|mask| {
                let len = mask.dims()[1];
                mask.slice(s![.., start..len, ..])
            }),
        };
        let new = self.try_forward_rows(rows_input, cache)?;
        let context = cache.answered.append(new.context);
        Ok(MhaOutput {
            weights: new.weights,
            context,
        })
    }

    /// New query rows `[b, t, d_model]` (and for self-attention their key and value rows)
    /// attended through `cache`'s keys and values; the masks cover every key (`mask_pad
    /// [b, m]`, `mask_attn [b, t, m]`). Context `[b, t, d_model]`.
    pub(crate) fn try_forward_rows(
        &self,
        input: MhaInput,
        cache: &mut MhaCache,
    ) -> Result<MhaOutput, AttentionError> {
        let MhaInput {
            inner: mut input,
            mask_attn,
        } = input;
        let [b, t, _] = input.query.dims();
        if let Some(cached) = &cache.key
            && cached.dims()[0] != b
        {
            return Err(AttentionError::Shape {
                what: "cached query",
                expected: format!("[b = {}, t, d_model]: the cache's batch", cached.dims()[0]),
                got: input.query.dims().to_vec(),
            });
        }
        if input.causal && self.options.causal_alignment != crate::CausalAlignment::BottomRight {
            return Err(AttentionError::InvalidConfig {
                field: "causal_alignment",
                value: format!("{:?}", self.options.causal_alignment),
                reason: "a cached causal call needs the bottom-right alignment (the new rows are \
                         the last queries)"
                    .into(),
            });
        }
        // The new queries continue at the cache's positions.
        let query = self.heads(&self.query, input.query.clone(), self.n_heads);
        let query = self.rotate(query, cache.queries)?;
        let cached_keys = cache.key.as_ref().map_or(0, |k| k.dims()[2]);
        // The cache is written only once the call has succeeded.
        let (key, value) = match cache.kind {
            CacheKind::Autoregressive => {
                if input.key.dims()[1] != t {
                    return Err(AttentionError::Shape {
                        what: "cached key",
                        expected: format!("[b, {t}, d_model]: the new rows of a self-attention"),
                        got: input.key.dims().to_vec(),
                    });
                }
                let key = self.heads(&self.key, input.key.clone(), self.n_kv_heads);
                let key = self.rotate(key, cached_keys)?;
                let value = self.heads(&self.value, input.value.clone(), self.n_kv_heads);
                let append = |old: Option<Tensor<4>>, new: Tensor<4>| match old {
                    Some(old) => Tensor::cat(vec![old, new], 2),
                    None => new,
                };
                (
                    append(cache.key.clone(), key),
                    append(cache.value.clone(), value),
                )
            }
            CacheKind::Memory => match (cache.key.clone(), cache.value.clone()) {
                (Some(key), Some(value)) if key.dims()[2] == input.key.dims()[1] => (key, value),
                _ => (
                    self.rotate(self.heads(&self.key, input.key.clone(), self.n_kv_heads), 0)?,
                    self.heads(&self.value, input.value.clone(), self.n_kv_heads),
                ),
            },
        };
        let m = key.dims()[2];
        if let Some(mask) = mask_attn {
            if mask.dims() != [b, t, m] {
                return Err(AttentionError::Shape {
                    what: "mask_attn",
                    expected: format!("[b, new rows, m] = [{b}, {t}, {m}]"),
                    got: mask.dims().to_vec(),
                });
            }
            // [b, t, m] -> [b, 1, t, m]
            input = input.mask(mask.unsqueeze_dim(1));
        }
        let out = self.attend(input, query, key.clone(), value.clone())?;
        cache.queries += t;
        cache.key = Some(key);
        cache.value = Some(value);
        Ok(out)
    }
}
