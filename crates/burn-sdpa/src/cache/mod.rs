//! The KV cache of cached decoding: the projected keys and values of the tokens seen so far,
//! so that each new token costs one query against the cache instead of a forward pass over the
//! whole prefix.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`KvCache`]: its kinds, lengths and storage (preallocated slots, ring, concatenation) |
//! | `positions.rs` | the position of every cached key and new query, and the masks built from them |
//! | `decode.rs` | `MultiHeadSdpa::forward_cache` and `forward_cache_ragged` |

mod decode;
mod positions;

use burn::prelude::*;

use crate::error::AttentionError;

/// Slots a growable cache allocates at least at its first call (otherwise the next power of two
/// above what that call needs): 256 tokens of `h_kv · (d_k + d_v)` floats is small, and starting
/// there saves the first doublings.
pub(crate) const INITIAL_CAPACITY: usize = 256;

/// How a cache stores its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Preallocated slots `[b, h_kv, capacity, d]`, token p of a sequence in slot p; the
    /// capacity is chosen at the first call when `None`, and doubles when `growable`.
    Slots {
        capacity: Option<usize>,
        growable: bool,
    },
    /// A ring of `window` slots per sequence: token p in slot `p mod window`.
    Ring { window: usize },
    /// Every call concatenates the new tokens to the old ones (`Tensor::cat`): the cache of
    /// earlier versions, kept as the baseline `examples/decode` measures against.
    Concatenating,
}

/// The keys and values of the tokens a [`MultiHeadSdpa`](crate::MultiHeadSdpa) has
/// decoded so far, after the projections, QK-norm and rotary positions: keys
/// `[b, h_kv, slots, d_k]`, values `[b, h_kv, slots, d_v]`, and the length of every sequence
/// of the batch.
///
/// - [`KvCache::with_capacity`]: `capacity` slots per sequence allocated at the first call,
///   new tokens written in place; on the CPU kernel a one-token query also reads the cache where
///   it lies, so no token costs a copy of the cache (other paths get the filled slots as a
///   strided view, which they may copy). A call that would need
///   more is refused with [`AttentionError::CacheFull`], unless the cache is made
///   [`growable`](Self::growable), when the capacity doubles.
/// - [`KvCache::new`]: growable, starting at [`KvCache::INITIAL_CAPACITY`] (or the next power of two
///   above what the first call needs).
/// - [`KvCache::sliding`]: a ring buffer of `window` slots; each query sees itself and the
///   `window − 1` tokens before it (so a cached decode equals the full forward with
///   [`AttentionInput::window`](crate::AttentionInput::window)`(window − 1, 0)`). Its slots are
///   not positions: it refuses masks, biases, padding masks and segments (which earlier versions
///   took over the last tokens in order), and weights or scores asked for come back over its
///   slots, in ring order.
/// - [`KvCache::concatenating`]: the cache of earlier versions (each call copies the whole
///   cache with `Tensor::cat`), kept as a baseline.
///
/// Every sequence of the batch has its own length: with
/// [`forward_cache_ragged`](crate::MultiHeadSdpa::forward_cache_ragged) a batch of prompts
/// of different lengths prefills and decodes together, and no sequence ever sees another's
/// padding.
///
/// ```
/// use burn::prelude::*;
/// use burn_sdpa::{KvCache, MultiHeadSdpaInput, MultiHeadSdpaConfig};
/// let device = Device::flex();
/// let mha = MultiHeadSdpaConfig::new(16, 4).init(&device);
/// let mut cache = KvCache::with_capacity(8);
/// for _ in 0..3 {
///     let token = Tensor::<3>::zeros([1, 1, 16], &device); // [b, 1, d_model]
///     let out = mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache);
///     assert_eq!(out.context.dims(), [1, 1, 16]);
/// }
/// assert_eq!((cache.len(), cache.capacity()), (3, Some(8)));
/// ```
#[derive(Debug, Clone)]
pub struct KvCache {
    kind: Kind,
    /// `[b, h_kv, slots, d_k]`, `None` before the first call.
    key: Option<Tensor<4>>,
    /// `[b, h_kv, slots, d_v]`.
    value: Option<Tensor<4>>,
    /// Tokens seen per sequence (empty before the first call).
    lengths: Vec<usize>,
}

impl Default for KvCache {
    fn default() -> Self {
        Self::new()
    }
}

impl KvCache {
    /// Slots per sequence of a growable cache ([`KvCache::new`]) before it first grows.
    pub const INITIAL_CAPACITY: usize = INITIAL_CAPACITY;

    fn of(kind: Kind) -> Self {
        Self {
            kind,
            key: None,
            value: None,
            lengths: Vec::new(),
        }
    }

    /// A growable cache that keeps every token: [`KvCache::INITIAL_CAPACITY`] slots per sequence (or
    /// what the first call needs), doubling when full.
    pub fn new() -> Self {
        Self::of(Kind::Slots {
            capacity: None,
            growable: true,
        })
    }

    /// A cache of `capacity` tokens per sequence (prompt and generated tokens together),
    /// allocated at the first call; a call that needs more is refused with
    /// [`AttentionError::CacheFull`] (see [`growable`](Self::growable)). A capacity of 0 is
    /// treated as 1.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::of(Kind::Slots {
            capacity: Some(capacity.max(1)),
            growable: false,
        })
    }

    /// Lets a cache of [`with_capacity`](Self::with_capacity) double its capacity when a call
    /// needs more (each doubling copies the cache once). No effect on the other kinds.
    pub fn growable(mut self) -> Self {
        if let Kind::Slots { growable, .. } = &mut self.kind {
            *growable = true;
        }
        self
    }

    /// A sliding-window cache: each query sees itself and the `window − 1` tokens before it
    /// (Mistral-style local attention), kept in a ring buffer of `window` slots per sequence. A
    /// window of 0 is treated as 1.
    pub fn sliding(window: usize) -> Self {
        Self::of(Kind::Ring {
            window: window.max(1),
        })
    }

    /// The cache of earlier versions: every call concatenates the new keys and values to the
    /// cached ones (`Tensor::cat`, a copy of the whole cache per call; O(T²) copying over T
    /// tokens). Kept as the baseline `examples/decode` measures the preallocated cache
    /// against; sequences of different lengths are not supported.
    pub fn concatenating() -> Self {
        Self::of(Kind::Concatenating)
    }

    /// Tokens of the longest sequence decoded so far (including those a sliding cache has
    /// dropped).
    pub fn len(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0)
    }

    /// Tokens decoded so far, per sequence of the batch (empty before the first call).
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Whether nothing was decoded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens the cache holds now for its longest sequence (at most the window of a sliding
    /// cache).
    pub fn cached(&self) -> usize {
        match self.kind {
            Kind::Ring { window } => self.len().min(window),
            _ => self.len(),
        }
    }

    /// Slots per sequence: the capacity of a preallocated cache (`None` before a growable
    /// cache's first call and for a concatenating cache), the window of a sliding one.
    pub fn capacity(&self) -> Option<usize> {
        match self.kind {
            Kind::Slots { capacity, .. } => capacity,
            Kind::Ring { window } => Some(window),
            Kind::Concatenating => None,
        }
    }

    /// The window of a sliding cache.
    pub fn window(&self) -> Option<usize> {
        match self.kind {
            Kind::Ring { window } => Some(window),
            _ => None,
        }
    }

    /// Forgets every token and keeps the kind, window, capacity and the allocated slots (the
    /// next call reuses them when its batch, heads and device are the same; a concatenating
    /// cache lets its tokens go).
    pub fn clear(&mut self) {
        self.lengths.clear();
        if self.kind == Kind::Concatenating {
            self.key = None;
            self.value = None;
        }
    }

    /// The first position of each of `b` sequences in this call (their lengths so far).
    fn starts(&self, b: usize) -> Vec<usize> {
        if self.lengths.is_empty() {
            vec![0; b]
        } else {
            self.lengths.clone()
        }
    }

    /// Checks that new keys `[b, h_kv, t, d_k]` and values `[b, h_kv, t, d_v]` belong to the
    /// cache's batch, heads and device. A cache holding no token (new, cleared, or after a
    /// failed first call) takes any: slots of another shape, dtype or device are let go.
    fn check_heads(&mut self, key: &Tensor<4>, value: &Tensor<4>) -> Result<(), AttentionError> {
        let (Some(old_key), Some(old_value)) = (&self.key, &self.value) else {
            return Ok(());
        };
        let (old, new) = (old_key.dims(), key.dims());
        let (old_v, new_v) = (old_value.dims(), value.dims());
        let same_shape =
            old[0] == new[0] && old[1] == new[1] && old[3] == new[3] && old_v[3] == new_v[3];
        if self.lengths.is_empty() {
            let same_place = old_key.device() == key.device()
                && old_key.is_autodiff() == key.is_autodiff()
                && old_key.dtype() == key.dtype()
                && old_value.dtype() == value.dtype();
            if !(same_shape && same_place) {
                self.key = None;
                self.value = None;
            }
            return Ok(());
        }
        if !same_shape {
            return Err(AttentionError::Shape {
                what: "cached decoding input",
                expected: format!(
                    "keys [b = {}, h_kv = {}, t, d_k = {}] and values [.., d_v = {}] like the cache's",
                    old[0], old[1], old[3], old_v[3]
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
        // A cache holding tokens stores them in one dtype: new keys or values of another would
        // fail inside the slot assignment, so they are refused here, by name.
        for (what, old, new) in [
            ("cached keys", old_key.dtype(), key.dtype()),
            ("cached values", old_value.dtype(), value.dtype()),
        ] {
            if old != new {
                return Err(AttentionError::DtypeMismatch {
                    query: format!("{new:?}"),
                    other: what,
                    other_dtype: format!("{old:?}"),
                });
            }
        }
        Ok(())
    }

    /// Makes room for `needed` tokens per sequence in a cache of slots, allocating it at the
    /// first call and doubling a growable one; keys and values are shaped like `key` and
    /// `value` `[b, h_kv, t, d]`.
    fn reserve(
        &mut self,
        needed: usize,
        key: &Tensor<4>,
        value: &Tensor<4>,
    ) -> Result<(), AttentionError> {
        let (slots, growable) = match self.kind {
            Kind::Slots { capacity, growable } => (capacity, growable),
            Kind::Ring { window } => (Some(window), false),
            Kind::Concatenating => return Ok(()),
        };
        let allocated = self.key.as_ref().map(|k| k.dims()[2]);
        let capacity = match slots.or(allocated) {
            // The next power of two above the first call: room for the tokens that follow.
            None => (needed + 1).next_power_of_two().max(INITIAL_CAPACITY),
            Some(c) if needed <= c => c,
            Some(c) if growable => {
                let mut c = c;
                while c < needed {
                    c = c.saturating_mul(2);
                }
                c
            }
            Some(capacity) => return Err(AttentionError::CacheFull { capacity, needed }),
        };
        if allocated != Some(capacity) {
            self.key = Some(grown(self.key.take(), key, capacity));
            self.value = Some(grown(self.value.take(), value, capacity));
        }
        if let Kind::Slots { capacity: c, .. } = &mut self.kind {
            *c = Some(capacity);
        }
        Ok(())
    }
}

/// `old` `[b, h_kv, slots, d]` (or nothing) copied into a zeroed tensor of `capacity` slots,
/// shaped like `like` `[b, h_kv, t, d]`.
fn grown(old: Option<Tensor<4>>, like: &Tensor<4>, capacity: usize) -> Tensor<4> {
    let [b, h_kv, _, d] = like.dims();
    let fresh = Tensor::<4>::zeros([b, h_kv, capacity, d], (&like.device(), like.dtype()));
    match old {
        Some(old) => {
            let slots = old.dims()[2];
            fresh.slice_assign(s![.., .., 0..slots, ..], old)
        }
        None => fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::DType;

    /// New keys or values of another dtype than the cache's tokens are refused by name, never
    /// passed on to the slot assignment (issue 31).
    #[test]
    fn a_call_in_another_dtype_is_refused_by_name() {
        let device = Device::flex();
        let stored = Tensor::<4>::zeros([1, 2, 4, 8], &device);
        let mut cache = KvCache::new();
        cache.key = Some(stored.clone());
        cache.value = Some(stored);
        cache.lengths = vec![3];
        let new = Tensor::<4>::zeros([1, 2, 1, 8], (&device, DType::F16));
        let e = cache.check_heads(&new, &new).unwrap_err();
        assert!(
            matches!(
                e,
                AttentionError::DtypeMismatch {
                    other: "cached keys",
                    ..
                }
            ),
            "{e}"
        );
        let same = Tensor::<4>::zeros([1, 2, 1, 8], &device);
        assert!(cache.check_heads(&same, &same).is_ok());
        // An empty cache takes any dtype (it lets its slots go).
        cache.lengths.clear();
        assert!(cache.check_heads(&new, &new).is_ok());
        assert!(cache.key.is_none());
    }
}
