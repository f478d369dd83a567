//! A plain float64 attention written from the definition, used as the oracle of the property
//! tests. It follows the contract of `shared/golden/README.md` literally, loop by loop.

use sdpa::{CausalAlignment, Window};

/// One attention problem with row-major data.
#[derive(Debug, Clone)]
pub struct Problem {
    pub b: usize,
    pub h: usize,
    pub h_kv: usize,
    pub n: usize,
    pub m: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    /// `[b|1, h|1, n|1, m]`, true = masked out.
    pub mask: Option<([usize; 4], Vec<bool>)>,
    /// `[b|1, h|1, n|1, m]`
    pub bias: Option<([usize; 4], Vec<f64>)>,
    pub causal: Option<CausalAlignment>,
    pub scale: f64,
    /// `c`: the scaled scores become `c · tanh(s / c)` before the bias.
    pub softcap: Option<f64>,
    /// Query i sees key j only when `c − left ≤ j ≤ c + right`, `c = i + offset` of the causal
    /// alignment (bottom-right when `causal` is `None`).
    pub window: Option<Window>,
}

/// Index of a broadcast `[b|1, h|1, n|1, m]` tensor.
fn bidx(shape: [usize; 4], b: usize, h: usize, i: usize, j: usize) -> usize {
    let pick = |x: usize, d: usize| if d == 1 { 0 } else { x };
    ((pick(b, shape[0]) * shape[1] + pick(h, shape[1])) * shape[2] + pick(i, shape[2])) * shape[3]
        + j
}

/// Returns (context `[b, h, n, d_v]`, weights `[b, h, n, m]`).
pub fn attention(p: &Problem) -> (Vec<f64>, Vec<f64>) {
    let group = p.h / p.h_kv;
    let mut context = vec![0.0; p.b * p.h * p.n * p.d_v];
    let mut weights = vec![0.0; p.b * p.h * p.n * p.m];
    for bi in 0..p.b {
        for hi in 0..p.h {
            let kv = hi / group;
            for i in 0..p.n {
                let mut scores = vec![f64::NEG_INFINITY; p.m];
                let mut visible = vec![true; p.m];
                for j in 0..p.m {
                    if let Some((shape, mask)) = &p.mask
                        && mask[bidx(*shape, bi, hi, i, j)]
                    {
                        visible[j] = false;
                    }
                    let offset = match p.causal.unwrap_or_default() {
                        CausalAlignment::TopLeft => 0,
                        CausalAlignment::BottomRight => p.m as i64 - p.n as i64,
                    };
                    if p.causal.is_some() && j as i64 > i as i64 + offset {
                        visible[j] = false;
                    }
                    if let Some(window) = p.window {
                        let centre = i as i64 + offset;
                        let before = window.left.is_some_and(|l| (j as i64) < centre - l as i64);
                        let after = window.right.is_some_and(|r| j as i64 > centre + r as i64);
                        if before || after {
                            visible[j] = false;
                        }
                    }
                    let mut s = 0.0;
                    for d in 0..p.d_k {
                        s += p.q[((bi * p.h + hi) * p.n + i) * p.d_k + d]
                            * p.k[((bi * p.h_kv + kv) * p.m + j) * p.d_k + d];
                    }
                    s *= p.scale;
                    if let Some(c) = p.softcap {
                        s = c * (s / c).tanh();
                    }
                    if let Some((shape, bias)) = &p.bias {
                        s += bias[bidx(*shape, bi, hi, i, j)];
                    }
                    if visible[j] {
                        scores[j] = s;
                    }
                }
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue; // no visible key: zero weights and context
                }
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for j in 0..p.m {
                    let w = exps[j] / sum;
                    weights[((bi * p.h + hi) * p.n + i) * p.m + j] = w;
                    for e in 0..p.d_v {
                        context[((bi * p.h + hi) * p.n + i) * p.d_v + e] +=
                            w * p.v[((bi * p.h_kv + kv) * p.m + j) * p.d_v + e];
                    }
                }
            }
        }
    }
    (context, weights)
}
