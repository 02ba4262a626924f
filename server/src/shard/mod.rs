//! One shard: a thread with its own io_uring runtime that owns the shard's storage and replicas
//! (the node layer over the io_uring backend), serves the connections it accepts, and executes
//! the work routed to its partitions from any shard.
//!
//! Everything a shard owns is touched by its loop alone: connection tasks and other shards hand
//! it [`Work`] through its bounded inbox, and it answers through each item's reply slot. Between
//! inbox batches it ticks the replicas, runs one I/O round (which makes everything submitted
//! meanwhile durable together), answers what committed, and, on shard 0, applies committed
//! metadata and publishes the new catalog. It never shares mutable state with another shard; the
//! published catalog is immutable and read through [`Published`](crate::metadata::Published).
//!
//! The shard's `[shard]` tuning is applied here: its runtime's ring (`uring_entries`, SQPOLL),
//! direct or buffered files (`direct_io`), how long the loop holds new writes back before an I/O
//! round so that more of them share one flush cycle ([`FlushGate`], `flush_delay_us_max`), and
//! the segment age its new partitions get (`segment_age_ms_max`).
//!
//! By job: `work` is what the inbox carries and what it answers; `thread` the shard's life from
//! pinning to shutdown, with start-up recovery; `state` what the loop owns; `event_loop` the
//! loop itself; `handoff` its controlled shutdown (the groups it leads handed to peers before
//! the loop stops); `flush_gate` its group commit; `writes` the queue and pending table of
//! produce and offset writes; `fetch` reads and long-polls; `offsets` consumer offsets in the
//! partition logs; `snapshots` the state snapshots; `transfer` the machines' part of state
//! transfers; `catalog` the partition groups the catalog
//! places here; `deletion` the ones it lets go; `metadata` shard 0's metadata state machine; `coordinator` its consumer groups; `kafka_coordinator` the Kafka ones;
//! `formation` how shard 0 of a node with an empty data directory forms its cluster or rejoins
//! it.

mod catalog;
mod coordinator;
mod deletion;
mod event_loop;
mod fetch;
mod flush_gate;
mod formation;
mod handoff;
mod kafka_coordinator;
mod metadata;
mod moves;
mod offsets;
mod snapshots;
mod state;
mod thread;
mod transfer;
mod work;
mod writes;

pub use flush_gate::FlushGate;
pub use formation::{FORMATION_FILE, read as read_formation};
pub use offsets::CONSUMERS_PER_PARTITION_MAX;
pub use thread::{ShardSpec, now_ms, run};
pub use work::{
    Body, FetchArgs, GroupRequest, GroupStats, KafkaGroupReply, KafkaGroupRequest, Mesh, Outcome,
    ReplySender, ShardReport, Work, mesh,
};
