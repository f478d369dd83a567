//! Rounding f32 runs to bf16, 16 (or 2 × 16) values at a time with AVX512_BF16 where the CPU
//! has it.

use super::pairs::avx512_bf16_detected;

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
