//! A small self-attention classifier built on `burn_sdpa::MultiHeadSdpa`.

use burn::module::Module;
use burn::nn::{
    Embedding, EmbeddingConfig, Gelu, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::prelude::*;
use burn_sdpa::diagnostics::{AttentionDiagnostics, diagnostics_from_row_stats};
use burn_sdpa::rows::linear_rows;
use burn_sdpa::{
    AttentionError, AttentionOptions, MultiHeadSdpa, MultiHeadSdpaConfig, MultiHeadSdpaInput,
    QkNorm, RowStats,
};
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::task::{TaskBatch, TaskConfig};

/// How the query and key projections are initialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QkInit {
    /// Burn's Linear default (Kaiming uniform, gain 1/√3): query and key components have
    /// variance ≈ 1/3, so unscaled logits have std ≈ √d_k / 3.
    #[default]
    Default,
    /// Normal with std 1/√(d_model · var_x): query and key components have unit variance at
    /// initialization (the article's assumption), so unscaled logits have std ≈ √d_k.
    Unit,
}

/// Configuration of [`AttentionModel`].
#[derive(Config, Debug)]
pub struct ModelConfig {
    /// Vocabulary size (from the task).
    pub vocab_size: usize,
    /// Sequence length (from the task), for the learned position embeddings.
    pub seq_len: usize,
    /// Number of classes (from the task).
    pub n_classes: usize,
    /// Model width. 64 is enough for k = 8 and keeps a step in milliseconds.
    #[config(default = 64)]
    pub d_model: usize,
    /// Attention heads. 2 lets one head match content while another is free.
    #[config(default = 2)]
    pub n_heads: usize,
    /// Query/key size per head, independent of `d_model` so that d_k can be swept from 16 to
    /// 1024 at a fixed width; `None` = `d_model / n_heads`.
    pub d_k: Option<usize>,
    /// Value size per head; `None` = d_k. The lab fixes it at 32 (`d_model / n_heads`) so that a
    /// d_k sweep changes the scores alone and a step at d_k = 1024 costs half as much.
    pub d_v: Option<usize>,
    /// Attention blocks. One block solves *match*; *recall* needs two (one to copy each key
    /// onto its value's position, one to look it up).
    #[config(default = 1)]
    pub n_layers: usize,
    /// Pre-layer-norm before attention and MLP (and before the head): keeps the attention
    /// input at unit variance, which is what makes `QkInit::Unit` exact.
    #[config(default = true)]
    pub layer_norm: bool,
    /// An MLP after each attention (off: the tasks need only attention).
    #[config(default = false)]
    pub mlp: bool,
    /// Hidden width of the MLP as a multiple of `d_model`.
    #[config(default = 4)]
    pub mlp_ratio: usize,
    /// The attention's options: its scale policy (the variable the experiments change), soft-cap,
    /// dropout on the weights (0: the experiments measure the softmax itself), causal alignment
    /// and computation path (`Auto`: the fastest correct one; the others are there to compare
    /// them on a whole model).
    #[config(default = "AttentionOptions::new()")]
    pub attention: AttentionOptions,
    /// Initialization of the query/key projections.
    #[config(default = "QkInit::Default")]
    pub qk_init: QkInit,
    /// A factor on the initial query and key projection weights (1: the initialization as
    /// `qk_init` gives it). The lab's intervention arm uses d_k^(−1/4): unscaled logits then start
    /// exactly as 1/√d_k-scaled ones, while training keeps the unscaled gradients.
    #[config(default = 1.0)]
    pub qk_init_gain: f64,
    /// QK-norm of the attention heads (none by default; compared by `logit-control`).
    #[config(default = "QkNorm::None")]
    pub qk_norm: QkNorm,
    /// A learned temperature on the attention scores, starting at this factor (none by
    /// default; the lab's `training` starts it at 1 on unscaled scores).
    #[config(default = "None")]
    pub learned_temperature: Option<f64>,
}

impl ModelConfig {
    /// A model sized for a task.
    pub fn for_task(task: &TaskConfig) -> Self {
        Self::new(task.vocab, task.seq_len(), task.n_classes())
    }

    /// Checks the sizes.
    pub fn validate(&self) -> Result<(), ModelError> {
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("seq_len", self.seq_len),
            ("n_classes", self.n_classes),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("n_layers", self.n_layers),
            ("mlp_ratio", self.mlp_ratio),
        ] {
            if v == 0 {
                return Err(ModelError::invalid(field, 0, "must be > 0"));
            }
        }
        if self.d_k == Some(0) {
            return Err(ModelError::invalid("d_k", 0, "must be > 0"));
        }
        if !(self.qk_init_gain.is_finite() && self.qk_init_gain > 0.0) {
            return Err(ModelError::invalid(
                "qk_init_gain",
                self.qk_init_gain,
                "must be a finite number > 0",
            ));
        }
        self.mha_config().validate()?;
        Ok(())
    }

    fn mha_config(&self) -> MultiHeadSdpaConfig {
        let mut cfg = MultiHeadSdpaConfig::new(self.d_model, self.n_heads)
            .with_d_k(self.d_k)
            .with_d_v(self.d_v)
            .with_learned_temperature(self.learned_temperature)
            .with_options(self.attention.clone())
            .with_qk_norm(self.qk_norm)
            .with_bias(false);
        let gain = self.qk_init_gain;
        match self.qk_init {
            QkInit::Unit => {
                // The attention input has unit-variance components after layer norm; without it,
                // token + position embeddings (each N(0, 1)) have variance 2.
                let var_x = if self.layer_norm { 1.0 } else { 2.0 };
                let std = gain / (self.d_model as f64 * var_x).sqrt();
                cfg = cfg.with_qk_initializer(Some(Initializer::Normal { mean: 0.0, std }));
            }
            // Burn's Linear default, scaled: the same draws times the gain.
            QkInit::Default if gain != 1.0 => {
                cfg = cfg.with_qk_initializer(Some(Initializer::KaimingUniform {
                    gain: gain / 3.0f64.sqrt(),
                    fan_out_only: false,
                }));
            }
            QkInit::Default => {}
        }
        cfg
    }

    /// Builds the model, or says which setting is wrong.
    pub fn try_init(&self, device: &Device) -> Result<AttentionModel, ModelError> {
        self.validate()?;
        let norm = |d| {
            self.layer_norm.then(|| {
                LayerNormConfig::new(d)
                    .with_epsilon(LAYER_NORM_EPSILON)
                    .init(device)
            })
        };
        let blocks = (0..self.n_layers)
            .map(|_| {
                Ok(Block {
                    norm_attn: norm(self.d_model),
                    attention: self.mha_config().try_init(device)?,
                    norm_mlp: (self.mlp && self.layer_norm).then(|| {
                        LayerNormConfig::new(self.d_model)
                            .with_epsilon(LAYER_NORM_EPSILON)
                            .init(device)
                    }),
                    mlp: self.mlp.then(|| Mlp {
                        up: LinearConfig::new(self.d_model, self.d_model * self.mlp_ratio)
                            .init(device),
                        down: LinearConfig::new(self.d_model * self.mlp_ratio, self.d_model)
                            .init(device),
                        activation: Gelu::new(),
                    }),
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(AttentionModel {
            token_embedding: EmbeddingConfig::new(self.vocab_size, self.d_model).init(device),
            position_embedding: EmbeddingConfig::new(self.seq_len, self.d_model).init(device),
            blocks,
            norm_out: norm(self.d_model),
            head: LinearConfig::new(self.d_model, self.n_classes).init(device),
            seq_len: self.seq_len,
        })
    }

    /// Builds the model.
    ///
    /// # Panics
    /// With the message of [`try_init`](Self::try_init)'s error.
    pub fn init(&self, device: &Device) -> AttentionModel {
        self.try_init(device).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A position-wise MLP.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `d_model -> ratio · d_model`
    pub up: Linear,
    /// `ratio · d_model -> d_model`
    pub down: Linear,
    /// GELU.
    pub activation: Gelu,
}

/// One pre-norm block: `x + attn(norm(x))`, then optionally `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct Block {
    /// Norm before attention.
    pub norm_attn: Option<LayerNorm>,
    /// The attention layer.
    pub attention: MultiHeadSdpa,
    /// Norm before the MLP.
    pub norm_mlp: Option<LayerNorm>,
    /// The MLP.
    pub mlp: Option<Mlp>,
}

/// What one attention layer did in a forward pass (when asked to record it), taken from that
/// forward itself: the row statistics its attention path carried through the softmax (no second
/// pass, no `[b, h, s, s]` weights) and the scale of the heads it projected (reduced right away,
/// so that the heads themselves are not kept alive past the step's backward pass).
#[derive(Debug, Clone)]
pub struct LayerAttention {
    /// `[b, h, s]` each: entropy, largest weight and logit, visible keys, logit mean and std.
    pub stats: RowStats,
    /// `[2]`, outside autodiff: the standard deviation of the query and of the key components
    /// that enter the scores (after QK-norm, before the scale), over every batch entry, head,
    /// position and component.
    pub qk_std: Tensor<1>,
}

impl LayerAttention {
    /// The record of a layer from its row statistics and the query `[b, h, s, d_k]` and key
    /// `[b, h_kv, s, d_k]` heads it projected.
    pub fn new(stats: RowStats, query: &Tensor<4>, key: &Tensor<4>) -> Self {
        // [mean, std] -> [std]: one pass over each head's buffer, in place (the heads are a
        // permuted view of the projection), outside autodiff.
        let std = |t: &Tensor<4>| burn_sdpa::rows::mean_and_std(t.clone()).slice(s![1..2]);
        Self {
            stats,
            qk_std: Tensor::cat(vec![std(query), std(key)], 0),
        }
    }

    /// The library's diagnostics of this layer (an error only when they cannot be read back
    /// from the device).
    pub fn diagnostics(&self) -> Result<AttentionDiagnostics, AttentionError> {
        diagnostics_from_row_stats(&self.stats)
    }

    /// The standard deviation of the query and of the key components that enter the scores
    /// (see [`qk_std`](Self::qk_std)): the article's premise is that they are close to 1 after
    /// LayerNorm and training.
    pub fn qk_std(&self) -> Result<(f64, f64), AttentionError> {
        let v: Vec<f64> = burn_sdpa::util::read_back("the query and key std", self.qk_std.clone())?;
        Ok((v[0], v[1]))
    }
}

/// The output of a forward pass.
#[derive(Debug, Clone)]
pub struct ModelOutput {
    /// `[b, n_targets, n_classes]` logits at the scored positions.
    pub logits: Tensor<3>,
    /// Per layer, when recorded.
    pub attention: Vec<LayerAttention>,
}

/// The loss and accuracy of a batch.
#[derive(Debug, Clone)]
pub struct BatchResult {
    /// Mean cross-entropy, `[1]`.
    pub loss: Tensor<1>,
    /// `[b · n_targets, n_classes]` logits.
    pub logits: Tensor<2>,
    /// `[b · n_targets]` targets.
    pub targets: Tensor<1, Int>,
    /// The recorded attention, if asked for.
    pub attention: Vec<LayerAttention>,
}

impl BatchResult {
    /// Fraction of correct predictions, `[1]` (on the device, outside autodiff).
    pub fn accuracy(&self) -> Tensor<1> {
        burn_sdpa::rows::accuracy(self.logits.clone(), self.targets.clone())
    }
}

/// Token and position embeddings, attention blocks, a linear classification head.
#[derive(Module, Debug)]
pub struct AttentionModel {
    /// Token embedding `vocab -> d_model`.
    pub token_embedding: Embedding,
    /// Learned position embedding `seq_len -> d_model`.
    pub position_embedding: Embedding,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final norm.
    pub norm_out: Option<LayerNorm>,
    /// Classification head `d_model -> n_classes`.
    pub head: Linear,
    /// Sequence length the position embedding covers.
    pub seq_len: usize,
}

/// What a forward pass records of each attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// Nothing (the plain training and evaluation forward).
    Nothing,
    /// The row statistics and the scale of the projected query and key heads
    /// ([`LayerAttention`]).
    Stats,
    /// The softmax weights (a materializing pass, for analysis).
    Weights,
}

/// The ε of every LayerNorm of the model (Burn's default, and PyTorch's).
pub const LAYER_NORM_EPSILON: f64 = 1e-5;

/// `norm` applied to `x` through the library's fused `layer_norm` (Burn's `LayerNorm::forward`
/// elsewhere than on the CPU backends); the model's norms all have [`LAYER_NORM_EPSILON`].
fn normalize(norm: &LayerNorm, x: Tensor<3>) -> Tensor<3> {
    let beta = norm.beta.as_ref().map(|b| b.val());
    burn_sdpa::rows::layer_norm(x, norm.gamma.val(), beta, LAYER_NORM_EPSILON)
}

impl AttentionModel {
    /// The hidden states and, if `record`, each layer's attention.
    ///
    /// # Shapes
    /// - tokens: `[b, s]` with `s <= seq_len`
    /// - hidden: `[b, s, d_model]`
    ///
    /// # Panics
    /// With the message of [`try_encode`](Self::try_encode)'s error.
    pub fn encode(&self, tokens: Tensor<2, Int>, record: bool) -> (Tensor<3>, Vec<LayerAttention>) {
        self.try_encode(tokens, record)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`encode`](Self::encode), or the attention's error (a path that cannot serve the call:
    /// `CubeKernel` on a CPU backend, say).
    pub fn try_encode(
        &self,
        tokens: Tensor<2, Int>,
        record: bool,
    ) -> Result<(Tensor<3>, Vec<LayerAttention>), ModelError> {
        let mode = if record {
            Record::Stats
        } else {
            Record::Nothing
        };
        let (hidden, recorded, _) = self.encode_recording(tokens, mode)?;
        Ok((hidden, recorded))
    }

    /// Each layer's softmax weights `[b, h, s, s]` for `tokens` `[b, s]` (for analysis: the
    /// weights need the materializing path, so this forward is not the training one).
    ///
    /// # Panics
    /// When the attention cannot serve the call (its implementation cannot return weights).
    pub fn attention_maps(&self, tokens: Tensor<2, Int>) -> Vec<Tensor<4>> {
        self.encode_recording(tokens, Record::Weights)
            .unwrap_or_else(|e| panic!("{e}"))
            .2
    }

    /// [`encode`](Self::encode), recording what `mode` asks for: (hidden, each layer's
    /// statistics and heads, each layer's weights).
    fn encode_recording(
        &self,
        tokens: Tensor<2, Int>,
        mode: Record,
    ) -> Result<(Tensor<3>, Vec<LayerAttention>, Vec<Tensor<4>>), ModelError> {
        let [b, s] = tokens.dims();
        let device = tokens.device();
        // [s] -> [1, s] -> [b, s]
        let positions = Tensor::<1, Int>::arange(0..s as i64, &device)
            .unsqueeze::<2>()
            .expand([b, s]);
        // [b, s, d_model]
        let mut x =
            self.token_embedding.forward(tokens) + self.position_embedding.forward(positions);
        let (mut recorded, mut maps) = (Vec::new(), Vec::new());
        for block in &self.blocks {
            let h = match &block.norm_attn {
                Some(norm) => normalize(norm, x.clone()),
                None => x.clone(),
            };
            let out = if mode == Record::Weights {
                let out = block
                    .attention
                    .try_forward(MultiHeadSdpaInput::self_attn(h).need_weights())?;
                maps.extend(out.weights.clone());
                out
            } else if mode == Record::Stats {
                // The training forward itself asks its path for the row statistics (every path
                // carries them through its softmax) and measures the heads it projected.
                let input = MultiHeadSdpaInput::self_attn(h).need_row_stats();
                let attention = &block.attention;
                let (query, key, value) = attention.project_heads(&input)?;
                let mut out = attention.attend(input, query.clone(), key.clone(), value)?;
                if let Some(stats) = out.row_stats.take() {
                    recorded.push(LayerAttention::new(stats, &query, &key));
                }
                out
            } else {
                block
                    .attention
                    .try_forward(MultiHeadSdpaInput::self_attn(h))?
            };
            x = x + out.context;
            if let Some(mlp) = &block.mlp {
                let h = match &block.norm_mlp {
                    Some(norm) => normalize(norm, x.clone()),
                    None => x.clone(),
                };
                x = x + linear_rows(&mlp.down, mlp.activation.forward(linear_rows(&mlp.up, h)));
            }
        }
        if let Some(norm) = &self.norm_out {
            x = normalize(norm, x);
        }
        Ok((x, recorded, maps))
    }

    /// Logits at the positions `target_range`.
    ///
    /// # Shapes
    /// - tokens: `[b, s]`
    /// - logits: `[b, target_range.len(), n_classes]`
    ///
    /// # Panics
    /// With the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        target_range: std::ops::Range<usize>,
        record: bool,
    ) -> ModelOutput {
        self.try_forward(tokens, target_range, record)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`forward`](Self::forward), or the attention's error.
    pub fn try_forward(
        &self,
        tokens: Tensor<2, Int>,
        target_range: std::ops::Range<usize>,
        record: bool,
    ) -> Result<ModelOutput, ModelError> {
        let (hidden, attention) = self.try_encode(tokens, record)?;
        // [b, s, d_model] -> [b, t, d_model]
        let hidden = hidden.slice(s![.., target_range, ..]);
        Ok(ModelOutput {
            logits: linear_rows(&self.head, hidden),
            attention,
        })
    }

    /// Loss and predictions on a task batch.
    ///
    /// # Shapes
    /// - batch.tokens: `[b, s]`; batch.targets: `[b, t]`
    /// - logits: `[b · t, n_classes]`
    ///
    /// # Panics
    /// With the message of [`try_forward_batch`](Self::try_forward_batch)'s error.
    pub fn forward_batch(&self, batch: &TaskBatch, record: bool) -> BatchResult {
        self.try_forward_batch(batch, record)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`forward_batch`](Self::forward_batch), or the attention's error (a path that cannot
    /// serve the call): what training runs, so that such a path is an error, never a panic.
    pub fn try_forward_batch(
        &self,
        batch: &TaskBatch,
        record: bool,
    ) -> Result<BatchResult, ModelError> {
        let out = self.try_forward(batch.tokens.clone(), batch.target_range.clone(), record)?;
        let [b, t, c] = out.logits.dims();
        // [b, t, C] -> [b·t, C]
        let logits = out.logits.reshape([b * t, c]);
        // [b, t] -> [b·t]
        let targets = batch.targets.clone().reshape([b * t]);
        let loss = burn_sdpa::rows::cross_entropy(logits.clone(), targets.clone());
        Ok(BatchResult {
            loss,
            logits,
            targets,
            attention: out.attention,
        })
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
