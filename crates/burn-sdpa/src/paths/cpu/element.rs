//! The element types the CPU kernel stores its inputs and outputs in: `f32`, and bf16 (the
//! products read bf16 operands and sum in f32; the softmax, the log-sum-exp, the output's
//! accumulator and every gradient accumulator are f32).

use burn::tensor::bf16;

use super::simd;
use super::tile::{View, product};
use super::tile_bf16::{PackedRhs, bf16_bits, product_bf16_packed};

/// A storage type of the CPU kernel (`f32` or bf16): its conversion from f32, its tile products
/// and its dot product.
pub(crate) trait Element: Copy + Send + Sync + 'static {
    /// A right operand prepared for the products it enters (the view itself for f32, whose
    /// products pack their own operands; bf16 tiles packed once).
    type Rhs<'a>: Send + Sync;

    /// `dst[i]` = this type's value nearest to `src[i]` (round to nearest even).
    fn store(src: &[f32], dst: &mut [Self]);
    /// `rhs` prepared for [`Element::product`] and [`Element::product_f32_lhs`].
    fn prepare(rhs: View<'_, Self>) -> Self::Rhs<'_>;
    /// `dst (+)= factor · lhs · rhs` on two operands of this type.
    fn product(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, Self>,
        rhs: &Self::Rhs<'_>,
        accumulate: bool,
        factor: f32,
    );
    /// The same with an `f32` left operand (the weights P or their gradient dS), read at this
    /// type's precision.
    fn product_f32_lhs(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, f32>,
        rhs: &Self::Rhs<'_>,
        accumulate: bool,
        factor: f32,
    );
    /// `Σ a_i · b_i` in f32.
    fn dot(a: &[Self], b: &[Self]) -> f32;
}

impl Element for f32 {
    type Rhs<'a> = View<'a, f32>;

    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn prepare(rhs: View<'_, f32>) -> View<'_, f32> {
        rhs
    }
    fn product(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, f32>,
        rhs: &View<'_, f32>,
        accumulate: bool,
        factor: f32,
    ) {
        product(dst, dst_stride, lhs, *rhs, accumulate, factor)
    }
    fn product_f32_lhs(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, f32>,
        rhs: &View<'_, f32>,
        accumulate: bool,
        factor: f32,
    ) {
        product(dst, dst_stride, lhs, *rhs, accumulate, factor)
    }
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        simd::dot(a, b)
    }
}

impl Element for bf16 {
    type Rhs<'a> = PackedRhs;

    fn store(src: &[f32], dst: &mut [bf16]) {
        super::tile_bf16::round_to_bf16(src, dst)
    }
    fn prepare(rhs: View<'_, bf16>) -> PackedRhs {
        PackedRhs::new(rhs)
    }
    fn product(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, bf16>,
        rhs: &PackedRhs,
        accumulate: bool,
        factor: f32,
    ) {
        product_bf16_packed(dst, dst_stride, lhs, rhs, accumulate, factor)
    }
    fn product_f32_lhs(
        dst: &mut [f32],
        dst_stride: usize,
        lhs: View<'_, f32>,
        rhs: &PackedRhs,
        accumulate: bool,
        factor: f32,
    ) {
        product_bf16_packed(dst, dst_stride, lhs, rhs, accumulate, factor)
    }
    fn dot(a: &[bf16], b: &[bf16]) -> f32 {
        simd::dot_bf16(bf16_bits(a), bf16_bits(b))
    }
}
