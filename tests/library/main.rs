//! Contract, reference-parity and end-to-end tests of the attention library, on every backend
//! compiled in (`--features wgpu` adds the wgpu backend to the CPU ones; `--features cuda` the
//! CUDA backend, whose tests need a GPU).

mod auto;
mod common;
mod cpu_dtypes;
mod cube;
mod cube_dtypes;
mod cube_head_sizes;
mod cube_sweep;
mod cuda;
mod drop_in;
mod drop_in_api;
mod errors;
mod extensions;
mod golden;
mod gradients;
mod half_precision;
mod kernel_size;
mod kv_cache;
mod layers;
mod packed;
mod parity;
mod properties;
mod reference;
mod root_names;
mod rope;
mod row_stats;
mod rows;
mod sinks;
