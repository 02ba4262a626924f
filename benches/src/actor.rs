//! What every actor thread has in common: pinning to its CPU, its own io_uring runtime, and the
//! tally of what it moved (messages, bytes, the measured window, errors by kind), which the
//! report merges across actors.
//!
//! It owns no measuring policy (what counts as measured is the actor's call) and reads no clock;
//! `connect` is the one connection step every actor shares (`--connect owner` moves the client to
//! the shard that owns the actor's partition).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use shoal_client::{Client, ClientConfig, ClientError};

/// Pins the calling thread to `cpu` (nothing when `None`).
pub fn pin(cpu: Option<usize>) -> Result<(), String> {
    match cpu {
        Some(cpu) if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) => {
            Err(format!("cannot pin to CPU {cpu}"))
        }
        _ => Ok(()),
    }
}

/// Runs `actor` to its end on the calling thread, pinned to `cpu`, on a new io_uring runtime.
pub fn run_pinned<T>(
    cpu: Option<usize>,
    actor: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    pin(cpu)?;
    let mut runtime = shoal_client::runtime().map_err(|e| format!("io_uring runtime: {e}"))?;
    runtime.block_on(actor)
}

/// The partition an actor works on, to find the shard that owns it.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    pub stream: &'a str,
    pub topic: &'a str,
    pub partition: u32,
}

/// Connects an actor's client; in a cluster, to the node that leads `target` (the split
/// connection an actor uses never follows a primary by itself: it reconnects here instead, given
/// the primary a `NotPrimary` named as `prefer`); with `to_owner`, moves it to the shard that owns
/// `target` (`--connect owner`: the server must name per-shard listeners, `[network]
/// shard_listen`). Returns the client and whether the shard serving it owns the partition
/// (`None`: no single partition, or a server that names no shard).
pub async fn connect(
    config: ClientConfig,
    target: Option<Target<'_>>,
    to_owner: bool,
    prefer: Option<String>,
) -> Result<(Client, Option<bool>), ClientError> {
    let config = match prefer {
        // The named primary first, then the seeds as before.
        Some(primary) => ClientConfig {
            seeds: std::iter::once(primary).chain(config.seeds.iter().cloned()).collect(),
            ..config
        },
        None => config,
    };
    let mut client = Client::connect(config.clone()).await?;
    let Some(target) = target else { return Ok((client, None)) };
    let description = client.describe(target.stream, target.topic).await?;
    let Some(index) = description.partitions.iter().position(|p| p.partition == target.partition)
    else {
        return Ok((client, None));
    };
    let primary = description.primaries.get(index).map(|p| p.primary);
    let nodes = client.node_addresses();
    let address_of = |node: u8| nodes.iter().find(|(index, _)| *index == node).map(|(_, a)| a);
    if let Some(address) = primary.and_then(address_of)
        && client.address() != Some(address.as_str())
    {
        let seeds = std::iter::once(address.clone()).chain(config.seeds.iter().cloned());
        client = Client::connect(ClientConfig { seeds: seeds.collect(), ..config }).await?;
    }
    let owner = description.partitions[index].shard;
    if to_owner {
        client.connect_to_shard(owner).await?;
    }
    let served_by = client.server().filter(|hello| hello.version >= 2).map(|hello| hello.shard);
    Ok((client, served_by.map(|shard| shard == owner)))
}

/// What an actor (or, merged, a side of the run) moved.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Measured messages (after warm-up).
    pub messages: u64,
    /// Measured payload bytes.
    pub bytes: u64,
    /// Every message, warm-up included.
    pub messages_total: u64,
    /// From the start of the first measured operation to the end of the last, in nanoseconds
    /// since the run's start.
    pub window_ns: Option<(u64, u64)>,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
}

impl Tally {
    /// Counts messages moved, measured or not.
    pub fn moved(&mut self, messages: u64) {
        self.messages_total += messages;
    }

    /// Counts an operation from `start_ns` to `end_ns` as measured.
    pub fn measured(&mut self, start_ns: u64, end_ns: u64, messages: u64, bytes: u64) {
        self.messages += messages;
        self.bytes += bytes;
        self.window_ns = Some(match self.window_ns {
            Some((from, to)) => (from.min(start_ns), to.max(end_ns)),
            None => (start_ns, end_ns),
        });
    }

    /// Counts an error.
    pub fn error(&mut self, kind: impl Into<String>) {
        *self.errors.entry(kind.into()).or_default() += 1;
    }

    /// Adds another tally (the window spans both).
    pub fn merge(&mut self, other: &Tally) {
        self.messages += other.messages;
        self.bytes += other.bytes;
        self.messages_total += other.messages_total;
        if let Some((from, to)) = other.window_ns {
            self.measured(from, to, 0, 0);
        }
        for (kind, count) in &other.errors {
            *self.errors.entry(kind.clone()).or_default() += count;
        }
    }

    /// Length of the measured window.
    pub fn seconds(&self) -> f64 {
        self.window_ns.map_or(0.0, |(from, to)| to.saturating_sub(from) as f64 / 1e9)
    }

    /// Measured messages and throughput, as the report shows them.
    pub fn throughput_json(&self) -> Value {
        json!({
            "messages": self.messages,
            "throughput_msg_s": rate(self.messages as f64, self.seconds()),
            "throughput_mb_s": rate(self.bytes as f64 / 1e6, self.seconds()),
        })
    }
}

/// `amount` per second, rounded to hundredths (0 for an empty window).
pub fn rate(amount: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { ((amount / seconds) * 100.0).round() / 100.0 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_tallies_merge_windows_and_errors() {
        let mut a = Tally::default();
        a.moved(10);
        a.measured(0, 1_000_000_000, 5, 500);
        a.error("Busy");
        let mut b = Tally::default();
        b.measured(500_000_000, 2_000_000_000, 5, 500);
        b.error("Busy");
        let mut all = Tally::default();
        all.merge(&a);
        all.merge(&b);
        assert_eq!((all.messages, all.bytes, all.messages_total), (10, 1000, 10));
        // A window that starts at time 0 counts from 0.
        assert_eq!(all.window_ns, Some((0, 2_000_000_000)));
        assert_eq!(all.errors["Busy"], 2);
        assert_eq!(all.throughput_json()["throughput_msg_s"], 5.0);
        assert_eq!(Tally::default().throughput_json()["throughput_mb_s"], 0.0);
    }
}
