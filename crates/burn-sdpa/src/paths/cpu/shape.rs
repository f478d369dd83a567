//! The sizes, options and tile sizes of a CPU kernel call, and the slice-length checks.

use core::ops::Range;

use crate::error::AttentionError;
use crate::types::{AttentionDims, Window};

/// Queries per task of the forward pass (default), chosen with `cargo run --release --example
/// cpu_kernel_tiles` (the sweep is in the README): a `[256, 512]` score tile (512 KiB), the
/// accumulator and the key/value tiles still fit in a 1 MiB L2.
pub const QUERY_BLOCK: usize = 256;
/// Keys per tile of the forward pass (default) for short key sequences.
pub const KEY_BLOCK: usize = 256;
/// Keys per tile of the forward pass once there are at least [`LONG_KEYS`] keys, where the
/// larger tile measured faster (as in PyTorch's CPU kernel, which takes 512 keys from 768 on).
pub const LONG_KEY_BLOCK: usize = 512;
/// From this many keys on, the forward pass takes [`LONG_KEY_BLOCK`] keys per tile.
pub const LONG_KEYS: usize = 768;

/// Sizes and options of one kernel call; the slices are contiguous row-major
/// `q: [batch, n_heads, n, d_k]`, `k: [batch, n_kv_heads, m, d_k]`,
/// `v: [batch, n_kv_heads, m, d_v]`, `out: [batch, n_heads, n, d_v]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelShape {
    /// The sizes (h_kv must divide h).
    pub dims: AttentionDims,
    /// Factor applied to QKᵀ.
    pub scale: f32,
    /// `Some(offset)`: key `j` is visible to query `i` only when `j <= i + offset`.
    pub causal_offset: Option<i64>,
    /// `Some(c)`: the scaled scores s become `c · tanh(s / c)` before the bias.
    pub softcap: Option<f32>,
    /// `Some((window, offset))`: key `j` is visible to query `i` only inside the window's band
    /// around `i + offset` ([`Window::keys`]).
    pub window: Option<(Window, i64)>,
}

impl KernelShape {
    /// A call of these sizes and scale, with no causal mask, soft-cap or window.
    pub fn new(dims: AttentionDims, scale: f32) -> Self {
        Self {
            dims,
            scale,
            causal_offset: None,
            softcap: None,
            window: None,
        }
    }

    /// Checks the slice lengths, the head grouping and the tile sizes against this shape.
    pub fn validate<T>(
        &self,
        tiles: Tiles,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
    ) -> Result<(), AttentionError> {
        let s = &self.dims;
        if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
            return Err(AttentionError::HeadGrouping {
                n_heads: s.n_heads,
                n_kv_heads: s.n_kv_heads,
            });
        }
        if tiles.query_block == 0 || tiles.key_block == 0 {
            return Err(AttentionError::InvalidConfig {
                field: "tiles",
                value: format!("{tiles:?}"),
                reason: "tile sizes must be > 0".into(),
            });
        }
        if let Some(softcap) = self.softcap {
            crate::types::validate_softcap(softcap as f64)?;
        }
        check_len("query slice", q.len(), [s.batch, s.n_heads, s.n, s.d_k])?;
        check_len("key slice", k.len(), [s.batch, s.n_kv_heads, s.m, s.d_k])?;
        check_len("value slice", v.len(), [s.batch, s.n_kv_heads, s.m, s.d_v])?;
        check_len("output slice", out.len(), [s.batch, s.n_heads, s.n, s.d_v])
    }

    /// Keys visible to query `query_idx` under the causal mask and the window (a range whose
    /// start and end never decrease from one query to the next).
    pub(crate) fn visible_keys(&self, query_idx: usize) -> Range<usize> {
        let m = self.dims.m;
        let mut keys = self
            .window
            .map_or(0..m, |(window, offset)| window.keys(query_idx, offset, m));
        if let Some(offset) = self.causal_offset {
            let causal_end = (query_idx as i64 + offset + 1).clamp(0, m as i64) as usize;
            keys.end = keys.end.min(causal_end);
        }
        keys.start..keys.end.max(keys.start)
    }
}

/// Checks that a slice of `len` values holds the row-major `shape`.
pub(crate) fn check_len(
    what: &'static str,
    len: usize,
    shape: [usize; 4],
) -> Result<(), AttentionError> {
    let want = shape.iter().product::<usize>();
    if len == want {
        Ok(())
    } else {
        Err(AttentionError::Shape {
            what,
            expected: format!("{want} values for the shape {shape:?}"),
            got: vec![len],
        })
    }
}

/// Tile sizes of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    /// Queries per task.
    pub query_block: usize,
    /// Keys per tile.
    pub key_block: usize,
}

impl Default for Tiles {
    /// [`QUERY_BLOCK`] × [`KEY_BLOCK`].
    fn default() -> Self {
        Self {
            query_block: QUERY_BLOCK,
            key_block: KEY_BLOCK,
        }
    }
}

impl Tiles {
    /// These tiles, shrunk for packed documents of at least `shortest` tokens: a tile is at most
    /// the documents' length (a power of two, 32 at least), so that the tiles between documents
    /// are skipped whole instead of computed and masked.
    pub fn fitted_to(self, shortest: Option<usize>) -> Self {
        let Some(shortest) = shortest else {
            return self;
        };
        let fit = |block: usize| {
            let cap = shortest.max(32).next_power_of_two();
            let cap = if cap > shortest.max(32) { cap / 2 } else { cap };
            block.min(cap.max(32))
        };
        Self {
            query_block: fit(self.query_block),
            key_block: fit(self.key_block),
        }
    }

    /// The forward pass's tiles for `m` keys: [`QUERY_BLOCK`] × [`KEY_BLOCK`], or
    /// [`LONG_KEY_BLOCK`] keys from [`LONG_KEYS`] on.
    pub fn for_keys(m: usize) -> Self {
        Self {
            query_block: QUERY_BLOCK,
            key_block: if m >= LONG_KEYS {
                LONG_KEY_BLOCK
            } else {
                KEY_BLOCK
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_shrink_to_the_shortest_document() {
        let tiles = Tiles::for_keys(1024);
        assert_eq!(tiles.fitted_to(None), tiles);
        let fitted = tiles.fitted_to(Some(128));
        assert_eq!((fitted.query_block, fitted.key_block), (128, 128));
        let fitted = tiles.fitted_to(Some(200));
        assert_eq!((fitted.query_block, fitted.key_block), (128, 128));
        let fitted = tiles.fitted_to(Some(3));
        assert_eq!((fitted.query_block, fitted.key_block), (32, 32));
        let fitted = tiles.fitted_to(Some(100_000));
        assert_eq!(fitted, tiles);
    }
}
