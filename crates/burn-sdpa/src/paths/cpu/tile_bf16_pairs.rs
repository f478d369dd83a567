//! The pair layout of the bf16 tile products, and their AVX512_BF16 path.
//!
//! Both bf16 instructions the products use multiply *pairs*: `VDPBF16PS` (AVX512_BF16) adds to
//! each of its 16 f32 lanes `a₀·b₀ + a₁·b₁` of a pair of bf16 values, and AMX's `TDPBF16PS`
//! does the same per tile element. So the right operand `[k, n]` is packed as pairs of rows:
//! tiles of 16 columns × 32 rows, column tile by column tile, each tile 16 lines of 64 bytes
//! where line `p` holds, for each of the 16 columns, the values of rows `2p` and `2p + 1`
//! (`tile_bf16_pack.rs` packs them); within a column tile the lines of successive depth tiles follow each other, so
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
/// `pack::pack_rhs`; `dst` is row-major `[lhs.rows, n]` with rows `dst_stride` apart.
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
