//! `sdpa bench`: time every attention path on every backend asked for (the lab's benchmark).

use std::path::PathBuf;

use clap::Args;

use burn_sdpa::{BackendFamily, Implementation};

use super::UsageError;
use super::report::{LabArgs, lab_error};

/// Arguments of `sdpa bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Backend(s): ndarray, flex, wgpu, vulkan, cuda or all; may be given more than once.
    #[arg(long = "backend", default_value = "flex")]
    pub backends: Vec<String>,
    /// Output folder: a new or empty folder, or one the benches wrote (holding their manifest
    /// `.sdpa-bench`, which lists the files they may replace there).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Write into --out even when it holds files the benches did not write, replacing those of
    /// the bench's file names.
    #[arg(long)]
    pub overwrite: bool,
    /// Tiny sizes (a smoke run, seconds).
    #[arg(long)]
    pub quick: bool,
    /// Plain progress lines instead of a bar.
    #[arg(long)]
    pub plain: bool,
    /// Time only these n = m (may be given more than once; default: the whole sweep), e.g. to
    /// re-measure the cells a rule change touched.
    #[arg(long = "n")]
    pub ns: Vec<usize>,
    /// Skip the memory sweeps (inference and training), unless sizes are given below.
    #[arg(long)]
    pub skip_memory: bool,
    /// Sizes of the inference memory sweep (b = 1; may be given more than once).
    #[arg(long = "memory-n")]
    pub memory_ns: Vec<usize>,
    /// Sizes of the training (forward + backward) memory sweep (b = 1; may be given more than
    /// once).
    #[arg(long = "training-memory-n")]
    pub training_memory_ns: Vec<usize>,
    /// Time only these modes: forward, forward+backward, "forward, padded",
    /// "forward+backward, padded", "forward, causal", "forward+backward, causal" (may be given
    /// more than once; default: all six).
    #[arg(long = "mode")]
    pub modes: Vec<String>,
    /// Storage type of query, key and value: f32, bf16 or f16 (a half type writes
    /// `bench_<backend>_<dtype>.json` and `BENCH_<backend>_<dtype>.md`).
    #[arg(long, value_parser = ["f32", "bf16", "f16"], default_value = "f32")]
    pub dtype: String,
    /// Time only this path (repeatable; default: every path).
    #[arg(long = "path", help = path_help())]
    pub paths: Vec<String>,
    /// Batch size b of the timed cells (default: 4; 1 with --quick). The memory sweeps keep
    /// b = 1.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Heads h (default: 8; 2 with --quick).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Head size d = d_k = d_v (default: 64; 16 with --quick).
    #[arg(long = "d-k")]
    pub d_k: Option<usize>,
    /// Least timed runs per path and cell, after one warm-up (default: 5; 2 with --quick).
    #[arg(long)]
    pub reps: Option<usize>,
    /// More runs are timed, up to 30 (or --reps if more), until each path has run this long
    /// in a cell (default: 3000 ms; 0 with --quick).
    #[arg(long)]
    pub min_total_ms: Option<f64>,
}

/// `sdpa bench`: times every path on every backend asked for.
pub fn bench(args: &BenchArgs) -> anyhow::Result<bool> {
    let lab = LabArgs {
        backends: args.backends.clone(),
        out: Some(args.out.clone()),
        quick: args.quick,
        tune: false,
        long: false,
        seed: 42,
        plain: args.plain,
        shard: None,
        render_only: None,
        merge: Vec::new(),
    };
    let (mut env, _) = lab.env()?;
    let ctx = sdpa_lab::bench::BenchContext {
        progress: lab.progress(),
        seed: 42,
    };
    let mut config = sdpa_lab::bench::BenchConfig::new(args.quick);
    config.dtype = args.dtype.clone();
    let known = path_names();
    if let Some(bad) = args.paths.iter().find(|p| !known.contains(&p.as_str())) {
        return Err(UsageError(format!("--path must be one of {known:?}, got `{bad}`")).into());
    }
    config.paths = args.paths.clone();
    for (flag, size, field) in [
        ("--batch", args.batch, &mut config.b),
        ("--heads", args.heads, &mut config.h),
        ("--d-k", args.d_k, &mut config.d),
    ] {
        match size {
            Some(0) => return Err(UsageError(format!("{flag} must be > 0, got 0")).into()),
            Some(size) => *field = size,
            None => {}
        }
    }
    if let Some(reps) = args.reps {
        if reps == 0 {
            return Err(UsageError("--reps must be > 0, got 0".into()).into());
        }
        config.reps = reps;
        config.max_reps = config.max_reps.max(reps);
    }
    if let Some(ms) = args.min_total_ms {
        if !(ms.is_finite() && ms >= 0.0) {
            return Err(UsageError(format!("--min-total-ms must be ≥ 0, got {ms}")).into());
        }
        config.min_total_ms = ms;
        // Honoured with --quick too: more runs, up to the full bench's 30 (or --reps if more).
        if ms > 0.0 {
            config.max_reps = config.max_reps.max(30).max(config.reps);
        }
    }
    for (flag, sizes) in [
        ("--n", &args.ns),
        ("--memory-n", &args.memory_ns),
        ("--training-memory-n", &args.training_memory_ns),
    ] {
        if let Some(bad) = sizes.iter().find(|&&n| n == 0) {
            return Err(UsageError(format!("{flag} must be > 0, got {bad}")).into());
        }
    }
    if !args.ns.is_empty() {
        config.ns = args.ns.clone();
    }
    if args.skip_memory {
        config.memory_ns.clear();
        config.training_memory_ns.clear();
    }
    if !args.memory_ns.is_empty() {
        config.memory_ns = args.memory_ns.clone();
    }
    if !args.training_memory_ns.is_empty() {
        config.training_memory_ns = args.training_memory_ns.clone();
    }
    for mode in &args.modes {
        let known = sdpa_lab::bench::Mode::ALL.map(|m| m.name());
        if !known.contains(&mode.as_str()) {
            return Err(
                UsageError(format!("--mode must be one of {known:?}, got `{mode}`")).into(),
            );
        }
    }
    if !args.modes.is_empty() {
        config.modes = args.modes.clone();
    }
    // Before anything is allocated or written: sizes that cannot fit are bad usage.
    let sizes = format!(
        "the benchmark (b {}, h {}, d {}, n up to {})",
        config.b,
        config.h,
        config.d,
        config
            .ns
            .iter()
            .chain(&config.memory_ns)
            .chain(&config.training_memory_ns)
            .max()
            .copied()
            .unwrap_or(0)
    );
    let needed = config.memory_estimate().ok_or_else(|| {
        UsageError(format!(
            "{sizes}: the sizes overflow: far beyond any machine's memory"
        ))
    })?;
    // A backend computing in the host's memory must hold the largest cell there. A GPU
    // backend's tensors live in the GPU's memory: the host holds the drawn inputs only, and a
    // cell the GPU cannot hold (the naive path's n×n scores) is skipped with the device's error
    // when it runs, not refused up front (`sdpa_lab::bench` records it).
    let on_host = env.backends.iter().any(|b| {
        !b.name
            .parse::<crate::BackendKind>()
            .is_ok_and(|k| k.needs_gpu())
    });
    let needed = if on_host {
        needed
    } else {
        config.input_bytes().ok_or_else(|| {
            UsageError(format!(
                "{sizes}: the sizes overflow: far beyond any machine's memory"
            ))
        })?
    };
    sdpa_model::check_fits(&sizes, needed).map_err(|e| UsageError(e.to_string()))?;
    keep_backends_with_dtype(args, &mut env.backends)?;
    refuse_measuring_nothing(args, &config, &mut env.backends)?;
    // Before anything runs: the folder must be the benches' own (or empty), and every file
    // this run writes one they may replace.
    let names: Vec<String> = env
        .backends
        .iter()
        .flat_map(|b| sdpa_lab::bench::file_names(&b.name, &config))
        .collect();
    let mut folder = sdpa_lab::bench::BenchFolder::claim(&args.out, &names, args.overwrite)
        .map_err(lab_error)?;
    let mut ok = true;
    for backend in &env.backends {
        // The host's peak memory says nothing of a GPU backend's run (its tensors are on the
        // GPU): not measured there.
        let on_gpu = backend
            .name
            .parse::<crate::BackendKind>()
            .is_ok_and(|k| k.needs_gpu());
        let config = sdpa_lab::bench::BenchConfig {
            peak_memory: config.peak_memory && !on_gpu,
            ..config.clone()
        };
        let mut report = sdpa_lab::bench::run_bench(backend, &config, &ctx)?;
        report.kernel_compiler = backend
            .name
            .parse::<crate::BackendKind>()
            .ok()
            .and_then(|k| k.kernel_compiler())
            .map(String::from);
        println!("{}", sdpa_lab::bench::markdown(&report));
        for f in sdpa_lab::bench::write(&report, &mut folder).map_err(lab_error)? {
            println!("wrote {f}");
        }
        for note in &report.skipped {
            println!("note: {}: skipped {note}", report.backend);
        }
        // The target (Auto at most 10% slower than the fastest other path) is checked on the
        // paired estimate, on the CPU backends it was set on, and never on a smoke run (`--quick`
        // times sub-millisecond cells twice: it checks that everything runs, not speed). On
        // wgpu without a GPU, lavapipe is a CPU driver: Auto is not held to it.
        let checked = !args.quick && matches!(report.backend.as_str(), "flex" | "ndarray");
        for ((mode, n, medians), (_, _, paired)) in
            report.auto_ratio.iter().zip(&report.auto_ratio_paired)
        {
            if *paired > 1.10 || *medians > 1.10 {
                println!(
                    "note: {}: auto / fastest other path = {medians:.2} (medians), {paired:.2} \
                     (paired runs) ({mode}, n = {n})",
                    report.backend
                );
            }
            if checked && *paired > 1.10 {
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// Refuses (exit 2, before anything is written) a bench that would measure nothing on a backend
/// named on the command line: a `--path` that does not run there (the CubeCL kernels run on
/// wgpu, vulkan and cuda only), or paths and modes that leave no cell (the baseline takes no
/// mask). A backend that `all` brought in is skipped with a note instead, as for `--dtype`; and
/// when none is left, nothing would be measured: refused too.
fn refuse_measuring_nothing(
    args: &BenchArgs,
    config: &sdpa_lab::bench::BenchConfig,
    backends: &mut Vec<sdpa_lab::LabBackend>,
) -> anyhow::Result<()> {
    let why_not = |backend: &sdpa_lab::LabBackend| {
        let cube = BackendFamily::of(&backend.device) == BackendFamily::CubeCl;
        let served = sdpa_lab::bench::paths(config.block_size, cube);
        if let Some(path) = config
            .paths
            .iter()
            .find(|p| !served.iter().any(|(name, _)| name == p))
        {
            return Some(format!(
                "--path {path} does not run on the {} backend: the CubeCL kernels \
                 (cube_kernel, cube_tensor_cores) run on wgpu, vulkan and cuda only (build with \
                 --features wgpu and pass --backend wgpu); the {} backend runs {}",
                backend.name,
                backend.name,
                served
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        (config.cells_per_size(cube) == 0).then(|| {
            format!(
                "the paths {:?} time none of the modes {:?} on the {} backend (the baseline \
                 takes no mask): nothing would be measured",
                config.paths, config.modes, backend.name
            )
        })
    };
    keep_backends(
        args,
        backends,
        |backend| {
            why_not(backend).map(|reason| Refusal {
                error: reason.clone(),
                note: reason,
            })
        },
        "no backend asked for can time the paths and modes asked for: nothing would be \
         measured"
            .into(),
    )
}

/// Keeps the backends whose devices have tensors of `--dtype` (bf16 and f16 are not on every
/// backend: NdArray has neither). A backend named on the command line without it is bad usage
/// (exit 2, before anything runs); one `all` brought in is skipped with a note.
fn keep_backends_with_dtype(
    args: &BenchArgs,
    backends: &mut Vec<sdpa_lab::LabBackend>,
) -> anyhow::Result<()> {
    let dtype = match args.dtype.as_str() {
        "bf16" => burn::tensor::FloatDType::BF16,
        "f16" => burn::tensor::FloatDType::F16,
        _ => return Ok(()),
    };
    keep_backends(
        args,
        backends,
        |backend| {
            (!backend.device.supports_dtype(dtype)).then(|| Refusal {
                error: format!(
                    "the {} backend has no {} tensors (--dtype {}): bench it in f32, or bench {} \
                     on another backend (flex)",
                    backend.name, args.dtype, args.dtype, args.dtype
                ),
                note: format!("it has no {} tensors (--dtype {})", args.dtype, args.dtype),
            })
        },
        format!(
            "no backend asked for has {} tensors (--dtype {})",
            args.dtype, args.dtype
        ),
    )
}

/// Why a backend cannot serve a bench: the error when it was named on the command line, the
/// note when `all` brought it in.
struct Refusal {
    error: String,
    note: String,
}

/// Keeps the backends `refusal` finds nothing against. One named on the command line that it
/// refuses is bad usage (exit 2, before anything runs); one `all` brought in is skipped with a
/// note; none left is bad usage too (`none_left`).
fn keep_backends(
    args: &BenchArgs,
    backends: &mut Vec<sdpa_lab::LabBackend>,
    refusal: impl Fn(&sdpa_lab::LabBackend) -> Option<Refusal>,
    none_left: String,
) -> anyhow::Result<()> {
    let named = |name: &str| args.backends.iter().any(|b| b.eq_ignore_ascii_case(name));
    let mut kept = Vec::new();
    for backend in backends.drain(..) {
        match refusal(&backend) {
            None => kept.push(backend),
            Some(r) if named(&backend.name) => return Err(UsageError(r.error).into()),
            Some(r) => eprintln!("note: skipping {}: {}", backend.name, r.note),
        }
    }
    if kept.is_empty() {
        return Err(UsageError(none_left).into());
    }
    *backends = kept;
    Ok(())
}

/// What `--path` takes: every name [`Implementation::all`] gives, then the baseline.
fn path_names() -> Vec<&'static str> {
    Implementation::all(Implementation::DEFAULT_BLOCK_SIZE)
        .map(Implementation::name)
        .chain([sdpa_lab::bench::BASELINE])
        .collect()
}

/// The help of `--path`, from [`path_names`].
fn path_help() -> String {
    format!(
        "Time only this path (repeatable; default: every path): {}",
        path_names().join(", ")
    )
}
