//! Resident memory of this process (Linux `/proc/self`), to measure the peak memory of a
//! computation: reset the high-water mark, run, read it.

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
