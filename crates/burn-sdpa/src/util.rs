//! Small helpers the workspace's crates share and a caller may want: reading a tensor back to
//! the host with a typed error, and checking a logit soft-cap before it reaches a config.

pub use crate::input::read_back;
pub use crate::types::validate_softcap;
