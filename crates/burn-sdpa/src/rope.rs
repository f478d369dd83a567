//! Rotary positions (RoFormer, Su et al. 2021) for the multi-head layer: queries and keys are
//! rotated by their positions after QK-norm, so that a score depends on the positions only
//! through their difference. Burn's `RotaryEncoding` does the rotation; cached decoding passes
//! the position of the first new token.

use burn::nn::{RotaryEncoding, RotaryEncodingConfig};
use burn::prelude::*;

use crate::error::AttentionError;

/// Rotary positions of [`MultiHeadSdpa`](crate::MultiHeadSdpa)
/// (`MultiHeadSdpaConfig::with_rope(Some(RopeConfig::new(max_positions)))`).
#[derive(Config, Debug)]
pub struct RopeConfig {
    /// Positions the layer can encode: the longest sequence, prompt and generated tokens
    /// together (the rotations are precomputed for them).
    pub max_positions: usize,
    /// Base of the rotation frequencies (10 000 in RoFormer and LLaMA).
    #[config(default = 10000.0)]
    pub theta: f64,
}

impl RopeConfig {
    /// Checks the configuration for heads of size `d_k` (which must be even: the rotation
    /// pairs features).
    pub(crate) fn validate(&self, d_k: usize) -> Result<(), AttentionError> {
        if !d_k.is_multiple_of(2) {
            return Err(AttentionError::InvalidConfig {
                field: "rope",
                value: format!("d_k = {d_k}"),
                reason: "rotary positions pair the features of a head: d_k must be even".into(),
            });
        }
        if self.max_positions == 0 {
            return Err(AttentionError::InvalidConfig {
                field: "rope.max_positions",
                value: "0".into(),
                reason: "must be > 0".into(),
            });
        }
        if !(self.theta.is_finite() && self.theta > 1.0 && (self.theta as f32).is_finite()) {
            return Err(AttentionError::InvalidConfig {
                field: "rope.theta",
                value: self.theta.to_string(),
                reason: "must be a finite number > 1".into(),
            });
        }
        Ok(())
    }

    /// The rotations for heads of size `d_k`.
    pub(crate) fn init(&self, d_k: usize, device: &Device) -> RotaryEncoding {
        RotaryEncodingConfig::new(self.max_positions, d_k)
            .with_theta(self.theta as f32)
            .init(device)
    }
}

/// `x` `[b, h, len, d_k]` rotated for the positions `start .. start + len`, or an error naming
/// positions beyond what the layer encodes.
fn rotate(rope: &RotaryEncoding, x: Tensor<4>, start: usize) -> Result<Tensor<4>, AttentionError> {
    let len = x.dims()[2];
    let max = rope.freq_complex.dims()[0];
    match start.checked_add(len) {
        Some(end) if end <= max => Ok(rope.apply(x, start)),
        _ => Err(AttentionError::InvalidConfig {
            field: "rope positions",
            value: format!("{start}..{}", start.saturating_add(len)),
            reason: format!("the layer encodes positions below {max} (RopeConfig::max_positions)"),
        }),
    }
}

/// `x` `[b, h, len, d_k]` with batch row r rotated for the positions
/// `starts[r] .. starts[r] + len` (one start for every row when `starts` holds one; cached
/// decoding of sequences of different lengths passes one per row). With `counts`, only row r's
/// first `counts[r]` tokens must lie below the table's end: the rest are padding, rotated when
/// they fit and left as they are when they do not (nothing reads them).
pub(crate) fn rotate_rows(
    rope: &RotaryEncoding,
    x: Tensor<4>,
    starts: &[usize],
    counts: Option<&[usize]>,
) -> Result<Tensor<4>, AttentionError> {
    let [b, _, len, _] = x.dims();
    let max = rope.freq_complex.dims()[0];
    let fits = |start: usize| start.checked_add(len).is_some_and(|end| end <= max);
    if starts.is_empty() {
        return Ok(x);
    }
    // Row r's start: one for every row, or one per row.
    let start_of = |r: usize| starts[if starts.len() == 1 { 0 } else { r }];
    let shared = starts.iter().all(|&s| s == starts[0]);
    if shared && (counts.is_none() || fits(starts[0])) {
        return rotate(rope, x, starts[0]);
    }
    let rows = (0..b)
        .map(|r| {
            let start = start_of(r);
            // [b, h, len, d_k] -> [1, h, len, d_k], row r
            let row = x.clone().slice(s![r..r + 1, .., .., ..]);
            match counts.and_then(|c| c.get(r).copied()) {
                Some(count) if !fits(start) && count < len => {
                    // The row's tokens rotated, its padding left as it is.
                    let tokens = row.clone().slice(s![.., .., 0..count, ..]);
                    let padding = row.slice(s![.., .., count..len, ..]);
                    let tokens = if count > 0 {
                        vec![rotate(rope, tokens, start)?]
                    } else {
                        vec![]
                    };
                    Ok(Tensor::cat([tokens, vec![padding]].concat(), 2))
                }
                _ => rotate(rope, row, start),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Tensor::cat(rows, 0))
}
