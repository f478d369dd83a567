//! burn-nn's transformer layers against this crate's drop-in ones, in the two models Burn's own
//! examples build (`examples/text-classification` and `examples/text-generation` of the Burn
//! repository): the model code is written once and compiled twice, with only the `use` line
//! changed (`burn::nn::transformer` → `burn_sdpa::nn::transformer`).
//!
//! ```sh
//! cargo run --release --example burn_nn_drop_in                  # both models, seq 128 and 512, flex
//! cargo run --release --example burn_nn_drop_in -- --out docs/bench/BENCH_drop_in.md
//! ```
//!
//! How long on 2 cores: not measured as a whole; 200 training steps per model and arm at seq 128,
//! then 3 rounds of 10 steps per arm at seq 128 and 512 (at the rates of
//! `docs/bench/BENCH_drop_in.md`, 1.4 to 22 steps/s on 2 cores), plus the build.
//!
//! For each model: the drop-in model loads the burn-nn model's initial record, both train on the
//! same seeded synthetic batches with Adam (dropout 0: on the attention weights it would keep the
//! drop-in layer on the materializing path), and the losses are compared step for step. Then
//! training steps per second at each sequence length, burn-nn and drop-in alternating, rounds
//! reported with their median. The trained text generators finally generate greedily, with and
//! without the encoder's autoregressive cache.

use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The two models of Burn's examples, over the transformer module `$transformer`.
macro_rules! burn_examples {
    ($transformer:path) => {
        use burn::module::Module;
        use burn::nn::attention::generate_autoregressive_mask;
        use burn::nn::loss::CrossEntropyLossConfig;
        use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
        use burn::prelude::*;
        // The one line that differs between the two builds.
        use $transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};

        use super::Sizes;

        /// Burn's `TextClassificationModel`: the first position's output classifies.
        #[derive(Module, Debug)]
        pub struct TextClassificationModel {
            transformer: TransformerEncoder,
            embedding_token: Embedding,
            embedding_pos: Embedding,
            output: Linear,
            n_classes: usize,
        }

        impl TextClassificationModel {
            pub fn new(sizes: &Sizes, n_classes: usize, device: &Device) -> Self {
                Self {
                    transformer: encoder(sizes).init(device),
                    embedding_token: EmbeddingConfig::new(sizes.vocab, sizes.d_model).init(device),
                    embedding_pos: EmbeddingConfig::new(sizes.max_seq_len, sizes.d_model)
                        .init(device),
                    output: LinearConfig::new(sizes.d_model, n_classes).init(device),
                    n_classes,
                }
            }

            /// # Shapes
            /// - tokens, mask_pad: `[b, s]`; labels: `[b]`; returns the mean loss `[1]`
            pub fn loss(
                &self,
                tokens: Tensor<2, Int>,
                mask_pad: Tensor<2, Bool>,
                labels: Tensor<1, Int>,
            ) -> Tensor<1> {
                let [b, s] = tokens.dims();
                let embedding = embed(&self.embedding_token, &self.embedding_pos, tokens);
                let encoded = self
                    .transformer
                    .forward(TransformerEncoderInput::new(embedding).mask_pad(mask_pad));
                let output = self.output.forward(encoded); // [b, s, n_classes]
                let _ = s;
                // [b, s, n_classes] -> [b, 1, n_classes] -> [b, n_classes]
                let first = output.slice(s![.., 0..1, ..]).reshape([b, self.n_classes]);
                CrossEntropyLossConfig::new()
                    .init(&first.device())
                    .forward(first, labels)
            }
        }

        /// Burn's `TextGenerationModel`: causal self-attention through the autoregressive mask.
        #[derive(Module, Debug)]
        pub struct TextGenerationModel {
            transformer: TransformerEncoder,
            embedding_token: Embedding,
            embedding_pos: Embedding,
            output: Linear,
            vocab_size: usize,
            pad_token: usize,
        }

        impl TextGenerationModel {
            pub fn new(sizes: &Sizes, device: &Device) -> Self {
                Self {
                    transformer: encoder(sizes).init(device),
                    embedding_token: EmbeddingConfig::new(sizes.vocab, sizes.d_model).init(device),
                    embedding_pos: EmbeddingConfig::new(sizes.max_seq_len, sizes.d_model)
                        .init(device),
                    output: LinearConfig::new(sizes.d_model, sizes.vocab).init(device),
                    vocab_size: sizes.vocab,
                    pad_token: 0,
                }
            }

            /// The next-token logits `[b, s, vocab]`.
            pub fn logits(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
                let [b, s] = tokens.dims();
                let device = tokens.device();
                let mask_pad = tokens.clone().equal_elem(self.pad_token as i64);
                let mask_attn = generate_autoregressive_mask(b, s, &device);
                let embedding = embed(&self.embedding_token, &self.embedding_pos, tokens);
                let encoded = self.transformer.forward(
                    TransformerEncoderInput::new(embedding)
                        .mask_pad(mask_pad)
                        .mask_attn(mask_attn),
                );
                self.output.forward(encoded)
            }

            /// # Shapes
            /// - tokens, targets: `[b, s]`; returns the mean loss `[1]` (padding ignored)
            pub fn loss(&self, tokens: Tensor<2, Int>, targets: Tensor<2, Int>) -> Tensor<1> {
                let [b, s] = tokens.dims();
                // [b, s, vocab] -> [b·s, vocab]
                let logits = self.logits(tokens).reshape([b * s, self.vocab_size]);
                CrossEntropyLossConfig::new()
                    .with_pad_tokens(Some(vec![self.pad_token]))
                    .init(&logits.device())
                    .forward(logits, targets.reshape([b * s]))
            }
        }

        impl TextGenerationModel {
            /// Greedy generation of `new_tokens` after `prompt` `[b, s]`, with the encoder's
            /// autoregressive cache (one new row per call) or a full forward per token: every
            /// row's tokens, prompt included.
            pub fn generate(
                &self,
                prompt: Tensor<2, Int>,
                new_tokens: usize,
                cached: bool,
            ) -> Vec<i64> {
                let mut tokens = prompt;
                let mut cache = self.transformer.new_autoregressive_cache();
                for _ in 0..new_tokens {
                    let [b, s] = tokens.dims();
                    let device = tokens.device();
                    let mask_pad = tokens.clone().equal_elem(self.pad_token as i64);
                    let mask_attn = generate_autoregressive_mask(b, s, &device);
                    let embedding =
                        embed(&self.embedding_token, &self.embedding_pos, tokens.clone());
                    let input = TransformerEncoderInput::new(embedding)
                        .mask_pad(mask_pad)
                        .mask_attn(mask_attn);
                    let encoded = if cached {
                        self.transformer
                            .forward_autoregressive_inference(input, &mut cache)
                    } else {
                        self.transformer.forward(input)
                    };
                    // [b, s, d_model] -> [b, 1, d_model] -> [b, 1, vocab] -> [b, 1]
                    let last = encoded.slice(s![.., s - 1..s, ..]);
                    let next = self.output.forward(last).argmax(2).reshape([b, 1]);
                    tokens = Tensor::cat(vec![tokens, next], 1);
                }
                tokens
                    .into_data()
                    .convert::<i64>()
                    .try_into_vec()
                    .expect("token ids")
            }
        }

        /// The encoder of both models (Burn's examples' shape, sized by `sizes`).
        fn encoder(sizes: &Sizes) -> TransformerEncoderConfig {
            TransformerEncoderConfig::new(sizes.d_model, sizes.d_ff, sizes.n_heads, sizes.n_layers)
                .with_norm_first(true)
                .with_dropout(0.0)
        }

        /// Token plus position embeddings, halved (as Burn's examples do), `[b, s, d_model]`.
        fn embed(token: &Embedding, position: &Embedding, tokens: Tensor<2, Int>) -> Tensor<3> {
            let [b, s] = tokens.dims();
            let device = tokens.device();
            // [s] -> [1, s] -> [b, s]
            let positions = Tensor::<1, Int>::arange(0..s as i64, &device)
                .reshape([1, s])
                .repeat_dim(0, b);
            (position.forward(positions) + token.forward(tokens)) / 2
        }
    };
}

/// The models with burn-nn's layers.
mod burn_nn {
    burn_examples!(burn::nn::transformer);
}

/// The same models with the drop-in layers.
mod drop_in {
    burn_examples!(burn_sdpa::nn::transformer);
}

/// The models' sizes.
#[derive(Debug, Clone)]
pub struct Sizes {
    vocab: usize,
    d_model: usize,
    d_ff: usize,
    n_heads: usize,
    n_layers: usize,
    max_seq_len: usize,
}

const SIZES: Sizes = Sizes {
    vocab: 64,
    d_model: 128,
    d_ff: 512,
    n_heads: 4,
    n_layers: 2,
    max_seq_len: 512,
};

/// A classification batch: tokens `[b, s]` (token 63 first, padding 0 at the end of some rows),
/// the padding mask and the labels (1 when token 1 occurs more often than token 2).
fn classification_batch(
    rng: &mut ChaCha8Rng,
    b: usize,
    s: usize,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Bool>, Tensor<1, Int>) {
    let mut tokens = Vec::with_capacity(b * s);
    let mut labels = Vec::with_capacity(b);
    for _ in 0..b {
        let len = rng.random_range(s / 2..=s);
        let row: Vec<i64> = (0..s)
            .map(|i| match i {
                0 => 63,
                i if i < len => rng.random_range(1..8),
                _ => 0,
            })
            .collect();
        let count = |t| row.iter().filter(|&&x| x == t).count();
        labels.push(i64::from(count(1) > count(2)));
        tokens.extend(row);
    }
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(tokens, [b, s]), device);
    let mask_pad = tokens.clone().equal_elem(0);
    (
        tokens,
        mask_pad,
        Tensor::from_data(TensorData::new(labels, [b]), device),
    )
}

/// A language-model batch: rows repeating a random motif of 2 to 6 tokens (1..63), inputs and
/// next-token targets `[b, s]`.
fn generation_batch(
    rng: &mut ChaCha8Rng,
    b: usize,
    s: usize,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for _ in 0..b {
        let period = rng.random_range(2..=6);
        let motif: Vec<i64> = (0..period).map(|_| rng.random_range(1..63)).collect();
        let row: Vec<i64> = (0..=s).map(|i| motif[i % period]).collect();
        inputs.extend_from_slice(&row[..s]);
        targets.extend_from_slice(&row[1..]);
    }
    let tensor = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [b, s]), device);
    (tensor(inputs), tensor(targets))
}

/// One of the two models of one build, behind one interface for the training loop.
trait Trainable: Module + Clone {
    /// The loss of batch `step` (the batches are drawn from `seed + step`).
    fn loss_at(&self, step: u64, seq_len: usize, device: &Device) -> Tensor<1>;
}

const BATCH: usize = 8;

macro_rules! trainable {
    ($build:ident) => {
        impl Trainable for $build::TextClassificationModel {
            fn loss_at(&self, step: u64, seq_len: usize, device: &Device) -> Tensor<1> {
                let mut rng = ChaCha8Rng::seed_from_u64(1000 + step);
                let (tokens, mask_pad, labels) =
                    classification_batch(&mut rng, BATCH, seq_len, device);
                self.loss(tokens, mask_pad, labels)
            }
        }

        impl Trainable for $build::TextGenerationModel {
            fn loss_at(&self, step: u64, seq_len: usize, device: &Device) -> Tensor<1> {
                let mut rng = ChaCha8Rng::seed_from_u64(2000 + step);
                let (tokens, targets) = generation_batch(&mut rng, BATCH, seq_len, device);
                self.loss(tokens, targets)
            }
        }
    };
}
trainable!(burn_nn);
trainable!(drop_in);

/// Trains `model` for `steps` Adam steps from batch `first`: the model and the losses.
fn train<M: Trainable>(
    mut model: M,
    first: u64,
    steps: usize,
    seq_len: usize,
    device: &Device,
) -> (M, Vec<f64>) {
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::with_capacity(steps);
    for step in first..first + steps as u64 {
        let loss = model.loss_at(step, seq_len, device);
        losses.push(loss.clone().into_scalar::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    (model, losses)
}

/// Training steps per second of `model` over `steps` steps (after one untimed step).
fn steps_per_second<M: Trainable>(model: M, steps: usize, seq_len: usize, device: &Device) -> f64 {
    let (model, _) = train(model, 0, 1, seq_len, device);
    let start = Instant::now();
    let _ = train(model, 1, steps, seq_len, device);
    steps as f64 / start.elapsed().as_secs_f64()
}

/// The command line: `--steps N` (equality run, default 200), `--timing-steps N` (default 10),
/// `--rounds N` (default 3), `--out FILE` (a Markdown report).
struct Args {
    steps: usize,
    timing_steps: usize,
    rounds: usize,
    out: Option<std::path::PathBuf>,
}

fn args() -> Args {
    let mut args = Args {
        steps: 200,
        timing_steps: 10,
        rounds: 3,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let count = |v: String| -> usize { v.parse().unwrap_or_else(|_| panic!("{flag}: {v}")) };
        match flag.as_str() {
            "--steps" => args.steps = count(value()),
            "--timing-steps" => args.timing_steps = count(value()),
            "--rounds" => args.rounds = count(value()),
            "--out" => args.out = Some(value().into()),
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Both builds of one model from the same initial parameters (the drop-in model loads the
/// burn-nn model's record).
fn pair<A: Trainable, B: Trainable>(theirs: A, ours: B) -> (A, B) {
    let ours = ours.load_record(theirs.clone().into_record());
    (theirs, ours)
}

fn main() {
    let args = args();
    let device = Device::flex().autodiff();
    let mut report = String::new();
    let mut line = |text: String| {
        println!("{text}");
        report.push_str(&text);
        report.push('\n');
    };
    line("# burn-nn's transformer layers against the drop-in layers of `burn_sdpa::nn`".into());
    line(String::new());
    line(format!(
        "Measured by `cargo run --release --example burn_nn_drop_in -- --out FILE`: Burn's own \
         examples' models (`text-classification`, `text-generation`) written once and compiled \
         twice, only the `use` line changed; the drop-in models load the burn-nn models' initial \
         records; a step is a forward, a backward and an Adam step. flex, {} threads; CPU \
         features detected at run time: {} (softmax on {}); {SIZES:?}, batch {BATCH}, Adam lr \
         1e-3, dropout 0.",
        burn_sdpa::cpu_kernel::threads(),
        burn_sdpa::cpu_kernel::cpu_features().join(", "),
        burn_sdpa::cpu_kernel::softmax_isa(),
    ));
    line(String::new());
    line(format!(
        "## Losses step for step ({} steps, seq 128)",
        args.steps
    ));
    line(String::new());
    line(
        "| model | burn-nn first → last loss | drop-in first → last loss | max \\|Δ loss\\| |"
            .into(),
    );
    line("|---|---|---|---|".into());
    let models = |device: &Device| {
        device.seed(7);
        let classifier = pair(
            burn_nn::TextClassificationModel::new(&SIZES, 2, device),
            drop_in::TextClassificationModel::new(&SIZES, 2, device),
        );
        let generator = pair(
            burn_nn::TextGenerationModel::new(&SIZES, device),
            drop_in::TextGenerationModel::new(&SIZES, device),
        );
        (classifier, generator)
    };
    let ((c_theirs, c_ours), (g_theirs, g_ours)) = models(&device);
    let compare = |name: &str, theirs: Vec<f64>, ours: Vec<f64>| {
        let max = theirs
            .iter()
            .zip(&ours)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        format!(
            "| {name} | {:.4} → {:.4} | {:.4} → {:.4} | {max:.2e} |",
            theirs[0],
            theirs[theirs.len() - 1],
            ours[0],
            ours[ours.len() - 1]
        )
    };
    let (_, a) = train(c_theirs, 0, args.steps, 128, &device);
    let (_, b) = train(c_ours, 0, args.steps, 128, &device);
    line(compare("text classification", a, b));
    let (g_theirs, a) = train(g_theirs, 0, args.steps, 128, &device);
    let (g_ours, b) = train(g_ours, 0, args.steps, 128, &device);
    line(compare("text generation", a, b));
    line(String::new());
    // Greedy generation from the trained text generators: 2 prompts of 8 tokens, 24 new ones.
    let inference = Device::flex();
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let (prompt, _) = generation_batch(&mut rng, 2, 8, &inference);
    let (g_theirs, g_ours) = (g_theirs.valid(), g_ours.valid());
    let runs = [
        (
            "burn-nn, full forward per token",
            g_theirs.generate(prompt.clone(), 24, false),
        ),
        (
            "burn-nn, its cache",
            g_theirs.generate(prompt.clone(), 24, true),
        ),
        (
            "drop-in, full forward per token",
            g_ours.generate(prompt.clone(), 24, false),
        ),
        ("drop-in, its cache", g_ours.generate(prompt, 24, true)),
    ];
    line("## Greedy generation (2 prompts of 8 tokens, 24 new tokens)".into());
    line(String::new());
    for (name, tokens) in &runs {
        line(format!("- {name}: {tokens:?}"));
    }
    let same = runs.iter().all(|(_, t)| *t == runs[0].1);
    line(format!("- the same tokens in all four: **{same}**"));
    line(String::new());
    line(format!(
        "## Training steps per second ({} steps per round, {} rounds, alternating)",
        args.timing_steps, args.rounds
    ));
    line(String::new());
    line(
        "| model | seq | burn-nn, median [rounds] | drop-in, median [rounds] | ratio of medians |"
            .into(),
    );
    line("|---|---|---|---|---|".into());
    for seq_len in [128, 512] {
        for name in ["text classification", "text generation"] {
            let (mut theirs, mut ours) = (Vec::new(), Vec::new());
            for _ in 0..args.rounds {
                let ((c_theirs, c_ours), (g_theirs, g_ours)) = models(&device);
                if name == "text classification" {
                    theirs.push(steps_per_second(
                        c_theirs,
                        args.timing_steps,
                        seq_len,
                        &device,
                    ));
                    ours.push(steps_per_second(
                        c_ours,
                        args.timing_steps,
                        seq_len,
                        &device,
                    ));
                } else {
                    theirs.push(steps_per_second(
                        g_theirs,
                        args.timing_steps,
                        seq_len,
                        &device,
                    ));
                    ours.push(steps_per_second(
                        g_ours,
                        args.timing_steps,
                        seq_len,
                        &device,
                    ));
                }
            }
            let fmt = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (mt, mo) = (median(theirs.clone()), median(ours.clone()));
            line(format!(
                "| {name} | {seq_len} | {mt:.2} [{}] | **{mo:.2}** [{}] | {:.2}× |",
                fmt(&theirs),
                fmt(&ours),
                mo / mt
            ));
        }
    }
    if let Some(out) = args.out {
        std::fs::write(&out, report).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    }
}
