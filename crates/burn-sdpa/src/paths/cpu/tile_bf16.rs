//! bf16 tile products with f32 accumulation: Intel AMX tiles (`TDPBF16PS`) where the CPU has
//! AMX-TILE and AMX-BF16 and the OS grants the tile state, the f32 product on widened copies
//! otherwise. The operands are bf16 values or f32 values rounded to bf16 (round to nearest even)
//! while they are packed; products and sums are f32.
//!
//! Why AMX and not AVX512_BF16: on the Intel Xeon this was written on (2 cores, AVX-512F/BW/VL,
//! AVX512_BF16, AMX), a loop of independent `VDPBF16PS zmm` ran at about 70 GFLOP/s per core and
//! one of `VFMADD231PS zmm` at about 210, while `TDPBF16PS` ran at about 1 460: the AVX-512 bf16
//! dot product is slower than f32 FMA there, the tile unit 7× faster.
//!
//! `SDPA_AMX=off` (read once per process) forces the portable path, so that both paths are
//! tested on a machine with AMX.

use std::sync::OnceLock;

use burn::tensor::bf16;

use super::tile::{View, product};

/// An operand element of the bf16 tile products: bf16 itself, or f32 rounded to bf16 when packed.
pub(crate) trait Bf16Operand: Copy {
    /// The bits of the bf16 value this element stands for.
    fn bf16_bits(self) -> u16;

    /// `dst[i] = src[i].bf16_bits()` for a run of consecutive values.
    fn pack_run(src: &[Self], dst: &mut [u16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.bf16_bits();
        }
    }
}

impl Bf16Operand for bf16 {
    fn bf16_bits(self) -> u16 {
        self.to_bits()
    }
}

impl Bf16Operand for f32 {
    fn bf16_bits(self) -> u16 {
        bf16::from_f32(self).to_bits()
    }

    fn pack_run(src: &[f32], dst: &mut [u16]) {
        amx::round_run(src, dst)
    }
}

/// The instruction set the bf16 tile products run with on this machine: `amx` or `portable`.
pub fn bf16_product_isa() -> &'static str {
    if amx::ready() { "amx" } else { "portable" }
}

/// A right operand `[k, n]` of [`product_bf16_packed`], rounded to bf16 and laid out once for
/// every product it enters: AMX's pair layout where the tile path runs, widened f32 rows on the
/// portable path.
#[derive(Debug)]
pub(crate) struct PackedRhs {
    rows: usize,
    cols: usize,
    layout: Layout,
}

#[derive(Debug)]
enum Layout {
    /// The tiles of `amx::pack_rhs`.
    Tiles(Vec<u16>),
    /// Row-major `[k, n]` f32 values, each exactly a bf16 value.
    Widened(Vec<f32>),
}

impl PackedRhs {
    /// `rhs` rounded to bf16 and packed for the path this machine runs.
    pub fn new<B: Bf16Operand>(rhs: View<'_, B>) -> Self {
        let (rows, cols) = (rhs.rows_len(), rhs.cols_len());
        let layout = if amx::ready() {
            Layout::Tiles(amx::pack_rhs(&rhs))
        } else {
            Layout::Widened(widened(&rhs))
        };
        Self { rows, cols, layout }
    }
}

/// The f32 value of bf16 bits (exact).
fn widen(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `view` rounded to bf16 and widened back to f32, row-major.
fn widened<T: Bf16Operand>(view: &View<'_, T>) -> Vec<f32> {
    let (rows, cols) = (view.rows_len(), view.cols_len());
    let mut out = Vec::with_capacity(rows * cols);
    for row_idx in 0..rows {
        out.extend((0..cols).map(|col_idx| widen(view.at(row_idx, col_idx).bf16_bits())));
    }
    out
}

/// `dst = factor · lhs · rhs` (or `dst += …` when `accumulate`) with the operands rounded to
/// bf16 and f32 products and sums, where `dst` is a row-major `[lhs.rows, rhs.cols]` block whose
/// rows are `dst_stride` apart.
///
/// # Panics
/// When the inner sizes differ or `dst` is too short.
#[cfg(test)]
pub(crate) fn product_bf16<A: Bf16Operand, B: Bf16Operand>(
    dst: &mut [f32],
    dst_stride: usize,
    lhs: View<'_, A>,
    rhs: View<'_, B>,
    accumulate: bool,
    factor: f32,
) {
    product_bf16_packed(
        dst,
        dst_stride,
        lhs,
        &PackedRhs::new(rhs),
        accumulate,
        factor,
    )
}

/// `dst = factor · lhs · rhs` (or `dst += …` when `accumulate`) with the operands rounded to
/// bf16 and f32 products and sums, the right operand packed beforehand; `dst` is a row-major
/// `[lhs.rows, rhs.cols]` block whose rows are `dst_stride` apart.
///
/// # Panics
/// When the inner sizes differ or `dst` is too short.
pub(crate) fn product_bf16_packed<A: Bf16Operand>(
    dst: &mut [f32],
    dst_stride: usize,
    lhs: View<'_, A>,
    rhs: &PackedRhs,
    accumulate: bool,
    factor: f32,
) {
    let (m, k, n) = (lhs.rows_len(), lhs.cols_len(), rhs.cols);
    assert_eq!(
        k, rhs.rows,
        "bf16 tile product: inner sizes {k} and {}",
        rhs.rows
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * dst_stride + n <= dst.len(),
        "bf16 tile product: [{m}, {n}] with row stride {dst_stride} does not fit {} values",
        dst.len()
    );
    match &rhs.layout {
        Layout::Tiles(tiles) => amx::product(dst, dst_stride, lhs, tiles, n, accumulate, factor),
        // The portable path: the left operand rounded and widened too, then the f32 product.
        Layout::Widened(b) => product(
            dst,
            dst_stride,
            View::rows(&widened(&lhs), m, k, k),
            View::rows(b, k, n, n),
            accumulate,
            factor,
        ),
    }
}

/// `dst[i]` = the bits of `src[i]` rounded to bf16 (nearest even).
fn round_run_portable(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16::from_f32(*s).to_bits();
    }
}

/// Whether `SDPA_AMX=off` is set (read once).
fn amx_switched_off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("SDPA_AMX").is_ok_and(|value| value == "off"))
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx {
    //! AMX on Linux x86-64: CPUID for the tile unit, `arch_prctl` for the permission to use its
    //! state, and the product in 2 × 2 blocks of 16 × 16 f32 tiles.

    use std::arch::asm;
    use std::sync::OnceLock;

    use super::super::tile::View;
    use super::{Bf16Operand, amx_switched_off};

    /// Rows of a tile, and f32 columns of an accumulator tile.
    const TILE: usize = 16;
    /// bf16 values along the inner dimension per tile (64 bytes per tile row).
    const DEPTH: usize = 32;
    /// u16 values in one packed operand tile.
    const TILE_VALUES: usize = TILE * DEPTH;
    /// Bytes between the rows of every tile.
    const ROW_BYTES: usize = 64;

    /// Whether the CPU has AMX-TILE, AMX-BF16 and AVX512_BF16 (its conversions), Linux grants
    /// this process the tile data state, and `SDPA_AMX=off` is not set (decided once).
    pub(super) fn ready() -> bool {
        static READY: OnceLock<bool> = OnceLock::new();
        *READY.get_or_init(|| {
            !amx_switched_off()
                && cpu_has_amx()
                && std::arch::is_x86_feature_detected!("avx512bf16")
                && request_tile_state()
        })
    }

    /// `dst[i]` = the bits of `src[i]` rounded to bf16 (nearest even), 16 at a time with
    /// AVX512_BF16 where the CPU has it.
    pub(super) fn round_run(src: &[f32], dst: &mut [u16]) {
        if std::arch::is_x86_feature_detected!("avx512bf16") {
            // SAFETY: the CPU supports AVX-512F and AVX512_BF16 (checked just above).
            unsafe { round_run_avx512(src, dst) }
        } else {
            super::round_run_portable(src, dst)
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn round_run_avx512(src: &[f32], dst: &mut [u16]) {
        use std::arch::x86_64::{
            __m256i, _mm256_storeu_si256, _mm512_cvtneps_pbh, _mm512_loadu_ps,
        };
        let len = src.len().min(dst.len());
        let (src_body, src_tail) = src[..len].split_at(len - len % 16);
        let (dst_body, dst_tail) = dst[..len].split_at_mut(len - len % 16);
        for (s, d) in src_body.chunks_exact(16).zip(dst_body.chunks_exact_mut(16)) {
            // SAFETY: both chunks hold exactly 16 values: a 64-byte load and a 32-byte store;
            // `__m256bh` and `__m256i` are both 256 bits of plain data.
            unsafe {
                let rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(s.as_ptr()));
                _mm256_storeu_si256(
                    d.as_mut_ptr().cast::<__m256i>(),
                    core::mem::transmute::<std::arch::x86_64::__m256bh, __m256i>(rounded),
                );
            }
        }
        super::round_run_portable(src_tail, dst_tail);
    }

    fn cpu_has_amx() -> bool {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // Leaf 7 exists when the maximum basic leaf is at least 7; EDX bit 24 is AMX-TILE, bit
        // 22 AMX-BF16.
        if __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        edx & (1 << 24) != 0 && edx & (1 << 22) != 0
    }

    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: Linux (5.16 on) enables AMX's
    /// tile data for a process only when it asks; the permission holds for all its threads.
    fn request_tile_state() -> bool {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: a plain system call with integer arguments; it reads and writes no memory of
        // this process, and the kernel clobbers only rcx and r11, declared here.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret == 0
    }

    /// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    impl TileConfig {
        fn full() -> Self {
            let mut bytes = [0u8; 64];
            bytes[0] = 1;
            for tile_idx in 0..8 {
                bytes[16 + 2 * tile_idx] = ROW_BYTES as u8;
                bytes[48 + tile_idx] = TILE as u8;
            }
            Self(bytes)
        }
    }

    /// `lhs [m, k]` packed as `[⌈m/16⌉ (even), ⌈k/32⌉]` tiles of 16 rows × 32 bf16, zero-padded.
    fn pack_lhs<A: Bf16Operand>(
        lhs: &View<'_, A>,
        row_tiles: usize,
        depth_tiles: usize,
    ) -> Vec<u16> {
        let (m, k) = (lhs.rows_len(), lhs.cols_len());
        let mut packed = vec![0u16; row_tiles * depth_tiles * TILE_VALUES];
        if let Some(rows) = lhs.row_major() {
            // Each tile row is a run of (up to) 32 consecutive values of one row.
            for (row_idx, row) in rows.enumerate() {
                let (tile_row, in_row) = (row_idx / TILE, row_idx % TILE);
                for (tile_depth, run) in row.chunks(DEPTH).enumerate() {
                    let at = (tile_row * depth_tiles + tile_depth) * TILE_VALUES + in_row * DEPTH;
                    A::pack_run(run, &mut packed[at..][..run.len()]);
                }
            }
        } else if let Some(cols) = lhs.col_major() {
            // A transposed block (Pᵀ, dSᵀ): round each contiguous column as a run, then
            // scatter it down the tiles' rows.
            let mut run = vec![0u16; m];
            for (col_idx, col) in cols.enumerate() {
                A::pack_run(col, &mut run);
                let (tile_depth, in_depth) = (col_idx / DEPTH, col_idx % DEPTH);
                for (row_idx, &bits) in run.iter().enumerate() {
                    let (tile_row, in_row) = (row_idx / TILE, row_idx % TILE);
                    let at = (tile_row * depth_tiles + tile_depth) * TILE_VALUES
                        + in_row * DEPTH
                        + in_depth;
                    packed[at] = bits;
                }
            }
        } else {
            for col_idx in 0..k {
                let (tile_depth, in_depth) = (col_idx / DEPTH, col_idx % DEPTH);
                for row_idx in 0..m {
                    let (tile_row, in_row) = (row_idx / TILE, row_idx % TILE);
                    let at = (tile_row * depth_tiles + tile_depth) * TILE_VALUES
                        + in_row * DEPTH
                        + in_depth;
                    packed[at] = lhs.at(row_idx, col_idx).bf16_bits();
                }
            }
        }
        packed
    }

    /// `rhs [k, n]` packed as `[⌈n/16⌉ (even), ⌈k/32⌉]` tiles in AMX's pair layout: tile row `p`
    /// holds, for each of 16 columns, the values of rows `2p` and `2p + 1`; zero-padded.
    pub(super) fn pack_rhs<B: Bf16Operand>(rhs: &View<'_, B>) -> Vec<u16> {
        let (k, n) = (rhs.rows_len(), rhs.cols_len());
        let (col_tiles, depth_tiles) = (even_tiles(n), k.div_ceil(DEPTH));
        let mut packed = vec![0u16; col_tiles * depth_tiles * TILE_VALUES];
        let at = |row_idx: usize, col_idx: usize| {
            let (tile_depth, in_depth) = (row_idx / DEPTH, row_idx % DEPTH);
            let (tile_col, in_col) = (col_idx / TILE, col_idx % TILE);
            (tile_col * depth_tiles + tile_depth) * TILE_VALUES
                + (in_depth / 2) * DEPTH
                + in_col * 2
                + in_depth % 2
        };
        if let Some(cols) = rhs.col_major() {
            // A transposed block (Kᵀ, Vᵀ): each column is contiguous, and a pair of rows of
            // one column is two adjacent values.
            for (col_idx, col) in cols.enumerate() {
                for (row_idx, value) in col.iter().enumerate() {
                    packed[at(row_idx, col_idx)] = value.bf16_bits();
                }
            }
        } else if let Some(rows) = rhs.row_major() {
            for (row_idx, row) in rows.enumerate() {
                for (col_idx, value) in row.iter().enumerate() {
                    packed[at(row_idx, col_idx)] = value.bf16_bits();
                }
            }
        } else {
            for row_idx in 0..k {
                for col_idx in 0..n {
                    packed[at(row_idx, col_idx)] = rhs.at(row_idx, col_idx).bf16_bits();
                }
            }
        }
        packed
    }

    /// Tiles along `len` rows or columns, rounded up to an even number: the product runs in
    /// 2 × 2 blocks of tiles.
    fn even_tiles(len: usize) -> usize {
        len.div_ceil(TILE).next_multiple_of(2)
    }

    /// `dst (+)= factor · lhs · b` for a right operand `b` `[k, n]` packed by [`pack_rhs`].
    pub(super) fn product<A: Bf16Operand>(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, A>,
        b: &[u16],
        n: usize,
        accumulate: bool,
        factor: f32,
    ) {
        let (m, k) = (lhs.rows_len(), lhs.cols_len());
        let (row_tiles, col_tiles) = (even_tiles(m), even_tiles(n));
        let depth_tiles = k.div_ceil(DEPTH);
        // The bound that keeps every tile load of `b` below inside it.
        assert_eq!(
            b.len(),
            col_tiles * depth_tiles * TILE_VALUES,
            "a packed right operand of [{k}, {n}]"
        );
        let a = pack_lhs(&lhs, row_tiles, depth_tiles);
        let config = TileConfig::full();
        // Four accumulator tiles: (rows 0, cols 0), (0, 1), (1, 0), (1, 1) of a 2 × 2 block.
        let mut block = [[0f32; TILE * TILE]; 4];
        // SAFETY: `ready()` established that the CPU has AMX and the OS granted its state; the
        // configuration gives every tile 16 rows of 64 bytes, and every tile load reads 1 KiB at
        // the start of a packed tile inside `a` or `b` (the indices below stay below
        // row_tiles·depth_tiles and col_tiles·depth_tiles); every store writes 1 KiB into one of
        // the `block` arrays. The compiler never uses the tile registers, so their values stay
        // between the asm blocks; `tilerelease` returns the state at the end.
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
            for row_tile in (0..row_tiles).step_by(2) {
                for col_tile in (0..col_tiles).step_by(2) {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                    for depth_idx in 0..depth_tiles {
                        let a0 = a
                            .as_ptr()
                            .add((row_tile * depth_tiles + depth_idx) * TILE_VALUES);
                        let a1 = a
                            .as_ptr()
                            .add(((row_tile + 1) * depth_tiles + depth_idx) * TILE_VALUES);
                        let b0 = b
                            .as_ptr()
                            .add((col_tile * depth_tiles + depth_idx) * TILE_VALUES);
                        let b1 = b
                            .as_ptr()
                            .add(((col_tile + 1) * depth_tiles + depth_idx) * TILE_VALUES);
                        asm!(
                            "tileloadd tmm4, [{a0} + {stride}*1]",
                            "tileloadd tmm5, [{a1} + {stride}*1]",
                            "tileloadd tmm6, [{b0} + {stride}*1]",
                            "tileloadd tmm7, [{b1} + {stride}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            a0 = in(reg) a0,
                            a1 = in(reg) a1,
                            b0 = in(reg) b0,
                            b1 = in(reg) b1,
                            stride = in(reg) ROW_BYTES,
                            options(nostack, readonly)
                        );
                    }
                    asm!(
                        "tilestored [{c0} + {stride}*1], tmm0",
                        "tilestored [{c1} + {stride}*1], tmm1",
                        "tilestored [{c2} + {stride}*1], tmm2",
                        "tilestored [{c3} + {stride}*1], tmm3",
                        c0 = in(reg) block[0].as_mut_ptr(),
                        c1 = in(reg) block[1].as_mut_ptr(),
                        c2 = in(reg) block[2].as_mut_ptr(),
                        c3 = in(reg) block[3].as_mut_ptr(),
                        stride = in(reg) ROW_BYTES,
                        options(nostack)
                    );
                    write_block(
                        dst,
                        dst_stride,
                        (row_tile * TILE, col_tile * TILE),
                        (m, n),
                        &block,
                        accumulate,
                        factor,
                    );
                }
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }

    /// Writes (or adds) `factor ·` the valid part of a 2 × 2 block of accumulator tiles whose
    /// first row and column are `origin` into `dst`.
    fn write_block(
        dst: &mut [f32],
        dst_stride: usize,
        origin: (usize, usize),
        (m, n): (usize, usize),
        block: &[[f32; TILE * TILE]; 4],
        accumulate: bool,
        factor: f32,
    ) {
        for (tile_idx, tile) in block.iter().enumerate() {
            let row0 = origin.0 + (tile_idx / 2) * TILE;
            let col0 = origin.1 + (tile_idx % 2) * TILE;
            if row0 >= m || col0 >= n {
                continue;
            }
            let cols = TILE.min(n - col0);
            for in_row in 0..TILE.min(m - row0) {
                let out = &mut dst[(row0 + in_row) * dst_stride + col0..][..cols];
                let sums = &tile[in_row * TILE..][..cols];
                if accumulate {
                    out.iter_mut().zip(sums).for_each(|(o, s)| *o += factor * s);
                } else {
                    out.iter_mut().zip(sums).for_each(|(o, s)| *o = factor * s);
                }
            }
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod amx {
    //! No AMX path on this target.
    use super::super::tile::View;
    use super::Bf16Operand;

    pub(super) fn ready() -> bool {
        let _ = super::amx_switched_off();
        false
    }

    pub(super) fn round_run(src: &[f32], dst: &mut [u16]) {
        super::round_run_portable(src, dst)
    }

    pub(super) fn pack_rhs<B: Bf16Operand>(_: &View<'_, B>) -> Vec<u16> {
        unreachable!("the AMX path is never ready on this target")
    }

    pub(super) fn product<A: Bf16Operand>(
        _: &mut [f32],
        _: usize,
        _: View<'_, A>,
        _: &[u16],
        _: usize,
        _: bool,
        _: f32,
    ) {
        unreachable!("the AMX path is never ready on this target")
    }
}

#[cfg(test)]
#[path = "tile_bf16_tests.rs"]
mod tests;
