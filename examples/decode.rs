//! Cached decoding: a small causal language model built on `MultiHeadAttention`, trained for a few
//! seconds, then generating token by token twice — with an `MhaCache` (each new token attends to
//! the cached keys and values) and by recomputing the whole prefix at every step — to show that
//! both give the same tokens and how much faster the cache is.
//!
//! ```sh
//! cargo run --release --example decode            # flex (the default CPU backend)
//! cargo run --release --example decode -- ndarray # or wgpu (with --features wgpu)
//! ```
//!
//! The task: sequences `x_t = (a + s·t) mod V` with a random start `a` and stride `s`; the next
//! token follows from the last two, so the model must attend to the previous position.

use std::time::Instant;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::TensorData;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sdpa::{BackendKind, MhaCache, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, QkNorm};

/// Vocabulary size (V).
const VOCAB: usize = 32;
/// Sequence length in training and in decoding (prompt + generated).
const SEQ_LEN: usize = 256;
/// Tokens given before generation starts.
const PROMPT: usize = 8;

/// One causal attention block between an embedding and a next-token head.
#[derive(Module, Debug)]
struct TinyLm {
    tokens: Embedding,
    positions: Embedding,
    norm: LayerNorm,
    attention: MultiHeadAttention,
    head: Linear,
}

impl TinyLm {
    fn new(d_model: usize, device: &Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, d_model).init(device),
            positions: EmbeddingConfig::new(SEQ_LEN, d_model).init(device),
            norm: LayerNormConfig::new(d_model).init(device),
            attention: MultiHeadAttentionConfig::new(d_model, 4)
                .with_qk_norm(QkNorm::RmsNorm)
                .init(device),
            head: LinearConfig::new(d_model, VOCAB).init(device),
        }
    }

    /// The input of the attention for tokens at positions `start..start + t`.
    ///
    /// # Shapes
    /// - tokens: `[b, t]` -> `[b, t, d_model]`
    fn embed(&self, tokens: Tensor<2, Int>, start: usize) -> Tensor<3> {
        let [_, t] = tokens.dims();
        let device = tokens.device();
        let positions =
            Tensor::<1, Int>::arange(start as i64..(start + t) as i64, &device).unsqueeze::<2>(); // [1, t]
        self.norm
            .forward(self.tokens.forward(tokens) + self.positions.forward(positions))
    }

    /// Next-token logits of every position of a whole sequence (causal).
    ///
    /// # Shapes
    /// - tokens: `[b, s]` -> logits `[b, s, V]`
    fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let x = self.embed(tokens, 0);
        let context = self
            .attention
            .forward(MhaInput::self_attn(x.clone()).causal())
            .context;
        self.head.forward(x + context)
    }

    /// Next-token logits of new tokens at positions `start..`, attending to `cache` too.
    ///
    /// # Shapes
    /// - tokens: `[b, t]` -> logits `[b, t, V]`
    fn forward_cached(
        &self,
        tokens: Tensor<2, Int>,
        start: usize,
        cache: &mut MhaCache,
    ) -> Tensor<3> {
        let x = self.embed(tokens, start);
        let context = self
            .attention
            .forward_cache(MhaInput::self_attn(x.clone()).causal(), cache)
            .context;
        self.head.forward(x + context)
    }
}

/// `batch` sequences `(a + s·t) mod V`, `[batch, SEQ_LEN]`.
fn sequences(rng: &mut ChaCha8Rng, batch: usize) -> Vec<i64> {
    (0..batch)
        .flat_map(|_| {
            let (a, s) = (rng.random_range(0..VOCAB), rng.random_range(1..VOCAB));
            (0..SEQ_LEN).map(move |t| ((a + s * t) % VOCAB) as i64)
        })
        .collect()
}

/// The last position's most likely token, per sequence.
fn argmax_last(logits: Tensor<3>) -> Vec<i64> {
    let [b, t, _] = logits.dims();
    logits
        .slice(s![.., t - 1..t, ..])
        .reshape([b, VOCAB])
        .argmax(1)
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .expect("token ids")
}

fn main() -> anyhow::Result<()> {
    sdpa::tune_allocator();
    let backend: BackendKind = match std::env::args().nth(1) {
        Some(name) => name.parse()?,
        None => BackendKind::Flex,
    };
    let device = backend.device()?;
    device.seed(7);
    let train_device = device.clone().autodiff();
    let mut model = TinyLm::new(64, &train_device);
    let mut optimizer = AdamConfig::new().init();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let loss_fn = CrossEntropyLossConfig::new().init(&train_device);
    let started = Instant::now();
    for step in 1..=600 {
        let batch = 16;
        let data = sequences(&mut rng, batch);
        let tokens =
            Tensor::<2, Int>::from_data(TensorData::new(data, [batch, SEQ_LEN]), &train_device);
        // Predict token t + 1 from tokens ..= t.
        let inputs = tokens.clone().slice(s![.., 0..SEQ_LEN - 1]);
        let targets = tokens
            .slice(s![.., 1..SEQ_LEN])
            .reshape([batch * (SEQ_LEN - 1)]);
        let logits = model
            .forward(inputs)
            .reshape([batch * (SEQ_LEN - 1), VOCAB]);
        let loss = loss_fn.forward(logits, targets);
        if step % 100 == 0 {
            println!(
                "step {step:>3}: loss {:.4}",
                loss.clone().into_scalar::<f32>()
            );
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(3e-3, model, grads);
    }
    println!(
        "trained in {:.1} s on {backend}",
        started.elapsed().as_secs_f64()
    );

    let model = model.valid();
    let batch = 4;
    let truth = sequences(&mut rng, batch);
    let prompt: Vec<i64> = truth
        .chunks(SEQ_LEN)
        .flat_map(|row| row[..PROMPT].to_vec())
        .collect();
    let prompt = Tensor::<2, Int>::from_data(TensorData::new(prompt, [batch, PROMPT]), &device);

    // With the cache: the prompt at once, then one token per step.
    let started = Instant::now();
    let mut cache = MhaCache::new();
    let mut next = argmax_last(model.forward_cached(prompt.clone(), 0, &mut cache));
    let mut cached = vec![next.clone()];
    for position in PROMPT..SEQ_LEN - 1 {
        let token = Tensor::<2, Int>::from_data(TensorData::new(next, [batch, 1]), &device);
        next = argmax_last(model.forward_cached(token, position, &mut cache));
        cached.push(next.clone());
    }
    let cached_s = started.elapsed().as_secs_f64();

    // Recomputing: the whole prefix at every step.
    let started = Instant::now();
    let mut sequence = prompt;
    let mut recomputed = Vec::new();
    for _ in PROMPT..SEQ_LEN {
        let next = argmax_last(model.forward(sequence.clone()));
        recomputed.push(next.clone());
        let token = Tensor::<2, Int>::from_data(TensorData::new(next, [batch, 1]), &device);
        sequence = Tensor::cat(vec![sequence, token], 1);
    }
    let recomputed_s = started.elapsed().as_secs_f64();

    let generated = SEQ_LEN - PROMPT;
    let same = cached == recomputed;
    let correct = (0..generated)
        .flat_map(|i| (0..batch).map(move |b| (i, b)))
        .filter(|&(i, b)| cached[i][b] == truth[b * SEQ_LEN + PROMPT + i])
        .count();
    println!(
        "{generated} tokens × {batch} sequences: cached {:.3} s ({:.0} tokens/s), recomputed {:.3} s ({:.0} tokens/s): {:.1}× faster with the cache",
        cached_s,
        (generated * batch) as f64 / cached_s,
        recomputed_s,
        (generated * batch) as f64 / recomputed_s,
        recomputed_s / cached_s
    );
    println!(
        "same tokens both ways: {same}; {:.1}% of the generated tokens follow the rule",
        100.0 * correct as f64 / (generated * batch) as f64
    );
    anyhow::ensure!(same, "cached decoding gave other tokens than recomputing");
    Ok(())
}
