//! How the three kernels tile their streamed rows (keys and values in the forward pass and dQ,
//! queries and dO in dK/dV), sized from the device's limits: part of each kernel's compile-time
//! configuration, so one shape class compiles once.
//!
//! Each streamed row (a key with its value, or a query with its dO) reaches the units one of
//! two ways. With **plane broadcasts** (the device has plane operations and planes of at least
//! [`LANES`] lanes, and the head sizes are multiples of [`LANES`]) a row is loaded once per plane
//! and broadcast: no shared memory, and a tile is only how far the loop runs between bounds
//! checks ([`MAX_TILE_ROWS`] rows). Otherwise the cube's units load a **tile** of `tile_rows`
//! rows of `d_k + d_v` floats into shared memory together; `tile_rows` is the largest power of
//! two up to [`MAX_TILE_ROWS`] whose two tiles fit the device's shared memory per cube (32 rows
//! at d = 64 in any device's 16 KiB, 8 at d = 256 in 16 KiB, 4 at d = 512). A call that no
//! tiling serves (a head size above [`MAX_HEAD_SIZE`], fewer units per cube than the kernels
//! use, or a single row not fitting) is refused with a reason, and `Auto` takes a tensor-op
//! path.
//!
//! On lavapipe every loop of a shader invocation ends silently after 65 535 iterations in all
//! ([`LLVMPIPE_LOOP_LIMIT`]); the loops over d step by 32 elements there, and a call whose loops
//! could still pass the limit (about a thousand keys at d = 256) is refused with the sizes.
//!
//! Three environment variables, read once per process, change the rule for measurements and
//! tests: `SDPA_CUBE_SHARED_BYTES` (bytes) replaces the device's shared memory per cube,
//! `SDPA_CUBE_PLANES=off` turns plane broadcasts off, and `SDPA_CUBE_ROWS` (1, 2, 4, 8, 16)
//! forces the rows per unit at head sizes up to [`UNROLL_HEAD_SIZE`].

use std::sync::OnceLock;

use cubecl::ir::DeviceProperties;

use super::steps::{UNITS, chunk_of};
use super::stream::LANES;

/// The loop iterations Mesa's llvmpipe (lavapipe) lets one shader invocation run, all loops
/// together (`LP_MAX_TGSI_LOOP_ITERATIONS` in Mesa's gallivm): past it every loop ends
/// silently, so a unit would stop early and leave stale memory in its outputs. The kernels'
/// loops over d step by [`CHUNK`](super::steps::CHUNK) elements when they are not unrolled,
/// and [`Tiling::check_loops`] refuses a call that could still run past the limit.
pub(crate) const LLVMPIPE_LOOP_LIMIT: usize = 65_535;

/// The margin kept below a loop limit: the bound [`Tiling::loop_iterations`] counts the
/// kernels' loops from their source, and the compiled shader may add a few.
pub(crate) const LOOP_MARGIN: f64 = 1.25;

/// The largest d_k and d_v the kernels serve (larger heads take a tensor-op path).
pub(crate) const MAX_HEAD_SIZE: usize = 512;

/// The most rows in a tile (one per unit of the cube).
pub(crate) const MAX_TILE_ROWS: usize = UNITS;

/// The largest head size (the larger of d_k and d_v) whose loops over d are unrolled. Larger
/// heads run them as loops: unrolled, a d = 512 kernel took 179 s to compile on lavapipe (74 s
/// as loops), and one row per unit is what their registers allow.
pub(crate) const UNROLL_HEAD_SIZE: usize = 128;

/// The most rows (queries, or keys in dK/dV) a unit owns, by head size (the larger of d_k and
/// d_v): `(largest head size, rows)`, the first entry whose head size is at least the call's. More
/// rows make every load of a key (or query) feed more multiply-adds but hold `rows · (d_k + d_v)`
/// floats in registers. Measured on lavapipe (b = 4, h = 8, n = 1024, forward + backward,
/// `examples/wgpu_kernel.rs` with `SDPA_CUBE_ROWS`, three runs, `docs/bench/BENCH_wgpu.md`), chosen
/// by a rule fixed before the last two runs (the fastest median, the fewer rows within 5%): 8 rows
/// at d = 32 (5.2% below 4 rows, the runs overlapping), 4 at d = 64 (ahead in every run) and
/// d = 128 (10% below 2 rows; 8 did not finish compiling in 12 minutes). Above
/// [`UNROLL_HEAD_SIZE`] one row per unit. Not measured on a GPU, whose registers per thread these
/// exceed (spills).
pub(crate) const ROWS_BY_HEAD_SIZE: [(usize, usize); 3] =
    [(32, 8), (UNROLL_HEAD_SIZE, 4), (usize::MAX, 1)];

/// The environment's overrides, read once.
#[derive(Debug, Clone, Copy, Default)]
struct Knobs {
    shared_bytes: Option<usize>,
    planes_off: bool,
    rows: Option<usize>,
}

fn knobs() -> Knobs {
    static KNOBS: OnceLock<Knobs> = OnceLock::new();
    *KNOBS.get_or_init(|| {
        let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string());
        Knobs {
            shared_bytes: var("SDPA_CUBE_SHARED_BYTES").and_then(|v| v.parse().ok()),
            planes_off: var("SDPA_CUBE_PLANES").is_some_and(|v| v == "off"),
            rows: var("SDPA_CUBE_ROWS")
                .and_then(|v| v.parse().ok())
                .filter(|r| [1, 2, 4, 8, 16].contains(r)),
        }
    })
}

/// What the tiling needs to know of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Shared memory per cube, in bytes.
    pub shared_bytes: usize,
    /// Units (threads) per cube.
    pub units_per_cube: usize,
    /// Whether rows may be shared by plane broadcasts.
    pub plane_broadcasts: bool,
    /// The loop iterations the driver lets one invocation run, if it ends loops past a count
    /// ([`LLVMPIPE_LOOP_LIMIT`] on lavapipe).
    pub loop_limit: Option<usize>,
}

/// The sizes of a call that set how long the kernels' loops run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoopDims {
    /// Queries per head.
    pub n: usize,
    /// Keys per head.
    pub m: usize,
    /// Query heads per key head.
    pub group: usize,
    /// The query and key head size.
    pub d_k: usize,
    /// The value head size.
    pub d_v: usize,
}

impl Limits {
    /// The limits of a CubeCL device, with the environment's overrides. Plane broadcasts need
    /// plane operations, which CubeCL reports for GPUs; Mesa's lavapipe has them (8 lanes with
    /// AVX2) though CubeCL reports no plane features for CPU devices, so it is recognised by name.
    pub(crate) fn of(properties: &DeviceProperties) -> Self {
        let knobs = knobs();
        let llvmpipe = properties.identity.name.contains("llvmpipe");
        let ops = properties
            .features
            .plane
            .contains(cubecl::features::Plane::Ops)
            || llvmpipe;
        Limits {
            shared_bytes: knobs
                .shared_bytes
                .unwrap_or(properties.hardware.max_shared_memory_size),
            units_per_cube: properties.hardware.max_units_per_cube as usize,
            plane_broadcasts: ops
                && properties.hardware.plane_size_min as usize >= LANES
                && !knobs.planes_off,
            loop_limit: llvmpipe.then_some(LLVMPIPE_LOOP_LIMIT),
        }
    }
}

/// The tiling of one call: the kernels' compile-time configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Tiling {
    /// Rows per tile (a power of two, at most [`MAX_TILE_ROWS`]).
    pub tile_rows: usize,
    /// Whether rows are shared by plane broadcasts (no shared memory) rather than tiles.
    pub planes: bool,
    /// Whether the loops over d are unrolled.
    pub unroll: bool,
}

impl Tiling {
    /// The tiling for head sizes `d_k`, `d_v` on a device with `limits`, or why there is none.
    pub(crate) fn for_device(limits: Limits, d_k: usize, d_v: usize) -> Result<Tiling, String> {
        if d_k > MAX_HEAD_SIZE || d_v > MAX_HEAD_SIZE {
            return Err(format!(
                "it serves head sizes up to {MAX_HEAD_SIZE} (d_k = {d_k}, d_v = {d_v})"
            ));
        }
        if limits.units_per_cube < UNITS {
            return Err(format!(
                "it needs {UNITS} units per cube and the device has {}",
                limits.units_per_cube
            ));
        }
        let unroll = d_k.max(d_v) <= UNROLL_HEAD_SIZE;
        if limits.plane_broadcasts && d_k.is_multiple_of(LANES) && d_v.is_multiple_of(LANES) {
            return Ok(Tiling {
                tile_rows: MAX_TILE_ROWS,
                planes: true,
                unroll,
            });
        }
        let row_bytes = (d_k + d_v) * size_of::<f32>();
        let fits = |rows: usize| rows * row_bytes <= limits.shared_bytes;
        let tile_rows = (0..=MAX_TILE_ROWS.trailing_zeros())
            .rev()
            .map(|shift| 1usize << shift)
            .find(|&rows| fits(rows))
            .ok_or_else(|| {
                format!(
                    "one row of keys and values (d_k + d_v = {} floats, {row_bytes} bytes) does \
                     not fit the device's {} bytes of shared memory per cube",
                    d_k + d_v,
                    limits.shared_bytes
                )
            })?;
        Ok(Tiling {
            tile_rows,
            planes: false,
            unroll,
        })
    }

    /// Iterations of one loop over `d` elements (0 when the loops over d are unrolled).
    fn loop_over(&self, d: usize) -> usize {
        if self.unroll { 0 } else { d / chunk_of(d) }
    }

    /// An upper bound on the loop iterations one unit runs in the busiest of the three kernels
    /// (counted from their source): per streamed row (a key in the forward pass and dQ, a query
    /// of each head of the group in dK/dV) one iteration of the row loop, its fetch, and at most
    /// four loops over d (dK/dV's two products and two sums); per tile its loop and its loads;
    /// per own row its loads, fills and stores. The band is not counted: every key or query is
    /// taken as visited, plus one tile before it.
    pub(crate) fn loop_iterations(&self, dims: LoopDims) -> usize {
        let (over_k, over_v) = (self.loop_over(dims.d_k), self.loop_over(dims.d_v));
        let groups = |d: usize| {
            let n_groups = d / LANES;
            if self.unroll {
                0
            } else {
                n_groups / chunk_of(n_groups).min(4)
            }
        };
        let fetch = if self.planes {
            groups(dims.d_k) + groups(dims.d_v)
        } else {
            over_k + over_v
        };
        let per_row = 1 + fetch + 2 * (over_k + over_v);
        let tile_loads = |d: usize| {
            let loads = (self.tile_rows * d).div_ceil(UNITS);
            if self.planes || self.unroll {
                0
            } else {
                loads / chunk_of(loads)
            }
        };
        let per_tile = 1 + tile_loads(dims.d_k) + tile_loads(dims.d_v);
        let stream = |len: usize| {
            (len + self.tile_rows) * per_row + (len.div_ceil(self.tile_rows) + 1) * per_tile
        };
        let d = dims.d_k.max(dims.d_v);
        let own = |len: usize| self.unit_rows(len, d) * (4 * (over_k + over_v) + 4) + 16;
        let query_block = stream(dims.m) + own(dims.n);
        let key_block = dims.group * (stream(dims.n) + 1) + own(dims.m);
        query_block.max(key_block)
    }

    /// Refuses a call whose loops could run past the device's loop limit (see
    /// [`LLVMPIPE_LOOP_LIMIT`]), naming the sizes.
    pub(crate) fn check_loops(&self, limits: Limits, dims: LoopDims) -> Result<(), String> {
        let Some(limit) = limits.loop_limit else {
            return Ok(());
        };
        let needed = self.loop_iterations(dims);
        if needed as f64 * LOOP_MARGIN <= limit as f64 {
            return Ok(());
        }
        Err(format!(
            "lavapipe (Mesa's llvmpipe) ends a shader's loops silently after {limit} iterations \
             in all, and a unit would run up to {needed} at n = {}, m = {}, d_k = {}, d_v = {} \
             (query heads per key head {}): shorter sequences or head sizes up to \
             {UNROLL_HEAD_SIZE} fit",
            dims.n, dims.m, dims.d_k, dims.d_v, dims.group
        ))
    }

    /// The shared memory the kernels allocate with this tiling, in bytes (two tiles).
    #[cfg(test)]
    pub(crate) fn shared_bytes(&self, d_k: usize, d_v: usize) -> usize {
        let tile_len = |d| super::stream::tile_len(self.planes, self.tile_rows, d);
        (tile_len(d_k) + tile_len(d_v)) * size_of::<f32>()
    }

    /// Rows per unit for a pass over `len` rows with head size `d` (the larger of d_k and d_v):
    /// [`ROWS_BY_HEAD_SIZE`]'s (or `SDPA_CUBE_ROWS`'s up to [`UNROLL_HEAD_SIZE`]), fewer when `len`
    /// is small, so that a short sequence does not leave most of a cube's rows idle.
    pub(crate) fn unit_rows(&self, len: usize, d: usize) -> usize {
        let table = ROWS_BY_HEAD_SIZE
            .iter()
            .find(|(head_size, _)| d <= *head_size)
            .map_or(1, |(_, rows)| *rows);
        let most = match knobs().rows {
            Some(forced) if self.unroll => forced,
            _ => table,
        };
        len.div_ceil(UNITS).next_power_of_two().clamp(1, most)
    }

    /// Whether `SDPA_CUBE_ROWS` is set (tests of the table skip themselves then).
    #[cfg(test)]
    pub(crate) fn rows_forced() -> bool {
        knobs().rows.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(shared_bytes: usize, plane_broadcasts: bool) -> Limits {
        Limits {
            shared_bytes,
            units_per_cube: 1024,
            plane_broadcasts,
            loop_limit: None,
        }
    }

    #[test]
    fn tiles_are_the_largest_power_of_two_that_fits() {
        for shared in [16 * 1024, 32 * 1024, 48 * 1024] {
            for d_k in (8..=MAX_HEAD_SIZE).step_by(8) {
                for d_v in [8, d_k, MAX_HEAD_SIZE] {
                    let tiling = Tiling::for_device(limits(shared, false), d_k, d_v)
                        .unwrap_or_else(|e| panic!("{shared} B, d_k {d_k}, d_v {d_v}: {e}"));
                    let rows = tiling.tile_rows;
                    assert!(rows.is_power_of_two() && rows <= MAX_TILE_ROWS);
                    assert!(!tiling.planes);
                    assert!(
                        tiling.shared_bytes(d_k, d_v) <= shared,
                        "{d_k} {d_v} {rows}"
                    );
                    // Twice the rows would not fit, unless the tile is already full.
                    assert!(
                        rows == MAX_TILE_ROWS || 2 * rows * (d_k + d_v) * 4 > shared,
                        "{d_k} {d_v} {rows}"
                    );
                }
            }
        }
        let rows = |shared, d| Tiling::for_device(limits(shared, false), d, d).map(|t| t.tile_rows);
        assert_eq!(rows(16 * 1024, 64), Ok(32));
        assert_eq!(rows(16 * 1024, 256), Ok(8));
        assert_eq!(rows(32 * 1024, 256), Ok(16));
        assert_eq!(rows(16 * 1024, 512), Ok(4));
    }

    #[test]
    fn plane_broadcasts_use_no_tile_and_need_head_sizes_in_whole_planes() {
        let tiling = Tiling::for_device(limits(16 * 1024, true), 256, 256).expect("tiling");
        assert!(tiling.planes);
        assert_eq!(tiling.shared_bytes(256, 256), 8);
        let odd = Tiling::for_device(limits(16 * 1024, true), 12, 256).expect("tiling");
        assert!(!odd.planes);
        assert_eq!(odd.tile_rows, 8);
    }

    #[test]
    fn what_no_tiling_serves_is_refused_with_the_sizes() {
        let err = Tiling::for_device(limits(48 * 1024, true), 520, 64).expect_err("too large");
        assert!(err.contains("512") && err.contains("d_k = 520"), "{err}");
        let err = Tiling::for_device(limits(2048, false), 512, 256).expect_err("no row fits");
        assert!(
            err.contains("3072 bytes") && err.contains("2048 bytes"),
            "{err}"
        );
        let few = Limits {
            units_per_cube: 16,
            ..limits(48 * 1024, true)
        };
        let err = Tiling::for_device(few, 64, 64).expect_err("too few units");
        assert_eq!(err, "it needs 32 units per cube and the device has 16");
    }

    #[test]
    fn loops_are_unrolled_up_to_the_unroll_head_size() {
        let unroll = |d_k, d_v| {
            Tiling::for_device(limits(48 * 1024, true), d_k, d_v)
                .expect("tiling")
                .unroll
        };
        assert!(unroll(128, 128));
        assert!(!unroll(128, 136));
        assert!(!unroll(256, 64));
    }

    #[test]
    fn rows_per_unit_follow_the_table_and_shrink_for_short_sequences() {
        if Tiling::rows_forced() {
            return; // SDPA_CUBE_ROWS overrides the table in this process
        }
        let tiling = |d| Tiling::for_device(limits(48 * 1024, true), d, d).expect("tiling");
        let rows = |len, d| tiling(d).unit_rows(len, d);
        assert_eq!(rows(4096, 16), 8);
        assert_eq!(rows(4096, 32), 8);
        assert_eq!(rows(4096, 40), 4);
        assert_eq!(rows(4096, 64), 4);
        assert_eq!(rows(4096, 128), 4);
        assert_eq!(rows(4096, 256), 1);
        assert_eq!(rows(4096, 512), 1);
        // One row per unit while a single cube's units cover the sequence, then doubling.
        for d in [32, 64] {
            assert_eq!(rows(1, d), 1);
            assert_eq!(rows(UNITS, d), 1);
            assert_eq!(rows(UNITS + 1, d), 2);
            assert_eq!(rows(3 * UNITS, d), 4);
        }
        assert_eq!(rows(5 * UNITS, 32), 8);
        assert_eq!(rows(5 * UNITS, 64), 4);
        // Ordered by head size; the last entry covers every head size.
        assert!(ROWS_BY_HEAD_SIZE.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(ROWS_BY_HEAD_SIZE.last().map(|e| e.0), Some(usize::MAX));
    }

    #[test]
    fn the_loop_bound_refuses_long_sequences_only_under_a_loop_limit() {
        let lavapipe = Limits {
            loop_limit: Some(LLVMPIPE_LOOP_LIMIT),
            ..limits(32 * 1024, true)
        };
        let dims = |n, m, d| LoopDims {
            n,
            m,
            group: 2,
            d_k: d,
            d_v: d,
        };
        for (d, admitted, refused) in [(512, 300, 2_000), (256, 600, 4_000), (64, 10_000, 60_000)] {
            for planes in [true, false] {
                let limits = Limits {
                    plane_broadcasts: planes,
                    ..lavapipe
                };
                let tiling = Tiling::for_device(limits, d, d).expect("tiling");
                for (n, m) in [(1, admitted), (admitted / 2, 33)] {
                    assert_eq!(
                        tiling.check_loops(limits, dims(n, m, d)),
                        Ok(()),
                        "{d} {n} {m}"
                    );
                }
                for (n, m) in [(1, refused), (refused, 33)] {
                    let err = tiling
                        .check_loops(limits, dims(n, m, d))
                        .expect_err("refused");
                    assert!(
                        err.contains("65535") && err.contains(&format!("d_k = {d}")),
                        "{err}"
                    );
                    // A device without the limit runs it.
                    let gpu = Limits {
                        loop_limit: None,
                        ..limits
                    };
                    assert_eq!(tiling.check_loops(gpu, dims(n, m, d)), Ok(()));
                }
            }
            // The bound grows with the lengths.
            let tiling = Tiling::for_device(lavapipe, d, d).expect("tiling");
            assert!(
                tiling.loop_iterations(dims(1, admitted + 1, d))
                    > tiling.loop_iterations(dims(1, admitted, d))
            );
        }
    }
}
