//! The rows of `metrics.csv` a resume keeps ([`read_metrics`]): read line by line, each line's
//! length bounded, and no further than the rows the checkpoint covers.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;

use super::config::TrainConfig;
use super::files::checksum_bytes;
use super::saved::shorten;
use crate::error::ModelError;
use crate::metrics::{StepMetrics, csv_header, csv_header_before_max_logit};

/// What a resume needs of `metrics.csv` (see [`read_metrics`]).
pub(crate) struct RowsWanted {
    /// The first step whose row the checkpoint does not cover (its `rows_through`).
    pub rows_through: usize,
    /// The budget of the run that wrote the checkpoint: the row of its last step is recorded
    /// even when it is not a `log_every`-th.
    pub saved_steps: usize,
}

/// The rows a checkpoint covers, as [`read_metrics`] read them.
pub(crate) struct CoveredRows {
    /// The rows the resumed run keeps (see [`read_metrics`]).
    pub rows: Vec<StepMetrics>,
    /// [`rows_checksum`] of every row the checkpoint covers, before any is dropped: what the
    /// checkpoint's own `rows_checksum` must be for these rows to be its run's.
    pub checksum: String,
    /// The first covered step whose held-out accuracy reached the target, before any row is
    /// dropped (the dropped row of an earlier budget's end may be that evaluation).
    pub reached: Option<usize>,
}

/// The checksum that binds a checkpoint to its run's rows: that of `metrics.csv` as this
/// version writes it (the header, then each row, each line ended by a newline) for `rows`, the
/// `max_logit` columns left out (a version before them did not write them: such rows read back
/// as NaN there, and a run of that version resumes). Written rows read back as the same numbers
/// (Rust prints the shortest text that parses back to the same `f64`, and `elapsed_s` is written
/// to the millisecond), so a resume computes it from the rows it read and a checkpoint from the
/// rows it holds.
pub(crate) fn rows_checksum<'a>(
    n_layers: usize,
    rows: impl IntoIterator<Item = &'a StepMetrics>,
) -> String {
    let header = csv_header(n_layers);
    let keep: Vec<bool> = header
        .split(',')
        .map(|name| !name.starts_with("max_logit_l"))
        .collect();
    let mut text = String::new();
    let mut push = |line: &str| {
        let kept: Vec<&str> = line
            .split(',')
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(field, _)| field)
            .collect();
        text.push_str(&kept.join(","));
        text.push('\n');
    };
    push(&header);
    for row in rows {
        push(&row.csv_row());
    }
    checksum_bytes(text.as_bytes())
}

/// One line of the file.
enum Line {
    /// A whole line (its newline removed).
    Bytes(Vec<u8>),
    /// A line longer than any row: its first bytes (the rest is never read).
    TooLong(Vec<u8>),
}

/// The next line of `reader`, at most `max` bytes of it read; `None` at the end of the file,
/// and for a last line without its newline (an append a kill interrupted).
fn next_line(
    reader: &mut BufReader<File>,
    max: usize,
    path: &Path,
) -> Result<Option<Line>, ModelError> {
    let mut buf = Vec::new();
    reader
        .by_ref()
        .take(max as u64 + 1)
        .read_until(b'\n', &mut buf)
        .map_err(|e| ModelError::io(path, e))?;
    if buf.last() == Some(&b'\n') {
        buf.pop();
        Ok(Some(Line::Bytes(buf)))
    } else if buf.len() > max {
        buf.truncate(80);
        Ok(Some(Line::TooLong(buf)))
    } else {
        Ok(None)
    }
}

/// The first number of a row that a run which did not diverge writes finite and that is not
/// (its column's name; the attention's `logit_std` and `max_logit` are NaN where they were not
/// measured, and are not checked).
fn not_finite(row: &StepMetrics) -> Option<&'static str> {
    let mut values = vec![
        ("loss", row.loss),
        ("accuracy", row.accuracy),
        ("grad_norm", row.grad_norm),
        ("grad_norm_query", row.grad_norm_query),
        ("grad_norm_key", row.grad_norm_key),
        ("grad_norm_value", row.grad_norm_value),
        ("elapsed_s", row.elapsed_s),
    ];
    values.extend(row.eval_loss.map(|v| ("eval_loss", v)));
    values.extend(row.eval_accuracy.map(|v| ("eval_accuracy", v)));
    for l in &row.layers {
        values.extend([
            ("entropy", l.entropy),
            ("normalized_entropy", l.normalized_entropy),
            ("max_prob", l.max_prob),
            ("saturated_fraction", l.saturated_fraction),
            ("query_std", l.query_std),
            ("key_std", l.key_std),
        ]);
    }
    values
        .into_iter()
        .find(|(_, v)| !v.is_finite())
        .map(|(name, _)| name)
}

/// The rows of `metrics.csv` that the checkpoint covers (before `wanted.rows_through`), checked:
/// the header is the run's, every row parses as UTF-8 and as a row, its numbers are finite (a
/// non-finite loss or gradient would have stopped the run), it holds a held-out evaluation
/// exactly on the evaluation steps, steps increase, and no step the run records (every
/// `log_every`-th, and the last of the checkpoint's budget) is missing. The file is read no
/// further than those rows: whatever follows them (rows the resumed run recomputes, or a line a
/// crash garbled) is left out, and so is a last line without its newline. A quoted line is cut
/// to its first 80 characters.
pub(crate) fn read_metrics(
    path: &Path,
    config: &TrainConfig,
    wanted: &RowsWanted,
) -> Result<CoveredRows, ModelError> {
    let (n_layers, log_every) = (config.model.n_layers, config.log_every);
    let checkpoint_step = wanted.rows_through;
    // The row of the saved budget's last step, when it is one the checkpoint covers and not a
    // `log_every`-th (then it is there only because it was the last).
    let last_row = (checkpoint_step > 0
        && wanted.saved_steps == checkpoint_step
        && !(checkpoint_step - 1).is_multiple_of(log_every))
    .then(|| checkpoint_step - 1);
    let damaged = |line: usize, reason: String| ModelError::DamagedMetrics {
        path: path.to_path_buf(),
        line,
        reason,
        checkpoint_step,
    };
    let file =
        File::open(path).map_err(|e| ModelError::checkpoint(path, format!("cannot read: {e}")))?;
    let mut reader = BufReader::new(file);
    // Every number of a row is far shorter than 40 characters.
    let max_line = 40 * (10 + 8 * n_layers);
    let known = [csv_header(n_layers), csv_header_before_max_logit(n_layers)];
    let header = match next_line(&mut reader, max_line, path)? {
        Some(Line::Bytes(bytes)) => String::from_utf8(bytes).ok(),
        _ => None,
    };
    let header = header.as_deref().map(|h| h.trim_end_matches('\r'));
    if !known.iter().any(|k| header == Some(k.as_str())) {
        return Err(damaged(
            1,
            "the header is not that of this run's metrics".into(),
        ));
    }
    let mut rows: Vec<StepMetrics> = Vec::new();
    // The next step the run must have recorded.
    let mut due = 0;
    let complete = |rows: &[StepMetrics], due: usize| {
        due >= checkpoint_step && last_row.is_none_or(|s| rows.last().is_some_and(|r| r.step == s))
    };
    let mut line_no = 1;
    while !complete(&rows, due) {
        let Some(line) = next_line(&mut reader, max_line, path)? else {
            break;
        };
        line_no += 1;
        let line = match line {
            Line::Bytes(bytes) => String::from_utf8(bytes)
                .map_err(|_| damaged(line_no, "the line is not UTF-8 text".into()))?,
            Line::TooLong(start) => {
                return Err(damaged(
                    line_no,
                    format!(
                        "a line of more than {max_line} bytes (`{}`…) is not a metrics row",
                        shorten(&String::from_utf8_lossy(&start))
                    ),
                ));
            }
        };
        let step = line
            .split(',')
            .next()
            .and_then(|s| s.trim().parse::<usize>().ok());
        if step.is_some_and(|s| s >= checkpoint_step) {
            break;
        }
        let row = StepMetrics::from_csv_row(&line, n_layers).ok_or_else(|| {
            damaged(
                line_no,
                format!("`{}` is not a metrics row", shorten(&line)),
            )
        })?;
        check_row(&row, rows.last(), due, config).map_err(|reason| damaged(line_no, reason))?;
        due = (row.step / log_every + 1) * log_every;
        rows.push(row);
    }
    if due < checkpoint_step {
        return Err(damaged(
            line_no + 1,
            format!("the rows stop before step {due}"),
        ));
    }
    if let Some(last) = last_row
        && rows.last().is_none_or(|r| r.step != last)
    {
        return Err(damaged(
            line_no + 1,
            format!("the row of step {last} (the last of the checkpoint's budget) is missing"),
        ));
    }
    let checksum = rows_checksum(n_layers, &rows);
    let reached = rows
        .iter()
        .find(|r| r.eval_accuracy.is_some_and(|a| a >= config.target_accuracy))
        .map(|r| r.step);
    // The row of an earlier budget's last step (recorded because it was the last, not a
    // `log_every`-th) is not one this run records when it goes on past it: dropped, so that a run
    // extended on resume writes the rows an uninterrupted run of the new budget writes.
    rows.retain(|r| r.step.is_multiple_of(log_every) || r.step + 1 == config.steps);
    Ok(CoveredRows {
        rows,
        checksum,
        reached,
    })
}

/// Why `row` cannot follow `last` (`due`: the next step the run must have recorded), if it
/// cannot.
fn check_row(
    row: &StepMetrics,
    last: Option<&StepMetrics>,
    due: usize,
    config: &TrainConfig,
) -> Result<(), String> {
    if let Some(column) = not_finite(row) {
        return Err(format!(
            "step {}: its {column} is not finite (a run that did not diverge writes it finite)",
            row.step
        ));
    }
    let evaluated = row.eval_loss.is_some() && row.eval_accuracy.is_some();
    if evaluated != row.step.is_multiple_of(config.eval_every) {
        let what = if evaluated {
            "recorded, but none is due"
        } else {
            "due, but missing"
        };
        return Err(format!(
            "step {}: a held-out evaluation is {what} there",
            row.step
        ));
    }
    if let Some(last) = last
        && row.step <= last.step
    {
        return Err(format!(
            "step {} comes after step {} (repeated or out of order)",
            row.step, last.step
        ));
    }
    if row.step > due {
        return Err(format!("step {due} is missing before step {}", row.step));
    }
    Ok(())
}
