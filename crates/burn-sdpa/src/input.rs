//! The inputs and outputs of an attention call, and the checks that turn an input into its
//! validated sizes ([`AttentionDims`]).

use burn::prelude::*;
use burn::tensor::kind::Basic;
use burn::tensor::{DType, Element};

use crate::error::AttentionError;
use crate::types::{AttentionDims, Window};

/// The inputs of one attention call, built fluently.
///
/// `D` is the rank of query, key and value: 4 for [`ScaledDotProductAttention`](crate::ScaledDotProductAttention)
/// (`[b, h, s, d]`, the default) and 3 for [`MultiHeadSdpa`](crate::MultiHeadSdpa)
/// (`[b, s, d_model]`, named [`MultiHeadSdpaInput`](crate::MultiHeadSdpaInput)); the masks and options are the
/// same for both.
///
/// ```
/// # use burn::prelude::*;
/// # use burn_sdpa::AttentionInput;
/// # let device = Device::flex();
/// let q = Tensor::<4>::zeros([1, 2, 3, 4], &device);
/// let k = Tensor::<4>::zeros([1, 2, 5, 4], &device);
/// let v = Tensor::<4>::zeros([1, 2, 5, 6], &device);
/// let input = AttentionInput::new(q, k, v).causal().need_weights();
/// ```
#[derive(Debug, Clone)]
pub struct AttentionInput<const D: usize = 4> {
    /// `[b, h, n, d_k]` (rank 4) or `[b, n, d_model]` (rank 3).
    pub query: Tensor<D>,
    /// `[b, h_kv, m, d_k]` (rank 4) or `[b, m, d_model]` (rank 3).
    pub key: Tensor<D>,
    /// `[b, h_kv, m, d_v]` (rank 4) or `[b, m, d_model]` (rank 3).
    pub value: Tensor<D>,
    /// `[b, m]`, true = padding: the key is hidden from every head and query.
    pub padding_mask: Option<Tensor<2, Bool>>,
    /// `[b|1, h|1, n|1, m]`, true = masked out.
    pub mask: Option<Tensor<4, Bool>>,
    /// `[b|1, h|1, n|1, m]`, added to the scaled scores.
    pub bias: Option<Tensor<4>>,
    /// Apply a causal mask with the module's alignment.
    pub causal: bool,
    /// A local window (query i sees keys `c − left ..= c + right`, `c` on the module's causal
    /// diagonal); paths that can skip keys outside it never build an n×m mask for it.
    pub window: Option<Window>,
    /// Packed sequences: query i of batch row r sees key j only inside its own segment
    /// (`query_ids [b, n]`, `key_ids [b, m]`, Int); see [`segments`](Self::segments).
    pub segments: Option<Segments>,
    /// ALiBi: one slope per query head, `[h]`; the bias `−slope_h · |c − j|` on the causal
    /// diagonal is added to the scaled scores (constants, no gradient).
    pub alibi_slopes: Option<Tensor<1>>,
    /// Attention sinks: one learned logit per query head, `[h]`, that joins every row's softmax
    /// denominator and takes no value (see [`sinks`](Self::sinks)); it carries a gradient.
    pub sinks: Option<Tensor<1>>,
    /// Return the attention weights.
    pub need_weights: bool,
    /// Return the scaled scores (plus bias, before masking), e.g. for logit statistics.
    pub need_scores: bool,
    /// Return the log-sum-exp of each query row's visible scores, `[b, h, n]`.
    pub need_lse: bool,
    /// Return each query row's statistics ([`RowStats`](crate::RowStats)).
    pub need_row_stats: bool,
}

/// The segment ids of packed sequences (FlashAttention's `cu_seqlens`, xformers'
/// `BlockDiagonalMask`, FlexAttention's document masking), one id per position.
#[derive(Debug, Clone)]
pub struct Segments {
    /// `[b, n]`: the segment of each query.
    pub query: Tensor<2, Int>,
    /// `[b, m]`: the segment of each key.
    pub key: Tensor<2, Int>,
}

impl<const D: usize> AttentionInput<D> {
    /// Query, key and value, with nothing masked.
    pub fn new(query: Tensor<D>, key: Tensor<D>, value: Tensor<D>) -> Self {
        Self {
            query,
            key,
            value,
            padding_mask: None,
            mask: None,
            bias: None,
            causal: false,
            window: None,
            segments: None,
            alibi_slopes: None,
            sinks: None,
            need_weights: false,
            need_scores: false,
            need_lse: false,
            need_row_stats: false,
        }
    }

    /// Packs several sequences into each batch row: query i of row r sees key j only when
    /// `query_ids[r, i] == key_ids[r, j]` (`[b, n]` and `[b, m]` Int tensors; the helper
    /// `mask::segment_ids_from_lengths` builds them from the
    /// documents' lengths). Combines with causal masking, windows, masks and padding (positions
    /// are the packed row's); the CPU kernel skips the tiles between documents, the other paths
    /// build the mask once per call.
    ///
    /// ```
    /// # use burn::prelude::*;
    /// # use burn_sdpa::{AttentionInput, mask::segment_ids_from_lengths};
    /// # let device = Device::flex();
    /// let x = Tensor::<4>::zeros([1, 2, 6, 4], &device);
    /// // Two documents of 4 and 2 tokens in one row of 6.
    /// let ids = segment_ids_from_lengths(&[vec![4, 2]], 6, &device).unwrap();
    /// let input = AttentionInput::new(x.clone(), x.clone(), x).causal().segments(ids.clone(), ids);
    /// ```
    pub fn segments(mut self, query_ids: Tensor<2, Int>, key_ids: Tensor<2, Int>) -> Self {
        self.segments = Some(Segments {
            query: query_ids,
            key: key_ids,
        });
        self
    }

    /// ALiBi with one slope per query head (`[h]`; `mask::alibi_slopes`
    /// gives the standard geometric ones): `−slope_h · |c − j|`, `c` on the causal diagonal (as
    /// FlashAttention's `alibi_slopes`), added to the scaled, soft-capped scores with the bias.
    pub fn alibi(mut self, slopes: Tensor<1>) -> Self {
        self.alibi_slopes = Some(slopes);
        self
    }

    /// Attention sinks (gpt-oss, StreamingLLM's learned form, FlashAttention 3's `sink`): one
    /// logit per query head, `[h]`, that joins the softmax denominator of every row of its head
    /// and takes no value, `p_ij = exp(s_ij) / (exp(sink_h) + Σ_j' exp(s_ij'))` over the visible
    /// keys (`s` the final scores: scaled, soft-capped, with bias and ALiBi). A row's weights
    /// then sum to less than 1, and a row with no visible key has a zero context. The sinks are
    /// usually parameters: their gradient flows on every path. A sink of −∞ is no sink; NaN or
    /// +∞ makes every row of its head NaN (the policy for non-finite inputs). For a constant sink
    /// of 0 on every head, use the option [`Softmax::Quiet`](crate::Softmax) instead.
    ///
    /// ```
    /// # use burn::prelude::*;
    /// # use burn_sdpa::AttentionInput;
    /// # let device = Device::flex();
    /// let x = Tensor::<4>::zeros([1, 2, 3, 4], &device);
    /// let sinks = Tensor::<1>::from_data([0.5, -1.0], &device);
    /// let input = AttentionInput::new(x.clone(), x.clone(), x).sinks(sinks);
    /// ```
    pub fn sinks(mut self, sinks: Tensor<1>) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// Return the log-sum-exp of each query row, `[b, h, n]` (−∞ for a row with no visible key):
    /// with it, partial attentions over disjoint sets of keys merge exactly (see
    /// [`merge_partial`](crate::lse::merge_partial)), the building block of ring attention.
    pub fn need_lse(mut self) -> Self {
        self.need_lse = true;
        self
    }

    /// Return each query row's statistics, `[b, h, n]` each ([`RowStats`](crate::RowStats):
    /// largest logit, log-sum-exp, entropy, largest weight, visible keys, logit mean and
    /// standard deviation), without the `[b, h, n, m]` weights. Served by the paths that
    /// materialize the scores for now (`Auto` takes `Naive` for such a call).
    pub fn need_row_stats(mut self) -> Self {
        self.need_row_stats = true;
        self
    }

    /// Hide padded keys: `[b, m]`, true = padding (replaces an earlier padding mask; the
    /// helpers `mask::padding_mask_from_lengths` and `mask::padding_mask_from_tokens` build
    /// one).
    pub fn padding_mask(mut self, padding: Tensor<2, Bool>) -> Self {
        self.padding_mask = Some(padding);
        self
    }

    /// A boolean mask, true = masked out, broadcastable to `[b, h, n, m]` (replaces an earlier
    /// one; combine masks with `mask::broadcast_or` or the other helpers of the `mask`
    /// module).
    pub fn mask(mut self, mask: Tensor<4, Bool>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// An additive bias (e.g. ALiBi, relative positions, or a float mask with −∞), broadcastable
    /// to `[b, h, n, m]`, added to the scaled scores (replaces an earlier one).
    pub fn bias(mut self, bias: Tensor<4>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Causal masking with the module's [`CausalAlignment`](crate::CausalAlignment).
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// Local attention: query i sees key j only when `c − left ≤ j ≤ c + right`, with
    /// `c = i + offset` on the diagonal of the module's
    /// [`CausalAlignment`](crate::CausalAlignment) (`m − n` for the default bottom-right, as
    /// FlashAttention's `window_size`); `None` leaves a side unbounded. Composes with
    /// [`causal`](Self::causal), masks and padding (what any of them hides stays hidden), and
    /// replaces an earlier window.
    ///
    /// ```
    /// # use burn::prelude::*;
    /// # use burn_sdpa::AttentionInput;
    /// # let device = Device::flex();
    /// # let x = Tensor::<4>::zeros([1, 2, 16, 8], &device);
    /// // Sliding-window causal attention over the last 4 positions (itself and 3 before).
    /// let input = AttentionInput::new(x.clone(), x.clone(), x).causal().window(3, 0);
    /// // A symmetric local band, unbounded on the right:
    /// # let x = Tensor::<4>::zeros([1, 2, 16, 8], &device);
    /// let input = AttentionInput::new(x.clone(), x.clone(), x).window(2, None);
    /// ```
    pub fn window(
        mut self,
        left: impl Into<Option<usize>>,
        right: impl Into<Option<usize>>,
    ) -> Self {
        self.window = Some(Window::new(left.into(), right.into()));
        self
    }

    /// Also return the attention weights `[b, h, n, m]`.
    pub fn need_weights(mut self) -> Self {
        self.need_weights = true;
        self
    }

    /// Also return the scaled scores `[b, h, n, m]` (with the bias, before masking).
    pub fn need_scores(mut self) -> Self {
        self.need_scores = true;
        self
    }

    /// Query, key, value, bias and ALiBi slopes cast to `dtype` (the masks and options as they
    /// are): the inputs of a call computed in another precision.
    pub(crate) fn cast_floats(self, dtype: burn::tensor::DType) -> Self {
        Self {
            query: self.query.cast(dtype),
            key: self.key.cast(dtype),
            value: self.value.cast(dtype),
            bias: self.bias.map(|b| b.cast(dtype)),
            alibi_slopes: self.alibi_slopes.map(|s| s.cast(dtype)),
            sinks: self.sinks.map(|s| s.cast(dtype)),
            ..self
        }
    }

    /// The same masks and options with other query, key and value tensors (the multi-head layer
    /// swaps its `[b, s, d_model]` inputs for the projected `[b, h, s, d_k]` heads).
    pub fn with_tensors<const E: usize>(
        self,
        query: Tensor<E>,
        key: Tensor<E>,
        value: Tensor<E>,
    ) -> AttentionInput<E> {
        AttentionInput {
            query,
            key,
            value,
            padding_mask: self.padding_mask,
            mask: self.mask,
            bias: self.bias,
            causal: self.causal,
            window: self.window,
            segments: self.segments,
            alibi_slopes: self.alibi_slopes,
            sinks: self.sinks,
            need_weights: self.need_weights,
            need_scores: self.need_scores,
            need_lse: self.need_lse,
            need_row_stats: self.need_row_stats,
        }
    }
}

/// The result of an attention call: rank 4 (`[b, h, n, d_v]`) for
/// [`ScaledDotProductAttention`](crate::ScaledDotProductAttention), rank 3 (`[b, n, d_model]`,
/// named [`MultiHeadSdpaOutput`](crate::MultiHeadSdpaOutput)) for the multi-head layer.
#[derive(Debug, Clone)]
pub struct AttentionOutput<const D: usize = 4> {
    /// `[b, h, n, d_v]` (rank 4) or `[b, n, d_model]` (rank 3).
    pub context: Tensor<D>,
    /// `[b, h, n, m]`: the softmax probabilities before dropout, if asked for. Masked keys and
    /// fully masked rows are exactly 0.
    pub weights: Option<Tensor<4>>,
    /// `[b, h, n, m]`: the scaled scores plus bias, before masking, if asked for.
    pub scores: Option<Tensor<4>>,
    /// `[b, h, n, m]`: the combined mask that was applied (padding, user mask, causal mask, −∞
    /// bias entries), true = masked out; `None` when nothing was masked or the path did not
    /// build it.
    pub mask: Option<Tensor<4, Bool>>,
    /// `[b, h, n]`: the log-sum-exp of each row's visible scores, if asked for (−∞ for a row
    /// with no visible key).
    pub lse: Option<Tensor<3>>,
    /// `[b, h, n]` each: the rows' statistics, if asked for.
    pub row_stats: Option<crate::RowStats>,
}

impl<const D: usize> AttentionOutput<D> {
    /// An output with the context only.
    pub fn from_context(context: Tensor<D>) -> Self {
        Self {
            context,
            weights: None,
            scores: None,
            mask: None,
            lse: None,
            row_stats: None,
        }
    }
}

/// Checks that the tensors of a call share the query's float dtype and device (autodiff state
/// included).
fn check_dtypes_and_devices(input: &AttentionInput) -> Result<(), AttentionError> {
    let query_device = input.query.device();
    let describe = |device: &Device, autodiff: bool| {
        format!("{device:?}{}", if autodiff { " (autodiff)" } else { "" })
    };
    let query_autodiff = input.query.is_autodiff();
    let floats = [("key", &input.key), ("value", &input.value)]
        .into_iter()
        .chain(input.bias.as_ref().map(|bias| ("bias", bias)));
    for (name, tensor) in floats {
        if tensor.dtype() != input.query.dtype() {
            return Err(AttentionError::DtypeMismatch {
                query: format!("{:?}", input.query.dtype()),
                other: name,
                other_dtype: format!("{:?}", tensor.dtype()),
            });
        }
        let (device, autodiff) = (tensor.device(), tensor.is_autodiff());
        if device != query_device || autodiff != query_autodiff {
            return Err(AttentionError::DeviceMismatch {
                query: describe(&query_device, query_autodiff),
                other: name,
                other_device: describe(&device, autodiff),
            });
        }
    }
    if let Some(sinks) = &input.sinks {
        if sinks.dtype() != input.query.dtype() {
            return Err(AttentionError::DtypeMismatch {
                query: format!("{:?}", input.query.dtype()),
                other: "attention sinks",
                other_dtype: format!("{:?}", sinks.dtype()),
            });
        }
        let (device, autodiff) = (sinks.device(), sinks.is_autodiff());
        if device != query_device || autodiff != query_autodiff {
            return Err(AttentionError::DeviceMismatch {
                query: describe(&query_device, query_autodiff),
                other: "attention sinks",
                other_device: describe(&device, autodiff),
            });
        }
    }
    let masks = [("mask", input.mask.as_ref().map(|m| m.device()))]
        .into_iter()
        .chain([(
            "padding mask",
            input.padding_mask.as_ref().map(|m| m.device()),
        )]);
    for (name, device) in masks {
        if let Some(device) = device
            && device != query_device
        {
            return Err(AttentionError::DeviceMismatch {
                query: describe(&query_device, query_autodiff),
                other: name,
                other_device: format!("{device:?}"),
            });
        }
    }
    Ok(())
}

/// Checks the shapes, dtypes and devices of an attention call and returns its sizes (the shape
/// checks are [`AttentionDims`]'s).
pub(crate) fn validate_input(input: &AttentionInput) -> Result<AttentionDims, AttentionError> {
    let dims =
        AttentionDims::from_shapes(input.query.dims(), input.key.dims(), input.value.dims())?;
    if let Some(padding) = &input.padding_mask
        && padding.dims() != [dims.batch, dims.m]
    {
        return Err(AttentionError::Shape {
            what: "padding mask",
            expected: format!("[b, m] = [{}, {}]", dims.batch, dims.m),
            got: padding.dims().to_vec(),
        });
    }
    if let Some(mask) = &input.mask {
        dims.check_broadcast("mask", mask.dims())?;
    }
    if let Some(bias) = &input.bias {
        dims.check_broadcast("bias", bias.dims())?;
    }
    if let Some(segments) = &input.segments {
        dims.check_segments(&segments.query.dims(), &segments.key.dims())?;
    }
    if let Some(slopes) = &input.alibi_slopes {
        dims.check_per_head("ALiBi slopes", &slopes.dims())?;
    }
    if let Some(sinks) = &input.sinks {
        dims.check_per_head("attention sinks", &sinks.dims())?;
    }
    check_dtypes_and_devices(input)?;
    if let Some(slopes) = &input.alibi_slopes {
        check_alibi_range(slopes, input.query.dtype())?;
    }
    Ok(dims)
}

/// The ALiBi slopes must be finite numbers of the computation's dtype (the query's): a slope
/// beyond its range is ±∞ there, which one path would turn into NaN and another into a finite
/// wrong context. One rule, checked before any path runs.
fn check_alibi_range(slopes: &Tensor<1>, dtype: DType) -> Result<(), AttentionError> {
    let values: Vec<f64> = read_back("ALiBi slopes", slopes.clone())?;
    let max = match dtype {
        DType::F16 => 65504.0,
        DType::F64 => f64::MAX,
        _ => f64::from(f32::MAX),
    };
    match values.iter().find(|v| !(v.is_finite() && v.abs() <= max)) {
        None => Ok(()),
        Some(bad) => Err(AttentionError::InvalidConfig {
            field: "alibi_slopes",
            value: format!("{bad}"),
            reason: format!(
                "every slope must be a finite number of the computation's dtype {dtype:?} (|slope| ≤ {max:e})"
            ),
        }),
    }
}

/// Reads a tensor back to the host as a `Vec<E>` (converting the element type), or says which
/// tensor could not be read. The one read-back of the workspace: a failed read is an error, never
/// an empty or zero vector.
///
/// ```
/// # use burn::prelude::*;
/// let device = Device::flex();
/// let x = Tensor::<2>::from_data([[1.0, 2.0]], &device);
/// let values: Vec<f64> = burn_sdpa::util::read_back("x", x).unwrap();
/// assert_eq!(values, [1.0, 2.0]);
/// ```
pub fn read_back<E: Element, const D: usize, K: Basic>(
    what: &'static str,
    tensor: Tensor<D, K>,
) -> Result<Vec<E>, AttentionError> {
    tensor
        .try_into_vec_as::<E>()
        .map_err(|e| AttentionError::ReadBack {
            what,
            reason: e.to_string(),
        })
}
