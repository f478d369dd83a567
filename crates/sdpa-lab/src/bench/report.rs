//! The bench's Markdown tables, its JSON file and its plots.

use super::BenchConfig;
use super::folder::BenchFolder;
use super::sweeps::MemoryRow;
use super::{BenchReport, Mode, paths};
use crate::context::LabError;
use crate::markdown::{f, md_table};
use crate::plot::{LinePlot, Series, line_plot};

/// Whether the report holds `cube_kernel` cells (a CubeCL backend): its column is shown then.
fn measured_cube(r: &BenchReport) -> bool {
    r.rows.iter().any(|x| x.path == "cube_kernel")
}

fn cell<'a>(r: &'a BenchReport, mode: &str, n: usize, p: &str) -> Option<&'a super::BenchRow> {
    r.rows
        .iter()
        .find(|x| x.mode == mode && x.n == n && x.path == p)
}

/// One mode's table: median ms (GFLOP/s) per path and n, and Auto's ratios.
fn mode_table(r: &BenchReport, mode: &str) -> String {
    let mut headers = vec!["n".to_string()];
    headers.extend(
        paths(r.config.block_size, measured_cube(r))
            .iter()
            .map(|p| p.0.to_string()),
    );
    headers.push("auto / best other (medians)".into());
    headers.push("auto / best other (paired)".into());
    let hs: Vec<&str> = headers.iter().map(|x| x.as_str()).collect();
    let rows: Vec<Vec<String>> = r
        .config
        .ns
        .iter()
        .map(|&n| {
            let mut row = vec![n.to_string()];
            for (p, _) in paths(r.config.block_size, measured_cube(r)) {
                row.push(cell(r, mode, n, p).map_or("–".into(), |x| {
                    let takes = match (&x.takes, p) {
                        (Some(t), "auto") => format!(" → {t}"),
                        _ => String::new(),
                    };
                    format!("{} ({}){takes}", f(x.median_ms, 1), f(x.gflops, 1))
                }));
            }
            for ratios in [&r.auto_ratio, &r.auto_ratio_paired] {
                row.push(
                    ratios
                        .iter()
                        .find(|(m, nn, _)| m == mode && *nn == n)
                        .map_or("–".into(), |x| f(x.2, 2)),
                );
            }
            row
        })
        .collect();
    md_table(&hs, &rows)
}

/// Peak memory added by one run, every mode, path and n.
fn peak_table(r: &BenchReport, modes: &[&str]) -> String {
    let mut headers = vec!["mode".to_string(), "n".to_string()];
    headers.extend(
        paths(r.config.block_size, measured_cube(r))
            .iter()
            .map(|p| p.0.to_string()),
    );
    let hs: Vec<&str> = headers.iter().map(|x| x.as_str()).collect();
    let mut rows = Vec::new();
    for &mode in modes {
        for &n in &r.config.ns {
            let mut row = vec![mode.to_string(), n.to_string()];
            for (p, _) in paths(r.config.block_size, measured_cube(r)) {
                row.push(
                    cell(r, mode, n, p)
                        .and_then(|x| x.peak_mib)
                        .map_or("n/a".into(), |m| f(m, 0)),
                );
            }
            rows.push(row);
        }
    }
    md_table(&hs, &rows)
}

/// The Markdown tables of a report.
pub fn markdown(r: &BenchReport) -> String {
    let mut s = format!(
        "## Benchmark on {} (b = {}, h = {}, d = {}; median of {} to {} runs after a warm-up, \
         the paths taking turns in an order that rotates each round, more runs until each path has run {} ms; \
         the padded modes hide the last {:.1}% of every batch element's keys and count the dense work, the \
         causal modes count half of it)\n\n",
        r.backend,
        r.config.b,
        r.config.h,
        r.config.d,
        r.config.reps,
        r.config.max_reps,
        r.config.min_total_ms,
        100.0 * r.config.padded_fraction
    );
    match r.config.dtype.as_str() {
        "bf16" => s.push_str(&format!(
            "Query, key and value stored in bf16 (the CPU kernel's tile products run with {}).\n\n",
            burn_sdpa::cpu_kernel::bf16_product_isa()
        )),
        "f16" => s.push_str(
            "Query, key and value stored in f16 (the CPU kernel computes in f32 on widened copies).\n\n",
        ),
        _ => {}
    }
    if let Some(compiler) = &r.kernel_compiler {
        s.push_str(&format!(
            "The {} backend's kernels were compiled to {compiler}.\n\n",
            r.backend
        ));
    }
    s.push_str(&format!(
        "CPU features detected at run time: {} (the CPU kernel's softmax loops run with {}).\n\n",
        if r.cpu_features.is_empty() {
            "none of the SIMD ones".to_string()
        } else {
            r.cpu_features.join(", ")
        },
        burn_sdpa::cpu_kernel::softmax_isa()
    ));
    if r.backend == "wgpu" {
        s.push_str(
            "On a machine without a GPU the wgpu backend runs on Mesa's lavapipe, a Vulkan driver on the \
             CPU: its timings compare paths on that driver, not on a GPU, and Auto's rule is not held to \
             them.\n\n",
        );
    }
    let modes: Vec<&str> = Mode::ALL
        .map(Mode::name)
        .into_iter()
        .filter(|m| r.config.modes.iter().any(|x| x == m))
        .collect();
    for &mode in &modes {
        s.push_str(&format!("### {mode}: median ms (GFLOP/s)\n\n"));
        s.push_str(&mode_table(r, mode));
        s.push('\n');
    }
    if !r.skipped.is_empty() {
        s.push_str("Paths skipped (they cannot serve the cell):\n\n");
        for k in &r.skipped {
            s.push_str(&format!("- {k}\n"));
        }
        s.push('\n');
    }
    s.push_str("### Peak memory added by one run (MiB)\n\n");
    s.push_str(&peak_table(r, &modes));
    for (title, sweep) in [
        ("Inference memory sweep (b = 1)", &r.memory),
        (
            "Training memory sweep: forward + backward (b = 1)",
            &r.training_memory,
        ),
    ] {
        s.push_str(&format!("\n### {title}\n\n"));
        s.push_str(&sweep_table(sweep));
    }
    s
}

fn sweep_table(rows: &[MemoryRow]) -> String {
    md_table(
        &[
            "path",
            "n",
            "takes",
            "time (s)",
            "peak memory added (MiB)",
            "note",
        ],
        &rows
            .iter()
            .map(|m| {
                vec![
                    m.path.clone(),
                    m.n.to_string(),
                    m.takes.clone().unwrap_or_else(|| "–".into()),
                    m.seconds.map_or("–".into(), |x| f(x, 2)),
                    m.peak_mib.map_or("–".into(), |x| f(x, 0)),
                    m.skipped.clone().unwrap_or_default(),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

/// The stem of a bench's files: the backend, and the dtype when it is not f32 (`flex_bf16`).
fn stem(backend: &str, config: &BenchConfig) -> String {
    if config.dtype == "f32" {
        backend.to_string()
    } else {
        format!("{backend}_{}", config.dtype)
    }
}

/// The name of the GFLOP/s plot of `mode`.
fn plot_name(stem: &str, mode: &str) -> String {
    let slug: String = mode
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("bench_{stem}_{}.png", slug.replace("__", "_"))
}

/// Every file a bench of `config` on `backend` may write (what [`write()`] writes when every mode
/// asked for is timed): checked against its folder before anything runs.
pub fn file_names(backend: &str, config: &BenchConfig) -> Vec<String> {
    let stem = stem(backend, config);
    let mut names = vec![format!("bench_{stem}.json"), format!("BENCH_{stem}.md")];
    names.extend(
        Mode::ALL
            .map(Mode::name)
            .into_iter()
            .filter(|m| config.modes.iter().any(|x| x == m))
            .map(|m| plot_name(&stem, m)),
    );
    names
}

/// Writes `bench_<backend>.json`, `BENCH_<backend>.md` and one GFLOP/s plot per mode into
/// `folder` (`<backend>_bf16` / `<backend>_f16` for a half-precision run), each listed in its
/// manifest before it is written.
pub fn write(r: &BenchReport, folder: &mut BenchFolder) -> Result<Vec<String>, LabError> {
    // `bench_flex_bf16.json` … for a bf16 run.
    let stem = stem(&r.backend, &r.config);
    let text = serde_json::to_string_pretty(r).map_err(|e| LabError::Serialize {
        what: "the bench report".into(),
        message: e.to_string(),
    })?;
    // Atomically and without following a link, as every file of the lab.
    let json = folder.write(&format!("bench_{stem}.json"), text.as_bytes())?;
    let md = folder.write(&format!("BENCH_{stem}.md"), markdown(r).as_bytes())?;
    let mut files = vec![json.display().to_string(), md.display().to_string()];
    let timed = Mode::ALL
        .map(Mode::name)
        .into_iter()
        .filter(|m| r.rows.iter().any(|x| &x.mode == m));
    for mode in timed {
        let path = folder.record(&plot_name(&stem, mode))?;
        line_plot(
            &path,
            &LinePlot {
                title: format!(
                    "Attention {mode} on {} (b={}, h={}, d={})",
                    r.backend, r.config.b, r.config.h, r.config.d
                ),
                x_label: "n = m".into(),
                y_label: "GFLOP/s".into(),
                log_x: true,
                log_y: false,
                series: paths(r.config.block_size, measured_cube(r))
                    .iter()
                    .map(|(p, _)| {
                        Series::line(
                            *p,
                            r.rows
                                .iter()
                                .filter(|x| x.mode == mode && x.path == *p)
                                .map(|x| (x.n as f64, x.gflops))
                                .collect(),
                        )
                    })
                    .filter(|series| !series.points.is_empty())
                    .collect(),
            },
        )?;
        files.push(path.display().to_string());
    }
    Ok(files)
}
