//! The CPU kernel's per-thread buffers of one query block, the tiles' ones starting on a page
//! boundary.

use super::shape::{KernelShape, Tiles};
use super::stats_scratch::StatsScratch;

/// Per-thread buffers of one query block.
pub(crate) struct Scratch {
    /// `[query_block, key_block]` scores, then probabilities.
    pub(crate) scores: PageAligned,
    /// `[query_block, d_v]` unnormalized output.
    pub(crate) acc: PageAligned,
    /// Running max per query.
    pub(crate) row_max: Vec<f32>,
    /// Running sum of exponentials per query.
    pub(crate) row_sum: Vec<f32>,
    /// The statistics' accumulators per query (used when they are asked for).
    pub(crate) stats: StatsScratch,
}

impl Scratch {
    pub(crate) fn new(shape: &KernelShape, tiles: Tiles) -> Self {
        Self {
            scores: PageAligned::zeros(tiles.query_block * tiles.key_block),
            acc: PageAligned::zeros(tiles.query_block * shape.dims.d_v),
            row_max: vec![f32::NEG_INFINITY; tiles.query_block],
            row_sum: vec![0.0; tiles.query_block],
            stats: StatsScratch::new(tiles.query_block),
        }
    }
}

/// Bytes of a page: where the scratch buffers start.
const PAGE: usize = 4096;

/// A zeroed `f32` buffer that starts on a page boundary, so that the cache sets its tiles fall
/// in do not depend on what the heap held before the call (one more allocation before a call,
/// such as the statistics' buffer, moved the scratch; an extra allocation of that size in the
/// call without statistics moved the bench's ratio by about a point).
pub(crate) struct PageAligned {
    data: Vec<f32>,
    offset: usize,
    len: usize,
}

impl PageAligned {
    fn zeros(len: usize) -> Self {
        let lanes = PAGE / std::mem::size_of::<f32>();
        let data = vec![0.0f32; len + lanes];
        // Elements to skip to the first page boundary (at most a page's worth).
        let offset = data.as_ptr().align_offset(PAGE).min(lanes);
        Self { data, offset, len }
    }
}

impl std::ops::Deref for PageAligned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data[self.offset..][..self.len]
    }
}

impl std::ops::DerefMut for PageAligned {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data[self.offset..][..self.len]
    }
}
