//! Group commit for the shard's loop: the [`FlushGate`] that decides when the writes gathered
//! since the last I/O round may start the next one.
//!
//! It reads no clock and touches no node: the loop passes `now` in and starts the round itself.

use std::time::{Duration, Instant};

/// Group commit for the shard's loop (`flush_delay_us_max`): decides when the writes that
/// arrived since the last I/O round may start one. With a delay of 0 a round starts as soon as
/// anything is pending, as if there were no gate; otherwise the first write that finds no round
/// due opens a window of the delay, and every write arriving within it joins the same round (and
/// so the same flush cycle). It reads no clock: the loop passes `now` in.
#[derive(Clone, Copy, Debug)]
pub struct FlushGate {
    delay: Duration,
    /// When the oldest write not yet handed to a round arrived.
    pending_since: Option<Instant>,
}

impl FlushGate {
    /// A gate holding writes for at most `delay_us_max` microseconds.
    pub fn new(delay_us_max: u32) -> FlushGate {
        FlushGate { delay: Duration::from_micros(u64::from(delay_us_max)), pending_since: None }
    }

    /// Whether a round may start now, given whether writes wait for one. A `true` answer is
    /// taken as the round starting: the window closes with it.
    pub fn open(&mut self, now: Instant, writes_pending: bool) -> bool {
        if self.delay.is_zero() {
            return true;
        }
        if !writes_pending {
            self.pending_since = None;
            return true;
        }
        let since = *self.pending_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.delay {
            self.pending_since = None;
            return true;
        }
        false
    }

    /// When a window that is open now closes (the loop must wake by then).
    pub fn deadline(&self) -> Option<Instant> {
        self.pending_since.map(|since| since + self.delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_gate_holds_writes_for_the_delay_from_the_first_of_them() {
        let start = Instant::now();
        let at = |us: u64| start + Duration::from_micros(us);
        let mut undelayed = FlushGate::new(0);
        assert!(undelayed.open(at(0), true), "no delay: a round whenever anything is pending");
        assert_eq!(undelayed.deadline(), None);

        let mut gate = FlushGate::new(500);
        assert!(gate.open(at(0), false), "nothing waits: nothing to hold back");
        assert_eq!(gate.deadline(), None);
        // The first write opens the window; later ones join it without stretching it.
        assert!(!gate.open(at(10), true));
        assert_eq!(gate.deadline(), Some(at(510)));
        assert!(!gate.open(at(300), true));
        assert!(!gate.open(at(509), true));
        assert_eq!(gate.deadline(), Some(at(510)));
        assert!(gate.open(at(510), true), "the window's end lets them all go in one round");
        assert_eq!(gate.deadline(), None, "the round took them: the window is closed");
        // The next write opens a new window.
        assert!(!gate.open(at(600), true));
        assert_eq!(gate.deadline(), Some(at(1100)));
        // Writes that left another way (a round that had to run anyway) close it too.
        assert!(gate.open(at(700), false));
        assert_eq!(gate.deadline(), None);
    }
}
