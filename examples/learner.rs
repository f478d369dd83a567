//! The same self-attention model trained with Burn's own `SupervisedTraining` / `Learner`
//! (burn-train), with the attention's entropy and largest probability shown as metrics beside
//! loss and accuracy (a live dashboard on a terminal, progress lines otherwise).
//!
//! ```sh
//! cargo run --release --example learner            # flex
//! cargo run --release --example learner -- ndarray
//! ```
//!
//! How long on 2 cores: not measured.
//!
//! Artifacts (metric logs per epoch, checkpoints) go to `runs/learner`.

use burn::data::dataloader::DataLoaderBuilder;
use burn::optim::AdamConfig;
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{Learner, SupervisedTraining};
use sdpa::BackendKind;
use sdpa::model::learner::{AttentionMetric, TaskBatcher, task_dataset};
use sdpa::model::{TaskConfig, TrainConfig, evaluate, init_model};

fn main() -> anyhow::Result<()> {
    sdpa::tune_allocator();
    let backend: BackendKind = match std::env::args().nth(1) {
        Some(name) => name.parse()?,
        None => BackendKind::Flex,
    };
    let device = backend.device()?.autodiff();
    let task = TaskConfig::new();
    let config = TrainConfig::for_task(task.clone());
    let model = init_model(&config.model, config.seed, &device)?;

    let batcher = TaskBatcher { task: task.clone() };
    let train = DataLoaderBuilder::new(batcher.clone())
        .batch_size(config.batch_size)
        .shuffle(config.seed)
        .set_device(device.clone())
        .build(task_dataset(&task, 32_000, 1));
    let valid = DataLoaderBuilder::new(batcher)
        .batch_size(config.batch_size)
        .set_device(device.clone())
        .build(task_dataset(&task, 2_048, 2));

    let learner = Learner::new(model, AdamConfig::new().init(), config.lr);
    let result = SupervisedTraining::new("runs/learner", train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .metric_train_numeric(AttentionMetric::entropy())
        .metric_valid_numeric(AttentionMetric::entropy())
        .metric_train_numeric(AttentionMetric::max_prob())
        .metric_valid_numeric(AttentionMetric::max_prob())
        .num_epochs(2)
        .summary()
        .launch(learner);
    if let Some(e) = result.error {
        anyhow::bail!("training failed: {e}");
    }

    // The held-out set of the custom loop, for a number to compare with `--example train`.
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(99);
    let inner = device.clone().without_autodiff();
    let batches: Vec<_> = (0..16).map(|_| task.batch(&mut rng, 64, &inner)).collect();
    let (loss, accuracy) = evaluate(&result.model, &batches)?;
    println!(
        "learner example on {backend}: held-out loss {loss:.4}, accuracy {:.2}%",
        100.0 * accuracy
    );
    println!("metric logs: runs/learner/train and runs/learner/valid");
    Ok(())
}
