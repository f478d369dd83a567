//! `training-confirm-2`: the second confirmatory run of `training`'s main question (issue 66).
//! Its [`design`] was committed before any of its runs: the premise from the article's own
//! example, each arm's learning rate tuned for this budget and one rate shared by both, a budget
//! long enough that «extremely slow» can fail on runs that finished, the two halves of the
//! article's sentence at 2.5% each, and seeds from a simulated power with censoring.

pub mod design;
pub mod frozen;
pub mod hypotheses;
pub mod power;
