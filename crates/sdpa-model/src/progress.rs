//! Progress display: a live bar on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ProgressMode {
    /// A bar when stdout is a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// Always a bar.
    Bar,
    /// Plain lines.
    Lines,
    /// Nothing.
    Quiet,
}

/// A progress display over `total` units.
pub struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    label: String,
    total: u64,
    last_line: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Progress {
    /// Starts a display at `position` of `total`.
    pub fn new(mode: ProgressMode, label: &str, position: u64, total: u64) -> Self {
        let mode = match mode {
            ProgressMode::Auto if std::io::stdout().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Lines,
            m => m,
        };
        let bar = (mode == ProgressMode::Bar).then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar:.cyan/blue} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix(label.to_string());
            bar.set_position(position);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            bar,
            lines: mode == ProgressMode::Lines,
            label: label.to_string(),
            total,
            last_line: std::sync::Mutex::new(None),
        }
    }

    /// Moves to `position` and shows `message` on the bar (cheap; call often).
    pub fn update(&self, position: u64, message: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(position);
            bar.set_message(message.to_string());
        } else if self.lines {
            // Plain lines: one every few seconds at most, so that long work shows it is alive.
            let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_none_or(|t: std::time::Instant| t.elapsed() >= Duration::from_secs(5)) {
                *last = Some(std::time::Instant::now());
                println!("{} {position}/{} {message}", self.label, self.total);
            }
        }
    }

    /// A line worth keeping (e.g. an evaluation): printed above the bar, or as a plain line.
    /// Control characters (a newline or an escape in a folder's name) are printed escaped: one
    /// line stays one line, and nothing reaches the terminal as a command.
    pub fn println(&self, line: &str) {
        let line = printable(line);
        match &self.bar {
            Some(bar) => bar.println(format!("{} {line}", self.label)),
            None if self.lines => println!("{} {line}", self.label),
            None => {}
        }
    }

    /// Ends the display.
    pub fn finish(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.finish_with_message(message.to_string()),
            None if self.lines => println!("{} {message}", self.label),
            None => {}
        }
    }
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), the rest as it is.
pub fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}
