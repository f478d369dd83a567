//! The two measurements of `attention-map`.

use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use sdpa_model::{TaskConfig, TrainConfig, train_in_memory};
use serde::{Deserialize, Serialize};

use crate::context::{LabError, normal_vec, rng, to_vec};

/// The article's random-projection maps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RandomMaps {
    /// The 8 × 8 weights of the first draw.
    pub first: Vec<Vec<f64>>,
    /// Draws.
    pub draws: usize,
    /// Rows 4–7 whose largest weight is on the twin (column i − 4) or on its identical copy
    /// (column i itself, which has the very same key), over every draw.
    pub twin_hits: usize,
    /// Rows 4–7 over every draw.
    pub rows: usize,
    /// The hits of each draw (0–4): the rows of one draw share its projections, so the share's
    /// interval is taken over draws.
    pub hits_per_draw: Vec<usize>,
    /// Mean weight of a row 4–7 on its twin, per draw.
    pub twin_weights: Vec<f64>,
}

/// The trained model's map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainedMap {
    /// Layer-0 weights of one held-out sequence, for the head that matches best.
    pub weights: Vec<Vec<f64>>,
    /// The sequence's tokens.
    pub tokens: Vec<i64>,
    /// The head drawn.
    pub head: usize,
    /// Per head: second-half rows whose largest weight is on their twin, over a held-out batch.
    pub twin_hits: Vec<usize>,
    /// Second-half rows per head.
    pub rows: usize,
    /// Held-out accuracy of the model.
    #[serde(with = "sdpa_model::json_float")]
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

/// The index of a row's largest value.
pub fn argmax(row: &[f64]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// `draws` random maps.
pub fn random_maps(draws: usize, seed: u64, device: &Device) -> Result<RandomMaps, LabError> {
    let mut rng = rng(seed, 7);
    let mut out = RandomMaps {
        first: Vec::new(),
        draws,
        twin_hits: 0,
        rows: 0,
        hits_per_draw: Vec::new(),
        twin_weights: Vec::new(),
    };
    for i in 0..draws {
        let w = random_map(&mut rng, device)?;
        let mut twin_w = 0.0;
        let mut hits = 0;
        for (r, row) in w.iter().enumerate().skip(4) {
            let a = argmax(row);
            if a == r - 4 || a == r {
                hits += 1;
            }
            twin_w += row[r - 4];
            out.rows += 1;
        }
        out.twin_weights.push(twin_w / 4.0);
        out.twin_hits += hits;
        out.hits_per_draw.push(hits);
        if i == 0 {
            out.first = w;
        }
    }
    Ok(out)
}

/// The default model trained on *match* (in memory), and its layer-0 map on a held-out batch.
pub fn trained_map(seed: u64, backend: &str, device: &Device) -> Result<TrainedMap, LabError> {
    let task = TaskConfig::new();
    let config = TrainConfig::for_task(task.clone()).with_seed(seed);
    let result = train_in_memory(&config, device, backend)?;
    let mut data_rng = rng(seed, 77);
    let batch = task.batch(&mut data_rng, 256, device);
    let tokens: Vec<i64> = burn_sdpa::util::read_back("the batch's tokens", batch.tokens.clone())?;
    let targets: Vec<i64> =
        burn_sdpa::util::read_back("the batch's targets", batch.targets.clone())?;
    let w = result
        .model
        .attention_maps(batch.tokens.clone())
        .into_iter()
        .next()
        .ok_or_else(|| LabError::Missing {
            from: "the trained model",
            what: "attention map".into(),
        })?;
    let [b, h, s, _] = w.dims();
    let wv = to_vec(w)?;
    let k = task.k;
    let twin_hits: Vec<usize> = (0..h)
        .map(|head| {
            let mut hit = 0;
            for bi in 0..b {
                for i in k..2 * k {
                    let off = ((bi * h + head) * s + i) * s;
                    if argmax(&wv[off..off + s]) as i64 == targets[bi * k + (i - k)] {
                        hit += 1;
                    }
                }
            }
            hit
        })
        .collect();
    let best = (0..h).max_by_key(|&i| twin_hits[i]).unwrap_or(0);
    Ok(TrainedMap {
        weights: (0..s)
            .map(|i| wv[(best * s + i) * s..(best * s + i + 1) * s].to_vec())
            .collect(),
        tokens: tokens[..s].to_vec(),
        head: best,
        twin_hits,
        rows: b * k,
        accuracy: result.summary.final_eval_accuracy,
        steps: result.summary.steps_run,
    })
}
