//! The experiments, one folder each: `mod.rs` holds the plan and the measurement of one cell,
//! `analyze.rs` the tables and claims (pure), `render.rs` the Markdown, CSV and plots.

pub mod dot_std;
pub mod saturation;
pub mod attention_saturation;
