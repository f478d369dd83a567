//! What several experiments measure the same way, below them all (no experiment imports
//! another's internals): softmax-Jacobian and gradient-share measures of attention, and the
//! lab's training runs.

pub mod attention;
pub mod training;
