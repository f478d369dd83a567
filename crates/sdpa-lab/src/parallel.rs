//! Independent runs on every core: the training experiments' runs are single-threaded most of
//! the time (small models), so running one per core divides the wall time. Every run draws its
//! data from its own seeded generator and its parameters under `sdpa_model`'s initialization
//! lock, so the results do not depend on the order the workers take the runs in.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::context::LabError;

/// Workers to use: one per core the process may use (at least 1).
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `job` on every item with [`workers`] threads and returns the results in item order;
/// `done` is called (one call at a time) as each run finishes, with the number finished so far.
/// The first error stops the workers from taking further items and is returned.
pub fn map_parallel<T, R>(
    items: &[T],
    job: impl Fn(&T) -> Result<R, LabError> + Sync,
    done: impl Fn(usize, &R) + Sync,
) -> Result<Vec<R>, LabError>
where
    T: Sync,
    R: Send,
{
    let next = AtomicUsize::new(0);
    let finished = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Result<R, LabError>>>> =
        Mutex::new((0..items.len()).map(|_| None).collect());
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..workers().min(items.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let idx = next.fetch_add(1, Ordering::SeqCst);
                    if idx >= items.len() || failed.load(Ordering::SeqCst) {
                        break;
                    }
                    let result = job(&items[idx]);
                    match &result {
                        Ok(r) => {
                            let mut count = finished.lock().unwrap_or_else(|p| p.into_inner());
                            *count += 1;
                            done(*count, r);
                        }
                        Err(_) => failed.store(true, Ordering::SeqCst),
                    }
                    results.lock().unwrap_or_else(|p| p.into_inner())[idx] = Some(result);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(items.len());
    for (idx, result) in results.into_iter().enumerate() {
        match result {
            Some(result) => out.push(result?),
            None => {
                // Not taken: an earlier failure stopped the workers; report that failure.
                return Err(LabError::NotStarted { index: idx });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_item_order_and_errors_stop_the_run() {
        let items: Vec<u64> = (0..37).collect();
        let calls = AtomicUsize::new(0);
        let out = map_parallel(
            &items,
            |x| Ok(x * x),
            |_, _| {
                calls.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(calls.load(Ordering::SeqCst), 37);
        let err = map_parallel(
            &items,
            |&x| {
                if x == 5 {
                    Err(LabError::Usage("five".into()))
                } else {
                    Ok(x)
                }
            },
            |_, _| {},
        )
        .unwrap_err();
        // Items are taken in order and a taken item always finishes: the error found first in
        // item order is the failure itself.
        assert!(err.to_string().contains("five"), "{err}");
    }
}
