//! Typed errors for every way an attention call or configuration can be wrong.

use thiserror::Error;

use crate::vocabulary::Implementation;

/// What went wrong in an attention call or configuration.
///
/// Every message names the shapes or values involved, so that a user can fix the call without
/// reading the library's source. [`ScaledDotProductAttention::forward`](crate::ScaledDotProductAttention::forward)
/// panics with the same message that [`try_forward`](crate::ScaledDotProductAttention::try_forward)
/// returns.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AttentionError {
    /// Query and key do not share the feature size d_k.
    #[error(
        "query and key must share d_k: query is {query:?} [b, h, n, d_k] but key is {key:?} [b, h_kv, m, d_k]"
    )]
    DkMismatch {
        /// Query shape.
        query: [usize; 4],
        /// Key shape.
        key: [usize; 4],
    },
    /// Query, key and value do not share the batch size.
    #[error(
        "query, key and value must share the batch size: query {query:?}, key {key:?}, value {value:?}"
    )]
    BatchMismatch {
        /// Query shape.
        query: [usize; 4],
        /// Key shape.
        key: [usize; 4],
        /// Value shape.
        value: [usize; 4],
    },
    /// Key and value do not agree on the number of heads or on the sequence length m.
    #[error(
        "key and value must share h_kv and m: key is {key:?} [b, h_kv, m, d_k], value is {value:?} [b, h_kv, m, d_v]"
    )]
    KeyValueMismatch {
        /// Key shape.
        key: [usize; 4],
        /// Value shape.
        value: [usize; 4],
    },
    /// The number of query heads is not a multiple of the number of key/value heads.
    #[error(
        "grouped-query attention needs n_heads % n_kv_heads == 0, but query has {n_heads} heads and key/value {n_kv_heads}"
    )]
    HeadGrouping {
        /// Query heads h.
        n_heads: usize,
        /// Key/value heads h_kv.
        n_kv_heads: usize,
    },
    /// A tensor has a zero-sized axis.
    #[error("{tensor} has an empty axis: shape {shape:?}")]
    EmptyAxis {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A mask or bias does not broadcast to the scores' shape `[b, h, n, m]`.
    #[error(
        "{tensor} of shape {shape:?} does not broadcast to the scores [b, h, n, m] = {scores:?}: each of its first three axes must be 1 or equal, its last must be m"
    )]
    NotBroadcastable {
        /// `"mask"` or `"bias"`.
        tensor: &'static str,
        /// The offending shape.
        shape: [usize; 4],
        /// The scores' shape.
        scores: [usize; 4],
    },
    /// A fixed scale that is not a finite positive number in f32 (printed as its shortest text,
    /// `1e300`, not three hundred digits).
    #[error("a fixed scale must be finite and > 0 in f32 (between 1.2e-38 and 3.4e38), got {0:?}")]
    InvalidScale(f64),
    /// Query, key, value and bias do not share one float dtype.
    #[error(
        "query, key, value and bias must share one float dtype: query is {query}, {other} is {other_dtype}"
    )]
    DtypeMismatch {
        /// The query's dtype.
        query: String,
        /// Which other tensor differs.
        other: &'static str,
        /// Its dtype.
        other_dtype: String,
    },
    /// The tensors of a call are not on one device (or mix autodiff and plain tensors).
    #[error(
        "every tensor of a call must be on the query's device {query}: {other} is on {other_device}"
    )]
    DeviceMismatch {
        /// The query's device.
        query: String,
        /// Which other tensor differs.
        other: &'static str,
        /// Its device.
        other_device: String,
    },
    /// A dropout probability outside [0, 1).
    #[error("dropout must be in [0, 1), got {0:?}")]
    InvalidDropout(f64),
    /// A configuration value that is out of range.
    #[error("invalid configuration: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The configuration field.
        field: &'static str,
        /// Its value, formatted.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The requested implementation cannot serve this call.
    #[error(
        "the {implementation} implementation cannot serve this call: {reason}; use Implementation::Naive or Auto"
    )]
    Unsupported {
        /// The implementation asked for.
        implementation: Implementation,
        /// Why not.
        reason: String,
    },
    /// A cache of fixed capacity cannot hold the tokens of a call (see
    /// [`KvCache::growable`](crate::KvCache::growable)).
    #[error(
        "the KV cache holds {capacity} tokens per sequence, this call needs {needed}; create it with more capacity or make it growable"
    )]
    CacheFull {
        /// Tokens per sequence the cache holds.
        capacity: usize,
        /// Tokens the longest sequence would hold after the call.
        needed: usize,
    },
    /// A tensor could not be read back from its device to the host.
    #[error("could not read {what} back from the device: {reason}")]
    ReadBack {
        /// Which tensor.
        what: &'static str,
        /// The backend's error.
        reason: String,
    },
    /// An input of the multi-head layer or of a helper has the wrong shape.
    #[error("{what}: expected {expected}, got {got:?}")]
    Shape {
        /// Which input.
        what: &'static str,
        /// What was expected, in words.
        expected: String,
        /// The shape that was given.
        got: Vec<usize>,
    },
}
