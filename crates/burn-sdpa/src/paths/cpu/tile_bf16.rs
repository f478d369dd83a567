//! bf16 tile products with f32 accumulation, on the fastest of three instruction sets this
//! machine has ([`Bf16Isa`]): Intel AMX tiles (`TDPBF16PS`) where the CPU has AMX-TILE and
//! AMX-BF16 and the OS grants the tile state, AVX512_BF16 (`VDPBF16PS`, `tile_bf16_pairs.rs`)
//! where the CPU has it, the f32 product on widened copies otherwise. The operands are bf16
//! values or f32 values rounded to bf16 (round to nearest even) while they are packed; products
//! and sums are f32.
//!
//! Measured per core with loops of independent instructions (scratch loops, not in the repo; the
//! kernel figures are, in `docs/bench/`): on an Intel Xeon with AMX, `VDPBF16PS zmm` ran at about
//! 70 GFLOP/s, `VFMADD231PS zmm` at 210 and `TDPBF16PS` at 1 460; on an AMD EPYC (Zen 5),
//! `VDPBF16PS` at about 470 and `VFMADD231PS` at 250. So AMX first, then AVX512_BF16 — which on
//! that Xeon is slower than the f32 product, a cost the kernel's bf16 storage still halves the
//! traffic of.
//!
//! `SDPA_BF16_ISA=amx|avx512_bf16|portable` (read once per process) caps the choice, so that every
//! path can be run on one machine; the unit tests run every path the machine has.

use std::sync::OnceLock;

use burn::tensor::bf16;

use super::tile::{View, product};

#[path = "tile_bf16_pack.rs"]
mod pack;
#[path = "tile_bf16_pairs.rs"]
mod pairs;
#[path = "tile_bf16_round.rs"]
mod round;

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

    /// `dst[2i] = first[i]`, `dst[2i + 1] = second[i]` as bf16 bits (0 past `second`'s end):
    /// two runs interleaved into pairs.
    fn pack_interleaved(first: &[Self], second: &[Self], dst: &mut [u16]) {
        for (i, pair) in dst.chunks_exact_mut(2).enumerate().take(first.len()) {
            pair[0] = first[i].bf16_bits();
            pair[1] = second.get(i).map_or(0, |x| x.bf16_bits());
        }
    }

    /// The bits of a run of values, when they are bf16 already (read in place, no rounding).
    fn as_bits(_values: &[Self]) -> Option<&[u16]> {
        None
    }
}

/// bf16 values as their bit patterns, in place.
pub(crate) fn bf16_bits(values: &[bf16]) -> &[u16] {
    // SAFETY: `bf16` is `repr(transparent)` over `u16`: the same size, alignment and bits, and
    // the slice keeps the borrow's lifetime.
    unsafe { core::slice::from_raw_parts(values.as_ptr().cast::<u16>(), values.len()) }
}

impl Bf16Operand for bf16 {
    fn bf16_bits(self) -> u16 {
        self.to_bits()
    }

    fn as_bits(values: &[bf16]) -> Option<&[u16]> {
        Some(bf16_bits(values))
    }
}

impl Bf16Operand for f32 {
    fn bf16_bits(self) -> u16 {
        bf16::from_f32(self).to_bits()
    }

    fn pack_run(src: &[f32], dst: &mut [u16]) {
        round::round_run(src, dst)
    }

    fn pack_interleaved(first: &[f32], second: &[f32], dst: &mut [u16]) {
        round::round_interleaved(first, second, dst)
    }
}

/// The instruction set of the bf16 tile products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bf16Isa {
    /// f32 products on operands rounded to bf16 and widened back (every CPU).
    Portable,
    /// `VDPBF16PS` on 512-bit vectors (AVX-512F, AVX-512BW, AVX512_BF16).
    Avx512Bf16,
    /// `TDPBF16PS` on AMX tiles (Linux x86-64 with AMX-TILE, AMX-BF16 and AVX512_BF16).
    Amx,
}

impl Bf16Isa {
    /// The name reports and `SDPA_BF16_ISA` use: `portable`, `avx512_bf16` or `amx`.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Isa::Portable => "portable",
            Bf16Isa::Avx512Bf16 => "avx512_bf16",
            Bf16Isa::Amx => "amx",
        }
    }

    /// Every instruction set this machine runs, slowest first (decided once).
    pub fn available() -> &'static [Bf16Isa] {
        static AVAILABLE: OnceLock<Vec<Bf16Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(|| {
            let mut isas = vec![Bf16Isa::Portable];
            if pairs::avx512_bf16_detected() {
                isas.push(Bf16Isa::Avx512Bf16);
            }
            if amx::ready() {
                isas.push(Bf16Isa::Amx);
            }
            isas
        })
    }

    /// The one the products take: the fastest available, at most `SDPA_BF16_ISA` when set.
    pub fn current() -> Bf16Isa {
        #[cfg(test)]
        if let Some(forced) = forcing::forced() {
            return forced;
        }
        static CURRENT: OnceLock<Bf16Isa> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            let cap = std::env::var("SDPA_BF16_ISA").ok().and_then(|name| {
                [Bf16Isa::Portable, Bf16Isa::Avx512Bf16, Bf16Isa::Amx]
                    .into_iter()
                    .find(|isa| isa.name() == name)
            });
            Self::available()
                .iter()
                .copied()
                .filter(|&isa| cap.is_none_or(|cap| isa <= cap))
                .max()
                .unwrap_or(Bf16Isa::Portable)
        })
    }
}

#[cfg(test)]
pub(crate) mod forcing {
    //! Tests run every instruction set in one process: [`force`] makes [`Bf16Isa::current`]
    //! answer one of them until its guard drops (one forcing test at a time).

    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::{Mutex, MutexGuard};

    use super::Bf16Isa;

    /// 0: nothing forced; otherwise 1 + the index in `ALL`.
    static FORCED: AtomicU8 = AtomicU8::new(0);
    const ALL: [Bf16Isa; 3] = [Bf16Isa::Portable, Bf16Isa::Avx512Bf16, Bf16Isa::Amx];

    pub(crate) fn forced() -> Option<Bf16Isa> {
        let idx = FORCED.load(Ordering::Relaxed) as usize;
        idx.checked_sub(1).map(|idx| ALL[idx])
    }

    /// Holds the forcing until dropped.
    pub(crate) struct Forced(#[allow(dead_code)] MutexGuard<'static, ()>);

    impl Drop for Forced {
        fn drop(&mut self) {
            FORCED.store(0, Ordering::Relaxed);
        }
    }

    /// Holds the forcing lock without forcing anything: [`Bf16Isa::current`] answers the
    /// machine's own choice until the guard drops.
    pub(crate) fn unforced() -> Forced {
        Forced(LOCK.lock().unwrap_or_else(|p| p.into_inner()))
    }

    static LOCK: Mutex<()> = Mutex::new(());

    /// [`Bf16Isa::current`] answers `isa` until the guard drops.
    ///
    /// # Panics
    /// When this machine cannot run `isa`.
    pub(crate) fn force(isa: Bf16Isa) -> Forced {
        assert!(
            Bf16Isa::available().contains(&isa),
            "{isa:?} is not available"
        );
        static LOCK: Mutex<()> = Mutex::new(());
        let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let idx = ALL.iter().position(|&x| x == isa).unwrap_or(0);
        FORCED.store(idx as u8 + 1, Ordering::Relaxed);
        Forced(guard)
    }
}

/// The instruction set the bf16 tile products run with on this machine: `amx`, `avx512_bf16`
/// or `portable`.
pub fn bf16_product_isa() -> &'static str {
    Bf16Isa::current().name()
}

/// A right operand `[k, n]` of [`product_bf16_packed`], rounded to bf16 and laid out once for
/// every product it enters: the pair layout of `tile_bf16_pairs.rs` on AMX and AVX512_BF16,
/// widened f32 rows on the portable path.
#[derive(Debug)]
pub(crate) struct PackedRhs {
    rows: usize,
    cols: usize,
    isa: Bf16Isa,
    layout: Layout,
}

#[derive(Debug)]
enum Layout {
    /// The tiles of `tile_bf16_pack::pack_rhs`.
    Pairs(Vec<u16>),
    /// Row-major `[k, n]` f32 values, each exactly a bf16 value.
    Widened(Vec<f32>),
}

impl PackedRhs {
    /// `rhs` rounded to bf16 and packed for the products of [`Bf16Isa::current`].
    pub fn new<B: Bf16Operand>(rhs: View<'_, B>) -> Self {
        Self::for_isa(rhs, Bf16Isa::current())
    }

    /// `rhs` rounded to bf16 and packed for the products of `isa`.
    pub fn for_isa<B: Bf16Operand>(rhs: View<'_, B>, isa: Bf16Isa) -> Self {
        let (rows, cols) = (rhs.rows_len(), rhs.cols_len());
        let layout = match isa {
            Bf16Isa::Amx | Bf16Isa::Avx512Bf16 => Layout::Pairs(pack::pack_rhs(&rhs)),
            Bf16Isa::Portable => Layout::Widened(widened(&rhs)),
        };
        Self {
            rows,
            cols,
            isa,
            layout,
        }
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
/// bf16 and f32 products and sums, on the products of `isa`; `dst` is a row-major
/// `[lhs.rows, rhs.cols]` block whose rows are `dst_stride` apart.
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
    isa: Bf16Isa,
) {
    product_bf16_packed(
        dst,
        dst_stride,
        lhs,
        &PackedRhs::for_isa(rhs, isa),
        accumulate,
        factor,
    )
}

/// `dst = factor · lhs · rhs` (or `dst += …` when `accumulate`) with the operands rounded to
/// bf16 and f32 products and sums, the right operand packed beforehand (the product runs on
/// the instruction set it was packed for); `dst` is a row-major `[lhs.rows, rhs.cols]` block
/// whose rows are `dst_stride` apart.
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
    match (&rhs.layout, rhs.isa) {
        (Layout::Pairs(tiles), Bf16Isa::Amx) => {
            amx::product(dst, dst_stride, lhs, tiles, n, accumulate, factor)
        }
        (Layout::Pairs(tiles), _) => {
            pairs::product(dst, dst_stride, lhs, tiles, n, accumulate, factor)
        }
        // The portable path: the left operand rounded and widened too, then the f32 product.
        (Layout::Widened(b), _) => product(
            dst,
            dst_stride,
            View::rows(&widened(&lhs), m, k, k),
            View::rows(b, k, n, n),
            accumulate,
            factor,
        ),
    }
}

/// `dst[i]` = `src[i]` rounded to bf16 (nearest even), 16 values at a time with AVX512_BF16
/// where the CPU has it, on the thread pool for long runs (a gradient rounded for a bf16
/// parameter).
pub(crate) fn round_to_bf16(src: &[f32], dst: &mut [bf16]) {
    use rayon::prelude::*;
    // SAFETY: `bf16` is `repr(transparent)` over `u16`: the same size, alignment and bits, and
    // the slice keeps the mutable borrow's lifetime.
    let bits =
        unsafe { core::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u16>(), dst.len()) };
    const CHUNK: usize = 1 << 16;
    if src.len() <= CHUNK {
        round::round_run(src, bits);
    } else {
        src.par_chunks(CHUNK)
            .zip(bits.par_chunks_mut(CHUNK))
            .for_each(|(s, d)| round::round_run(s, d));
    }
}

/// `dst[i]` = the bits of `src[i]` rounded to bf16 (nearest even).
fn round_run_portable(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16::from_f32(*s).to_bits();
    }
}

/// Whether `SDPA_BF16_ISA` keeps AMX out (read once): AMX's state is requested only when it
/// may be used.
fn amx_switched_off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("SDPA_BF16_ISA")
            .is_ok_and(|value| value == "portable" || value == "avx512_bf16")
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[path = "tile_bf16_amx.rs"]
mod amx;

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod amx {
    //! No AMX path on this target.
    use super::super::tile::View;
    use super::Bf16Operand;

    pub(super) fn ready() -> bool {
        let _ = super::amx_switched_off();
        false
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
