//! Packing right operands of the bf16 tile products into the pair layout (`tile_bf16_pairs.rs`
//! describes it): bf16 blocks 16 lines at a time with AVX-512 (16 × 16 transposes of pairs for a
//! transposed block, row interleaves for a row-major one), any other operand value by value.

use super::super::tile::View;
use super::Bf16Operand;
use super::pairs::{DEPTH, TILE, TILE_VALUES, avx512_bf16_detected, even_tiles};

/// `rhs [k, n]` packed in the pair layout: `[⌈n/16⌉ (even), ⌈k/32⌉]` tiles, zero-padded.
pub(super) fn pack_rhs<B: Bf16Operand>(rhs: &View<'_, B>) -> Vec<u16> {
    let (k, n) = (rhs.rows_len(), rhs.cols_len());
    let (col_tiles, depth_tiles) = (even_tiles(n), k.div_ceil(DEPTH));
    let mut packed = vec![0u16; col_tiles * depth_tiles * TILE_VALUES];
    if k == 0 || n == 0 {
        return packed;
    }
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16_detected() {
        if let Some((values, col_stride)) = rhs.col_major_data()
            && let Some(bits) = B::as_bits(values)
        {
            // SAFETY: the CPU has the instructions (checked above); the view's bounds check
            // keeps column j's k values at `j · col_stride` inside `bits`, and `packed` holds
            // every tile of [k, n].
            unsafe { x86_pack::columns(bits, col_stride, k, n, depth_tiles, &mut packed) };
            return packed;
        }
        if let Some((values, row_stride)) = rhs.row_major_data()
            && let Some(bits) = B::as_bits(values)
        {
            // SAFETY: as above, with row i's n values at `i · row_stride`.
            unsafe { x86_pack::rows(bits, row_stride, k, n, depth_tiles, &mut packed) };
            return packed;
        }
    }
    // The u16 index of (row, column): line `row / 2` of the column's tile, slot `row % 2`.
    let line = |pair_idx: usize, col_idx: usize| {
        ((col_idx / TILE) * depth_tiles * (DEPTH / 2) + pair_idx) * 2 * TILE + (col_idx % TILE) * 2
    };
    if let Some(cols) = rhs.col_major() {
        // A transposed block (Kᵀ, Vᵀ): each column is contiguous, and a pair of rows of one
        // column is two adjacent values, moved together.
        for (col_idx, col) in cols.enumerate() {
            for (pair_idx, pair) in col.chunks(2).enumerate() {
                let at = line(pair_idx, col_idx);
                packed[at] = pair[0].bf16_bits();
                if let Some(second) = pair.get(1) {
                    packed[at + 1] = second.bf16_bits();
                }
            }
        }
    } else if let Some(mut rows) = rhs.row_major() {
        // Two rows at a time, interleaved.
        let mut pair_idx = 0;
        while let Some(first) = rows.next() {
            let second = rows.next();
            for (col_idx, value) in first.iter().enumerate() {
                packed[line(pair_idx, col_idx)] = value.bf16_bits();
            }
            for (col_idx, value) in second.into_iter().flatten().enumerate() {
                packed[line(pair_idx, col_idx) + 1] = value.bf16_bits();
            }
            pair_idx += 1;
        }
    } else {
        for row_idx in 0..k {
            for col_idx in 0..n {
                packed[line(row_idx / 2, col_idx) + row_idx % 2] =
                    rhs.at(row_idx, col_idx).bf16_bits();
            }
        }
    }
    packed
}

#[cfg(target_arch = "x86_64")]
mod x86_pack {
    //! Packing bf16 right operands 16 lines at a time: a transposed block by 16 × 16 transposes
    //! of pairs (32-bit values), a row-major one by interleaving two rows.

    use std::arch::x86_64::{
        __m512i, _mm512_maskz_loadu_epi16, _mm512_permutex2var_epi16, _mm512_set_epi16,
        _mm512_setzero_si512, _mm512_shuffle_i32x4, _mm512_storeu_si512, _mm512_unpackhi_epi32,
        _mm512_unpackhi_epi64, _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
    };

    use super::{DEPTH, TILE};

    /// The first `len` (at most 32) u16 from `at` into a vector, zeros after them.
    ///
    /// # Safety
    /// `len` values at `at` are readable; the CPU has AVX-512BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load_u16(at: *const u16, len: usize) -> __m512i {
        let mask = if len >= 32 {
            u32::MAX
        } else {
            (1u32 << len) - 1
        };
        // SAFETY: the masked load reads only the `len` values the caller vouches for.
        unsafe { _mm512_maskz_loadu_epi16(mask, at.cast()) }
    }

    /// A transposed block: column j (`k` values at `j · col_stride`) holds the pairs of column j
    /// of the operand, so line p of a tile is pair p of 16 columns: 16 × 16 transposes of
    /// 32-bit values.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW; column j's k values lie in `bits` for j < n; `packed` holds
    /// `even_tiles(n) · depth_tiles` zeroed tiles.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn columns(
        bits: &[u16],
        col_stride: usize,
        k: usize,
        n: usize,
        depth_tiles: usize,
        packed: &mut [u16],
    ) {
        let zero = _mm512_setzero_si512();
        for col_tile in 0..n.div_ceil(TILE) {
            let cols = TILE.min(n - col_tile * TILE);
            for depth_tile in 0..depth_tiles {
                let depth0 = depth_tile * DEPTH;
                let len = DEPTH.min(k - depth0);
                // rows[c]: the 16 pairs of this depth tile of column (col_tile · 16 + c).
                let mut rows = [zero; TILE];
                for (c, row) in rows.iter_mut().enumerate().take(cols) {
                    let at = (col_tile * TILE + c) * col_stride + depth0;
                    // SAFETY: `len` values of column (col_tile · 16 + c) from depth0 on are
                    // inside `bits` (the caller's contract).
                    *row = unsafe { load_u16(bits.as_ptr().add(at), len) };
                }
                let lines = transpose(rows);
                let first = (col_tile * depth_tiles + depth_tile) * (DEPTH / 2) * 2 * TILE;
                for (p, line) in lines.iter().enumerate() {
                    let at = first + p * 2 * TILE;
                    assert!(at + 2 * TILE <= packed.len());
                    // SAFETY: 32 u16 at `at` are inside `packed` (asserted).
                    unsafe { _mm512_storeu_si512(packed.as_mut_ptr().add(at).cast(), *line) };
                }
            }
        }
    }

    /// The transpose of a 16 × 16 matrix of 32-bit values held one row per vector.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
        // 32-bit interleave: a[2i] lane l = (r2i[4l], r2i+1[4l], r2i[4l+1], r2i+1[4l+1]).
        let mut a = r;
        for i in 0..8 {
            a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // 64-bit interleave: b[4i + c] lane l holds column 4l + c of rows 4i .. 4i + 4.
        let mut b = a;
        for i in 0..4 {
            b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
            b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
        }
        // 128-bit blocks: column 4l + c is lane l of b[c], b[4 + c], b[8 + c], b[12 + c].
        let mut out = b;
        for c in 0..4 {
            let x0 = _mm512_shuffle_i32x4::<0x44>(b[c], b[4 + c]);
            let x1 = _mm512_shuffle_i32x4::<0xEE>(b[c], b[4 + c]);
            let x2 = _mm512_shuffle_i32x4::<0x44>(b[8 + c], b[12 + c]);
            let x3 = _mm512_shuffle_i32x4::<0xEE>(b[8 + c], b[12 + c]);
            out[c] = _mm512_shuffle_i32x4::<0x88>(x0, x2);
            out[4 + c] = _mm512_shuffle_i32x4::<0xDD>(x0, x2);
            out[8 + c] = _mm512_shuffle_i32x4::<0x88>(x1, x3);
            out[12 + c] = _mm512_shuffle_i32x4::<0xDD>(x1, x3);
        }
        out
    }

    /// A row-major block: line p of a tile interleaves rows 2p and 2p + 1 of its 16 columns.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW; row i's n values lie in `bits` at `i · row_stride` for i < k;
    /// `packed` holds `even_tiles(n) · depth_tiles` zeroed tiles.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn rows(
        bits: &[u16],
        row_stride: usize,
        k: usize,
        n: usize,
        depth_tiles: usize,
        packed: &mut [u16],
    ) {
        // Lane 2i takes value i of the first row, lane 2i + 1 value i of the second (index 32
        // on is the second operand).
        let order = _mm512_set_epi16(
            47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36,
            4, 35, 3, 34, 2, 33, 1, 32, 0,
        );
        let zero = _mm512_setzero_si512();
        for pair_idx in 0..k.div_ceil(2) {
            for col_tile in 0..n.div_ceil(TILE) {
                let col0 = col_tile * TILE;
                let cols = TILE.min(n - col0);
                // SAFETY: `cols` values of rows 2p and (when it exists) 2p + 1 from col0 on are
                // inside `bits` (the caller's contract).
                let (first, second) = unsafe {
                    let first = load_u16(bits.as_ptr().add(2 * pair_idx * row_stride + col0), cols);
                    let second = if 2 * pair_idx + 1 < k {
                        load_u16(
                            bits.as_ptr().add((2 * pair_idx + 1) * row_stride + col0),
                            cols,
                        )
                    } else {
                        zero
                    };
                    (first, second)
                };
                let line = _mm512_permutex2var_epi16(first, order, second);
                let at = (col_tile * depth_tiles * (DEPTH / 2) + pair_idx) * 2 * TILE;
                assert!(at + 2 * TILE <= packed.len());
                // SAFETY: 32 u16 at `at` are inside `packed` (asserted).
                unsafe { _mm512_storeu_si512(packed.as_mut_ptr().add(at).cast(), line) };
            }
        }
    }
}
