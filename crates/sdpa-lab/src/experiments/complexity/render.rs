//! `complexity`'s section: tables, CSV and plots from the analysis.

use super::PathKind;
use super::analyze::*;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::{f, md_table};
use crate::plot::{LinePlot, Series};

fn write_csv(data: &ComplexityData, canvas: &mut Canvas) -> Result<(), LabError> {
    canvas.csv(
        "complexity.csv",
        "path,n,time_ms,allocated_mib,resident_mib,weights_mib",
        &data
            .rows
            .iter()
            .map(|r| {
                format!(
                    "\"{}\",{},{},{},{},{}",
                    r.path.label(),
                    r.n,
                    r.time_ms,
                    r.allocated_mib.map_or(String::new(), |m| m.to_string()),
                    r.resident_mib.map_or(String::new(), |m| m.to_string()),
                    r.weights_mib.map_or(String::new(), |m| m.to_string())
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

fn plot(data: &ComplexityData, canvas: &mut Canvas) -> Result<String, LabError> {
    let mut series: Vec<Series> = [PathKind::Materialized, PathKind::Fastest]
        .iter()
        .map(|p| {
            Series::line(
                p.label(),
                data.rows
                    .iter()
                    .filter(|r| r.path == *p)
                    .map(|r| (r.n as f64, r.time_ms))
                    .collect(),
            )
        })
        .collect();
    if let Some(first) = data.rows.first() {
        let c = first.time_ms / (first.n as f64).powi(2);
        series.push(Series::reference(
            "∝ n²",
            data.rows
                .iter()
                .filter(|r| r.path == PathKind::Materialized)
                .map(|r| (r.n as f64, c * (r.n as f64).powi(2)))
                .collect(),
        ));
    }
    canvas.line_plot(
        "complexity_time.png",
        &LinePlot {
            title: format!(
                "Attention forward time vs sequence length (b {}, h {}, d {}; median of {})",
                data.bhd[0], data.bhd[1], data.bhd[2], data.reps
            ),
            x_label: "n = m".into(),
            y_label: "time (ms)".into(),
            log_x: true,
            log_y: true,
            series,
        },
    )
}

/// The section.
pub fn render(data: &ComplexityData, canvas: &mut Canvas) -> Result<String, LabError> {
    let table = md_table(
        &[
            "path",
            "n = m",
            "time (ms): median [fastest, slowest]",
            "heap held at once (MiB)",
            "resident rise (MiB)",
            "its weights tensor (MiB)",
        ],
        &data
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.path.label().into(),
                    r.n.to_string(),
                    format!(
                        "{} [{}, {}]",
                        f(r.time_ms, 2),
                        f(r.times_ms.iter().copied().fold(f64::INFINITY, f64::min), 2),
                        f(
                            r.times_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                            2
                        )
                    ),
                    r.allocated_mib.map_or("n/a".into(), |m| f(m, 1)),
                    r.resident_mib.map_or("n/a".into(), |m| f(m, 1)),
                    r.weights_mib.map_or("– (none)".into(), |m| f(m, 1)),
                ]
            })
            .collect::<Vec<_>>(),
    );
    write_csv(data, canvas)?;
    let plot = plot(data, canvas)?;
    let local = data
        .local_exponents
        .iter()
        .map(|(a, b, e)| format!("{a}→{b}: {e:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    let l = &data.llama;
    let [b, h, d] = data.bhd;
    Ok(format!(
        "b = {b}, h = {h}, d = {d}, n = m; median of {} forward passes after a warm-up. Memory: the most heap \
         bytes one forward holds at once, counted by the `sdpa` binary's counting allocator (every allocation), \
         beside the rise of the process's resident high-water mark (blind to reused buffers). Growth exponents \
         are fitted over n ∈ {:?} with one point per size, the median of its repeats (repeats of one size are not \
         independent points; the interval comes from the sizes' scatter about the line). The window n ≥ 1024 was \
         fixed after an earlier run's fit over n ≥ 512 straddled the band, so that window's fit is a claim of its \
         own below; the local time \
         exponents of the materialized path between consecutive sizes show where cache effects bend it: {local}.\n\n{table}\n{plot}\n\n\
         **LLaMA-7B arithmetic** (batch {}, {} heads, {} tokens, {} bytes per element, {} layers): one layer's \
         attention matrices take {} bytes = {} GB ({} GiB); all {} layers {} GB ({} GiB).\n",
        data.reps,
        data.fit_ns,
        l.batch,
        l.heads,
        l.seq_len,
        l.bytes_per_element,
        l.layers,
        l.bytes_per_layer,
        f(l.bytes_per_layer as f64 / 1e9, 2),
        f(l.bytes_per_layer as f64 / (1u64 << 30) as f64, 2),
        l.layers,
        f(l.bytes_all_layers as f64 / 1e9, 1),
        f(l.bytes_all_layers as f64 / (1u64 << 30) as f64, 1),
    ))
}
