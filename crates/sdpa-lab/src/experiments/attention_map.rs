//! Experiment 7 (`attention-map`): the article's experiment 3 (8 tokens, tokens 4–7 copies of
//! 0–3, random linear projections of width 32), printed and drawn, with the share of rows 4–7
//! whose largest weight is on their twin measured over many draws; then the map of a model
//! trained on *match*, which learns the permutation.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use sdpa_model::{ProgressMode, RunOptions, TaskConfig, TrainConfig, train};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, f, md_table, out_path};
use crate::claims::{Claim, Source, show};
use crate::context::{LabContext, LabError, normal_vec, to_vec};
use crate::plot::heatmap;
use crate::stats::{Estimate, mean_ci, wilson};

/// The article's random-projection map.
#[derive(Debug, Clone, Serialize)]
pub struct RandomMap {
    /// The 8 × 8 weights of one draw.
    pub weights: Vec<Vec<f64>>,
    /// Draws measured.
    pub draws: usize,
    /// Share of rows 4–7 whose largest weight is on the twin (column i − 4) or on its identical
    /// copy (column i itself, which has the very same key), with its Wilson interval over the
    /// rows of every draw.
    pub share_twin_is_max: Estimate,
    /// The same share if the argmax were random: 2 of 8 columns.
    pub chance: f64,
    /// Mean weight of a row 4–7 on its twin, with its t-interval over draws.
    pub mean_twin_weight: Estimate,
}

/// The trained model's map.
#[derive(Debug, Clone, Serialize)]
pub struct TrainedMap {
    /// Layer-0 weights of one held-out sequence, for the head that matches best.
    pub weights: Vec<Vec<f64>>,
    /// The sequence's tokens.
    pub tokens: Vec<i64>,
    /// The head drawn.
    pub head: usize,
    /// Share of second-half rows whose largest weight is on their twin, per head, over a
    /// held-out batch (Wilson intervals over its rows).
    pub share_twin_is_max: Vec<Estimate>,
    /// Held-out accuracy of the model.
    pub accuracy: f64,
    /// Steps it trained.
    pub steps: usize,
}

/// PyTorch's `nn.Linear` default initialization: weights and biases uniform in ±1/√fan_in.
fn linear(
    rng: &mut ChaCha8Rng,
    d_in: usize,
    d_out: usize,
    device: &Device,
) -> (Tensor<2>, Tensor<2>) {
    let bound = 1.0 / (d_in as f32).sqrt();
    let w: Vec<f32> = (0..d_in * d_out)
        .map(|_| rng.random_range(-bound..bound))
        .collect();
    let b: Vec<f32> = (0..d_out)
        .map(|_| rng.random_range(-bound..bound))
        .collect();
    (
        Tensor::from_data(TensorData::new(w, [d_in, d_out]), device),
        Tensor::from_data(TensorData::new(b, [1, d_out]), device),
    )
}

fn random_map(rng: &mut ChaCha8Rng, device: &Device) -> Result<Vec<Vec<f64>>, LabError> {
    let (seq, d) = (8, 32);
    let half: Vec<f32> = normal_vec(rng, 4 * d)
        .into_iter()
        .map(|x| x * 0.5)
        .collect();
    let mut x = half.clone();
    x.extend(half); // tokens 4..7 are copies of 0..3
    let x = Tensor::<2>::from_data(TensorData::new(x, [seq, d]), device);
    let (wq, bq) = linear(rng, d, d, device);
    let (wk, bk) = linear(rng, d, d, device);
    let q = x.clone().matmul(wq) + bq;
    let k = x.matmul(wk) + bk;
    let w = to_vec(softmax(q.matmul(k.transpose()) / (d as f64).sqrt(), 1))?;
    Ok(w.chunks(seq).map(|r| r.to_vec()).collect())
}

fn argmax(row: &[f64]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// The experiment.
pub struct AttentionMap;

impl Experiment for AttentionMap {
    fn name(&self) -> &'static str {
        "attention-map"
    }

    fn title(&self) -> &'static str {
        "Attention maps: random projections (the article's experiment 3) vs a trained model"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let device = &ctx.primary().device;
        let mut rng = ctx.rng(7);
        let first = random_map(&mut rng, device)?;
        let draws = if ctx.quick { 200 } else { 1000 };
        let (mut hits, mut rows) = (0usize, 0usize);
        let mut twin_weights = Vec::new();
        for i in 0..draws {
            let w = if i == 0 {
                first.clone()
            } else {
                random_map(&mut rng, device)?
            };
            let mut twin_w = 0.0;
            for (r, row) in w.iter().enumerate().skip(4) {
                let a = argmax(row);
                if a == r - 4 || a == r {
                    hits += 1;
                }
                twin_w += row[r - 4];
                rows += 1;
            }
            twin_weights.push(twin_w / 4.0);
        }
        let random = RandomMap {
            weights: first.clone(),
            draws,
            share_twin_is_max: wilson(hits, rows),
            chance: 2.0 / 8.0,
            mean_twin_weight: mean_ci(&twin_weights),
        };
        let p1 = "attention_map_random.png";
        heatmap(
            &out_path(ctx, p1),
            "Random projections (article's experiment 3)",
            &first,
            "key",
            "query",
        )?;

        // A model trained on match.
        let task = TaskConfig::new();
        let config = TrainConfig::for_task(task.clone()).with_seed(ctx.seed);
        let run_dir = ctx.out_dir.join("runs").join("attention-map");
        let _ = std::fs::remove_dir_all(&run_dir);
        let result = train(
            &config,
            device,
            &RunOptions {
                out_dir: run_dir,
                resume: false,
                backend: ctx.primary().name.clone(),
                progress: ProgressMode::Quiet,
                // The lab's own run folder: a report run again replaces its runs.
                overwrite: true,
            },
        )?;
        let mut data_rng = ctx.rng(77);
        let batch = task.batch(&mut data_rng, 256, device);
        let tokens: Vec<i64> = burn_sdpa::read_back("the batch's tokens", batch.tokens.clone())?;
        let targets: Vec<i64> = burn_sdpa::read_back("the batch's targets", batch.targets.clone())?;
        let (_, att) = result.model.encode(batch.tokens.clone(), true);
        let w = att
            .first()
            .map(|a| a.weights.clone())
            .ok_or_else(|| LabError::Other("no attention recorded".into()))?;
        let [b, h, s, _] = w.dims();
        let wv = to_vec(w)?;
        let k = task.k;
        let mut shares = vec![wilson(0, 0); h];
        for (head, share) in shares.iter_mut().enumerate() {
            let mut hit = 0;
            for bi in 0..b {
                for i in k..2 * k {
                    let off = ((bi * h + head) * s + i) * s;
                    if argmax(&wv[off..off + s]) as i64 == targets[bi * k + (i - k)] {
                        hit += 1;
                    }
                }
            }
            *share = wilson(hit, b * k);
        }
        let best = (0..h)
            .max_by(|&a, &c| shares[a].value.total_cmp(&shares[c].value))
            .unwrap_or(0);
        let map: Vec<Vec<f64>> = (0..s)
            .map(|i| wv[(best * s + i) * s..(best * s + i + 1) * s].to_vec())
            .collect();
        let trained = TrainedMap {
            weights: map.clone(),
            tokens: tokens[..s].to_vec(),
            head: best,
            share_twin_is_max: shares.clone(),
            accuracy: result.summary.final_eval_accuracy,
            steps: result.summary.steps_run,
        };
        let p2 = "attention_map_trained.png";
        heatmap(
            &out_path(ctx, p2),
            &format!(
                "Trained on match, head {best} (tokens {:?})",
                trained.tokens
            ),
            &map,
            "key",
            "query",
        )?;

        let matrix = |w: &[Vec<f64>]| {
            let mut rows = Vec::new();
            for (i, r) in w.iter().enumerate() {
                let mut row = vec![format!("t{i}")];
                row.extend(r.iter().map(|v| f(*v, 2)));
                rows.push(row);
            }
            rows
        };
        let headers8: Vec<String> = std::iter::once("".to_string())
            .chain((0..8).map(|j| j.to_string()))
            .collect();
        let h8: Vec<&str> = headers8.iter().map(|s| s.as_str()).collect();
        let markdown = format!(
            "**The article's setup.** 8 tokens of width 32 (x ~ N(0, 0.5²)), tokens 4–7 copies of 0–3, \
             Q, K from two independent random `nn.Linear(32, 32)` (PyTorch's default init), softmax of \
             QKᵀ/√32. One draw:\n\n{}\n![random map]({p1})\n\n\
             Over {draws} draws: the share of rows 4–7 whose largest weight is on their twin (or on \
             themselves, whose key is identical) is {} (Wilson 95%; chance would give {:.0}%), and the \
             mean weight of a row on its twin is {} (t-interval over draws; uniform is 0.125). \
             q_i·k_j = x_iᵀW_QᵀW_K x_j with *independent* random W_Q, W_K is not largest at x_j = x_i \
             unless W_QᵀW_K is positive definite, which training can learn; a copy is never *preferred* \
             to itself: columns i and i − 4 always get the same weight.\n\n\
             **A trained model.** The default model trained on *match* ({} steps, held-out accuracy {}); \
             the share of second-half rows whose largest weight is on their twin, per head (Wilson 95% \
             over a held-out batch): {}. Head {best} on one held-out sequence (tokens {:?}; rows 8–15 are \
             the second half, their twins are in columns 0–7):\n\n![trained map]({p2})\n",
            md_table(&h8, &matrix(&first)),
            show(random.share_twin_is_max),
            100.0 * random.chance,
            show(random.mean_twin_weight),
            trained.steps,
            f(trained.accuracy, 4),
            shares
                .iter()
                .map(|s| show(*s))
                .collect::<Vec<_>>()
                .join(", "),
            trained.tokens,
        );
        let claims = claims(&random, &trained);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "random": random, "trained": trained }),
            t0,
        )
        .files(vec![p1.into(), p2.into()], vec![]))
    }
}

/// The claims of `attention-map`, decided by its measurements.
pub fn claims(random: &RandomMap, trained: &TrainedMap) -> Vec<Claim> {
    let best = trained
        .share_twin_is_max
        .iter()
        .copied()
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .unwrap_or(wilson(0, 0));
    vec![
        Claim::above(
            "copies-attend-to-twins",
            Source::Article("experiment 3"),
            "with random projections, a copied token puts its largest weight on its twin",
            "share of rows 4–7 with the twin as argmax (Wilson interval)",
            random.share_twin_is_max,
            0.5,
        ),
        Claim::in_range(
            "random-maps-are-near-uniform",
            Source::Lab,
            "with random projections every row is close to uniform: the weight on the twin is about 1/8",
            "mean weight on the twin (t-interval over draws)",
            random.mean_twin_weight,
            0.075,
            0.175,
        ),
        Claim::above(
            "training-learns-matching",
            Source::Lab,
            "a model trained on match learns content matching: in its best head, second-half rows point at their twins",
            "share of rows with the twin as argmax, best head (Wilson interval)",
            best,
            0.9,
        ),
    ]
}
