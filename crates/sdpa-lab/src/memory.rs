//! Memory of a computation, two ways: the bytes it holds on the heap at once, counted by
//! [`CountingAllocator`] (exact, every allocation, where the binary installs it), and the rise of
//! the process's resident high-water mark (Linux `/proc/self`: what the OS sees, blind to buffers
//! the allocator reuses).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Reads a `kB` field of `/proc/self/status` in bytes.
fn status_field(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Current resident set size in bytes (None off Linux).
pub fn current_rss() -> Option<u64> {
    status_field("VmRSS:")
}

/// Peak resident set size since the last [`reset_peak`] (or the process start), in bytes.
pub fn peak_rss() -> Option<u64> {
    status_field("VmHWM:")
}

/// Resets the peak to the current resident size (Linux ≥ 4.0: `echo 5 > /proc/self/clear_refs`).
/// Returns false where that is not possible.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Runs `f` and returns its result with the peak resident memory it added above the resident
/// size before it started, in bytes (None where it cannot be measured).
pub fn measure_peak<T>(f: impl FnOnce() -> T) -> (T, Option<u64>) {
    let before = current_rss();
    let ok = reset_peak();
    let out = f();
    let peak = peak_rss();
    let added = match (ok, before, peak) {
        (true, Some(b), Some(p)) => Some(p.saturating_sub(b)),
        _ => None,
    };
    (out, added)
}

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes the process holds (and their peak) on top of the
/// system allocator, so that a measurement sees every heap allocation of a computation — the
/// resident high-water mark cannot see buffers the allocator reuses. Install it in a binary:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOCATOR: sdpa_lab::memory::CountingAllocator = sdpa_lab::memory::CountingAllocator;
/// ```
pub struct CountingAllocator;

impl CountingAllocator {
    fn added(size: usize) {
        let now = CURRENT.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(now, Ordering::Relaxed);
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated around it.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on to `System`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (through this allocator).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc` and `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            Self::added(new_size);
        }
        p
    }
}

/// Runs `f` and returns its result with the most bytes it held on the heap at once beyond what
/// the process held when it started (None when [`CountingAllocator`] is not the global
/// allocator). Allocations of other threads in that time count too.
pub fn measure_allocated<T>(f: impl FnOnce() -> T) -> (T, Option<u64>) {
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed);
    let installed = INSTALLED.load(Ordering::Relaxed);
    (out, installed.then(|| peak.saturating_sub(before) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_allocation_shows_in_the_peak() {
        if current_rss().is_none() {
            return; // not Linux: nothing to measure
        }
        let (_, added) = measure_peak(|| {
            let v = vec![1u8; 64 << 20];
            std::hint::black_box(&v);
            v.iter().map(|&x| x as u64).sum::<u64>()
        });
        let added = added.expect("peak measurable on Linux");
        assert!(
            added >= 60 << 20,
            "64 MiB allocation, measured {added} bytes"
        );
    }
}
