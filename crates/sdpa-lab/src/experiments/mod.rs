//! The experiments, one folder each: `mod.rs` holds the plan and the measurement of one cell,
//! `analyze.rs` the tables and claims (pure), `render.rs` the Markdown, CSV and plots.

pub mod attention_map;
pub mod attention_saturation;
pub mod compare;
pub mod complexity;
pub mod dot_std;
pub mod gradients;
pub mod logit_control;
pub mod masks;
pub mod saturation;
pub mod training;
pub mod training_confirm;
pub mod training_confirm2;
pub mod training_variants;
pub mod why_softmax;
