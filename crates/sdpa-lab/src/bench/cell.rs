//! One bench cell: its inputs, the paths that time it, and one timed run.

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn_sdpa::{
    AttentionInput, BackendFamily, Implementation, ScaledDotProductAttention,
    ScaledDotProductAttentionConfig,
};

use crate::context::{LabError, normal_tensor};

/// The hand-written baseline: softmax(QKᵀ/√d)·V with nothing else.
pub fn baseline(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let d = q.dims()[3];
    softmax(q.matmul(k.transpose()) / (d as f64).sqrt(), 3).matmul(v)
}

/// The attention module with the given implementation and the default settings.
pub fn module(implementation: Implementation) -> Result<ScaledDotProductAttention, LabError> {
    Ok(ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .try_init()?)
}

/// The name of the baseline (Burn's plain matmul/softmax/matmul, no mask) in the bench's lists.
pub const BASELINE: &str = "baseline";

/// The paths, as (name, implementation or None for the baseline): every one of
/// [`Implementation::all`], `cube_kernel` and `cube_tensor_cores` only on the CubeCL backends
/// (`cube`), the only ones they run on, then the baseline.
pub fn paths(block_size: usize, cube: bool) -> Vec<(&'static str, Option<Implementation>)> {
    let family = if cube {
        BackendFamily::CubeCl
    } else {
        BackendFamily::Flex
    };
    Implementation::all(block_size)
        .filter(|implementation| implementation.runs_on(family))
        .map(|implementation| (implementation.name(), Some(implementation)))
        .chain([(BASELINE, None)])
        .collect()
}

/// The paths that can run a mode: all of them, but the baseline takes no mask.
pub fn paths_for(
    block_size: usize,
    masked: bool,
    cube: bool,
) -> Vec<(&'static str, Option<Implementation>)> {
    paths(block_size, cube)
        .into_iter()
        .filter(|(_, implementation)| !(masked && implementation.is_none()))
        .collect()
}

/// The inputs of one cell: q, k, v `[b, h, n, d]`, in the padded modes the padding mask `[b, n]`
/// hiding the last `fraction` of every batch element's keys, in the causal modes the causal flag.
#[derive(Debug, Clone)]
pub struct BenchInputs {
    pub(super) q: Tensor<4>,
    pub(super) k: Tensor<4>,
    pub(super) v: Tensor<4>,
    padding: Option<Tensor<2, Bool>>,
    causal: bool,
    /// Segment ids `[b, n]` of the packed modes.
    segments: Option<Tensor<2, Int>>,
    /// The block-diagonal mask `[b, 1, n, n]` of the packed-as-a-mask modes.
    mask: Option<Tensor<4, Bool>>,
}

impl BenchInputs {
    /// Draws a cell on `device`.
    pub fn new(
        rng: &mut rand_chacha::ChaCha8Rng,
        shape: [usize; 4],
        padded: Option<f64>,
        device: &Device,
    ) -> Self {
        let [b, _, n, _] = shape;
        let padding = padded.map(|fraction| {
            let visible = n - ((n as f64 * fraction).round() as usize).min(n - 1);
            let lengths = Tensor::<1, Int>::full([b], visible as i64, device);
            burn_sdpa::mask::padding_mask_from_lengths(lengths, n)
        });
        Self {
            q: normal_tensor(rng, shape, device),
            k: normal_tensor(rng, shape, device),
            v: normal_tensor(rng, shape, device),
            padding,
            causal: false,
            segments: None,
            mask: None,
        }
    }

    /// The same cell with `documents` documents of equal length packed into each row: as segment
    /// ids, or (`as_mask`) as the dense block-diagonal mask they stand for.
    pub fn packed(mut self, documents: usize, as_mask: bool) -> Result<Self, LabError> {
        let [b, _, n, _] = self.q.dims();
        let device = self.q.device();
        let doc = n.div_ceil(documents.max(1));
        let lengths: Vec<Vec<usize>> = (0..b)
            .map(|_| {
                (0..n)
                    .step_by(doc)
                    .map(|start| doc.min(n - start))
                    .collect()
            })
            .collect();
        let ids = burn_sdpa::mask::segment_ids_from_lengths(&lengths, n, &device)?;
        if as_mask {
            // [b, n] -> [b, 1, n, 1] != [b, 1, 1, n]: [b, 1, n, n]
            let rows = ids.clone().reshape([b, 1, n, 1]).expand([b, 1, n, n]);
            let cols = ids.reshape([b, 1, 1, n]).expand([b, 1, n, n]);
            self.mask = Some(rows.not_equal(cols));
        } else {
            self.segments = Some(ids);
        }
        Ok(self)
    }

    /// The same cell with query, key and value in the config's storage type
    /// ([`BenchConfig::dtype`](super::BenchConfig::dtype)).
    pub fn stored(mut self, config: &super::BenchConfig) -> Self {
        let dtype = match config.dtype.as_str() {
            "bf16" => burn::tensor::DType::BF16,
            "f16" => burn::tensor::DType::F16,
            _ => return self,
        };
        (self.q, self.k, self.v) = (self.q.cast(dtype), self.k.cast(dtype), self.v.cast(dtype));
        self
    }

    /// The same cell with causal masking.
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    pub(super) fn input(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> AttentionInput {
        let mut input = AttentionInput::new(q, k, v);
        if let Some(padding) = &self.padding {
            input = input.padding_mask(padding.clone());
        }
        if self.causal {
            input = input.causal();
        }
        if let Some(ids) = &self.segments {
            input = input.segments(ids.clone(), ids.clone());
        }
        if let Some(mask) = &self.mask {
            input = input.mask(mask.clone());
        }
        input
    }
}

/// The path `attn` takes for a cell, as it prints: `naive`, `chunked(B)`, `fused`, `cpu_kernel`.
pub(super) fn path_taken(
    attn: &ScaledDotProductAttention,
    cell: &BenchInputs,
) -> Result<String, LabError> {
    let input = cell.input(cell.q.clone(), cell.k.clone(), cell.v.clone());
    Ok(attn.path(&input)?.to_string())
}

/// The context of one path: the module's forward, or [`baseline`] when `attn` is `None`.
pub fn forward_path(
    attn: Option<&ScaledDotProductAttention>,
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
) -> Result<Tensor<4>, LabError> {
    Ok(match attn {
        Some(a) => a.try_forward(AttentionInput::new(q, k, v))?.context,
        None => baseline(q, k, v),
    })
}

/// Runs one path on a cell, forward or forward + backward, and waits for the device.
pub fn run_once(
    attn: Option<&ScaledDotProductAttention>,
    cell: &BenchInputs,
    backward: bool,
) -> Result<(), LabError> {
    let leaf = |t: &Tensor<4>| {
        if backward {
            t.clone().require_grad()
        } else {
            t.clone()
        }
    };
    let (q, k, v) = (leaf(&cell.q), leaf(&cell.k), leaf(&cell.v));
    let out = match attn {
        Some(a) => {
            a.try_forward(cell.input(q.clone(), k.clone(), v.clone()))?
                .context
        }
        None => baseline(q.clone(), k.clone(), v.clone()),
    };
    let device = out.device();
    if backward {
        // The loss is summed in f32 for every storage type (as `benches/pytorch_sdpa.py` does):
        // a half-precision sum of n·d values is neither accurate nor what the bench times.
        let out = if out.dtype() == burn::tensor::DType::F32 {
            out
        } else {
            out.cast(burn::tensor::DType::F32)
        };
        let grads = out.sum().backward();
        for t in [&q, &k, &v] {
            let g = t.grad(&grads).ok_or_else(|| LabError::Missing {
                from: "autodiff",
                what: "gradient".into(),
            })?;
            g.slice(s![0..1, 0..1, 0..1, 0..1])
                .try_into_data()
                .map_err(|e| LabError::Device {
                    during: "reading the result back",
                    message: e.to_string(),
                })?;
        }
    } else {
        out.slice(s![0..1, 0..1, 0..1, 0..1])
            .try_into_data()
            .map_err(|e| LabError::Device {
                during: "reading the result back",
                message: e.to_string(),
            })?;
    }
    device.sync().map_err(|e| LabError::Device {
        during: "synchronizing",
        message: format!("{e:?}"),
    })?;
    Ok(())
}
