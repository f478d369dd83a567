//! The softmax loops of the CPU kernel, compiled once per instruction set (AVX-512, AVX2+FMA,
//! portable) and picked at run time, and the vectorizable `exp` they use.

/// Calls `$name::$body(args)` through the best `#[target_feature]` instance.
macro_rules! dispatch {
    ($body:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F (checked just above).
                return unsafe { avx512::$body($($arg),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU supports AVX2 and FMA (checked just above).
                return unsafe { avx2::$body($($arg),*) };
            }
        }
        portable::$body($($arg),*)
    }};
}

/// Largest element, NaN skipped (−∞ for an empty, all −∞ or all NaN slice).
pub fn max(xs: &[f32]) -> f32 {
    dispatch!(max_body(xs))
}

/// `x ← exp(x − max)` for every element; returns the sum of the new values.
pub fn exp_sub_sum(xs: &mut [f32], max: f32) -> f32 {
    dispatch!(exp_sub_sum_body(xs, max))
}

/// [`exp_sub_sum`] that also sums, in the same pass, what the row statistics need, with
/// `d = x − max`, over the visible elements (those above −∞): `[Σ e^d, Σ e^d·d, count, Σ d,
/// Σ d²]`. For a slice whose hidden elements, if any, lie in its first [`LANES`] (when
/// `hidden.0`) or in its last vector (when `hidden.1`; a tail shorter than a vector is always
/// checked): a tile the mask does not touch, or a row's visible run of a band tile widened to
/// whole vectors. The vectors between take no select.
pub fn exp_sub_sum_moments(xs: &mut [f32], max: f32, hidden: (bool, bool)) -> [f32; 5] {
    dispatch!(exp_sub_sum_moments_body(xs, max, hidden))
}

/// [`exp_sub_sum_moments`] over the visible elements only (those above −∞; their count is the
/// third sum): a hidden element's weight is 0 and it adds nothing to the other sums.
pub fn exp_sub_sum_moments_masked(xs: &mut [f32], max: f32) -> [f32; 5] {
    dispatch!(exp_sub_sum_moments_masked_body(xs, max))
}

/// `[Σ (x − shift), Σ (x − shift)²]`, summed in `f32` lanes.
#[cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code))]
pub fn sum_and_squares_about(xs: &[f32], shift: f32) -> [f32; 2] {
    dispatch!(sum_and_squares_about_body(xs, shift))
}

/// `e^x` for one `x ≤ 0` with the loops' polynomial (inlined: a loop over rows calling it
/// still vectorizes).
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    exp(x, |a, b, c| a * b + c)
}

/// `x ← x · factor` for every element.
pub fn scale(xs: &mut [f32], factor: f32) {
    dispatch!(scale_body(xs, factor))
}

/// `x ← exp(x − shift)` for every element (0 where `x − shift` is −∞ or below −87.3).
pub fn exp_sub(xs: &mut [f32], shift: f32) {
    dispatch!(exp_sub_body(xs, shift))
}

/// `x ← x + y` element by element.
pub fn add(xs: &mut [f32], ys: &[f32]) {
    dispatch!(add_body(xs, ys))
}

/// `x ← −∞` where `masked` is true.
pub fn mask(xs: &mut [f32], masked: &[bool]) {
    dispatch!(mask_body(xs, masked))
}

/// `p ← p · (dp − d)`: the softmax's backward, dS = P ∘ (dP − rowsum(dO ∘ O)).
pub fn softmax_grad(p: &mut [f32], dp: &[f32], d: f32) {
    dispatch!(softmax_grad_body(p, dp, d))
}

/// `x ← c · tanh(x / c)` for every element (the logit soft-cap).
pub fn softcap(xs: &mut [f32], cap: f32) {
    dispatch!(softcap_body(xs, cap))
}

/// [`softcap`], also writing the cap's derivative `1 − tanh²(x / c)` into `grad`.
pub fn softcap_with_grad(xs: &mut [f32], cap: f32, grad: &mut [f32]) {
    dispatch!(softcap_with_grad_body(xs, cap, grad))
}

/// `x ← x · y` element by element.
pub fn mul(xs: &mut [f32], ys: &[f32]) {
    dispatch!(mul_body(xs, ys))
}

/// Whether some element is NaN or infinite (x · 0 is NaN exactly for those).
pub fn non_finite(xs: &[f32]) -> bool {
    dispatch!(non_finite_body(xs))
}

/// Σ x·y.
pub fn dot(xs: &[f32], ys: &[f32]) -> f32 {
    dispatch!(dot_body(xs, ys))
}

/// Σ x·y over bf16 bit patterns (each widened to f32 exactly), summed in f32.
pub fn dot_bf16(xs: &[u16], ys: &[u16]) -> f32 {
    dispatch!(dot_bf16_body(xs, ys))
}

/// Lanes the loops are written for (the compiler maps them onto 4, 8 or 16-wide registers).
pub(crate) const LANES: usize = 16;

/// The loop bodies, written as plain lane-parallel arithmetic so the compiler vectorizes them.
macro_rules! bodies {
    ($madd:expr, $(#[$attr:meta])*) => {
        $(#[$attr])*
        pub fn max_body(xs: &[f32]) -> f32 {
            // `if x > l` rather than `f32::max`: one `max` instruction per vector instead of a
            // NaN test and a blend (a NaN is skipped either way: it is never `>`); four
            // independent lane sets, so that consecutive vectors do not wait on each other.
            let larger = |a: f32, x: f32| if x > a { x } else { a };
            let mut lanes = [[f32::NEG_INFINITY; LANES]; 4];
            let mut chunks = xs.chunks_exact(4 * LANES);
            for chunk in &mut chunks {
                for (set, part) in lanes.iter_mut().zip(chunk.chunks_exact(LANES)) {
                    for (l, x) in set.iter_mut().zip(part) {
                        *l = larger(*l, *x);
                    }
                }
            }
            // Then one vector at a time (a band tile's rows have any multiple of LANES).
            let mut rest = chunks.remainder().chunks_exact(LANES);
            for part in &mut rest {
                for (l, x) in lanes[0].iter_mut().zip(part) {
                    *l = larger(*l, *x);
                }
            }
            let tail = rest.remainder().iter().fold(f32::NEG_INFINITY, |a, x| larger(a, *x));
            lanes.iter().flatten().fold(tail, |a, x| larger(a, *x))
        }

        $(#[$attr])*
        pub fn exp_sub_sum_body(xs: &mut [f32], max: f32) -> f32 {
            let mut lanes = [0.0f32; LANES];
            let mut chunks = xs.chunks_exact_mut(LANES);
            for chunk in &mut chunks {
                for (l, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
                    *x = super::exp(*x - max, $madd);
                    *l += *x;
                }
            }
            let mut sum = 0.0;
            for x in chunks.into_remainder() {
                *x = super::exp(*x - max, $madd);
                sum += *x;
            }
            sum + lanes.iter().sum::<f32>()
        }

        $(#[$attr])*
        pub fn exp_sub_sum_moments_body(
            xs: &mut [f32],
            max: f32,
            (hidden_first, hidden_last): (bool, bool),
        ) -> [f32; 5] {
            // Only the first and the last vector may hold hidden elements (−∞), and only when
            // told: they take the selects, the vectors between them do not. One named array per
            // sum (a 2-D array of lanes was kept in memory, a store and a reload every vector).
            let mut weights = [0.0f32; LANES];
            let mut weighted = [0.0f32; LANES];
            let mut counts = [0.0f32; LANES];
            let mut firsts = [0.0f32; LANES];
            let mut seconds = [0.0f32; LANES];
            let n_chunks = xs.len() / LANES;
            let mut chunks = xs.chunks_exact_mut(LANES);
            let mut masked_chunks = 0;
            for (chunk_idx, chunk) in (&mut chunks).enumerate() {
                if (hidden_first && chunk_idx == 0) || (hidden_last && chunk_idx + 1 == n_chunks) {
                    masked_chunks += 1;
                    for i in 0..LANES {
                        let [p, pd, seen, d, dd] = masked_term(&mut chunk[i], max);
                        weights[i] += p;
                        weighted[i] += pd;
                        counts[i] += seen;
                        firsts[i] += d;
                        seconds[i] += dd;
                    }
                } else {
                    // Every element visible: the count is added once below.
                    for i in 0..LANES {
                        let d = chunk[i] - max;
                        let p = super::exp(d, $madd);
                        chunk[i] = p;
                        weights[i] += p;
                        weighted[i] = $madd(p, d, weighted[i]);
                        firsts[i] += d;
                        seconds[i] = $madd(d, d, seconds[i]);
                    }
                }
            }
            let mut total = sum_lanes(
                (weights, weighted, counts, firsts, seconds),
                chunks.into_remainder(),
                max,
            );
            total[2] += ((n_chunks - masked_chunks) * LANES) as f32;
            total
        }

        $(#[$attr])*
        pub fn exp_sub_sum_moments_masked_body(xs: &mut [f32], max: f32) -> [f32; 5] {
            let mut weights = [0.0f32; LANES];
            let mut weighted = [0.0f32; LANES];
            let mut counts = [0.0f32; LANES];
            let mut firsts = [0.0f32; LANES];
            let mut seconds = [0.0f32; LANES];
            let mut chunks = xs.chunks_exact_mut(LANES);
            for chunk in &mut chunks {
                for i in 0..LANES {
                    let [p, pd, seen, d, dd] = masked_term(&mut chunk[i], max);
                    weights[i] += p;
                    weighted[i] += pd;
                    counts[i] += seen;
                    firsts[i] += d;
                    seconds[i] += dd;
                }
            }
            sum_lanes(
                (weights, weighted, counts, firsts, seconds),
                chunks.into_remainder(),
                max,
            )
        }

        /// One element's terms `[e^d, e^d·d, 1, d, d²]` (`d = x − max`; all 0 for a hidden
        /// element, −∞), `x` replaced by its weight `e^d`.
        #[inline(always)]
        fn masked_term(x: &mut f32, max: f32) -> [f32; 5] {
            // A hidden element has d = −∞ and a weight exp(max(d, −100)) = 0; the select keeps
            // −∞ (and 0·−∞ = NaN) out of the other sums.
            let seen = *x > f32::NEG_INFINITY;
            let p = super::exp((*x - max).max(-100.0), $madd);
            let d = if seen { *x - max } else { 0.0 };
            *x = p;
            [p, p * d, if seen { 1.0 } else { 0.0 }, d, d * d]
        }

        /// The masked terms of the `tail` (shorter than a vector) plus the lanes' sums. The
        /// weights' sum is added up as [`exp_sub_sum_body`] adds it (the tail, then the lanes
        /// one after another), so that a step that asks for the statistics computes the very
        /// softmax of one that does not.
        #[inline(always)]
        fn sum_lanes(
            (weights, weighted, counts, firsts, seconds): Lanes5,
            tail: &mut [f32],
            max: f32,
        ) -> [f32; 5] {
            let mut total = [
                0.0,
                super::tree_sum(weighted),
                super::tree_sum(counts),
                super::tree_sum(firsts),
                super::tree_sum(seconds),
            ];
            let mut weights_tail = 0.0f32;
            for x in tail {
                let [p, rest @ ..] = masked_term(x, max);
                weights_tail += p;
                for (sum, t) in total[1..].iter_mut().zip(rest) {
                    *sum += t;
                }
            }
            total[0] = weights_tail + weights.iter().sum::<f32>();
            total
        }

        $(#[$attr])*
        #[cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code))]
        pub fn sum_and_squares_about_body(xs: &[f32], shift: f32) -> [f32; 2] {
            let mut lanes = [[0.0f32; LANES]; 2];
            let mut chunks = xs.chunks_exact(LANES);
            for chunk in &mut chunks {
                for i in 0..LANES {
                    let d = chunk[i] - shift;
                    lanes[0][i] += d;
                    lanes[1][i] = $madd(d, d, lanes[1][i]);
                }
            }
            let mut sums = [super::tree_sum(lanes[0]), super::tree_sum(lanes[1])];
            for x in chunks.remainder() {
                let d = *x - shift;
                sums[0] += d;
                sums[1] += d * d;
            }
            sums
        }

        $(#[$attr])*
        pub fn scale_body(xs: &mut [f32], factor: f32) {
            for x in xs {
                *x *= factor;
            }
        }

        $(#[$attr])*
        pub fn exp_sub_body(xs: &mut [f32], shift: f32) {
            for x in xs {
                *x = super::exp(*x - shift, $madd);
            }
        }

        $(#[$attr])*
        pub fn add_body(xs: &mut [f32], ys: &[f32]) {
            for (x, y) in xs.iter_mut().zip(ys) {
                *x += *y;
            }
        }

        $(#[$attr])*
        pub fn mask_body(xs: &mut [f32], masked: &[bool]) {
            for (x, m) in xs.iter_mut().zip(masked) {
                *x = if *m { f32::NEG_INFINITY } else { *x };
            }
        }

        $(#[$attr])*
        pub fn softmax_grad_body(p: &mut [f32], dp: &[f32], d: f32) {
            for (p, dp) in p.iter_mut().zip(dp) {
                *p *= *dp - d;
            }
        }

        $(#[$attr])*
        pub fn softcap_body(xs: &mut [f32], cap: f32) {
            let inv = 1.0 / cap;
            for x in xs {
                *x = cap * super::tanh(*x * inv, $madd);
            }
        }

        $(#[$attr])*
        pub fn softcap_with_grad_body(xs: &mut [f32], cap: f32, grad: &mut [f32]) {
            let inv = 1.0 / cap;
            for (x, g) in xs.iter_mut().zip(grad.iter_mut()) {
                let t = super::tanh(*x * inv, $madd);
                *x = cap * t;
                *g = 1.0 - t * t;
            }
        }

        $(#[$attr])*
        pub fn mul_body(xs: &mut [f32], ys: &[f32]) {
            for (x, y) in xs.iter_mut().zip(ys) {
                *x *= *y;
            }
        }

        $(#[$attr])*
        pub fn non_finite_body(xs: &[f32]) -> bool {
            let mut lanes = [0.0f32; LANES];
            let mut chunks = xs.chunks_exact(LANES);
            for chunk in &mut chunks {
                for (l, x) in lanes.iter_mut().zip(chunk) {
                    *l += *x * 0.0;
                }
            }
            let tail: f32 = chunks.remainder().iter().map(|x| *x * 0.0).sum();
            (tail + lanes.iter().sum::<f32>()).is_nan()
        }

        $(#[$attr])*
        pub fn dot_body(xs: &[f32], ys: &[f32]) -> f32 {
            let mut lanes = [0.0f32; LANES];
            let mut xc = xs.chunks_exact(LANES);
            let mut yc = ys.chunks_exact(LANES);
            for (x, y) in (&mut xc).zip(&mut yc) {
                for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
                    *l = $madd(*x, *y, *l);
                }
            }
            let tail: f32 = xc.remainder().iter().zip(yc.remainder()).map(|(x, y)| x * y).sum();
            tail + lanes.iter().sum::<f32>()
        }

        $(#[$attr])*
        pub fn dot_bf16_body(xs: &[u16], ys: &[u16]) -> f32 {
            // bf16 is the high half of an f32: widening is a shift.
            let widen = |bits: u16| f32::from_bits(u32::from(bits) << 16);
            let mut lanes = [0.0f32; LANES];
            let mut xc = xs.chunks_exact(LANES);
            let mut yc = ys.chunks_exact(LANES);
            for (x, y) in (&mut xc).zip(&mut yc) {
                for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
                    *l = $madd(widen(*x), widen(*y), *l);
                }
            }
            let tail: f32 = xc
                .remainder()
                .iter()
                .zip(yc.remainder())
                .map(|(x, y)| widen(*x) * widen(*y))
                .sum();
            tail + lanes.iter().sum::<f32>()
        }
    };
}

pub mod portable {
    use super::{LANES, Lanes5};
    // Without FMA, `mul_add` would be a libm call: multiply and add separately.
    bodies!(|a: f32, b: f32, c: f32| a * b + c, #[inline(always)]);
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    //! # Safety
    //! Call only on a CPU with AVX2 and FMA.
    #![allow(clippy::missing_safety_doc)]
    use super::{LANES, Lanes5};
    bodies!(f32::mul_add, #[target_feature(enable = "avx2,fma")]);
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    //! # Safety
    //! Call only on a CPU with AVX-512F.
    #![allow(clippy::missing_safety_doc)]
    use super::{LANES, Lanes5};
    bodies!(f32::mul_add, #[target_feature(enable = "avx512f,avx2,fma")]);
}

/// The five lane sets of the statistics' loops: weights, weighted, counts, first and second
/// moments.
type Lanes5 = (
    [f32; LANES],
    [f32; LANES],
    [f32; LANES],
    [f32; LANES],
    [f32; LANES],
);

/// The sum of a lane set by halving it (vector adds of its halves, not a scalar walk along it).
#[inline(always)]
fn tree_sum(lanes: [f32; LANES]) -> f32 {
    let mut half = [0.0f32; LANES / 2];
    for i in 0..LANES / 2 {
        half[i] = lanes[i] + lanes[i + LANES / 2];
    }
    let mut quarter = [0.0f32; LANES / 4];
    for i in 0..LANES / 4 {
        quarter[i] = half[i] + half[i + LANES / 4];
    }
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

/// `e^x` for `x ≤ 0` (the softmax argument), 0 below −87.3 (where `f32` underflows) and for −∞.
///
/// Range reduction `x = k·ln 2 + r`, |r| ≤ ln 2 / 2, then a degree-6 Taylor polynomial for
/// `e^r` (truncation error < 2e-7 relative) and `2^k` built in the exponent bits. Branch-free
/// so the loops above vectorize.
#[inline(always)]
fn exp(x: f32, madd: impl Fn(f32, f32, f32) -> f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that k · LN2_HI is exact for |k| < 2^11.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2^23: adding it rounds to an integer, held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.max(-87.0);
    let shifted = madd(clamped, LOG2_E, ROUND);
    let k = shifted - ROUND;
    let r = madd(k, -LN2_LO, madd(k, -LN2_HI, clamped));
    let mut p: f32 = 1.0 / 720.0;
    p = madd(p, r, 1.0 / 120.0);
    p = madd(p, r, 1.0 / 24.0);
    p = madd(p, r, 1.0 / 6.0);
    p = madd(p, r, 0.5);
    p = madd(p, r, 1.0);
    p = madd(p, r, 1.0);
    // 2^k: k + 127 in the exponent field (k is the low bits of `shifted`).
    let k_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let two_k = f32::from_bits(k_bits.wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { p * two_k }
}

/// `tanh(y) = sign(y) · (1 − e) / (1 + e)` with `e = e^(−2|y|) ≤ 1`, through [`exp`] (absolute
/// error < 3e-7, tested); ±1 for |y| beyond 43.5, where `e` underflows.
#[inline(always)]
fn tanh(y: f32, madd: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let e = exp(-2.0 * y.abs(), madd);
    ((1.0 - e) / (1.0 + e)).copysign(y)
}

#[cfg(test)]
#[path = "simd_tests.rs"]
mod tests;
