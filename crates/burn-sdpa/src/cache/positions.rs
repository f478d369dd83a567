//! The position in its sequence of every key a cached call attends and of every new query, and
//! the masks built from them when the key slots are not the positions of one shared diagonal:
//! sequences of different lengths, padded new tokens, or a ring buffer.

use burn::prelude::*;
use burn::tensor::TensorData;

use crate::types::Window;

/// Positions of the queries `[b][t]` and keys `[b][m]` of one cached call; `None` marks a
/// padded query (its row sees nothing and gives zeros) or an empty key slot.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Positions {
    queries: Vec<Vec<Option<usize>>>,
    keys: Vec<Vec<Option<usize>>>,
}

/// The token in slot `slot` of a ring of `window` slots holding the tokens before `end`
/// (the last `window` of them), or `None` when the slot is still empty.
fn ring_position(slot: usize, end: usize, window: usize) -> Option<usize> {
    (slot < end.min(window)).then(|| end - 1 - (end - 1 - slot) % window)
}

impl Positions {
    /// New tokens: row r's queries `starts[r] ..` for its first `counts[r]` of `t` rows, the
    /// rest padding; no keys yet.
    pub(super) fn new(starts: &[usize], counts: &[usize], t: usize) -> Self {
        let queries = starts
            .iter()
            .zip(counts)
            .map(|(&start, &count)| (0..t).map(|i| (i < count).then_some(start + i)).collect())
            .collect();
        Self {
            queries,
            keys: vec![Vec::new(); starts.len()],
        }
    }

    /// Appends `m` key slots of a cache of slots holding row r's tokens `0 .. ends[r]`.
    pub(super) fn with_slots(mut self, ends: &[usize], m: usize) -> Self {
        for (keys, &end) in self.keys.iter_mut().zip(ends) {
            keys.extend((0..m).map(|j| (j < end).then_some(j)));
        }
        self
    }

    /// Appends the first `m` slots of a ring of `window` slots holding row r's tokens before
    /// `ends[r]`.
    pub(super) fn with_ring(mut self, ends: &[usize], window: usize, m: usize) -> Self {
        for (keys, &end) in self.keys.iter_mut().zip(ends) {
            keys.extend((0..m).map(|slot| ring_position(slot, end, window)));
        }
        self
    }

    /// Appends the new tokens themselves as `t` keys (the queries' positions).
    pub(super) fn with_new_tokens(mut self) -> Self {
        for (keys, queries) in self.keys.iter_mut().zip(&self.queries) {
            keys.extend(queries.iter().copied());
        }
        self
    }

    /// `[b, 1, t, m]`, true = masked: a key is visible to a query when both exist, the key is
    /// not after the query (`causal`) and lies in the window around the query's position.
    pub(super) fn mask(
        &self,
        causal: bool,
        window: Option<Window>,
        device: &Device,
    ) -> Tensor<4, Bool> {
        let (b, t, m) = (
            self.queries.len(),
            self.queries[0].len(),
            self.keys[0].len(),
        );
        let visible = |q: usize, k: usize| {
            (!causal || k <= q)
                && window.is_none_or(|w| {
                    w.left.is_none_or(|left| k.saturating_add(left) >= q)
                        && w.right.is_none_or(|right| k <= q.saturating_add(right))
                })
        };
        let data: Vec<bool> = self
            .queries
            .iter()
            .zip(&self.keys)
            .flat_map(|(queries, keys)| {
                queries.iter().flat_map(move |&q| {
                    keys.iter().map(move |&k| match (q, k) {
                        (Some(q), Some(k)) => !visible(q, k),
                        _ => true,
                    })
                })
            })
            .collect();
        Tensor::from_data(TensorData::new(data, [b, 1, t, m]), device)
    }

    /// ALiBi at these positions, `[b, h, t, m]`: `−slope_h · |q − k|` (0 where a query or key
    /// is missing; the mask hides those).
    pub(super) fn alibi(&self, slopes: Tensor<1>) -> Tensor<4> {
        let device = slopes.device();
        let (b, t, m) = (
            self.queries.len(),
            self.queries[0].len(),
            self.keys[0].len(),
        );
        let data: Vec<f32> = self
            .queries
            .iter()
            .zip(&self.keys)
            .flat_map(|(queries, keys)| {
                queries.iter().flat_map(move |&q| {
                    keys.iter().map(move |&k| match (q, k) {
                        (Some(q), Some(k)) => q.abs_diff(k) as f32,
                        _ => 0.0,
                    })
                })
            })
            .collect();
        let h = slopes.dims()[0];
        // |q − k| [b, 1, t, m] times −slope [1, h, 1, 1] -> [b, h, t, m]
        let distance = Tensor::<4>::from_data(TensorData::new(data, [b, 1, t, m]), &device);
        distance.mul(slopes.neg().reshape([1, h, 1, 1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_slot_holds_the_latest_token_congruent_to_it() {
        // Window 3 after tokens 0..5: slots hold 3, 4 and 2.
        let held: Vec<_> = (0..3).map(|s| ring_position(s, 5, 3)).collect();
        assert_eq!(held, [Some(3), Some(4), Some(2)]);
        // Before it fills: tokens 0 and 1 in slots 0 and 1, slot 2 empty.
        let held: Vec<_> = (0..3).map(|s| ring_position(s, 2, 3)).collect();
        assert_eq!(held, [Some(0), Some(1), None]);
        assert_eq!(ring_position(0, 0, 3), None);
    }

    #[test]
    fn ragged_rows_mask_their_own_padding_and_future() {
        let device = Device::flex();
        // Row 0: 2 tokens cached, 2 new; row 1: 0 cached, 1 new of t = 2 (one padded query).
        let positions = Positions::new(&[2, 0], &[2, 1], 2).with_slots(&[4, 1], 4);
        let mask: Vec<bool> =
            crate::util::read_back("mask", positions.mask(true, None, &device)).unwrap();
        #[rustfmt::skip]
        let expected = [
            false, false, false, true,  // row 0, query at 2: keys 0..=2
            false, false, false, false, // row 0, query at 3: keys 0..=3
            false, true, true, true,    // row 1, query at 0: key 0
            true, true, true, true,     // row 1, padded query: nothing
        ];
        assert_eq!(mask, expected);
        let window = Window::new(Some(1), Some(0));
        let mask: Vec<bool> =
            crate::util::read_back("mask", positions.mask(false, Some(window), &device)).unwrap();
        assert_eq!(
            &mask[..8],
            [true, false, false, true, true, true, false, false]
        );
    }
}
