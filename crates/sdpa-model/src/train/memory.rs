//! The memory a training configuration needs, estimated before anything is allocated, and the
//! check that refuses one that cannot fit on this machine.
//!
//! The estimate counts f32 elements: the parameters four times (values, gradients and Adam's two
//! moments), and what one autodiff step keeps alive per layer: the query, key and value
//! projections and their gradients with the attention path's own copies (6 per element,
//! calibrated on the default model at d_k = 1000 and 4000: 150–170 kB per unit of d_k measured,
//! 147 kB estimated), the residual stream, the MLP, and the `[b, h, n, n]` scores, weights and
//! their gradients of the recorded steps. On the configurations measured it came within about
//! 20% of the peak resident memory (d_k = 4000: 0.63 GB estimated, 0.70 GB peak; k = 2000 with
//! batches of 4: 3.2 GiB estimated, 2.7 GiB peak), so a configuration it refuses is one that would
//! not, or only just, fit.

use crate::error::ModelError;

use super::config::TrainConfig;

/// Bytes of an f32.
const F32: u128 = 4;

/// Products and sums of sizes without overflow.
fn product(factors: &[usize]) -> Option<u128> {
    factors
        .iter()
        .try_fold(1u128, |acc, &f| acc.checked_mul(f as u128))
}

impl TrainConfig {
    /// The bytes a training run of this configuration needs, about (see the module docs); an
    /// error when the sizes overflow the arithmetic.
    pub fn memory_estimate(&self) -> Result<u64, ModelError> {
        let m = &self.model;
        let d = m.d_model;
        let h = m.n_heads;
        let d_k = m.d_k.unwrap_or(d / h.max(1));
        let d_v = m.d_v.unwrap_or(d_k);
        let (s, b, l) = (m.seq_len, self.batch_size, m.n_layers);
        let mlp = if m.mlp { m.mlp_ratio } else { 0 };
        let too_large = || {
            ModelError::invalid(
                "sizes",
                format!(
                    "d_model {d}, n_heads {h}, d_k {d_k}, d_v {d_v}, n_layers {l}, vocab {}, seq_len {s}, batch {b}",
                    m.vocab_size
                ),
                "their product overflows: far beyond any machine's memory",
            )
        };
        let sum = |terms: &[Option<u128>]| -> Option<u128> {
            terms
                .iter()
                .try_fold(0u128, |acc, t| acc.checked_add((*t)?))
        };
        // Query, key and value widths of one head.
        let qkv = d_k
            .checked_mul(2)
            .and_then(|x| x.checked_add(d_v))
            .ok_or_else(too_large)?;
        let per_layer_params = sum(&[
            product(&[d, h, qkv]),
            product(&[h, d_v, d]),
            product(&[2, mlp, d, d]),
            product(&[4, d]),
        ]);
        let params = sum(&[
            product(&[m.vocab_size, d]),
            product(&[s, d]),
            per_layer_params.and_then(|p| p.checked_mul(l as u128)),
            product(&[d, m.n_classes]),
        ]);
        let activations = sum(&[
            product(&[b, s, l, 6, h, qkv]),
            product(&[b, s, l, 8, d]),
            product(&[b, s, l, 4, mlp, d]),
            product(&[b, l, h, s, s, 6]),
            product(&[b, s, m.n_classes, 2]),
        ]);
        let bytes = sum(&[params.and_then(|p| p.checked_mul(4)), activations])
            .and_then(|e| e.checked_mul(F32))
            .ok_or_else(too_large)?;
        Ok(u64::try_from(bytes).unwrap_or(u64::MAX))
    }

    /// Refuses a configuration whose [`memory_estimate`](Self::memory_estimate) exceeds the
    /// memory this machine has available (when the machine says; see [`available_memory`]).
    pub fn check_memory(&self) -> Result<(), ModelError> {
        let needed = self.memory_estimate()?;
        check_fits(
            &format!(
                "training (d_model {}, {} heads, d_k {}, {} layers, vocabulary {}, sequences of {}, batches of {})",
                self.model.d_model,
                self.model.n_heads,
                self.model
                    .d_k
                    .unwrap_or(self.model.d_model / self.model.n_heads.max(1)),
                self.model.n_layers,
                self.model.vocab_size,
                self.model.seq_len,
                self.batch_size
            ),
            needed,
        )
    }
}

/// The memory this machine has available for a new computation, in bytes: `MemAvailable` of
/// `/proc/meminfo` (Linux); `None` where it cannot be read, and then nothing is refused.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses `needed` bytes for `what` when they exceed [`available_memory`].
pub fn check_fits(what: &str, needed: u64) -> Result<(), ModelError> {
    match available_memory() {
        Some(available) if needed > available => Err(ModelError::TooLarge {
            what: what.to_string(),
            needed_gib: needed as f64 / (1u64 << 30) as f64,
            available_gib: available as f64 / (1u64 << 30) as f64,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskConfig;

    #[test]
    fn the_estimate_grows_with_the_sizes_and_overflow_is_an_error() {
        let base = TrainConfig::for_task(TaskConfig::new());
        let small = base.memory_estimate().unwrap();
        assert!(small > 100_000 && small < 100 << 20, "{small}");
        let mut wide = base.clone();
        wide.model.d_k = Some(4000);
        let wide_bytes = wide.memory_estimate().unwrap();
        // Calibration: the default model at d_k = 4000 peaked at 0.68 GB resident.
        assert!(
            (400 << 20..1200 << 20).contains(&wide_bytes),
            "{wide_bytes}"
        );
        let mut huge = base.clone();
        huge.batch_size = usize::MAX;
        huge.model.n_layers = usize::MAX;
        assert!(huge.memory_estimate().is_err());
        let mut big = base;
        big.model.vocab_size = 10_000_000_000;
        assert!(big.memory_estimate().unwrap() > 1 << 40);
    }
}
