//! The pair layout of the bf16 tile products, and their AVX512_BF16 path.
//!
//! Both bf16 instructions the products use multiply *pairs*: `VDPBF16PS` (AVX512_BF16) adds to
//! each of its 16 f32 lanes `a₀·b₀ + a₁·b₁` of a pair of bf16 values, and AMX's `TDPBF16PS`
//! does the same per tile element. So the right operand `[k, n]` is packed as pairs of rows:
//! tiles of 16 columns × 32 rows, column tile by column tile, each tile 16 lines of 64 bytes
//! where line `p` holds, for each of the 16 columns, the values of rows `2p` and `2p + 1`
//! ([`pack_rhs`]); within a column tile the lines of successive depth tiles follow each other, so
//! pair `p` of column tile `c` is line `c · depth_tiles · 16 + p`.
//!
//! The AVX512_BF16 product ([`product`]) broadcasts one pair of the left operand to every lane
//! and multiplies it with a line of the right operand: a register block of 6 rows × 64 columns
//! (24 accumulators) per step over the pairs. The left operand is read in place when it is bf16
//! with its pairs adjacent (row-major, even k); f32 operands (the weights P and their gradient
//! dS) are rounded to bf16 once per product, transposed ones (Pᵀ, dSᵀ) with their rows
//! interleaved two by two so that a pair is adjacent again.

use std::cell::RefCell;

use super::super::tile::View;
use super::Bf16Operand;

/// Columns of a tile (and f32 lanes of a 512-bit vector).
pub(super) const TILE: usize = 16;
/// bf16 values along the inner dimension per tile (64 bytes per tile line).
pub(super) const DEPTH: usize = 32;
/// u16 values in one packed tile.
pub(super) const TILE_VALUES: usize = TILE * DEPTH;

/// Tiles along `len` rows or columns, rounded up to an even number (AMX runs 2 × 2 blocks of
/// tiles; the AVX-512 path reads the same layout).
pub(super) fn even_tiles(len: usize) -> usize {
    len.div_ceil(TILE).next_multiple_of(2)
}

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

/// A left operand `[rows, k]` as the AVX-512 product reads it: pair `p` of row `i` (the bf16
/// values of columns `2p` and `2p + 1`) is the two u16 at `i · row_stride + p · pair_stride`.
#[derive(Debug, Clone, Copy)]
struct PairedLhs<'a> {
    data: &'a [u16],
    rows: usize,
    pairs: usize,
    row_stride: usize,
    pair_stride: usize,
}

impl<'a> PairedLhs<'a> {
    /// Checks that every pair lies inside `data`: what makes the kernel's reads sound.
    fn new(
        data: &'a [u16],
        rows: usize,
        pairs: usize,
        row_stride: usize,
        pair_stride: usize,
    ) -> Self {
        if rows > 0 && pairs > 0 {
            let last = (rows - 1) * row_stride + (pairs - 1) * pair_stride + 2;
            assert!(
                last <= data.len(),
                "paired operand [{rows} rows, {pairs} pairs] reads past {} values",
                data.len()
            );
        }
        Self {
            data,
            rows,
            pairs,
            row_stride,
            pair_stride,
        }
    }
}

thread_local! {
    /// Scratch for the left operands this thread rounds or interleaves (kept between products:
    /// a tile's operand is up to 512 KiB, too large to allocate per product).
    static LHS_SCRATCH: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// `lhs` as pairs: read in place when its bf16 values are row-major with an even depth,
/// otherwise rounded to bf16 into `scratch` (rows two columns at a time when the view is
/// row-major, columns interleaved two by two when it is transposed).
fn paired_lhs<'s, A: Bf16Operand>(lhs: &View<'s, A>, scratch: &'s mut Vec<u16>) -> PairedLhs<'s> {
    let (m, k) = (lhs.rows_len(), lhs.cols_len());
    let pairs = k.div_ceil(2);
    if let Some((values, row_stride)) = lhs.row_major_data()
        && let Some(bits) = A::as_bits(values)
        && k % 2 == 0
    {
        return PairedLhs::new(bits, m, pairs, row_stride, 2);
    }
    // Every value below is written, so the scratch is grown but never cleared.
    if scratch.len() < m * pairs * 2 {
        scratch.resize(m * pairs * 2, 0);
    }
    if let Some(rows) = lhs.row_major() {
        // [m, 2·pairs], the odd column's partner zero.
        for (row, out) in rows.zip(scratch.chunks_exact_mut(2 * pairs)) {
            A::pack_run(row, &mut out[..k]);
            out[k..].fill(0);
        }
        return PairedLhs::new(scratch, m, pairs, 2 * pairs, 2);
    }
    if let Some(mut cols) = lhs.col_major() {
        // [pairs, m, 2]: columns 2p and 2p + 1 interleaved (a transposed P or dS: each column of
        // the view is a contiguous row of the block).
        let mut pair_idx = 0;
        while let Some(first) = cols.next() {
            let out = &mut scratch[pair_idx * 2 * m..][..2 * m];
            match cols.next() {
                Some(second) => A::pack_interleaved(first, second, out),
                None => A::pack_interleaved(first, &[], out),
            }
            pair_idx += 1;
        }
        return PairedLhs::new(scratch, m, pairs, 2, 2 * m);
    }
    for row_idx in 0..m {
        for col_idx in 0..2 * pairs {
            scratch[row_idx * 2 * pairs + col_idx] = if col_idx < k {
                lhs.at(row_idx, col_idx).bf16_bits()
            } else {
                0
            };
        }
    }
    PairedLhs::new(scratch, m, pairs, 2 * pairs, 2)
}

/// Whether this CPU runs the AVX512_BF16 products (AVX-512F, AVX-512BW and AVX512_BF16).
pub(super) fn avx512_bf16_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst (+)= factor · lhs · b` on AVX512_BF16 for a right operand `b` `[k, n]` packed by
/// [`pack_rhs`]; `dst` is row-major `[lhs.rows, n]` with rows `dst_stride` apart.
///
/// # Panics
/// When the CPU lacks the instructions ([`avx512_bf16_detected`]), or when `b` or `dst` does not
/// hold the sizes.
pub(super) fn product<A: Bf16Operand>(
    dst: &mut [f32],
    dst_stride: usize,
    lhs: View<'_, A>,
    b: &[u16],
    n: usize,
    accumulate: bool,
    factor: f32,
) {
    assert!(
        avx512_bf16_detected(),
        "the AVX512_BF16 product on a CPU without AVX512_BF16"
    );
    let (m, k) = (lhs.rows_len(), lhs.cols_len());
    if m == 0 || n == 0 {
        return;
    }
    let depth_tiles = k.div_ceil(DEPTH);
    assert_eq!(
        b.len(),
        even_tiles(n) * depth_tiles * TILE_VALUES,
        "a packed right operand of [{k}, {n}]"
    );
    assert!(
        (m - 1) * dst_stride + n <= dst.len(),
        "bf16 product: [{m}, {n}] with row stride {dst_stride} does not fit {} values",
        dst.len()
    );
    if k == 0 {
        // An empty sum: dst = 0, or dst unchanged when accumulating.
        if !accumulate {
            dst.chunks_mut(dst_stride)
                .take(m)
                .for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    LHS_SCRATCH.with_borrow_mut(|scratch| {
        let a = paired_lhs(&lhs, scratch);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has the instructions (asserted above); `PairedLhs::new` keeps every
        // pair read inside `a.data`, the assertions above keep every line of `b` (pairs below
        // depth_tiles · 16, column tiles below even_tiles(n)) inside `b` and every write inside
        // `dst`.
        unsafe {
            x86::product(dst, dst_stride, a, b, n, depth_tiles, accumulate, factor);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (a, b, dst, dst_stride, depth_tiles, accumulate, factor);
    });
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The kernel: register blocks of up to [`ROWS`] rows × [`VECTORS`] · 16 columns.

    use std::arch::x86_64::{
        __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_fmadd_ps, _mm512_loadu_si512,
        _mm512_mask_loadu_ps, _mm512_mask_storeu_ps, _mm512_mul_ps, _mm512_set1_epi32,
        _mm512_set1_ps, _mm512_setzero_ps,
    };

    use super::{DEPTH, PairedLhs, TILE};

    /// Rows of a register block.
    const ROWS: usize = 6;
    /// 16-column vectors of a register block.
    const VECTORS: usize = 4;

    /// See [`super::product`].
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and AVX512_BF16; `b` holds `even_tiles(n) · depth_tiles`
    /// packed tiles with `a.pairs ≤ depth_tiles · 16`; `dst` holds `[a.rows, n]` with rows
    /// `dst_stride` apart.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn product(
        dst: &mut [f32],
        dst_stride: usize,
        a: PairedLhs<'_>,
        b: &[u16],
        n: usize,
        depth_tiles: usize,
        accumulate: bool,
        factor: f32,
    ) {
        let col_vectors = n.div_ceil(TILE);
        // u16 values between successive column tiles of `b`.
        let tile_stride = depth_tiles * DEPTH * TILE;
        // SAFETY: every block reads rows below `a.rows` and pairs below `a.pairs` of `a` (kept
        // inside it by `PairedLhs::new`), lines below `a.pairs` of column tiles below
        // ⌈n/16⌉ of `b`, and writes rows below `a.rows` and columns below `n` of `dst`: inside
        // all three by the caller's contract; the CPU has the instructions by the same.
        unsafe {
            let mut row0 = 0;
            while row0 < a.rows {
                let rows = ROWS.min(a.rows - row0);
                let mut vector0 = 0;
                while vector0 < col_vectors {
                    let vectors = VECTORS.min(col_vectors - vector0);
                    let block = Block {
                        a: a.data.as_ptr().add(row0 * a.row_stride),
                        a_row_stride: a.row_stride,
                        a_pair_stride: a.pair_stride,
                        pairs: a.pairs,
                        b: b.as_ptr().add(vector0 * tile_stride),
                        b_tile_stride: tile_stride,
                        dst: dst.as_mut_ptr().add(row0 * dst_stride + vector0 * TILE),
                        dst_stride,
                        cols: n - vector0 * TILE,
                        accumulate,
                        factor,
                    };
                    // One monomorphized kernel per block shape.
                    macro_rules! dispatch {
                        ($($r:literal),*; $($v:literal),*) => {
                            dispatch!(@rows rows, vectors; [$($r),*]; [$($v),*])
                        };
                        (@rows $rows:ident, $vectors:ident; [$($r:literal),*]; $vs:tt) => {
                            match $rows {
                                $($r => dispatch!(@vectors $r, $vectors; $vs),)*
                                _ => unreachable!("at most {ROWS} rows"),
                            }
                        };
                        (@vectors $r:literal, $vectors:ident; [$($v:literal),*]) => {
                            match $vectors {
                                $($v => block.run::<$r, $v>(),)*
                                _ => unreachable!("at most {VECTORS} vectors"),
                            }
                        };
                    }
                    dispatch!(1, 2, 3, 4, 5, 6; 1, 2, 3, 4);
                    vector0 += vectors;
                }
                row0 += rows;
            }
        }
    }

    /// One register block's operands and destination.
    struct Block {
        /// The block's first row's pairs.
        a: *const u16,
        a_row_stride: usize,
        a_pair_stride: usize,
        pairs: usize,
        /// The first column tile's first line.
        b: *const u16,
        b_tile_stride: usize,
        /// The block's first output.
        dst: *mut f32,
        dst_stride: usize,
        /// Columns left from the block's first (the last vector may be partial).
        cols: usize,
        accumulate: bool,
        factor: f32,
    }

    impl Block {
        /// `R` rows × `V` vectors: for every pair, `V` lines of `b`, `R` broadcasts of a pair of
        /// `a` and `R · V` pair products into registers; then the block written once.
        ///
        /// # Safety
        /// As [`product`], for this block.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
        unsafe fn run<const R: usize, const V: usize>(&self) {
            // SAFETY: the caller keeps this block's reads inside `a` and `b` and its writes
            // inside `dst` (see `product`), and the CPU has the instructions.
            unsafe {
                let mut acc = [[_mm512_setzero_ps(); V]; R];
                for pair_idx in 0..self.pairs {
                    let mut lines = [bits(_mm512_set1_epi32(0)); V];
                    for (vector, line) in lines.iter_mut().enumerate() {
                        let at = self
                            .b
                            .add(vector * self.b_tile_stride + pair_idx * 2 * TILE);
                        *line = bits(_mm512_loadu_si512(at.cast()));
                    }
                    for (row, acc_row) in acc.iter_mut().enumerate() {
                        let at = self
                            .a
                            .add(row * self.a_row_stride + pair_idx * self.a_pair_stride);
                        let pair = bits(_mm512_set1_epi32(at.cast::<i32>().read_unaligned()));
                        for (sum, line) in acc_row.iter_mut().zip(&lines) {
                            *sum = _mm512_dpbf16_ps(*sum, pair, *line);
                        }
                    }
                }
                let factor = _mm512_set1_ps(self.factor);
                for (row, acc_row) in acc.iter().enumerate() {
                    for (vector, sum) in acc_row.iter().enumerate() {
                        let cols = self.cols.saturating_sub(vector * TILE).min(TILE);
                        let mask = if cols == TILE {
                            u16::MAX
                        } else {
                            (1u16 << cols) - 1
                        };
                        let out = self.dst.add(row * self.dst_stride + vector * TILE);
                        let value = if self.accumulate {
                            _mm512_fmadd_ps(*sum, factor, _mm512_mask_loadu_ps(*sum, mask, out))
                        } else {
                            _mm512_mul_ps(*sum, factor)
                        };
                        _mm512_mask_storeu_ps(out, mask, value);
                    }
                }
            }
        }
    }

    /// 32 bf16 values from 512 bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn bits(x: __m512i) -> __m512bh {
        // SAFETY: both types are 512 bits of plain data.
        unsafe { core::mem::transmute::<__m512i, __m512bh>(x) }
    }
}

// Rounding f32 runs to bf16, 16 (or 2 × 16) values at a time with AVX512_BF16 where the
// CPU has it.

/// `dst[i]` = the bits of `src[i]` rounded to bf16 (nearest even; with AVX512_BF16, f32
/// subnormals, below 1.2e-38, become ±0, as the instruction does).
pub(super) fn round_run(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16_detected() {
        // SAFETY: the CPU has AVX-512F, AVX-512BW and AVX512_BF16 (checked just above).
        return unsafe { x86_round::round_run(src, dst) };
    }
    super::round_run_portable(src, dst)
}

/// `dst[2i]`, `dst[2i + 1]` = the bits of `first[i]`, `second[i]` rounded to bf16 (0 past
/// `second`'s end), for `i < first.len()`.
pub(super) fn round_interleaved(first: &[f32], second: &[f32], dst: &mut [u16]) {
    let len = first.len().min(dst.len() / 2);
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16_detected() {
        // The body 16 pairs at a time, the tail through the same instructions, zero-padded
        // (so that every value is rounded alike; `second` may be shorter: its missing values
        // are 0).
        let body = len - len % 16;
        let done = if second.len() >= body { body } else { 0 };
        if done > 0 {
            // SAFETY: the CPU has the instructions (checked above); `done` values of both runs
            // and 2 · done of `dst` exist.
            unsafe {
                x86_round::round_interleaved(&first[..done], &second[..done], &mut dst[..2 * done])
            };
        }
        for start in (done..len).step_by(16) {
            let count = 16.min(len - start);
            let (mut a, mut b, mut out) = ([0.0f32; 16], [0.0f32; 16], [0u16; 32]);
            a[..count].copy_from_slice(&first[start..start + count]);
            let available = second.len().saturating_sub(start).min(count);
            if available > 0 {
                b[..available].copy_from_slice(&second[start..start + available]);
            }
            // SAFETY: as above, on 16-value buffers and a 32-value output.
            unsafe { x86_round::round_interleaved(&a, &b, &mut out) };
            dst[2 * start..2 * (start + count)].copy_from_slice(&out[..2 * count]);
        }
        return;
    }
    interleave_portable(&first[..len], second, &mut dst[..2 * len]);
}

fn interleave_portable(first: &[f32], second: &[f32], dst: &mut [u16]) {
    use burn::tensor::bf16;
    for (i, pair) in dst.chunks_exact_mut(2).enumerate().take(first.len()) {
        pair[0] = bf16::from_f32(first[i]).to_bits();
        pair[1] = second.get(i).map_or(0, |&x| bf16::from_f32(x).to_bits());
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_round {
    use std::arch::x86_64::{
        __m256bh, __m256i, __m512bh, __m512i, _mm256_storeu_si256, _mm512_cvtne2ps_pbh,
        _mm512_cvtneps_pbh, _mm512_loadu_ps, _mm512_permutexvar_epi16, _mm512_set_epi16,
        _mm512_storeu_si512,
    };

    /// # Safety
    /// The CPU has AVX-512F and AVX512_BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_run(src: &[f32], dst: &mut [u16]) {
        let len = src.len().min(dst.len());
        let (src_body, src_tail) = src[..len].split_at(len - len % 16);
        let (dst_body, dst_tail) = dst[..len].split_at_mut(len - len % 16);
        for (s, d) in src_body.chunks_exact(16).zip(dst_body.chunks_exact_mut(16)) {
            // SAFETY: both chunks hold exactly 16 values: a 64-byte load and a 32-byte
            // store; `__m256bh` and `__m256i` are both 256 bits of plain data.
            unsafe {
                let rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(s.as_ptr()));
                _mm256_storeu_si256(
                    d.as_mut_ptr().cast::<__m256i>(),
                    core::mem::transmute::<__m256bh, __m256i>(rounded),
                );
            }
        }
        if !src_tail.is_empty() {
            // The tail through the same instruction (zero-padded), so that every value of the
            // run is rounded alike (it flushes f32 subnormals to zero; the portable rounding
            // keeps them as bf16 subnormals).
            let (mut padded, mut rounded) = ([0.0f32; 16], [0u16; 16]);
            padded[..src_tail.len()].copy_from_slice(src_tail);
            // SAFETY: as above, on the two 16-value buffers.
            unsafe { round_run(&padded, &mut rounded) };
            dst_tail.copy_from_slice(&rounded[..dst_tail.len()]);
        }
    }

    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and AVX512_BF16; `first` and `second` hold a
    /// multiple of 16 values, the same number, and `dst` twice as many.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn round_interleaved(first: &[f32], second: &[f32], dst: &mut [u16]) {
        // Lane 2i takes value i of the low half (first), lane 2i + 1 value i of the high
        // half (second).
        let order = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        for ((a, b), d) in first
            .chunks_exact(16)
            .zip(second.chunks_exact(16))
            .zip(dst.chunks_exact_mut(32))
        {
            // SAFETY: 16 values from each run (64-byte loads), 32 u16 stored (64 bytes);
            // `__m512bh` and `__m512i` are both 512 bits of plain data.
            unsafe {
                let halves =
                    _mm512_cvtne2ps_pbh(_mm512_loadu_ps(b.as_ptr()), _mm512_loadu_ps(a.as_ptr()));
                let pairs = _mm512_permutexvar_epi16(
                    order,
                    core::mem::transmute::<__m512bh, __m512i>(halves),
                );
                _mm512_storeu_si512(d.as_mut_ptr().cast(), pairs);
            }
        }
    }
}
