//! The open-loop send schedule: in a rate-limited run the k-th send of an actor is *intended*
//! at `start + k × interval`, whatever happened before, and its latency is measured from that
//! intended time. A stall therefore counts against every send it delayed, not only the one in
//! flight (no coordinated omission). Without a rate, each send is intended when it is made.
//!
//! It owns only arithmetic on times passed in as arguments (nanoseconds since the run's start);
//! it never reads a clock, so its accuracy is tested on a virtual one.

/// An actor's send schedule.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    interval_ns: Option<u64>,
    start_ns: u64,
    sent: u64,
}

impl Schedule {
    /// A schedule starting at `start_ns`, one send every `interval_ns` (`None`: as fast as the
    /// in-flight bound allows).
    pub fn new(start_ns: u64, interval_ns: Option<u64>) -> Schedule {
        Schedule { interval_ns: interval_ns.map(|i| i.max(1)), start_ns, sent: 0 }
    }

    /// When the next send is intended (`now_ns` when unlimited).
    pub fn intended_ns(&self, now_ns: u64) -> u64 {
        match self.interval_ns {
            Some(interval) => self.start_ns + self.sent * interval,
            None => now_ns,
        }
    }

    /// Whether the next send is due at `now_ns`.
    pub fn is_due(&self, now_ns: u64) -> bool {
        self.intended_ns(now_ns) <= now_ns
    }

    /// How long until the next send is due.
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.intended_ns(now_ns).saturating_sub(now_ns)
    }

    /// Takes the next send; returns the time it was intended for, from which its latency counts.
    pub fn take(&mut self, now_ns: u64) -> u64 {
        let intended = self.intended_ns(now_ns);
        self.sent += 1;
        intended
    }

    /// Sends taken so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }
}

/// A rate limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Megabytes (10⁶ bytes) of message payload per second, over all actors.
    MegabytesPerSecond(f64),
    /// Messages per second, over all actors.
    MessagesPerSecond(f64),
}

impl Rate {
    /// Parses `100MB/s` or `5000msg/s`.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let number =
            |digits: &str| digits.trim().parse::<f64>().ok().filter(|v| *v > 0.0 && v.is_finite());
        if let Some(value) = text.strip_suffix("MB/s").and_then(number) {
            return Ok(Rate::MegabytesPerSecond(value));
        }
        if let Some(value) = text.strip_suffix("msg/s").and_then(number) {
            return Ok(Rate::MessagesPerSecond(value));
        }
        Err(format!("--rate {text}: use e.g. 100MB/s or 5000msg/s"))
    }

    /// One actor's interval between batch sends, when `actors` share the rate.
    pub fn batch_interval_ns(
        &self,
        actors: usize,
        messages_per_batch: usize,
        batch_payload_bytes: usize,
    ) -> u64 {
        let batches_per_second = match *self {
            Rate::MegabytesPerSecond(mb) => mb * 1e6 / batch_payload_bytes.max(1) as f64,
            Rate::MessagesPerSecond(messages) => messages / messages_per_batch.max(1) as f64,
        };
        let per_actor = batches_per_second / actors.max(1) as f64;
        (1e9 / per_actor).max(1.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A closed connection of one request at a time, answering in 0.1 ms, except that the
    /// request sent at 50 ms is answered only at 150 ms. Returns each send's latency from its
    /// intended time, in send order.
    fn run_with_stall(interval_ns: Option<u64>, sends: u64) -> Vec<(u64, u64)> {
        let mut schedule = Schedule::new(0, interval_ns);
        let mut now = 0;
        let mut latencies = Vec::new();
        while schedule.sent() < sends {
            now += schedule.wait_ns(now);
            let intended = schedule.take(now);
            let answered = if (50 * MS..51 * MS).contains(&now) { 150 * MS } else { now + MS / 10 };
            now = answered;
            latencies.push((intended, answered - intended));
        }
        latencies
    }

    #[test]
    fn schedule_a_stall_counts_for_every_send_it_delayed() {
        // 1 send per ms; the 100 ms stall at 50 ms delays the sends intended at 51..150 ms.
        let latencies = run_with_stall(Some(MS), 300);
        for &(intended, latency) in &latencies {
            if (50 * MS..150 * MS).contains(&intended) {
                // Sent at 150 ms or later: its latency includes the whole wait since intended.
                assert!(latency >= 150 * MS - intended, "{intended} {latency}");
            }
        }
        let delayed = latencies.iter().filter(|&&(_, latency)| latency > MS).count();
        assert!(delayed >= 100, "only {delayed} sends saw the stall");
        // Once caught up, sends are back on their intended times.
        let (intended, latency) = latencies[299];
        assert_eq!(intended, 299 * MS);
        assert!(latency <= MS, "{latency}");
    }

    #[test]
    fn schedule_closed_loop_hides_the_stall_which_is_why_it_is_not_used() {
        // Without intended times (sends back to back, 0.1 ms each: the 501st is at 50 ms), only
        // the stalled send itself shows the stall.
        let latencies = run_with_stall(None, 1000);
        let delayed = latencies.iter().filter(|&&(_, latency)| latency > MS).count();
        assert_eq!(delayed, 1);
    }

    #[test]
    fn schedule_rate_accuracy_on_a_virtual_clock() {
        // 10 MB/s of 1,000-byte messages in 100-message batches over 2 actors: 50 batches/s each.
        let rate = Rate::parse("10MB/s").unwrap();
        let interval = rate.batch_interval_ns(2, 100, 100_000);
        assert_eq!(interval, 20 * MS);
        let mut schedule = Schedule::new(0, Some(interval));
        let mut now = 0;
        for _ in 0..50 {
            now += schedule.wait_ns(now);
            schedule.take(now);
        }
        // The 50th send of the second is intended at 980 ms: 50 batches in one second.
        assert_eq!(now, 49 * 20 * MS);
        assert_eq!(Rate::parse("5000msg/s").unwrap().batch_interval_ns(1, 10, 1), 2 * MS);
        assert!(Rate::parse("fast").is_err());
        assert!(Rate::parse("-3MB/s").is_err());
    }
}
