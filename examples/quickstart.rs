//! Quickstart: use `MultiHeadSdpa` inside your own Burn model.
//!
//! ```sh
//! cargo run --release --example quickstart            # flex (the default CPU backend)
//! cargo run --release --example quickstart -- ndarray # or ndarray / wgpu (with --features wgpu)
//! ```
//!
//! How long on 2 cores: not measured (one forward, one backward and one Adam step of a tiny model).
//!
//! Builds a tiny classifier (embedding → causal self-attention → mean pool → linear), runs a
//! forward and a backward pass on an autodiff device, takes one Adam step, and prints the
//! attention map of the first head.

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn_sdpa::mask::padding_mask_from_tokens;
use burn_sdpa::{MultiHeadSdpa, MultiHeadSdpaConfig, MultiHeadSdpaInput};
// This repository's backend switch (its command-line name to a `Device`); in your project, make
// the device directly, e.g. `Device::flex()`.
use sdpa::BackendKind;

/// The user's model: nothing in it is specific to this crate except the attention layer.
#[derive(Module, Debug)]
struct TinyClassifier {
    embedding: Embedding,
    attention: MultiHeadSdpa,
    head: Linear,
}

impl TinyClassifier {
    fn new(vocab: usize, d_model: usize, n_classes: usize, device: &Device) -> Self {
        Self {
            embedding: EmbeddingConfig::new(vocab, d_model).init(device),
            attention: MultiHeadSdpaConfig::new(d_model, 4).init(device),
            head: LinearConfig::new(d_model, n_classes).init(device),
        }
    }

    /// # Shapes
    /// - tokens: `[b, s]` (0 = padding)
    /// - logits: `[b, n_classes]`; weights: `[b, h, s, s]`
    fn forward(&self, tokens: Tensor<2, Int>) -> (Tensor<2>, Tensor<4>) {
        let padding = padding_mask_from_tokens(tokens.clone(), 0);
        let x = self.embedding.forward(tokens); // [b, s, d_model]
        let out = self.attention.forward(
            MultiHeadSdpaInput::self_attn(x)
                .padding_mask(padding)
                .causal()
                .need_weights(),
        );
        let pooled = out.context.mean_dim(1).squeeze_dim::<2>(1); // [b, d_model]
        (
            self.head.forward(pooled),
            out.weights.expect("asked for weights"),
        )
    }
}

fn main() -> anyhow::Result<()> {
    let backend: BackendKind = match std::env::args().nth(1) {
        Some(name) => name.parse()?,
        None => BackendKind::Flex,
    };
    let device = backend.device()?.autodiff();
    device.seed(42);

    let model = TinyClassifier::new(16, 32, 3, &device);
    let tokens = Tensor::<2, Int>::from_data([[3, 5, 7, 9, 2, 0], [4, 4, 8, 1, 0, 0]], &device);
    let targets = Tensor::<1, Int>::from_data([2, 0], &device);

    let (logits, weights) = model.forward(tokens.clone());
    let criterion = CrossEntropyLossConfig::new().init(&device);
    let loss = criterion.forward(logits, targets.clone());
    let before = loss.clone().into_scalar::<f32>();
    let grads = loss.backward();
    let query_grad_norm = model
        .attention
        .query
        .weight
        .grad(&grads)
        .map(|g| g.square().sum().sqrt().into_scalar::<f32>());
    let grads = GradientsParams::from_grads(grads, &model);
    let mut optim = AdamConfig::new().init();
    let model = optim.step(1e-2, model, grads);
    let (logits, _) = model.forward(tokens);
    let after = criterion.forward(logits, targets).into_scalar::<f32>();

    println!("backend: {backend}");
    println!("loss before one Adam step: {before:.4}, after: {after:.4}");
    println!("gradient norm of the query projection: {query_grad_norm:?}");
    println!(
        "attention map, sequence 0, head 0 (rows = queries, columns = keys; causal, token 5 is padding):"
    );
    let map = weights
        .slice(s![0..1, 0..1, .., ..])
        .squeeze_dims::<2>(&[0, 1]);
    let [s, _] = map.dims();
    let values: Vec<f32> = map.into_data().convert::<f32>().try_into_vec()?;
    print!("     ");
    for j in 0..s {
        print!("{j:>6}");
    }
    println!();
    for i in 0..s {
        print!("  q{i} ");
        for j in 0..s {
            print!("{:>6.2}", values[i * s + j]);
        }
        println!();
    }
    Ok(())
}
