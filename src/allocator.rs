//! The process's allocator settings for training and the lab.
//!
//! Burn allocates a fresh buffer for most tensor ops. With glibc's defaults, a buffer above the
//! dynamic mmap threshold (128 KiB at start) gets its own `mmap` and is returned to the kernel on
//! `free`, so every large intermediate of every step pays for page faults on first touch. The
//! default model at d_k = 1024 (8 MiB activations) spent ~45% of its wall time there: 60 steps
//! took 12.0 s with the defaults and 6.9 s with the thresholds below (`sdpa train --task match
//! --d-k 1024 --scale none --init unit --steps 60 --no-early-stop`, measured on 2 cores).

/// Keeps buffers up to 32 MiB (glibc's largest mmap threshold) on the heap and freed memory in
/// the process, so that the same sizes are reused from step to step. Does nothing on other C
/// libraries. Called by the `sdpa` binary and the examples at start; a library user may call it
/// in their own `main`.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3 (malloc.h).
        const M_TRIM_THRESHOLD: libc::c_int = -1;
        const M_MMAP_THRESHOLD: libc::c_int = -3;
        // SAFETY: mallopt only changes allocator parameters; it is called before any other
        // thread is started by this crate, and glibc serializes it with the allocator's lock.
        unsafe {
            libc::mallopt(M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(M_TRIM_THRESHOLD, 1 << 30);
        }
    }
}
