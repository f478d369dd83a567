//! `sdpa golden DIR`: replay golden case files through the module.

use std::path::PathBuf;

use clap::Args;

use burn::tensor::FloatDType;

use crate::golden;

/// `f32`, `f16` or `bf16`.
fn parse_dtype(text: &str) -> Result<FloatDType, String> {
    match text {
        "f32" => Ok(FloatDType::F32),
        "f16" => Ok(FloatDType::F16),
        "bf16" => Ok(FloatDType::BF16),
        other => Err(format!("{other}: the dtypes are f32, f16 and bf16")),
    }
}
use crate::{BackendKind, Implementation};

/// Arguments of `sdpa golden`.
#[derive(Args, Debug, Clone)]
pub struct GoldenArgs {
    /// Folder of case files (every *.json in it is a case).
    pub dir: PathBuf,
    /// Backend: ndarray, flex, wgpu, vulkan or cuda (must be compiled in).
    #[arg(long, default_value = "flex")]
    pub backend: BackendKind,
    /// The implementation the cases run on.
    #[arg(long, default_value = "auto", help = super::implementation_help("The implementation"))]
    pub implementation: Implementation,
    /// The dtype of the cases' float inputs: f32 checks the cases' own answers; f16 and bf16
    /// round the inputs to that type, run the implementation in it and compare with f32 Naive on
    /// the same rounded inputs (the context within 4 unit roundoffs of its largest value, each
    /// gradient within 8; the
    /// row statistics and weights are not compared). A backend without the dtype is refused
    /// (exit 2).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: FloatDType,
    /// Fail a case whose tolerance cannot fail on one of its expected tensors (an output of zeros
    /// would pass it); without it, such a case is checked on the rest and its line says which
    /// checks cannot fail.
    #[arg(long)]
    pub strict: bool,
}

/// Runs every case, prints a line per case (its file relative to the folder, its name, its
/// checks) and `N passed, M failed` (and how many cases the implementation does not serve, e.g.
/// masks for the CPU kernel, and how many passed with a check that cannot fail); true when every
/// case it serves passed (under `--strict`, with every check able to fail).
pub fn run(args: &GoldenArgs) -> anyhow::Result<bool> {
    let device = super::open_device(args.backend)?;
    if !device.supports_dtype(args.dtype) {
        return Err(super::UsageError(format!(
            "the {} backend has no {:?} tensors: replay the cases in f32, or in this dtype on \
             another backend",
            args.backend, args.dtype
        ))
        .into());
    }
    // A folder that cannot be read or holds no case is bad usage (exit 2), a case that fails is
    // a failed check (exit 1).
    let files = golden::case_files(&args.dir).map_err(|e| super::UsageError(e.to_string()))?;
    if files.is_empty() {
        return Err(
            super::UsageError(format!("{}: no *.json case files", args.dir.display())).into(),
        );
    }
    // A GPU result names the compiler that produced its kernels (CUDA: LLVM or NVRTC).
    let compiler = args
        .backend
        .kernel_compiler()
        .map(|c| format!(", kernels compiled to {c}"))
        .unwrap_or_default();
    println!(
        "golden cases in {} on {}{compiler} ({:?}, {:?})",
        args.dir.display(),
        args.backend,
        args.implementation,
        args.dtype
    );
    let (mut passed, mut failed, mut not_served, mut loose) = (0, 0, 0, 0);
    for file in &files {
        // Every line names its file relative to the folder given (several cases may share a
        // `name`): ok, FAIL and SKIP alike.
        let relative = file.strip_prefix(&args.dir).unwrap_or(file);
        match golden::run_file_in(file, &device, args.implementation, args.dtype).map_err(|e| {
            golden::GoldenError {
                path: golden::escaped(relative),
                ..e
            }
        }) {
            Ok(mut report) => {
                report.file = relative.display().to_string();
                println!("{}", report.line(args.strict));
                let ok = if args.strict {
                    report.passed_strict()
                } else {
                    report.passed()
                };
                if ok {
                    passed += 1;
                    loose += usize::from(report.note.is_some());
                } else {
                    failed += 1;
                }
            }
            // A case's own text (its reason) is data: control characters are escaped, so that
            // it can never print a line of its own.
            Err(e) if e.unsupported => {
                println!("SKIP {}", golden::one_line(&e.to_string()));
                not_served += 1;
            }
            Err(e) => {
                println!("FAIL {}", golden::one_line(&e.to_string()));
                failed += 1;
            }
        }
    }
    let mut summary = format!("{passed} passed, {failed} failed");
    if not_served > 0 {
        summary.push_str(&format!(
            ", {not_served} not served by {:?} (it rejects them with the reason above)",
            args.implementation
        ));
    }
    if loose > 0 {
        summary.push_str(&format!(
            "; {loose} of the passed with a check that cannot fail (see their lines; --strict \
             fails them)"
        ));
    }
    println!("{summary}");
    // An implementation that serves none of the cases has checked nothing: bad usage (exit 2),
    // as `train` and `bench` answer a path their backend cannot serve.
    if passed == 0 && failed == 0 && not_served > 0 {
        return Err(super::UsageError(format!(
            "{:?} on {} serves none of the {not_served} cases (the SKIP lines say why): \
             nothing was checked; choose an implementation or a backend that serves them",
            args.implementation, args.backend
        ))
        .into());
    }
    // A folder of cases that all failed to load has not been tested either.
    Ok(failed == 0 && passed > 0)
}
