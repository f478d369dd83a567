//! AMX on Linux x86-64: CPUID for the tile unit, `arch_prctl` for the permission to use its
//! state, and the product in 2 × 2 blocks of 16 × 16 f32 tiles.

use std::arch::asm;
use std::sync::OnceLock;

use super::super::tile::View;
use super::pairs::{DEPTH, TILE, TILE_VALUES, even_tiles};
use super::{Bf16Operand, amx_switched_off};

/// Bytes between the rows of every tile.
const ROW_BYTES: usize = 64;

/// Whether the CPU has AMX-TILE, AMX-BF16 and AVX512_BF16 (its conversions), Linux grants
/// this process the tile data state, and `SDPA_BF16_ISA` does not keep it out (decided once).
pub(super) fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        !amx_switched_off()
            && cpu_has_amx()
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && request_tile_state()
    })
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
fn pack_lhs<A: Bf16Operand>(lhs: &View<'_, A>, row_tiles: usize, depth_tiles: usize) -> Vec<u16> {
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
                let at =
                    (tile_row * depth_tiles + tile_depth) * TILE_VALUES + in_row * DEPTH + in_depth;
                packed[at] = bits;
            }
        }
    } else {
        for col_idx in 0..k {
            let (tile_depth, in_depth) = (col_idx / DEPTH, col_idx % DEPTH);
            for row_idx in 0..m {
                let (tile_row, in_row) = (row_idx / TILE, row_idx % TILE);
                let at =
                    (tile_row * depth_tiles + tile_depth) * TILE_VALUES + in_row * DEPTH + in_depth;
                packed[at] = lhs.at(row_idx, col_idx).bf16_bits();
            }
        }
    }
    packed
}

/// `dst (+)= factor · lhs · b` for a right operand `b` `[k, n]` packed by
/// `super::pack::pack_rhs`.
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
