//! Where a run's optimizer steps spend their time: each step's wall time, phase by phase (what
//! `sdpa train-bench` reports).
//!
//! The phases are wall time on the host. The CPU backends compute eagerly, so each phase holds
//! its own work; a GPU backend queues work asynchronously, so there the forward and backward
//! phases hold only the queueing and the host read waits for the device.

use serde::{Deserialize, Serialize};

/// The phases of one training step, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Drawing the batch on the host and moving it to the device.
    Data,
    /// The forward pass (the autodiff graph is built here).
    Forward,
    /// The backward pass.
    Backward,
    /// Reading the loss and the global gradient norm back to the host (the divergence check).
    HostRead,
    /// The step's record when one is due: metrics, attention diagnostics, held-out evaluation.
    Record,
    /// The optimizer's update.
    Optimizer,
    /// A checkpoint when one is due.
    Checkpoint,
}

impl Phase {
    /// Every phase, in step order.
    pub const ALL: [Phase; 7] = [
        Phase::Data,
        Phase::Forward,
        Phase::Backward,
        Phase::HostRead,
        Phase::Record,
        Phase::Optimizer,
        Phase::Checkpoint,
    ];

    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::HostRead => "host_read",
            Phase::Record => "record",
            Phase::Optimizer => "optimizer",
            Phase::Checkpoint => "checkpoint",
        }
    }
}

/// Wall time of every step this process ran, phase by phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepProfile {
    /// Per step, in order: seconds per phase, indexed like [`Phase::ALL`].
    pub steps: Vec<[f64; 7]>,
}

impl StepProfile {
    /// Seconds spent in `phase` by the steps in `range` (of [`steps`](Self::steps)).
    pub fn seconds(&self, phase: Phase, range: std::ops::Range<usize>) -> f64 {
        self.steps[range].iter().map(|s| s[phase as usize]).sum()
    }

    /// Wall time of step `idx` (seconds).
    pub fn step_seconds(&self, idx: usize) -> f64 {
        self.steps[idx].iter().sum()
    }
}

/// Times the phases of one step: each [`lap`](Self::lap) charges the time since the previous
/// one to a phase.
#[derive(Debug)]
pub(crate) struct StepClock {
    last: std::time::Instant,
    phases: [f64; 7],
}

impl StepClock {
    pub fn start() -> Self {
        Self {
            last: std::time::Instant::now(),
            phases: [0.0; 7],
        }
    }

    /// Charges the time since the last lap to `phase`.
    pub fn lap(&mut self, phase: Phase) {
        let now = std::time::Instant::now();
        self.phases[phase as usize] += (now - self.last).as_secs_f64();
        self.last = now;
    }

    /// Ends the step: appends its phases to `profile`.
    pub fn finish(self, profile: &mut StepProfile) {
        profile.steps.push(self.phases);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_charge_their_phase_and_the_step_its_total() {
        let mut profile = StepProfile::default();
        for _ in 0..2 {
            let mut clock = StepClock::start();
            std::thread::sleep(std::time::Duration::from_millis(5));
            clock.lap(Phase::Forward);
            clock.lap(Phase::Optimizer);
            clock.finish(&mut profile);
        }
        assert_eq!(profile.steps.len(), 2);
        assert!(profile.seconds(Phase::Forward, 0..1) >= 0.005);
        assert!(profile.seconds(Phase::Forward, 0..2) >= 0.010);
        assert!(profile.seconds(Phase::Forward, 0..1) > profile.seconds(Phase::Optimizer, 0..1));
        assert_eq!(profile.seconds(Phase::Data, 0..2), 0.0);
        assert!(profile.step_seconds(1) >= profile.seconds(Phase::Forward, 1..2));
    }
}
