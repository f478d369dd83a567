//! Mask helpers. Every mask here uses **true = masked out** (Burn's and the article's polarity;
//! PyTorch's boolean `attn_mask` is the opposite).

use core::ops::Range;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::error::AttentionError;
use crate::input::AttentionInput;
use crate::types::{AttentionDims, CausalAlignment, Window};

/// The causal mask for n queries and m keys, `[n, m]`, true where key j is hidden from query i.
///
/// [`CausalAlignment::TopLeft`] hides j > i; [`CausalAlignment::BottomRight`] hides
/// j > i + (m − n). With bottom-right alignment and n > m the first n − m queries see no key.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::{mask::causal_mask, CausalAlignment};
/// let device = Device::flex();
/// let mask = causal_mask(4, 4, CausalAlignment::TopLeft, &device);
/// // [[false, true,  true,  true ],
/// //  [false, false, true,  true ],
/// //  [false, false, false, true ],
/// //  [false, false, false, false]]
/// assert_eq!(mask.dims(), [4, 4]);
/// ```
pub fn causal_mask(
    n: usize,
    m: usize,
    alignment: CausalAlignment,
    device: &Device,
) -> Tensor<2, Bool> {
    causal_mask_for_keys(n, m, 0..m, alignment, device)
}

/// The columns `keys` of [`causal_mask`]`(n, m, ..)`: `[n, keys.len()]`, true where key j
/// (absolute index) is hidden from query i, i.e. j > i + offset. The chunked path builds its
/// mask one key block at a time with it.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::{mask::causal_mask_for_keys, CausalAlignment};
/// let device = Device::flex();
/// // Keys 2..4 of a 4 × 4 top-left mask: [[true, true], [true, true], [false, true], [false, false]]
/// let block = causal_mask_for_keys(4, 4, 2..4, CausalAlignment::TopLeft, &device);
/// assert_eq!(block.dims(), [4, 2]);
/// ```
pub fn causal_mask_for_keys(
    n: usize,
    m: usize,
    keys: Range<usize>,
    alignment: CausalAlignment,
    device: &Device,
) -> Tensor<2, Bool> {
    let (centre, cols) = diagonal_grid(n, keys, alignment.offset(n, m), device);
    cols.greater(centre)
}

/// The positions every causal, window and ALiBi mask compares, `[n, keys.len()]` each: a query's
/// place on the diagonal, `i + offset`, and a key's index `j`.
fn diagonal_grid(
    n: usize,
    keys: Range<usize>,
    offset: i64,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let len = keys.len();
    // [n] -> [n, 1] and [len] -> [1, len], both expanded to [n, len]
    let centre = Tensor::<1, Int>::arange(0..n as i64, device)
        .reshape([n, 1])
        .add_scalar(offset)
        .expand([n, len]);
    let cols = Tensor::<1, Int>::arange(keys.start as i64..keys.end as i64, device)
        .reshape([1, len])
        .expand([n, len]);
    (centre, cols)
}

/// The mask of a local [`Window`] for n queries and m keys, `[n, m]`, true where key j lies
/// outside query i's band `c − left ..= c + right`, `c = i + alignment.offset(n, m)`. The module
/// builds the same columns itself where a path needs them (it never needs this whole matrix on the
/// CPU kernel); this is the explicit form, for other code and for tests.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::{mask::window_mask, CausalAlignment, Window};
/// let device = Device::flex();
/// let mask = window_mask(4, 4, Window::new(Some(1), Some(0)), CausalAlignment::BottomRight, &device);
/// // [[false, true,  true,  true ],
/// //  [false, false, true,  true ],
/// //  [true,  false, false, true ],
/// //  [true,  true,  false, false]]
/// let hidden: Vec<bool> = mask.into_data().to_vec().unwrap();
/// assert_eq!(&hidden[8..12], &[true, false, false, true]);
/// ```
pub fn window_mask(
    n: usize,
    m: usize,
    window: Window,
    alignment: CausalAlignment,
    device: &Device,
) -> Tensor<2, Bool> {
    window_mask_for_keys(n, m, 0..m, window, alignment, device)
}

/// The columns `keys` of [`window_mask`]`(n, m, ..)`: `[n, keys.len()]`.
pub fn window_mask_for_keys(
    n: usize,
    m: usize,
    keys: Range<usize>,
    window: Window,
    alignment: CausalAlignment,
    device: &Device,
) -> Tensor<2, Bool> {
    let len = keys.len();
    let offset = alignment.offset(n, m);
    // A side reaching past every key hides nothing; dropping it keeps the positions below
    // n + m, far from the Int tensors' limits.
    let window = window.within(n, m).unwrap_or_default();
    let (centre, cols) = diagonal_grid(n, keys, offset, device);
    let before = window
        .left
        .map(|left| cols.clone().lower(centre.clone().sub_scalar(left as i64)));
    let after = window
        .right
        .map(|right| cols.greater(centre.add_scalar(right as i64)));
    match (before, after) {
        (Some(before), Some(after)) => before.bool_or(after),
        (Some(hidden), None) | (None, Some(hidden)) => hidden,
        (None, None) => Tensor::<2, Bool>::full([n, len], false, device),
    }
}

/// A padding mask `[b, m]` from sequence lengths `[b]`: true at positions `j >= length`.
///
/// A length of 0 masks the whole sequence (its query rows then get zero context); a length of m
/// or more masks nothing.
pub fn padding_mask_from_lengths(lengths: Tensor<1, Int>, m: usize) -> Tensor<2, Bool> {
    let device = lengths.device();
    let [b] = lengths.dims();
    // [m] -> [1, m]
    let positions = Tensor::<1, Int>::arange(0..m as i64, &device).unsqueeze::<2>();
    // [b] -> [b, 1]
    let lengths = lengths.reshape([b, 1]);
    positions
        .expand([b, m])
        .greater_equal(lengths.expand([b, m]))
}

/// A padding mask `[b, m]` from token ids `[b, m]`: true where the token is `pad_id`.
pub fn padding_mask_from_tokens(tokens: Tensor<2, Int>, pad_id: i64) -> Tensor<2, Bool> {
    tokens.equal_elem(pad_id)
}

/// Turns a padding mask `[b, m]` into an attention mask `[b, 1, 1, m]` that hides the padded
/// keys from every head and query.
pub fn padding_to_attention_mask(padding: Tensor<2, Bool>) -> Tensor<4, Bool> {
    let [b, m] = padding.dims();
    // [b, m] -> [b, 1, 1, m]
    padding.reshape([b, 1, 1, m])
}

/// Combines a causal mask `[n, m]` and a padding mask `[b, m]` into `[b, 1, n, m]` (the article's
/// §5.2: `causal[None, None] | padding[:, None, None, :]`, with our polarity true = masked).
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::{mask::*, CausalAlignment};
/// let device = Device::flex();
/// let tokens = Tensor::<2, Int>::from_data([[5, 6, 0, 0]], &device);
/// let padding = padding_mask_from_tokens(tokens, 0);
/// let causal = causal_mask(4, 4, CausalAlignment::TopLeft, &device);
/// let mask = combine_causal_and_padding(causal, padding).unwrap();
/// assert_eq!(mask.dims(), [1, 1, 4, 4]);
/// ```
pub fn combine_causal_and_padding(
    causal: Tensor<2, Bool>,
    padding: Tensor<2, Bool>,
) -> Result<Tensor<4, Bool>, AttentionError> {
    let [n, m] = causal.dims();
    let [b, m_pad] = padding.dims();
    if m != m_pad {
        return Err(AttentionError::Shape {
            what: "padding mask",
            expected: format!("[b, m] with m = {m} (the causal mask is [{n}, {m}])"),
            got: vec![b, m_pad],
        });
    }
    // [n, m] -> [1, 1, n, m] -> [b, 1, n, m]
    let causal = causal.reshape([1, 1, n, m]).expand([b, 1, n, m]);
    // [b, m] -> [b, 1, 1, m] -> [b, 1, n, m]
    let padding = padding_to_attention_mask(padding).expand([b, 1, n, m]);
    Ok(causal.bool_or(padding))
}

/// Logical or of two rank-4 masks that broadcast against each other (size-1 axes expand).
///
/// # Panics
/// If an axis differs and neither side is 1;
/// [`ScaledDotProductAttention::try_forward`](crate::ScaledDotProductAttention::try_forward)
/// checks the shapes it passes here.
pub fn broadcast_or(a: Tensor<4, Bool>, b: Tensor<4, Bool>) -> Tensor<4, Bool> {
    let (da, db) = (a.dims(), b.dims());
    let target: [usize; 4] = core::array::from_fn(|i| da[i].max(db[i]));
    a.expand(target).bool_or(b.expand(target))
}

/// Segment ids for packed sequences, `[b, len]`: row r holds its documents of `lengths[r]`
/// tokens one after another (ids 0, 1, 2, …), and the positions after them (padding) the id −1.
/// An error names a row whose lengths exceed `len`.
///
/// ```
/// # use burn::prelude::*;
/// use burn_sdpa::mask::segment_ids_from_lengths;
/// let device = Device::flex();
/// let ids = segment_ids_from_lengths(&[vec![3, 2], vec![4]], 6, &device).unwrap();
/// let values: Vec<i64> = burn_sdpa::util::read_back("ids", ids).unwrap();
/// assert_eq!(values, [0, 0, 0, 1, 1, -1, 0, 0, 0, 0, -1, -1]);
/// ```
pub fn segment_ids_from_lengths(
    lengths: &[Vec<usize>],
    len: usize,
    device: &Device,
) -> Result<Tensor<2, Int>, AttentionError> {
    let mut ids = Vec::with_capacity(lengths.len() * len);
    for (row_idx, row) in lengths.iter().enumerate() {
        let total = row.iter().try_fold(0usize, |acc, &l| acc.checked_add(l));
        if total.is_none_or(|total| total > len) {
            return Err(AttentionError::InvalidConfig {
                field: "segment lengths",
                value: format!("row {row_idx}: {row:?}"),
                reason: format!("they add up to more than the row's {len} positions"),
            });
        }
        for (segment_idx, &l) in row.iter().enumerate() {
            ids.extend(std::iter::repeat_n(segment_idx as i64, l));
        }
        ids.resize((row_idx + 1) * len, -1);
    }
    Ok(Tensor::from_data(
        TensorData::new(ids, [lengths.len(), len]),
        device,
    ))
}

/// The standard ALiBi slopes for `n_heads` heads (Press et al., 2022): the geometric sequence
/// 2^(−8/h), 2^(−16/h), …; for a head count that is not a power of two, those of the power of
/// two below, then every other one of the power above (as the reference implementation).
///
/// ```
/// use burn_sdpa::mask::alibi_slopes;
/// assert_eq!(alibi_slopes(4), [0.25, 0.0625, 0.015625, 0.00390625]);
/// ```
pub fn alibi_slopes(n_heads: usize) -> Vec<f64> {
    fn power_of_two(h: usize) -> Vec<f64> {
        let start = 2f64.powf(-8.0 / h as f64);
        (1..=h).map(|i| start.powi(i as i32)).collect()
    }
    if n_heads == 0 {
        return Vec::new();
    }
    let below = 1usize << (usize::BITS - 1 - n_heads.leading_zeros());
    if below == n_heads {
        return power_of_two(n_heads);
    }
    let mut slopes = power_of_two(below);
    slopes.extend(
        power_of_two(2 * below)
            .into_iter()
            .step_by(2)
            .take(n_heads - below),
    );
    slopes
}

/// The segment part of the mask of the keys `keys`, `[b, 1, n, len]` (true where a query and a
/// key belong to different segments), or `None` without segments.
pub(crate) fn segment_mask_for_keys(
    input: &AttentionInput,
    dims: &AttentionDims,
    keys: Range<usize>,
) -> Option<Tensor<4, Bool>> {
    let segments = input.segments.as_ref()?;
    let (b, n, len) = (dims.batch, dims.n, keys.len());
    let key = if len == dims.m {
        segments.key.clone()
    } else {
        segments.key.clone().slice(s![.., keys])
    };
    // [b, n] -> [b, 1, n, 1] and [b, len] -> [b, 1, 1, len], both expanded to [b, 1, n, len]
    let query_ids = segments
        .query
        .clone()
        .reshape([b, 1, n, 1])
        .expand([b, 1, n, len]);
    let key_ids = key.reshape([b, 1, 1, len]).expand([b, 1, n, len]);
    Some(query_ids.not_equal(key_ids))
}

/// ALiBi's bias for the keys `keys`, `[1, h, n, len]`: `−slope_h · |i + offset − j|` (detached:
/// the slopes are constants).
pub(crate) fn alibi_bias_for_keys(
    slopes: &Tensor<1>,
    n: usize,
    m: usize,
    keys: Range<usize>,
    alignment: CausalAlignment,
    dtype: DType,
) -> Tensor<4> {
    let device = slopes.device();
    let h = slopes.dims()[0];
    let offset = alignment.offset(n, m);
    // |c − j| as [n, keys.len()]
    let (centre, cols) = diagonal_grid(n, keys, offset, &device);
    let distance = (centre - cols).abs().float().cast(dtype);
    // [h] -> [1, h, 1, 1] times [n, len] -> [1, 1, n, len]
    let slopes = slopes.clone().detach().cast(dtype).reshape([1, h, 1, 1]);
    distance.unsqueeze::<4>().mul(slopes).neg()
}

/// The most negative finite value of a float dtype: what masked scores are filled with before
/// the softmax (they are zeroed again after it, so the value never reaches the output).
pub fn most_negative(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MIN,
        DType::F16 => -65504.0,
        DType::BF16 => -3.389_531_4e38,
        _ => f32::MIN as f64,
    }
}

/// The padding mask and the user mask of a call, or-ed, `[b|1, h|1, n|1, m]` (no causal part,
/// no bias), or `None` when it has neither.
pub(crate) fn user_mask(input: &AttentionInput) -> Option<Tensor<4, Bool>> {
    let padding = input.padding_mask.clone().map(padding_to_attention_mask);
    match (padding, input.mask.clone()) {
        (Some(padding), Some(mask)) => Some(broadcast_or(padding, mask)),
        (padding, mask) => padding.or(mask),
    }
}

/// The mask of the keys `keys` of a call, `[b|1, h|1, n|1, keys.len()]` (broadcastable to the
/// scores of those keys), or `None` when nothing there is masked: the padding mask's and the
/// user mask's columns, the causal part, the window's part and the −∞ entries of `bias` (the
/// bias of the same keys). This is the one mask builder of the crate: the naive path asks for all keys, the
/// chunked path for one block at a time.
pub(crate) fn mask_for_keys(
    input: &AttentionInput,
    dims: &AttentionDims,
    alignment: CausalAlignment,
    keys: Range<usize>,
    bias: Option<&Tensor<4>>,
) -> Option<Tensor<4, Bool>> {
    let device = input.query.device();
    let mut parts: Vec<Tensor<4, Bool>> = Vec::new();
    if let Some(mask) = user_mask(input) {
        parts.push(if keys.len() == dims.m {
            mask
        } else {
            mask.slice(s![.., .., .., keys.clone()])
        });
    }
    if input.causal {
        // [n, len] -> [1, 1, n, len]
        parts.push(
            causal_mask_for_keys(dims.n, dims.m, keys.clone(), alignment, &device).unsqueeze(),
        );
    }
    if let Some(window) = input.window {
        // [n, len] -> [1, 1, n, len]
        parts.push(
            window_mask_for_keys(dims.n, dims.m, keys.clone(), window, alignment, &device)
                .unsqueeze(),
        );
    }
    if let Some(segments) = segment_mask_for_keys(input, dims, keys.clone()) {
        parts.push(segments);
    }
    if let Some(bias) = bias {
        // A −∞ bias entry is a mask entry: treat it as one so that a row whose bias is −∞
        // everywhere gives zeros, not NaN.
        parts.push(bias.clone().is_inf().bool_and(bias.clone().lower_elem(0.0)));
    }
    parts.into_iter().reduce(broadcast_or)
}
