//! Cached decoding of the multi-head layer: project the new tokens, write their keys and values
//! into the cache, attend the new queries to every token the cache holds for their sequence.

use std::ops::Range;

use burn::prelude::*;
use burn::tensor::TensorData;

use super::positions::Positions;
use super::{Kind, KvCache};
use crate::error::AttentionError;
use crate::mask::{broadcast_or, padding_mask_from_lengths};
use crate::mha::{MultiHeadSdpa, MultiHeadSdpaInput, MultiHeadSdpaOutput};
use crate::types::check_broadcast;
use crate::types::{CausalAlignment, Window};
use crate::vocabulary::AttentionPath;

/// What one cached call adds: `counts[r]` of the `t` new tokens of row r, after its
/// `starts[r]` tokens seen before.
struct Step {
    starts: Vec<usize>,
    counts: Vec<usize>,
    t: usize,
}

impl Step {
    /// Tokens of row r after the call.
    fn ends(&self) -> Vec<usize> {
        self.starts
            .iter()
            .zip(&self.counts)
            .map(|(s, c)| s + c)
            .collect()
    }

    /// Whether every row starts at the same position and adds all `t` tokens: then the key
    /// slots are the positions of one diagonal and the input's masks apply as they are.
    fn uniform(&self) -> bool {
        self.starts.iter().all(|&s| s == self.starts[0]) && self.counts.iter().all(|&c| c == self.t)
    }

    /// Groups of rows written together: all rows at once when they share start and count.
    fn row_groups(&self) -> Vec<(Range<usize>, usize, usize)> {
        let b = self.starts.len();
        let shared = self.starts.iter().all(|&s| s == self.starts[0])
            && self.counts.iter().all(|&c| c == self.counts[0]);
        if shared {
            vec![(0..b, self.starts[0], self.counts[0])]
        } else {
            (0..b)
                .map(|r| (r..r + 1, self.starts[r], self.counts[r]))
                .collect()
        }
    }
}

/// `slot` `[b, h_kv, slots, d]` with `new` written over `rows` × `slots` (in place when the
/// cache holds the only reference to its storage).
fn assign(slot: &mut Option<Tensor<4>>, rows: Range<usize>, slots: Range<usize>, new: Tensor<4>) {
    if let Some(storage) = slot.take() {
        *slot = Some(storage.slice_assign(s![rows, .., slots, ..], new));
    }
}

impl KvCache {
    /// Refuses what this cache cannot serve before anything is projected or written.
    fn check_call(&self, input: &MultiHeadSdpaInput, step: &Step) -> Result<(), AttentionError> {
        let b = step.starts.len();
        if !self.lengths.is_empty() && self.lengths.len() != b {
            return Err(AttentionError::Shape {
                what: "cached decoding input",
                expected: format!("[b = {}, t, d_model] like the cache's", self.lengths.len()),
                got: input.query.dims().to_vec(),
            });
        }
        let invalid = |field, value: String, reason: &str| AttentionError::InvalidConfig {
            field,
            value,
            reason: reason.into(),
        };
        if let Some(count) = step.counts.iter().find(|&&c| c > step.t) {
            return Err(invalid(
                "new_tokens",
                format!("{:?}", step.counts),
                &format!(
                    "each row adds at most the t = {} tokens of the input, not {count}",
                    step.t
                ),
            ));
        }
        let named = [
            ("mask", input.mask.is_some()),
            ("bias", input.bias.is_some()),
            ("padding_mask", input.padding_mask.is_some()),
            ("segments", input.segments.is_some()),
        ];
        let given = named
            .iter()
            .find(|(_, given)| *given)
            .map(|(name, _)| *name);
        match self.kind {
            Kind::Ring { .. } if input.window.is_some() => Err(invalid(
                "window",
                format!("{:?}", input.window),
                "a sliding-window cache sets the window itself",
            )),
            Kind::Ring { .. } if given.is_some() => Err(invalid(
                given.unwrap_or_default(),
                "given".into(),
                "a sliding-window cache keeps its keys in a ring buffer, whose slots are not \
                 positions: masks, biases, padding and segments are not supported with it \
                 (causal masking and ALiBi are); use a cache of slots",
            )),
            Kind::Concatenating if !step.uniform() => Err(invalid(
                "new_tokens",
                format!("{:?} after {:?}", step.counts, step.starts),
                "the concatenating cache holds sequences of one length; use KvCache::new()",
            )),
            Kind::Slots { .. }
                if !step.uniform()
                    && (input.padding_mask.is_some() || input.segments.is_some()) =>
            {
                Err(invalid(
                    given.unwrap_or_default(),
                    "given".into(),
                    "sequences of different lengths: the cache hides each one's padding itself, \
                     and padding masks and segments are not supported",
                ))
            }
            _ => Ok(()),
        }
    }

    /// Writes the new keys `[b, h_kv, t, d_k]` and values of the call into their slots: row
    /// r's token i at slot `starts[r] + i` (modulo the window of a ring, whose earlier slots a
    /// call of more than `window` tokens overwrites).
    fn write(&mut self, key: &Tensor<4>, value: &Tensor<4>, step: &Step) {
        let window = self.window();
        for (rows, start, count) in step.row_groups() {
            let keep = window.map_or(count, |w| count.min(w));
            let mut i = count - keep;
            while i < count {
                let position = start + i;
                let (slot, run) = match window {
                    Some(w) => (position % w, (w - position % w).min(count - i)),
                    None => (position, count - i),
                };
                let new_tokens = i..i + run;
                let key = key
                    .clone()
                    .slice(s![rows.clone(), .., new_tokens.clone(), ..]);
                let value = value.clone().slice(s![rows.clone(), .., new_tokens, ..]);
                assign(&mut self.key, rows.clone(), slot..slot + run, key);
                assign(&mut self.value, rows.clone(), slot..slot + run, value);
                i += run;
            }
        }
    }

    /// The first `m` slots of the keys and values `[b, h_kv, m, d]`.
    fn view(&self, m: usize) -> Option<(Tensor<4>, Tensor<4>)> {
        let (key, value) = (self.key.as_ref()?, self.value.as_ref()?);
        Some((
            key.clone().slice(s![.., .., 0..m, ..]),
            value.clone().slice(s![.., .., 0..m, ..]),
        ))
    }
}

/// The input with its causal mask, window (`window`, on the positions) and ALiBi turned into a
/// mask and bias over the key slots of `positions`, combined with the input's own mask and
/// bias.
fn positioned(
    mut input: MultiHeadSdpaInput,
    positions: &Positions,
    window: Option<Window>,
    scores: [usize; 4],
) -> Result<MultiHeadSdpaInput, AttentionError> {
    let device = input.query.device();
    let mask = positions.mask(input.causal, window, &device);
    input.mask = Some(match input.mask.take() {
        Some(user) => {
            check_broadcast("mask", user.dims(), scores)?;
            broadcast_or(user, mask)
        }
        None => mask,
    });
    if let Some(slopes) = input.alibi_slopes.take() {
        if slopes.dims()[0] != scores[1] {
            return Err(AttentionError::Shape {
                what: "alibi slopes",
                expected: format!("[h = {}]", scores[1]),
                got: slopes.dims().to_vec(),
            });
        }
        let alibi = positions.alibi(slopes);
        input.bias = Some(match input.bias.take() {
            Some(user) => {
                check_broadcast("bias", user.dims(), scores)?;
                alibi + user
            }
            None => alibi,
        });
    }
    input.causal = false;
    input.window = None;
    Ok(input)
}

/// Whether a call of one token per sequence needs nothing but each sequence's filled slots: nothing
/// of it names keys by position (masks, biases, padding, segments, windows and ALiBi do; weights
/// and scores would come back over slots rather than positions).
fn one_token_plain(input: &MultiHeadSdpaInput) -> bool {
    input.mask.is_none()
        && input.bias.is_none()
        && input.padding_mask.is_none()
        && input.segments.is_none()
        && input.window.is_none()
        && input.alibi_slopes.is_none()
        && !input.need_weights
        && !input.need_scores
}

impl MultiHeadSdpa {
    /// Cached decoding: attends the new tokens `x` `[b, t, d_model]` (the input's query; its key
    /// and value must be the same tokens) to every token in `cache` and to themselves, then
    /// keeps their keys and values in the cache. Ask for `.causal()` when t > 1: the new tokens
    /// then see the cache and the new tokens before them. Masks and biases, if any, cover the
    /// keys `0 .. cache.len()` after the call (token j of each sequence); a sliding cache
    /// refuses them.
    ///
    /// Decoding a sequence token by token gives the last rows of the full causal forward over
    /// it, to float tolerance (tested). A call that fails leaves the lengths, and every token a
    /// later call can see, unchanged (it may have allocated or grown the slots, or written into
    /// slots no query sees).
    ///
    /// # Shapes
    /// - input: query = key = value `[b, t, d_model]`
    /// - context: `[b, t, d_model]`
    pub fn try_forward_cache(
        &self,
        input: MultiHeadSdpaInput,
        cache: &mut KvCache,
    ) -> Result<MultiHeadSdpaOutput, AttentionError> {
        let [b, t, _] = input.query.dims();
        self.decode(input, vec![t; b], cache)
    }

    /// Cached decoding: see [`try_forward_cache`](Self::try_forward_cache).
    ///
    /// # Shapes
    /// - input: query = key = value `[b, t, d_model]`
    /// - context: `[b, t, d_model]`
    ///
    /// # Panics
    /// With the message of [`try_forward_cache`](Self::try_forward_cache)'s error.
    pub fn forward_cache(
        &self,
        input: MultiHeadSdpaInput,
        cache: &mut KvCache,
    ) -> MultiHeadSdpaOutput {
        self.try_forward_cache(input, cache)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Cached decoding of sequences of different lengths: row r of the input `[b, t, d_model]`
    /// holds `new_tokens[r] ≤ t` new tokens of sequence r followed by padding. Each sequence
    /// continues at its own length (rotary positions too), sees only its own tokens, and its
    /// padding is neither attended nor cached; the context rows of the padding are the output
    /// projection of zeros. A batch of prompts of different lengths prefills in one call
    /// (right-padded to the longest) and then decodes one token per row per call
    /// (`new_tokens` all 1, or 0 for a sequence that has finished).
    ///
    /// Gives each sequence what decoding it alone gives, to float tolerance (tested).
    ///
    /// ```
    /// # use burn::prelude::*;
    /// use burn_sdpa::{KvCache, MultiHeadSdpaInput, MultiHeadSdpaConfig};
    /// let device = Device::flex();
    /// let mha = MultiHeadSdpaConfig::new(16, 4).init(&device);
    /// let mut cache = KvCache::new();
    /// // Prompts of 5 and 2 tokens, right-padded to 5.
    /// let prompts = Tensor::<3>::zeros([2, 5, 16], &device);
    /// mha.forward_cache_ragged(MultiHeadSdpaInput::self_attn(prompts).causal(), &[5, 2], &mut cache);
    /// let tokens = Tensor::<3>::zeros([2, 1, 16], &device);
    /// mha.forward_cache_ragged(MultiHeadSdpaInput::self_attn(tokens), &[1, 1], &mut cache);
    /// assert_eq!(cache.lengths(), [6, 3]);
    /// ```
    ///
    /// # Shapes
    /// - input: query = key = value `[b, t, d_model]`; `new_tokens`: b counts
    /// - context: `[b, t, d_model]`
    pub fn try_forward_cache_ragged(
        &self,
        input: MultiHeadSdpaInput,
        new_tokens: &[usize],
        cache: &mut KvCache,
    ) -> Result<MultiHeadSdpaOutput, AttentionError> {
        let b = input.query.dims()[0];
        if new_tokens.len() != b {
            return Err(AttentionError::Shape {
                what: "new_tokens",
                expected: format!("one count per batch row (b = {b})"),
                got: vec![new_tokens.len()],
            });
        }
        self.decode(input, new_tokens.to_vec(), cache)
    }

    /// Cached decoding of sequences of different lengths: see
    /// [`try_forward_cache_ragged`](Self::try_forward_cache_ragged).
    ///
    /// # Shapes
    /// - input: query = key = value `[b, t, d_model]`; `new_tokens`: b counts
    /// - context: `[b, t, d_model]`
    ///
    /// # Panics
    /// With the message of [`try_forward_cache_ragged`](Self::try_forward_cache_ragged)'s
    /// error.
    pub fn forward_cache_ragged(
        &self,
        input: MultiHeadSdpaInput,
        new_tokens: &[usize],
        cache: &mut KvCache,
    ) -> MultiHeadSdpaOutput {
        self.try_forward_cache_ragged(input, new_tokens, cache)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// One new token per sequence with nothing that names keys by position: write it, then
    /// attend to the filled slots of its sequence, the others hidden as padding (a sequence with
    /// no new token has no query and sees nothing). When the module's path is the CPU kernel,
    /// the query attends to the whole storage, which the kernel reads where it lies and whose
    /// padded tiles it skips: nothing is copied. Otherwise it attends to the slots the longest
    /// sequence fills.
    fn one_token(
        &self,
        input: MultiHeadSdpaInput,
        query: Tensor<4>,
        key: Tensor<4>,
        value: Tensor<4>,
        step: &Step,
        cache: &mut KvCache,
    ) -> Result<MultiHeadSdpaOutput, AttentionError> {
        let window = cache.window();
        let held: Vec<usize> = step
            .ends()
            .iter()
            .map(|&end| window.map_or(end, |w| end.min(w)))
            .collect();
        let width = held.iter().copied().max().unwrap_or(0);
        cache.reserve(width, &key, &value)?;
        // Slots past a sequence's length hold nothing it sees, and a ring's new token replaces
        // the one `window` positions back, which no query from here on sees: writing first is
        // safe even if the call then fails.
        cache.write(&key, &value, step);
        let visible: Vec<i64> = held
            .iter()
            .zip(&step.counts)
            .map(|(&held, &count)| if count == 0 { 0 } else { held as i64 })
            .collect();
        let device = query.device();
        let lengths =
            Tensor::<1, Int>::from_data(TensorData::new(visible.clone(), [visible.len()]), &device);
        let mut input = input;
        // A single query per sequence at its newest position sees every token its sequence holds.
        input.causal = false;
        if let (Some(keys), Some(values)) = (cache.key.clone(), cache.value.clone()) {
            let slots = keys.dims()[2];
            let whole = input
                .clone()
                .padding_mask(padding_mask_from_lengths(lengths.clone(), slots));
            let probe = whole
                .clone()
                .with_tensors(query.clone(), keys.clone(), values.clone());
            if self.attention.path(&probe)? == AttentionPath::CpuKernel {
                return self.attend(whole, query, keys, values);
            }
        }
        let (keys, values) = cache.view(width).unwrap_or((key, value));
        if visible.iter().any(|&v| v as usize != width) {
            input = input.padding_mask(padding_mask_from_lengths(lengths, width));
        }
        self.attend(input, query, keys, values)
    }

    fn decode(
        &self,
        input: MultiHeadSdpaInput,
        counts: Vec<usize>,
        cache: &mut KvCache,
    ) -> Result<MultiHeadSdpaOutput, AttentionError> {
        let dims = [input.query.dims(), input.key.dims(), input.value.dims()];
        if dims[0] != dims[1] || dims[0] != dims[2] {
            return Err(AttentionError::Shape {
                what: "cached decoding input",
                expected: "query, key and value of the same tokens [b, t, d_model]".into(),
                got: dims.concat(),
            });
        }
        let [b, t, _] = dims[0];
        let step = Step {
            starts: cache.starts(b),
            counts,
            t,
        };
        cache.check_call(&input, &step)?;
        // The new tokens follow each sequence's tokens so far (rotary positions, if any).
        let (query, key, value) =
            self.project_heads_rows(&input, &step.starts, Some(&step.counts))?;
        cache.check_heads(&key, &value)?;
        let ends = step.ends();
        let longest = ends.iter().copied().max().unwrap_or(0);
        let scores = |m: usize| [b, self.n_heads, t, m];
        // Key slot j is position j of every sequence, on the diagonal the module's masks use:
        // the input's causal mask, window and ALiBi apply as they are.
        let on_diagonal =
            step.uniform() && self.attention.causal_alignment == CausalAlignment::BottomRight;
        let out = match cache.kind {
            Kind::Slots { .. } | Kind::Ring { .. } if t == 1 && one_token_plain(&input) => {
                self.one_token(input, query, key, value, &step, cache)?
            }
            Kind::Concatenating => {
                let (key, value) = match cache.view(cache.len()) {
                    // [b, h_kv, cached, d] ++ [b, h_kv, t, d] -> [b, h_kv, cached + t, d]
                    Some((old_key, old_value)) => (
                        Tensor::cat(vec![old_key, key], 2),
                        Tensor::cat(vec![old_value, value], 2),
                    ),
                    None => (key, value),
                };
                // A call that fails leaves the cache as it was.
                let out = self.attend(input, query, key.clone(), value.clone())?;
                cache.key = Some(key);
                cache.value = Some(value);
                out
            }
            Kind::Slots { .. } => {
                // Slots past a sequence's length hold nothing it sees: writing first is safe
                // even if the call then fails.
                cache.reserve(longest, &key, &value)?;
                cache.write(&key, &value, &step);
                let (keys, values) = cache.view(longest).unwrap_or((key, value));
                let input = if on_diagonal {
                    input
                } else {
                    let positions =
                        Positions::new(&step.starts, &step.counts, t).with_slots(&ends, longest);
                    let window = input.window;
                    positioned(input, &positions, window, scores(longest))?
                };
                self.attend(input, query, keys, values)?
            }
            Kind::Ring { window } if t == 1 => {
                // The new token overwrites the one `window` positions back, which no query
                // from here on sees: writing first is safe even if the call then fails.
                let m = longest.min(window);
                cache.reserve(m, &key, &value)?;
                cache.write(&key, &value, &step);
                let (keys, values) = cache.view(m).unwrap_or((key, value));
                // Every filled slot lies in the window of a uniform batch's one query.
                let input = if on_diagonal && input.alibi_slopes.is_none() {
                    input
                } else {
                    let positions =
                        Positions::new(&step.starts, &step.counts, t).with_ring(&ends, window, m);
                    let band = Some(Window::new(Some(window - 1), None));
                    positioned(input, &positions, band, scores(m))?
                };
                self.attend(input, query, keys, values)?
            }
            Kind::Ring { window } => {
                // Several new tokens: attend to the ring followed by them, then write.
                let filled = step.starts.iter().copied().max().unwrap_or(0).min(window);
                let (keys, values) = match cache.view(filled) {
                    Some((old_key, old_value)) if filled > 0 => (
                        // [b, h_kv, filled, d] ++ [b, h_kv, t, d] -> [b, h_kv, filled + t, d]
                        Tensor::cat(vec![old_key, key.clone()], 2),
                        Tensor::cat(vec![old_value, value.clone()], 2),
                    ),
                    _ => (key.clone(), value.clone()),
                };
                let positions = Positions::new(&step.starts, &step.counts, t)
                    .with_ring(&step.starts, window, filled)
                    .with_new_tokens();
                let band = Some(Window::new(Some(window - 1), None));
                let input = positioned(input, &positions, band, scores(filled + t))?;
                let out = self.attend(input, query, keys, values)?;
                cache.reserve(longest.min(window), &key, &value)?;
                cache.write(&key, &value, &step);
                out
            }
        };
        cache.lengths = ends;
        Ok(out)
    }
}
