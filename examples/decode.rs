//! Cached decoding: a small causal language model built on `MultiHeadSdpa` (rotary
//! positions, QK-norm), trained for a few seconds, then
//! 1. generating from short prompts three ways — with the preallocated `KvCache`, with the
//!    concatenating cache of earlier versions, and by recomputing the whole prefix at every
//!    step — which must give the same tokens;
//! 2. decoding a batch of prompts of different lengths together (`forward_cache_ragged`), which
//!    must give the tokens each prompt gives alone;
//! 3. timing tokens per second after 1k and 4k cached tokens, the three ways.
//!
//! ```sh
//! cargo run --release --example decode            # flex (the default CPU backend)
//! cargo run --release --example decode -- ndarray # or wgpu (with --features wgpu)
//! cargo run --release --example decode -- flex --quick  # contexts of 256 and 512 tokens
//! ```
//!
//! How long on 2 cores: not measured as a whole; a few seconds of training, then generation after
//! 1k and 4k cached tokens three ways, recomputing the prefix being the slow one (36 tokens/s after
//! 4096 tokens at batch 4 on 2 cores, `docs/bench/decode_flex.md`); `--quick` stops at 512 tokens.
//!
//! The task: sequences `x_t = (a + s·t) mod V` with a random start `a` and stride `s`; the next
//! token follows from the last two, so the model must attend to the previous position.

use std::time::Instant;

use anyhow::ensure;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::TensorData;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sdpa::{
    BackendKind, KvCache, MultiHeadSdpa, MultiHeadSdpaConfig, MultiHeadSdpaInput, QkNorm,
    RopeConfig,
};

/// Vocabulary size (V).
const VOCAB: usize = 32;
/// Sequence length in training and in the first decoding (prompt + generated).
const SEQ_LEN: usize = 256;
/// Tokens given before generation starts: the model reads the stride off the tokens it has
/// seen, and from 8 it errs early and then continues its own errors (9% of the generated tokens
/// continued the two before them, against 78% from 32).
const PROMPT: usize = 32;
/// Cached tokens before the timed steps: 1k and 4k, what the issue asks to be measured.
const CONTEXTS: [usize; 2] = [1024, 4096];
/// `--quick`: short contexts, to try the example in seconds.
const QUICK_CONTEXTS: [usize; 2] = [256, 512];
/// Tokens generated (and timed) per sequence after each context: enough steps that the
/// per-step time is stable, few enough that the context barely grows.
const TIMED_STEPS: usize = 32;
/// Positions the rotary encoding holds: the longest context and its timed steps.
const MAX_POSITIONS: usize = 4096 + TIMED_STEPS + 1;

/// One causal attention block between an embedding and a next-token head.
#[derive(Module, Debug)]
struct TinyLm {
    tokens: Embedding,
    norm: LayerNorm,
    attention: MultiHeadSdpa,
    head: Linear,
}

impl TinyLm {
    fn new(d_model: usize, device: &Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, d_model).init(device),
            norm: LayerNormConfig::new(d_model).init(device),
            // Rotary positions: the attention knows the order, and a cached token is rotated
            // for its position once, when it enters the cache.
            attention: MultiHeadSdpaConfig::new(d_model, 4)
                .with_qk_norm(QkNorm::RmsNorm)
                .with_rope(Some(RopeConfig::new(MAX_POSITIONS)))
                .init(device),
            head: LinearConfig::new(d_model, VOCAB).init(device),
        }
    }

    /// The input of the attention (positions enter in the attention, by rotation).
    ///
    /// # Shapes
    /// - tokens: `[b, t]` -> `[b, t, d_model]`
    fn embed(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        self.norm.forward(self.tokens.forward(tokens))
    }

    /// Next-token logits of every position of a whole sequence (causal).
    ///
    /// # Shapes
    /// - tokens: `[b, s]` -> logits `[b, s, V]`
    fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let x = self.embed(tokens);
        let context = self
            .attention
            .forward(MultiHeadSdpaInput::self_attn(x.clone()).causal())
            .context;
        self.head.forward(x + context)
    }

    /// Next-token logits of new tokens, attending to `cache` too; row r holds `counts[r]`
    /// tokens and then padding.
    ///
    /// # Shapes
    /// - tokens: `[b, t]` -> logits `[b, t, V]`
    fn forward_cached(
        &self,
        tokens: Tensor<2, Int>,
        counts: &[usize],
        cache: &mut KvCache,
    ) -> Tensor<3> {
        let x = self.embed(tokens);
        let input = MultiHeadSdpaInput::self_attn(x.clone()).causal();
        let context = self
            .attention
            .forward_cache_ragged(input, counts, cache)
            .context;
        self.head.forward(x + context)
    }
}

/// `batch` sequences `(a + s·t) mod V` of `len` tokens, `[batch, len]` row-major.
fn sequences(rng: &mut ChaCha8Rng, batch: usize, len: usize) -> Vec<i64> {
    (0..batch)
        .flat_map(|_| {
            let (a, s) = (rng.random_range(0..VOCAB), rng.random_range(1..VOCAB));
            (0..len).map(move |t| ((a + s * t) % VOCAB) as i64)
        })
        .collect()
}

/// `[b, t]` token ids on `device`.
fn tokens(ids: Vec<i64>, b: usize, device: &Device) -> Tensor<2, Int> {
    let t = ids.len() / b;
    Tensor::from_data(TensorData::new(ids, [b, t]), device)
}

/// The most likely next token at every position, `[b, t]` row-major.
fn argmax_rows(logits: Tensor<3>) -> anyhow::Result<Vec<i64>> {
    let [b, t, _] = logits.dims();
    // [b, t, V] -> [b, t] most likely tokens
    logits
        .argmax(2)
        .reshape([b, t])
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .map_err(|e| anyhow::anyhow!("token ids: {e:?}"))
}

/// The most likely next token of row r after its position `last[r]`.
fn argmax_at(logits: Tensor<3>, last: &[usize]) -> anyhow::Result<Vec<i64>> {
    let t = logits.dims()[1];
    let best = argmax_rows(logits)?;
    Ok(last
        .iter()
        .enumerate()
        .map(|(r, &i)| best[r * t + i])
        .collect())
}

/// The most likely next token after the last position, per sequence.
fn argmax_last(logits: Tensor<3>) -> anyhow::Result<Vec<i64>> {
    let [b, t, _] = logits.dims();
    argmax_at(logits, &vec![t - 1; b])
}

/// Tokens generated after a prompt and the seconds the generation steps took.
struct Generated {
    /// `[step][b]`: the token each sequence chose at each step (the first from the prompt).
    tokens: Vec<Vec<i64>>,
    /// Seconds of the `steps` calls after the prompt's.
    seconds: f64,
}

impl Generated {
    fn tokens_per_second(&self) -> f64 {
        let b = self.tokens[0].len();
        (b * (self.tokens.len() - 1)) as f64 / self.seconds
    }
}

/// `steps + 1` tokens after `prompt` `[b, p]` with `cache`: the prompt in one call, then one
/// token per sequence per call (these `steps` calls are timed).
fn generate_cached(
    model: &TinyLm,
    prompt: Tensor<2, Int>,
    steps: usize,
    mut cache: KvCache,
) -> anyhow::Result<Generated> {
    let [b, p] = prompt.dims();
    let device = prompt.device();
    let mut next = argmax_last(model.forward_cached(prompt, &vec![p; b], &mut cache))?;
    let mut generated = vec![next.clone()];
    let started = Instant::now();
    for _ in 0..steps {
        let logits = model.forward_cached(tokens(next, b, &device), &vec![1; b], &mut cache);
        next = argmax_last(logits)?;
        generated.push(next.clone());
    }
    Ok(Generated {
        tokens: generated,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `steps + 1` tokens after `prompt` `[b, p]`, running the whole sequence at every step (the
/// `steps` forwards after the prompt's are timed).
fn generate_recomputed(
    model: &TinyLm,
    prompt: Tensor<2, Int>,
    steps: usize,
) -> anyhow::Result<Generated> {
    let [b, _] = prompt.dims();
    let device = prompt.device();
    let mut sequence = prompt;
    let mut next = argmax_last(model.forward(sequence.clone()))?;
    let mut generated = vec![next.clone()];
    let started = Instant::now();
    for _ in 0..steps {
        sequence = Tensor::cat(vec![sequence, tokens(next, b, &device)], 1);
        next = argmax_last(model.forward(sequence.clone()))?;
        generated.push(next.clone());
    }
    Ok(Generated {
        tokens: generated,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Trains the model on whole sequences for a few seconds.
fn train(backend: BackendKind, device: &Device, rng: &mut ChaCha8Rng) -> TinyLm {
    let train_device = device.clone().autodiff();
    let mut model = TinyLm::new(64, &train_device);
    let mut optimizer = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&train_device);
    let started = Instant::now();
    for step in 1..=600 {
        let batch = 16;
        let tokens = tokens(sequences(rng, batch, SEQ_LEN), batch, &train_device);
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
    model.valid()
}

/// Part 1: short prompts generated three ways give the same tokens.
fn three_ways(model: &TinyLm, device: &Device, rng: &mut ChaCha8Rng) -> anyhow::Result<()> {
    let batch = 4;
    let truth = sequences(rng, batch, SEQ_LEN);
    let prompt: Vec<i64> = truth
        .chunks(SEQ_LEN)
        .flat_map(|row| row[..PROMPT].to_vec())
        .collect();
    let prompt = tokens(prompt, batch, device);
    let steps = SEQ_LEN - PROMPT - 1;
    let preallocated = generate_cached(model, prompt.clone(), steps, KvCache::new())?;
    let concatenated = generate_cached(model, prompt.clone(), steps, KvCache::concatenating())?;
    let recomputed = generate_recomputed(model, prompt, steps)?;
    // A generated token follows the rule when it continues the last two tokens before it
    // (the prompt's or generated ones): x_t = 2·x_{t−1} − x_{t−2} mod V.
    let mut correct = 0;
    for b in 0..batch {
        let mut seq: Vec<i64> = truth[b * SEQ_LEN..b * SEQ_LEN + PROMPT].to_vec();
        for step in &preallocated.tokens {
            let (a, c) = (seq[seq.len() - 2], seq[seq.len() - 1]);
            correct += usize::from(step[b] == (2 * c - a).rem_euclid(VOCAB as i64));
            seq.push(step[b]);
        }
    }
    // Next-token accuracy with the true prefix (teacher forcing), from the third token on.
    let logits = model.forward(tokens(truth.clone(), batch, device));
    let predicted = argmax_rows(logits)?;
    let forced = (0..batch)
        .flat_map(|b| (1..SEQ_LEN - 1).map(move |i| (b, i)))
        .filter(|&(b, i)| predicted[b * SEQ_LEN + i] == truth[b * SEQ_LEN + i + 1])
        .count();
    println!(
        "next-token accuracy with the true prefix {:.1}%; generating {} tokens × {batch} sequences: \
         {:.1}% continue the two tokens before them; preallocated cache {:.0} tokens/s, \
         concatenating cache {:.0}, recomputing {:.0}",
        100.0 * forced as f64 / (batch * (SEQ_LEN - 2)) as f64,
        steps + 1,
        100.0 * correct as f64 / ((steps + 1) * batch) as f64,
        preallocated.tokens_per_second(),
        concatenated.tokens_per_second(),
        recomputed.tokens_per_second(),
    );
    ensure!(
        preallocated.tokens == concatenated.tokens && preallocated.tokens == recomputed.tokens,
        "the three ways of generating gave different tokens"
    );
    println!("same tokens all three ways: true");
    Ok(())
}

/// Part 2: prompts of different lengths decoded together give what each gives alone.
fn ragged(model: &TinyLm, device: &Device, rng: &mut ChaCha8Rng) -> anyhow::Result<()> {
    let lengths = [8, 3, 12, 5];
    let (longest, steps) = (12, 40);
    let truth = sequences(rng, lengths.len(), longest);
    // Right-padded prompts [4, longest] (the padding is token 0; it is never seen).
    let padded: Vec<i64> = truth
        .chunks(longest)
        .zip(lengths)
        .flat_map(|(row, len)| (0..longest).map(move |i| if i < len { row[i] } else { 0 }))
        .collect();
    let mut cache = KvCache::new();
    let logits = model.forward_cached(tokens(padded, lengths.len(), device), &lengths, &mut cache);
    let mut next = argmax_at(logits, &lengths.map(|len| len - 1))?;
    let mut together = vec![next.clone()];
    for _ in 0..steps {
        let logits = model.forward_cached(tokens(next, 4, device), &[1; 4], &mut cache);
        next = argmax_last(logits)?;
        together.push(next.clone());
    }
    for (r, len) in lengths.into_iter().enumerate() {
        let prompt = tokens(truth[r * longest..r * longest + len].to_vec(), 1, device);
        let alone = generate_cached(model, prompt, steps, KvCache::new())?;
        let row: Vec<i64> = together.iter().map(|step| step[r]).collect();
        let alone: Vec<i64> = alone.tokens.iter().map(|step| step[0]).collect();
        ensure!(
            row == alone,
            "the prompt of {len} tokens decoded in a ragged batch gave other tokens than alone"
        );
    }
    println!(
        "prompts of {lengths:?} tokens decoded together ({} tokens each): the same tokens as each alone",
        steps + 1
    );
    Ok(())
}

/// Timed repeats of each way of generating: the table gives the median and the range, since
/// the machine's other work moves single timings.
const REPEATS: usize = 5;

/// The median, smallest and largest of `values`.
fn median_range(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// Part 3: tokens per second after `context` cached tokens, the three ways.
fn timed(
    model: &TinyLm,
    device: &Device,
    rng: &mut ChaCha8Rng,
    context: usize,
) -> anyhow::Result<()> {
    let batch = 4;
    let prompt = tokens(sequences(rng, batch, context), batch, device);
    let mut speeds = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..REPEATS {
        let capacity = KvCache::with_capacity(context + TIMED_STEPS + 1);
        let preallocated = generate_cached(model, prompt.clone(), TIMED_STEPS, capacity)?;
        let growable = generate_cached(model, prompt.clone(), TIMED_STEPS, KvCache::new())?;
        let concatenated =
            generate_cached(model, prompt.clone(), TIMED_STEPS, KvCache::concatenating())?;
        let recomputed = generate_recomputed(model, prompt.clone(), TIMED_STEPS)?;
        ensure!(
            preallocated.tokens == concatenated.tokens && growable.tokens == concatenated.tokens,
            "the caches gave different tokens after {context} tokens"
        );
        for (speed, way) in
            speeds
                .iter_mut()
                .zip([preallocated, growable, concatenated, recomputed])
        {
            speed.push(way.tokens_per_second());
        }
    }
    let [p, g, c, r] = speeds.map(median_range);
    let cell = |(median, low, high): (f64, f64, f64)| format!("{median:.0} [{low:.0}, {high:.0}]");
    println!(
        "| {context} | {} | {} | {} | {} | {:.2}× | {:.1}× |",
        cell(p),
        cell(g),
        cell(c),
        cell(r),
        p.0 / c.0,
        p.0 / r.0
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    sdpa::tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let backend: BackendKind = match args.iter().find(|a| !a.starts_with("--")) {
        Some(name) => name.parse()?,
        None => BackendKind::Flex,
    };
    let device = backend.device()?;
    device.seed(7);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let model = train(backend, &device, &mut rng);
    three_ways(&model, &device, &mut rng)?;
    ragged(&model, &device, &mut rng)?;
    println!(
        "\ntokens per second (median [min, max] of {REPEATS} runs), batch 4, d_model 64, 4 heads, \
         {TIMED_STEPS} steps after the context, {backend}:"
    );
    println!(
        "| cached tokens | preallocated (capacity = what is needed) | growable (`KvCache::new()`) | \
         concatenating cache | recomputing the prefix | preallocated / concatenating | \
         preallocated / recomputing |"
    );
    println!("|---|---|---|---|---|---|---|");
    for context in if quick { QUICK_CONTEXTS } else { CONTEXTS } {
        timed(&model, &device, &mut rng, context)?;
    }
    Ok(())
}
