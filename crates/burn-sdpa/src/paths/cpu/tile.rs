//! The tile products of the CPU kernels: small matrix products on slices, through the `gemm`
//! crate (the one Burn's Flex backend uses), single-threaded inside a kernel task.

/// A matrix read from a slice with a row stride and a column stride, so that a row-major block
/// and its transpose are the same data read two ways (`f32` for [`product`], bf16 or `f32` for
/// the bf16 product of `tile_bf16.rs`).
#[derive(Debug)]
pub(crate) struct View<'a, T = f32> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for View<'_, T> {}

impl<'a, T: Copy> View<'a, T> {
    /// A row-major `[rows, cols]` block whose rows are `row_stride` apart.
    pub fn rows(data: &'a [T], rows: usize, cols: usize, row_stride: usize) -> Self {
        Self::checked(data, rows, cols, row_stride, 1)
    }

    /// The transpose of a row-major `[cols, rows]` block whose rows are `row_stride` apart,
    /// read as `[rows, cols]`.
    pub fn transposed(data: &'a [T], rows: usize, cols: usize, row_stride: usize) -> Self {
        Self::checked(data, rows, cols, 1, row_stride)
    }

    /// Rows of the matrix.
    pub fn rows_len(&self) -> usize {
        self.rows
    }

    /// Columns of the matrix.
    pub fn cols_len(&self) -> usize {
        self.cols
    }

    /// The rows as slices, when every row is contiguous (column stride 1).
    pub fn row_major(&self) -> Option<impl Iterator<Item = &'a [T]> + use<'a, T>> {
        let view = *self;
        (view.col_stride == 1 && view.cols > 0).then(move || {
            (0..view.rows).map(move |row_idx| &view.data[row_idx * view.row_stride..][..view.cols])
        })
    }

    /// The columns as slices, when every column is contiguous (row stride 1): a transposed
    /// row-major block.
    pub fn col_major(&self) -> Option<impl Iterator<Item = &'a [T]> + use<'a, T>> {
        let view = *self;
        (view.row_stride == 1 && view.rows > 0).then(move || {
            (0..view.cols).map(move |col_idx| &view.data[col_idx * view.col_stride..][..view.rows])
        })
    }

    /// The values from the first element on and the row stride, when every row is contiguous
    /// (column stride 1).
    pub fn row_major_data(&self) -> Option<(&'a [T], usize)> {
        (self.col_stride == 1).then_some((self.data, self.row_stride))
    }

    /// The values from the first element on and the column stride, when every column is
    /// contiguous (row stride 1): a transposed row-major block.
    pub fn col_major_data(&self) -> Option<(&'a [T], usize)> {
        (self.row_stride == 1).then_some((self.data, self.col_stride))
    }

    /// The element at (`row_idx`, `col_idx`).
    ///
    /// # Panics
    /// Outside the matrix.
    pub fn at(&self, row_idx: usize, col_idx: usize) -> T {
        assert!(
            row_idx < self.rows && col_idx < self.cols,
            "tile view [{}, {}]: no element ({row_idx}, {col_idx})",
            self.rows,
            self.cols
        );
        self.data[row_idx * self.row_stride + col_idx * self.col_stride]
    }

    fn checked(
        data: &'a [T],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        // Every element the product reads lies inside `data`: this is what makes the unsafe
        // call in `product` sound.
        let last = if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * row_stride + (cols - 1) * col_stride + 1
        };
        assert!(
            last <= data.len(),
            "tile view [{rows}, {cols}] with strides ({row_stride}, {col_stride}) reads past a slice of {}",
            data.len()
        );
        Self {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }
}

/// `dst = factor · lhs · rhs` (or `dst += factor · lhs · rhs` when `accumulate`), where `dst`
/// is a row-major `[lhs.rows, rhs.cols]` block whose rows are `dst_stride` apart.
///
/// # Panics
/// When the inner sizes differ or `dst` is too short (the views check their own bounds).
pub(crate) fn product(
    dst: &mut [f32],
    dst_stride: usize,
    lhs: View<'_>,
    rhs: View<'_>,
    accumulate: bool,
    factor: f32,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(
        k, rhs.rows,
        "tile product: inner sizes {k} and {}",
        rhs.rows
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * dst_stride + n <= dst.len(),
        "tile product: [{m}, {n}] with row stride {dst_stride} does not fit {} values",
        dst.len()
    );
    // SAFETY: `View::checked` and the assertion above keep every address gemm reads or writes
    // inside the three slices, `dst` is borrowed mutably so it aliases neither input, and gemm
    // does not retain the pointers.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            factor,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_of_blocks_and_transposes() {
        // a: [2, 3], b: [3, 2] stored transposed as [2, 3].
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b_t = [1.0, 0.0, 2.0, 0.0, 1.0, 1.0];
        let mut dst = [0.0; 4];
        product(
            &mut dst,
            2,
            View::rows(&a, 2, 3, 3),
            View::transposed(&b_t, 3, 2, 3),
            false,
            1.0,
        );
        assert_eq!(dst, [7.0, 5.0, 16.0, 11.0]);
        product(
            &mut dst,
            2,
            View::rows(&a, 2, 3, 3),
            View::transposed(&b_t, 3, 2, 3),
            true,
            0.5,
        );
        assert_eq!(dst, [10.5, 7.5, 24.0, 16.5]);
    }

    #[test]
    #[should_panic(expected = "reads past")]
    fn a_view_past_its_slice_panics() {
        let _ = View::rows(&[0.0; 5], 2, 3, 3);
    }
}
