//! The tensor-core kernels' tiles (`mma.rs` forward, `mma_backward.rs` backward): the square
//! tile shapes, the compile-time tiling with what it costs in shared memory and loop
//! iterations (the blocker's arithmetic, unit-tested here), loading a tile of rows into shared
//! memory, and the two products every kernel is built from, on CubeCL's matrix instructions
//! (`cmma`): `S = A·Bᵀ` of two tiles of rows (QKᵀ, dO·Vᵀ) and `O += A·B` (P·V, dS·K) or
//! `O += Aᵀ·B` (Pᵀ·dO, dSᵀ·Q), half operands and f32 results, in shared memory or, for the
//! backward's dQ, dK and dV, in accumulator fragments written out at the end.

use cubecl::prelude::*;

/// The square tile shapes the kernels run, in order of preference: 16×16×16 (tensor cores on
/// CUDA list it for f16 and bf16 with an f32 accumulator), 8×8×8 (Mesa 26's lavapipe lists it
/// for f16 with an f32 accumulator, and no other float shape).
pub(crate) const MMA_SIZES: [usize; 2] = [16, 8];

/// The alignment in bytes of every shared tile the matrix instructions load from or store to
/// (CUDA's `wmma` loads need 32-byte aligned pointers; every tile's size is a multiple of it, but
/// the tiles are packed in the order they are declared, so each asks for it).
pub(crate) const MMA_ALIGN: usize = 32;

/// The tensor-core kernels' compile-time tiling (beside
/// [`FlashConfig`](super::config::FlashConfig), whose `rows` is the rows of a tile each unit
/// owns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MmaTiling {
    /// The tile: M = N = K = `size` (one of [`MMA_SIZES`]).
    pub size: usize,
    /// Units per cube: one plane.
    pub lanes: usize,
    /// d_k rounded up to a multiple of `size`.
    pub d_k_pad: usize,
    /// d_v rounded up to a multiple of `size`.
    pub d_v_pad: usize,
}

impl MmaTiling {
    /// The tiling for head sizes `d_k`, `d_v` in tiles of `size` on a device whose planes have
    /// `lanes` units.
    pub(crate) fn new(size: usize, lanes: usize, d_k: usize, d_v: usize) -> MmaTiling {
        MmaTiling {
            size,
            lanes,
            d_k_pad: d_k.div_ceil(size) * size,
            d_v_pad: d_v.div_ceil(size) * size,
        }
    }

    /// Rows of a tile per unit.
    pub(crate) fn rows(&self) -> usize {
        self.size.div_ceil(self.lanes)
    }

    /// Loop iterations per unit to walk a `size × d_pad` tile (loading or zeroing it).
    fn tile_steps(&self, d_pad: usize) -> usize {
        (self.size * d_pad).div_ceil(self.lanes)
    }

    /// Bytes of shared memory per cube of the forward kernel for half operands of
    /// `half_bytes` bytes: Q, K (`size × d_k_pad`), V (`size × d_v_pad`) and P (`size²`) in the
    /// half type; S (`size²`) and the output (`size × d_v_pad`) in f32.
    pub(crate) fn shared_bytes(&self, half_bytes: usize) -> usize {
        let operands = self.size * (2 * self.d_k_pad + self.d_v_pad) + self.size * self.size;
        let accumulators = self.size * self.size + self.size * self.d_v_pad;
        operands * half_bytes + accumulators * 4
    }

    /// Bytes of shared memory per cube of the larger backward kernel (dK/dV; dQ's tiles are a
    /// subset of its): Q, K (`size × d_k_pad`), dO, V (`size × d_v_pad`), P and dS (`size²`)
    /// in the half type, S and dP (`size²`) in f32. (dQ, dK and dV stay on the matrix unit.)
    pub(crate) fn backward_shared_bytes(&self, half_bytes: usize) -> usize {
        let (size, dkp, dvp) = (self.size, self.d_k_pad, self.d_v_pad);
        let operands = 2 * size * (dkp + dvp) + 2 * size * size;
        operands * half_bytes + 2 * size * size * 4
    }

    /// Bytes of shared memory per cube a call needs: the forward's, and under `autodiff` the
    /// larger of the forward's and the backward's.
    pub(crate) fn call_shared_bytes(&self, half_bytes: usize, autodiff: bool) -> usize {
        let forward = self.shared_bytes(half_bytes);
        if autodiff {
            forward.max(self.backward_shared_bytes(half_bytes))
        } else {
            forward
        }
    }

    /// The tiling of the first of the `listed` tile sizes (the device's square matrix shapes,
    /// in [`MMA_SIZES`] order) whose tiles fit `shared_limit` bytes of shared memory, or the
    /// bytes the last (smallest) one needs. `listed` is not empty.
    pub(crate) fn fitting(
        listed: &[usize],
        lanes: usize,
        (d_k, d_v): (usize, usize),
        (half_bytes, autodiff): (usize, bool),
        shared_limit: usize,
    ) -> Result<MmaTiling, usize> {
        let mut needed = 0;
        for &size in listed {
            let tiling = MmaTiling::new(size, lanes, d_k, d_v);
            needed = tiling.call_shared_bytes(half_bytes, autodiff);
            if needed <= shared_limit {
                return Ok(tiling);
            }
        }
        Err(needed)
    }

    /// The loop iterations one unit of the forward kernel runs in all for `n_key_tiles` tiles
    /// of keys (see `tile::LLVMPIPE_LOOP_LIMIT`), counted from the kernel's loops that are not
    /// unrolled: per tile, loading the key and value tiles, rescaling its output rows and the
    /// tile loop's own step (2, with a margin); outside, loading the query tile, zeroing the
    /// output tile and writing its rows.
    pub(crate) fn loop_iterations(&self, n_key_tiles: usize, d_v: usize) -> usize {
        let per_tile = self.tile_steps(self.d_k_pad)
            + self.tile_steps(self.d_v_pad)
            + self.rows() * self.d_v_pad
            + 2;
        let outside =
            self.tile_steps(self.d_k_pad) + self.tile_steps(self.d_v_pad) + self.rows() * d_v;
        n_key_tiles * per_tile + outside
    }

    /// The loop iterations one unit of the busier backward kernel runs in all: dQ's for
    /// `n_key_tiles` tiles of keys (per tile: loading K and V, and the loop's step; outside:
    /// loading Q and dO), or dK/dV's for `n_query_tiles` tiles of queries of each of the
    /// `group` heads that share a key head (per tile: loading Q and dO, and the step; per head,
    /// the head loop's step; outside: loading K and V). Writing the results is unrolled.
    pub(crate) fn backward_loop_iterations(
        &self,
        n_key_tiles: usize,
        n_query_tiles: usize,
        group: usize,
    ) -> usize {
        let per_tile = self.tile_steps(self.d_k_pad) + self.tile_steps(self.d_v_pad);
        let dq = n_key_tiles * (per_tile + 2) + per_tile;
        let dkdv = group * (n_query_tiles * (per_tile + 2) + 2) + per_tile;
        dq.max(dkdv)
    }
}

/// `dst[i]` = row `base_row + row0 + i / d_pad`, element `i % d_pad` of `src` (rows of `d`
/// elements) for the `size × d_pad` tile, zeros past `len` rows (counted from `row0`) and past `d`
/// elements; loaded by the cube's `lanes` units together.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_tile<F: Float>(
    dst: &mut Shared<[F]>,
    src: &Tensor<F>,
    base_row: usize,
    row0: usize,
    len: usize,
    #[comptime] d: usize,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let unit = UNIT_POS_X as usize;
    let lanes = tiling.lanes;
    for step in 0..comptime!((tiling.size * d_pad).div_ceil(tiling.lanes)) {
        let i = step * lanes + unit;
        if i < comptime!(tiling.size * d_pad) {
            let (r, dd) = (i / d_pad, i % d_pad);
            let mut x = F::from_int(0);
            if row0 + r < len && dd < d {
                x = src[(base_row + row0 + r) * d + dd];
            }
            dst[i] = x;
        }
    }
}

/// Zeros the `size × d_pad` f32 tile `dst`, the cube's `lanes` units together.
#[cube]
pub(crate) fn zero_tile(
    dst: &mut Shared<[f32]>,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let unit = UNIT_POS_X as usize;
    let lanes = tiling.lanes;
    for step in 0..comptime!((tiling.size * d_pad).div_ceil(tiling.lanes)) {
        let i = step * lanes + unit;
        if i < comptime!(tiling.size * d_pad) {
            dst[i] = 0.0f32;
        }
    }
}

/// `out = A·Bᵀ` (`size × size`, row-major, f32) for two `size × d_pad` row-major tiles of rows
/// `a` and `b` (QKᵀ, dO·Vᵀ): over the `d_pad / size` column blocks `c`,
/// B(kk, j) = b[j][c·size + kk], column-major with stride `d_pad`.
#[cube]
pub(crate) fn product_abt<F: Float>(
    out: &mut Shared<[f32]>,
    a: &Shared<[F]>,
    b: &Shared<[F]>,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let size = comptime!(tiling.size);
    let acc = cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        size,
        size,
        size,
        cmma::MatrixLayout::Undefined,
        0.0f32,
    );
    #[unroll]
    for c in 0..comptime!(d_pad / size) {
        let a_block = cmma::Matrix::<F>::from_slice(
            cmma::MatrixIdent::A,
            size,
            size,
            size,
            cmma::MatrixLayout::RowMajor,
            &a[c * size..comptime!(size * d_pad)],
            comptime!(d_pad as u32),
        );
        let b_block = cmma::Matrix::<F>::from_slice(
            cmma::MatrixIdent::B,
            size,
            size,
            size,
            cmma::MatrixLayout::ColMajor,
            &b[c * size..comptime!(size * d_pad)],
            comptime!(d_pad as u32),
        );
        cmma::execute(&a_block, &b_block, &acc, &acc);
    }
    cmma::store(
        out,
        &acc,
        comptime!(size as u32),
        cmma::MatrixLayout::RowMajor,
    );
}

/// The A operand from the `size × size` tile `a`: read row-major, or column-major with
/// `transposed` (Aᵀ).
#[cube]
fn square_a<F: Float>(
    a: &Shared<[F]>,
    #[comptime] transposed: bool,
    #[comptime] tiling: MmaTiling,
) -> cmma::Matrix<F> {
    let size = comptime!(tiling.size);
    let layout = comptime!(if transposed {
        cmma::MatrixLayout::ColMajor
    } else {
        cmma::MatrixLayout::RowMajor
    });
    cmma::Matrix::<F>::from_slice(
        cmma::MatrixIdent::A,
        size,
        size,
        size,
        layout,
        &a[0..comptime!(size * size)],
        comptime!(size as u32),
    )
}

/// The B operand of column block `c` of the `size × d_pad` row-major tile `b`:
/// B(kk, j) = b[kk][c·size + j].
#[cube]
fn row_block_b<F: Float>(
    b: &Shared<[F]>,
    c: usize,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) -> cmma::Matrix<F> {
    let size = comptime!(tiling.size);
    cmma::Matrix::<F>::from_slice(
        cmma::MatrixIdent::B,
        size,
        size,
        size,
        cmma::MatrixLayout::RowMajor,
        &b[c * size..comptime!(size * d_pad)],
        comptime!(d_pad as u32),
    )
}

/// `out += A·B` (`out` `size × d_pad`, row-major, f32), A a `size × size` tile (`a`, read
/// row-major, or column-major with `transposed` for `out += aᵀ·B`: Pᵀ·dO, dSᵀ·Q), B the
/// `size × d_pad` row-major tile `b`: per column block `c`, B(kk, j) = b[kk][c·size + j].
#[cube]
pub(crate) fn add_product<F: Float>(
    out: &mut Shared<[f32]>,
    a: &Shared<[F]>,
    b: &Shared<[F]>,
    #[comptime] transposed: bool,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let size = comptime!(tiling.size);
    let a_block = square_a::<F>(a, transposed, tiling);
    #[unroll]
    for c in 0..comptime!(d_pad / size) {
        let acc = cmma::Matrix::<f32>::from_slice(
            cmma::MatrixIdent::Accumulator,
            size,
            size,
            size,
            cmma::MatrixLayout::RowMajor,
            &out[c * size..comptime!(size * d_pad)],
            comptime!(d_pad as u32),
        );
        let b_block = row_block_b::<F>(b, c, d_pad, tiling);
        cmma::execute(&a_block, &b_block, &acc, &acc);
        cmma::store(
            &mut out[c * size..comptime!(size * d_pad)],
            &acc,
            comptime!(d_pad as u32),
            cmma::MatrixLayout::RowMajor,
        );
    }
}

/// A `size × d_pad` f32 accumulator kept on the matrix unit, as its `d_pad / size` column
/// blocks (fragments), zero: the backward's dQ, dK and dV, summed over many tiles without
/// passing through shared memory.
#[cube]
pub(crate) fn zero_fragments(
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) -> Sequence<cmma::Matrix<f32>> {
    let size = comptime!(tiling.size);
    let mut blocks = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..comptime!(d_pad / size) {
        blocks.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            size,
            size,
            size,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        ));
    }
    blocks
}

/// `acc += A·B` for the fragments `acc` of a `size × d_pad` accumulator ([`zero_fragments`]),
/// A and B as in [`add_product`].
#[cube]
pub(crate) fn add_product_fragments<F: Float>(
    acc: &Sequence<cmma::Matrix<f32>>,
    a: &Shared<[F]>,
    b: &Shared<[F]>,
    #[comptime] transposed: bool,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let size = comptime!(tiling.size);
    let a_block = square_a::<F>(a, transposed, tiling);
    #[unroll]
    for c in 0..comptime!(d_pad / size) {
        let b_block = row_block_b::<F>(b, c, d_pad, tiling);
        let block = acc.index(c);
        cmma::execute(&a_block, &b_block, block, block);
    }
}

/// Writes the fragments `acc` of a `size × d_pad` accumulator, times `factor`, as rows
/// `base_row + row0 + t` of `out` (rows of `d` elements), but the rows past `len` (counted
/// from `row0`) and the columns past `d`: each column block goes through `stage` (a
/// `size × size` f32 tile), each unit writing its rows `t = unit + r · lanes`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_fragments<F: Float>(
    out: &mut Tensor<F>,
    acc: &Sequence<cmma::Matrix<f32>>,
    stage: &mut Shared<[f32]>,
    base_row: usize,
    row0: usize,
    len: usize,
    factor: f32,
    #[comptime] d: usize,
    #[comptime] d_pad: usize,
    #[comptime] tiling: MmaTiling,
) {
    let (size, lanes) = comptime!((tiling.size, tiling.lanes));
    let unit = UNIT_POS_X as usize;
    #[unroll]
    for c in 0..comptime!(d_pad / size) {
        sync_cube();
        cmma::store(
            stage,
            acc.index(c),
            comptime!(size as u32),
            cmma::MatrixLayout::RowMajor,
        );
        sync_cube();
        #[unroll]
        for r in 0..comptime!(tiling.rows()) {
            let t = unit + r * lanes;
            if t < size && row0 + t < len {
                let row_idx = base_row + row0 + t;
                #[unroll]
                for jj in 0..size {
                    let dd = c * size + jj;
                    if dd < d {
                        out[row_idx * d + dd] = F::cast_from(stage[t * size + jj] * factor);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_sizes_pad_to_whole_tiles() {
        let t = MmaTiling::new(16, 32, 64, 64);
        assert_eq!((t.d_k_pad, t.d_v_pad), (64, 64));
        let t = MmaTiling::new(16, 8, 8, 20);
        assert_eq!((t.d_k_pad, t.d_v_pad), (16, 32));
        let t = MmaTiling::new(16, 32, 96, 320);
        assert_eq!((t.d_k_pad, t.d_v_pad), (96, 320));
        let t = MmaTiling::new(8, 8, 20, 4);
        assert_eq!((t.d_k_pad, t.d_v_pad), (24, 8));
    }

    #[test]
    fn every_row_of_a_tile_has_one_unit() {
        for size in MMA_SIZES {
            for lanes in [4, 8, 16, 32, 64] {
                let t = MmaTiling::new(size, lanes, 64, 64);
                // Rows t = unit + r · lanes for r < rows(): each of 0..size exactly once.
                let mut seen = vec![0; size];
                for unit in 0..lanes {
                    for r in 0..t.rows() {
                        let row = unit + r * lanes;
                        if row < size {
                            seen[row] += 1;
                        }
                    }
                }
                assert_eq!(seen, vec![1; size], "size {size}, lanes {lanes}");
            }
        }
    }

    #[test]
    fn shared_memory_counts_every_tile() {
        // d = 64, f16: q, k (16 × 64), v (16 × 64), p (16 × 16) in 2 bytes; s (16 × 16) and
        // o (16 × 64) in 4.
        let t = MmaTiling::new(16, 32, 64, 64);
        let halves = 16 * 64 * 3 + 16 * 16;
        let floats = 16 * 16 + 16 * 64;
        assert_eq!(t.shared_bytes(2), halves * 2 + floats * 4);
        // d = 256 fits a GPU's 48 KiB; d = 512 does not.
        assert!(MmaTiling::new(16, 32, 256, 256).shared_bytes(2) <= 48 << 10);
        assert!(MmaTiling::new(16, 32, 512, 512).shared_bytes(2) > 48 << 10);
    }

    #[test]
    fn loop_iterations_grow_with_the_key_tiles() {
        let t = MmaTiling::new(16, 8, 64, 64);
        let one = t.loop_iterations(1, 64);
        let two = t.loop_iterations(2, 64);
        // Per tile: k and v tiles (128 + 128 per unit), 2 rows × 64 rescaled, 2 for the loop.
        assert_eq!(two - one, 128 + 128 + 2 * 64 + 2);
        assert_eq!(one, (two - one) + 128 + 128 + 2 * 64);
    }

    #[test]
    fn the_backward_keeps_its_sums_out_of_shared_memory() {
        // d = 64, f16, tiles of 16: q, k, dO, v (16 × 64) and p, ds (16 × 16) in 2 bytes;
        // s and dP (16 × 16) in 4; dQ, dK, dV on the matrix unit.
        let t = MmaTiling::new(16, 32, 64, 64);
        assert_eq!(
            t.backward_shared_bytes(2),
            (4 * 16 * 64 + 2 * 256) * 2 + 2 * 256 * 4
        );
        // Lavapipe's 32 KiB and 8 × 8 tiles hold d = 256 (and d_k = 320 with d_v = 512, whose
        // forward they do not hold), not d = 512; a GPU's 48 KiB and 16 × 16 tiles hold d = 256.
        assert!(MmaTiling::new(8, 8, 256, 256).backward_shared_bytes(2) <= 32 << 10);
        assert!(MmaTiling::new(8, 8, 320, 512).backward_shared_bytes(2) <= 32 << 10);
        assert!(MmaTiling::new(8, 8, 320, 512).shared_bytes(2) > 32 << 10);
        assert!(MmaTiling::new(8, 8, 512, 512).backward_shared_bytes(2) > 32 << 10);
        assert!(MmaTiling::new(16, 32, 256, 256).backward_shared_bytes(2) <= 48 << 10);
    }

    #[test]
    fn the_backward_loops_grow_with_the_tiles_of_the_busier_kernel() {
        let t = MmaTiling::new(8, 8, 64, 32);
        // Per tile: K or Q (8 × 64 / 8 = 64 steps), V or dO (8 × 32 / 8 = 32) and the step (2).
        let per_tile = 64 + 32 + 2;
        // dK/dV with one head and one query tile: the tile, the head loop's step (2), loading K
        // and V (96).
        assert_eq!(t.backward_loop_iterations(1, 1, 1), per_tile + 2 + 96);
        // dQ's key tiles and dK/dV's query tiles times the group: the larger one counts.
        assert_eq!(t.backward_loop_iterations(10, 2, 1), 10 * per_tile + 96);
        assert_eq!(
            t.backward_loop_iterations(2, 3, 4),
            4 * (3 * per_tile + 2) + 96
        );
    }

    #[test]
    fn the_largest_listed_tile_that_fits_is_taken() {
        let fit = |listed: &[usize], dims, autodiff, limit| {
            MmaTiling::fitting(listed, 32, dims, (2, autodiff), limit).map(|t| t.size)
        };
        // d = 256: 16 × 16 tiles fit 48 KiB (42 496 bytes forward), not 32 KiB, where 8 × 8
        // tiles do if the device lists them.
        assert_eq!(fit(&[16, 8], (256, 256), true, 48 << 10), Ok(16));
        assert_eq!(fit(&[16, 8], (256, 256), true, 32 << 10), Ok(8));
        let needed = MmaTiling::new(16, 32, 256, 256).call_shared_bytes(2, true);
        assert_eq!(needed, 42_496);
        assert_eq!(fit(&[16], (256, 256), true, 32 << 10), Err(needed));
        // d_k = 512, d_v = 16 in tiles of 16: the forward needs 35 840 bytes, the backward
        // 36 864; only a call under autodiff counts the backward's.
        assert_eq!(fit(&[16, 8], (512, 16), false, 36_000), Ok(16));
        assert_eq!(fit(&[16, 8], (512, 16), true, 36_000), Ok(8));
        // Nothing fits d = 512 in 16 KiB: the smallest listed tile's need is named.
        let needed = MmaTiling::new(8, 32, 512, 512).call_shared_bytes(2, true);
        assert_eq!(fit(&[16, 8], (512, 512), true, 16 << 10), Err(needed));
    }
}
