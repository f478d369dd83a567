//! What a user can ask for ([`Implementation`]) and what actually runs ([`Path`]).
//!
//! Both print themselves and `Implementation` parses back from what it prints, so the CLI, the
//! bench and error messages share one spelling: `auto`, `naive`, `chunked:256`, `fused`,
//! `cpu_kernel` (paths print a chunked block size as `chunked(256)`).

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which computation path the module takes. All paths have the same semantics (masks, bias,
/// causal alignment, grouped-query heads, zero output for fully masked rows); they differ in speed
/// and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Implementation {
    /// Pick the fastest correct path for the request, the backend and the autodiff state (the
    /// rule is [`auto_path`](crate::auto_path); the measurements behind it are in the README).
    #[default]
    Auto,
    /// Materialize the scores and weights `[b, h, n, m]`; the only path that can return the
    /// weights.
    Naive,
    /// Online softmax over blocks of `block_size` keys, in Burn tensor ops: O(n · block_size)
    /// memory for inference, works on every backend and under autodiff.
    Chunked {
        /// Keys per block.
        block_size: usize,
    },
    /// Delegate to `burn::tensor::module::attention` (Flex's tiled CPU kernel, CubeCL's flash
    /// kernel, the fallback under autodiff). Cannot return weights or apply dropout, and only
    /// knows bottom-right causal alignment.
    Fused,
    /// This crate's query-blocked flash kernel for CPU inference ([`crate::cpu_kernel`]): `f32`,
    /// no mask or bias (causal with either alignment is fine), no autodiff (it has no backward
    /// pass), no weights, no dropout. It reads the tensors on the host, so it belongs on CPU
    /// backends.
    CpuKernel,
}

/// The path an attention call actually takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Path {
    /// See [`Implementation::Naive`].
    Naive,
    /// See [`Implementation::Chunked`].
    Chunked(usize),
    /// See [`Implementation::Fused`].
    Fused,
    /// See [`Implementation::CpuKernel`].
    CpuKernel,
}

impl Implementation {
    /// The path an explicit implementation asks for; `None` for `Auto`, which chooses.
    pub fn path(self) -> Option<Path> {
        match self {
            Implementation::Auto => None,
            Implementation::Naive => Some(Path::Naive),
            Implementation::Chunked { block_size } => Some(Path::Chunked(block_size)),
            Implementation::Fused => Some(Path::Fused),
            Implementation::CpuKernel => Some(Path::CpuKernel),
        }
    }
}

impl Path {
    /// The implementation that asks for exactly this path.
    pub fn implementation(self) -> Implementation {
        match self {
            Path::Naive => Implementation::Naive,
            Path::Chunked(block_size) => Implementation::Chunked { block_size },
            Path::Fused => Implementation::Fused,
            Path::CpuKernel => Implementation::CpuKernel,
        }
    }
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Implementation::Auto => f.write_str("auto"),
            Implementation::Naive => f.write_str("naive"),
            Implementation::Chunked { block_size } => write!(f, "chunked:{block_size}"),
            Implementation::Fused => f.write_str("fused"),
            Implementation::CpuKernel => f.write_str("cpu_kernel"),
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Chunked(block_size) => write!(f, "chunked({block_size})"),
            other => other.implementation().fmt(f),
        }
    }
}

impl FromStr for Implementation {
    type Err = String;

    /// Parses `auto`, `naive`, `fused`, `cpu_kernel`, `chunked:BLOCK` or `chunked(BLOCK)`
    /// (BLOCK > 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let block = s
            .strip_prefix("chunked:")
            .or_else(|| s.strip_prefix("chunked(")?.strip_suffix(')'));
        match (s, block.map(str::parse::<usize>)) {
            ("auto", _) => Ok(Implementation::Auto),
            ("naive", _) => Ok(Implementation::Naive),
            ("fused", _) => Ok(Implementation::Fused),
            ("cpu_kernel", _) => Ok(Implementation::CpuKernel),
            (_, Some(Ok(block_size))) if block_size > 0 => {
                Ok(Implementation::Chunked { block_size })
            }
            _ => Err(format!(
                "expected auto, naive, fused, cpu_kernel or chunked:BLOCK (BLOCK > 0), got `{s}`"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implementations_print_and_parse_back() {
        for implementation in [
            Implementation::Auto,
            Implementation::Naive,
            Implementation::Chunked { block_size: 256 },
            Implementation::Fused,
            Implementation::CpuKernel,
        ] {
            let printed = implementation.to_string();
            assert_eq!(printed.parse::<Implementation>(), Ok(implementation));
        }
        assert_eq!(Path::Chunked(8).to_string(), "chunked(8)");
        assert_eq!(
            "chunked(8)".parse::<Implementation>(),
            Ok(Implementation::Chunked { block_size: 8 })
        );
        assert_eq!(Path::CpuKernel.to_string(), "cpu_kernel");
        for bad in ["chunked:0", "chunked:", "flash", "chunked(3"] {
            assert!(bad.parse::<Implementation>().is_err(), "{bad}");
        }
    }
}
