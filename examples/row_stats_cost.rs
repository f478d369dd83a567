//! What the row statistics cost (issue 35), in one sitting on flex:
//!
//! 1. **Training, step by step.** The default model at seq 512 (task k 256, vocab 512, batch 64,
//!    2 heads, d_k 32) trained with `--log-every 2`: every even step records (asks its training
//!    forward for the row statistics, reduces them to the layers' diagnostics, reads them back
//!    with the loss, the accuracy and the gradient norms, writes the CSV row), every odd step
//!    does not, evaluation only at step 0. Each recorded step's wall time is divided by the mean
//!    of its two unrecorded neighbours': that paired ratio is what `--log-every 1` adds to every
//!    step over `--log-every 1000`, with the machine's drift (other tenants, the allocator)
//!    cancelled step by step. The figure is the median of the ratios over [`PAIRED_RUNS`] runs,
//!    with its 95% distribution-free interval.
//! 2. **Training, whole runs** (context): `--log-every 1` against `--log-every 1000`, the mean
//!    step of whole runs, alternating round by round. On this 2-core machine its rounds spread
//!    by ±15%, so it cannot decide a 5% threshold; it is printed beside the paired figure.
//! 3. **The fused forward.** The module's forward (Auto: the CPU kernel) at b 4, h 8, n 1024,
//!    d 64, causal, with and without `need_row_stats()`, in pairs of calls back to back (the
//!    first arm flipping every round): the figure is the median of the pairs' ratios with its
//!    95% interval; per round, the median of each arm.
//!
//! The threshold was fixed by the issue before any run: each cost at most 5% (the median ratio
//! at most 1.05). The paired designs (steps, pairs of calls) replaced per-run and per-round
//! medians after those were seen to spread by more than the threshold on this 2-core machine
//! (disclosed in the report; the threshold unchanged).
//!
//! ```sh
//! cargo run --release --example row_stats_cost                      # prints the tables
//! cargo run --release --example row_stats_cost -- --out docs/bench/BENCH_row_stats.md
//! ```

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::model::{ProgressMode, RunOptions, TaskConfig, TrainConfig, train};
use sdpa::{AttentionInput, ScaledDotProductAttentionConfig};

/// Rounds of each measurement (arms alternate inside a round, their order flips every round).
const ROUNDS: usize = 7;
/// Optimizer steps per training run (the first is left out of the mean).
const TRAIN_STEPS: usize = 16;
/// Training runs of the step-paired measurement.
const PAIRED_RUNS: usize = 4;
/// Optimizer steps per step-paired run (even steps record).
const PAIRED_STEPS: usize = 42;
/// Forward calls per arm and round (alternating call by call).
const FORWARD_REPS: usize = 15;
/// The largest relative cost the issue allows.
const THRESHOLD: f64 = 0.05;

/// The per-phase seconds of every step of one training run of `steps` steps at `log_every`.
fn train_steps(log_every: usize, steps: usize, dir: &std::path::Path) -> Vec<[f64; 7]> {
    let task = TaskConfig::new().with_k(256).with_vocab(512);
    let mut config = TrainConfig::for_task(task);
    config.steps = steps;
    config.batch_size = 64;
    config.seed = 1;
    config.log_every = log_every;
    config.eval_every = 1000;
    config.stop_at_target = false;
    let options = RunOptions {
        out_dir: dir.join(format!("log{log_every}")),
        resume: false,
        backend: "flex".into(),
        progress: ProgressMode::Quiet,
        overwrite: true,
    };
    let result = train(&config, &Device::flex().autodiff(), &options).expect("training runs");
    result.profile.steps
}

/// Mean seconds per step (the first and the last left out) of one training run, and per phase.
fn train_step_seconds(log_every: usize, dir: &std::path::Path) -> (f64, [f64; 7]) {
    let all = train_steps(log_every, TRAIN_STEPS, dir);
    // Steps 1 .. last − 1: the first evaluates, the last writes the final checkpoint. Every
    // phase counts (the checkpoint phase of the others holds the freeing of the step's
    // tensors).
    let steps = &all[1..all.len() - 1];
    let total: f64 = steps.iter().map(|phases| phases.iter().sum::<f64>()).sum();
    let mut per_phase = [0.0; 7];
    for phases in steps {
        for (sum, x) in per_phase.iter_mut().zip(phases) {
            *sum += x / steps.len() as f64;
        }
    }
    (total / steps.len() as f64, per_phase)
}

/// The step-paired measurement: per recorded step, its wall time over the mean of its two
/// unrecorded neighbours' (steps 2, 4, …, the last two and step 0 left out), pooled over
/// [`PAIRED_RUNS`] runs at `--log-every 2`; and per phase the mean seconds of the recorded
/// steps and of their neighbours.
fn paired_steps(dir: &std::path::Path) -> (Vec<f64>, [[f64; 7]; 2]) {
    let mut ratios = Vec::new();
    let mut phases = [[0.0f64; 7]; 2];
    let mut counts = [0usize; 2];
    for run in 0..PAIRED_RUNS {
        let steps = train_steps(2, PAIRED_STEPS, dir);
        let wall = |idx: usize| steps[idx].iter().sum::<f64>();
        for idx in (2..PAIRED_STEPS - 2).step_by(2) {
            ratios.push(wall(idx) / ((wall(idx - 1) + wall(idx + 1)) / 2.0));
            for (arm, step) in [(0, idx), (1, idx - 1), (1, idx + 1)] {
                counts[arm] += 1;
                for (sum, x) in phases[arm].iter_mut().zip(steps[step]) {
                    *sum += x;
                }
            }
        }
        eprintln!(
            "paired run {}/{PAIRED_RUNS}: {} ratios so far",
            run + 1,
            ratios.len()
        );
    }
    for (arm, count) in counts.iter().enumerate() {
        for x in &mut phases[arm] {
            *x /= *count as f64;
        }
    }
    (ratios, phases)
}

/// One forward at b 4, h 8, n 1024, d 64 (causal), with or without statistics: its seconds.
fn forward_once(stats: bool, q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>) -> f64 {
    let attention = ScaledDotProductAttentionConfig::new().init();
    let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone()).causal();
    if stats {
        input = input.need_row_stats();
    }
    let start = Instant::now();
    let out = attention.forward(input);
    // Read back a little of each output, so that nothing stays lazy.
    let _ = out.context.slice(s![0..1, 0..1, 0..1, 0..1]).into_data();
    if let Some(rows) = out.row_stats {
        let _ = rows.entropy.slice(s![0..1, 0..1, 0..1]).into_data();
    }
    start.elapsed().as_secs_f64()
}

/// One round of the forward: [`FORWARD_REPS`] pairs of calls, one per arm back to back (the
/// first arm flips with `with_first`): the median seconds of each arm, and each pair's ratio
/// (with / without).
fn forward_round(
    with_first: bool,
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
) -> ((f64, f64), Vec<f64>) {
    let (mut with, mut without, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..FORWARD_REPS {
        let mut pair = [0.0; 2];
        for stats in [with_first, !with_first] {
            pair[usize::from(!stats)] = forward_once(stats, q, k, v);
        }
        with.push(pair[0]);
        without.push(pair[1]);
        ratios.push(pair[0] / pair[1]);
    }
    ((median(&mut with), median(&mut without)), ratios)
}

/// Whether a median ratio is within the threshold, in words.
fn verdict(median_ratio: f64) -> String {
    let side = if median_ratio <= 1.0 + THRESHOLD {
        "within"
    } else {
        "over"
    };
    format!("{side} the {:.0}% allowed", THRESHOLD * 100.0)
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

/// One measurement's rounds: (seconds with statistics, without) per round.
struct Rounds(Vec<(f64, f64)>);

impl Rounds {
    fn ratios(&self) -> Vec<f64> {
        self.0
            .iter()
            .map(|(with, without)| with / without)
            .collect()
    }

    /// (median, smallest, largest) per-round ratio.
    fn summary(&self) -> (f64, f64, f64) {
        let mut r = self.ratios();
        let m = median(&mut r);
        (m, r[0], r[r.len() - 1])
    }

    /// The rounds' table and its median ratio; with the verdict against the threshold when
    /// this measurement `decides`.
    fn table(&self, title: &str, unit: &str, scale: f64, decides: bool) -> String {
        let mut out = format!(
            "| {title} round | with statistics ({unit}) | without ({unit}) | ratio |\n|---|---|---|---|\n"
        );
        for (idx, (with, without)) in self.0.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.3} |\n",
                idx + 1,
                with * scale,
                without * scale,
                with / without
            ));
        }
        let (m, lo, hi) = self.summary();
        out.push_str(&format!(
            "\nMedian ratio {m:.3} (rounds {lo:.3}–{hi:.3}): a cost of {:+.1}%",
            (m - 1.0) * 100.0,
        ));
        if decides {
            out.push_str(&format!(", {}.\n", verdict(m)));
        } else {
            out.push_str(" (context, not the decision).\n");
        }
        out
    }
}

fn main() {
    // The allocator settings of the `sdpa` binary (see `tune_allocator`): without them every
    // large buffer of a step is mmapped and page-faulted anew, and that noise differs between
    // the arms.
    sdpa::tune_allocator();
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let out_path = arg("--out").map(std::path::PathBuf::from);
    // `--only forward` (for profiling the kernel): the forward rounds alone, no report.
    let forward_only = arg("--only").as_deref() == Some("forward");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let device = Device::flex();
    device.seed(3);
    let shape = [4, 8, 1024, 64];
    let normal = Distribution::Normal(0.0, 1.0);
    let (q, k, v) = (
        Tensor::<4>::random(shape, normal, &device),
        Tensor::<4>::random(shape, normal, &device),
        Tensor::<4>::random(shape, normal, &device),
    );
    // Warm-up: the thread pool, the allocator, the first tiles.
    let _ = forward_round(true, &q, &k, &v);
    // `--only with` / `--only without` (for profiling one arm): 100 forward calls of it.
    if let Some(arm @ ("with" | "without")) = arg("--only").as_deref() {
        let mut times: Vec<f64> = (0..100)
            .map(|_| forward_once(arm == "with", &q, &k, &v))
            .collect();
        eprintln!(
            "forward {arm} statistics: median {:.2} ms",
            median(&mut times) * 1e3
        );
        return;
    }

    if arg("--only").as_deref() == Some("training") {
        let (mut ratios, phases) = paired_steps(dir.path());
        eprintln!("paired median ratio {:.3}", median(&mut ratios));
        for phase in sdpa::model::Phase::ALL {
            let idx = phase as usize;
            eprintln!(
                "{:>10}: {:.2} / {:.2} ms",
                phase.name(),
                phases[0][idx] * 1e3,
                phases[1][idx] * 1e3
            );
        }
        return;
    }

    let (mut training, mut forward, mut forward_ratios) = (Vec::new(), Vec::new(), Vec::new());
    // Per arm (with, without): the phases' seconds per step, summed over rounds.
    let mut phases = [[0.0f64; 7]; 2];
    for round in 0..ROUNDS {
        let with_first = round % 2 == 0;
        let mut pair = [0.0; 2];
        let (medians, ratios) = forward_round(with_first, &q, &k, &v);
        forward.push(medians);
        forward_ratios.extend(ratios);
        if forward_only {
            let (with, without) = forward[round];
            eprintln!(
                "forward round {}: {:.2} / {:.2} ms",
                round + 1,
                with * 1e3,
                without * 1e3
            );
            continue;
        }
        for arm in 0..2 {
            let stats = (arm == 0) == with_first;
            let (t, per_phase) = train_step_seconds(if stats { 1 } else { 1000 }, dir.path());
            pair[usize::from(!stats)] = t;
            for (sum, x) in phases[usize::from(!stats)].iter_mut().zip(per_phase) {
                *sum += x / ROUNDS as f64;
            }
        }
        training.push((pair[0], pair[1]));
        eprintln!(
            "round {}/{ROUNDS}: forward {:.1} / {:.1} ms, training step {:.0} / {:.0} ms",
            round + 1,
            forward[round].0 * 1e3,
            forward[round].1 * 1e3,
            training[round].0 * 1e3,
            training[round].1 * 1e3,
        );
    }
    let paired_forward = sdpa::lab::stats::hypothesis::median_ci(&forward_ratios, 0.95);
    let forward_figure = format!(
        "**Median paired ratio {:.3}, 95% interval [{:.3}, {:.3}] over {} pairs of calls: a cost of {:+.1}%, {}.**",
        paired_forward.value,
        paired_forward.lo,
        paired_forward.hi,
        paired_forward.n,
        (paired_forward.value - 1.0) * 100.0,
        verdict(paired_forward.value),
    );
    if forward_only {
        eprintln!(
            "{}\n{forward_figure}",
            Rounds(forward).table("forward", "ms", 1e3, false)
        );
        return;
    }
    let (training, forward) = (Rounds(training), Rounds(forward));
    let (ratios, paired_phases) = paired_steps(dir.path());
    let paired = sdpa::lab::stats::hypothesis::median_ci(&ratios, 0.95);
    let mean_ratio = {
        let [with, without] = paired_phases.map(|p| p.iter().sum::<f64>());
        with / without
    };
    let phase_table = |phases: &[[f64; 7]; 2], with: &str, without: &str| {
        let mut table =
            format!("| phase | {with} (ms per step) | {without} (ms per step) |\n|---|---|---|\n");
        for phase in sdpa::model::Phase::ALL {
            let idx = phase as usize;
            table.push_str(&format!(
                "| {} | {:.1} | {:.1} |\n",
                phase.name(),
                phases[0][idx] * 1e3,
                phases[1][idx] * 1e3
            ));
        }
        table
    };
    let paired_table = phase_table(
        &paired_phases,
        "recorded steps",
        "their unrecorded neighbours",
    );
    let whole_table = phase_table(&phases, "with statistics", "without");
    let features = sdpa::cpu_kernel::cpu_features().join(", ");
    let report = format!(
        "# What the row statistics cost\n\n\
         Measured by `cargo run --release --example row_stats_cost -- --out docs/bench/BENCH_row_stats.md`, \
         on flex with {threads} threads and the `sdpa` binary's allocator settings; CPU features: {features} (softmax loops: {isa}), in one sitting. \
         The threshold (at most {pct:.0}%, the median ratio at most {limit:.2}) was fixed by issue 35 before any run.\n\n\
         ## Training at seq 512: what `--log-every 1` adds to a step\n\n\
         The default model (task k 256, vocab 512, batch 64, 2 heads, d_k 32, Adam) trained with \
         `--log-every 2`, {PAIRED_RUNS} runs of {PAIRED_STEPS} steps, evaluation only at step 0: every even step \
         records (its training forward carries the row statistics, which are reduced to the layer's \
         diagnostics and read back with the loss, the accuracy and the gradient norms in one transfer; \
         the CSV row is written), every odd step does not. Each recorded step's wall time over the mean \
         of its two unrecorded neighbours' is what `--log-every 1` adds to every step over `--log-every 1000`, \
         with the machine's drift cancelled step by step.\n\n\
         **Median paired ratio {pm:.3}, 95% interval [{plo:.3}, {phi:.3}] over {pn} recorded steps: a cost of {pct_cost:+.1}%, {pverdict}** \
         (ratio of the mean step times {mean_ratio:.3}).\n\n\
         Where a step's time goes (mean over the recorded steps and over their neighbours; `host_read` \
         holds the diagnostics' reductions and the step's one read-back, `record` the CSV line, \
         `checkpoint` the freeing of the step's tensors):\n\n{paired_table}\n\
         ### Context: whole runs, `--log-every 1` against `--log-every 1000`\n\n\
         {TRAIN_STEPS} steps per run, evaluation only at step 0 in both, a step's wall time averaged over \
         steps 1–{last} (step 0 evaluates, the last writes the final checkpoint); {ROUNDS} rounds, the arms \
         alternating, their order flipping every round. This was the first design; its rounds spread too \
         widely on this 2-core machine to decide a 5% threshold, so the step-paired design above replaced \
         it as the decision after that spread was seen (the threshold unchanged).\n\n{train}\n{whole_table}\n\
         ## The fused forward: with and without `need_row_stats()`\n\n\
         `ScaledDotProductAttention` (Auto: the CPU kernel) at b 4, h 8, n 1024, d_k = d_v = 64, \
         causal, inference; {ROUNDS} rounds of {FORWARD_REPS} pairs of calls, one per arm back to back \
         (the first arm flipping every round). Each pair's ratio cancels the machine's drift between \
         calls; the figure is their median over every pair. (The first design, the ratio of each round's \
         medians, is in the table; its rounds spread by more than the threshold when the host was busy, \
         which is why the pairs decide.)\n\n{forward_figure}\n\n{fwd}",
        threads = sdpa::cpu_kernel::threads(),
        isa = sdpa::cpu_kernel::softmax_isa(),
        pct = THRESHOLD * 100.0,
        limit = 1.0 + THRESHOLD,
        last = TRAIN_STEPS - 2,
        pm = paired.value,
        plo = paired.lo,
        phi = paired.hi,
        pn = paired.n,
        pct_cost = (paired.value - 1.0) * 100.0,
        pverdict = verdict(paired.value),
        train = training.table("training", "ms per step", 1e3, false),
        fwd = forward.table("forward", "ms", 1e3, false),
    );
    println!("{report}");
    if let Some(path) = out_path {
        std::fs::write(&path, report).expect("the report is written");
        eprintln!("wrote {}", path.display());
    }
}
