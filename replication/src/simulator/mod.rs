//! The deterministic cluster simulator: a whole cluster — nodes running the real node layer
//! and engine over simulated disks, clients, and a faulty network — driven in one thread from
//! one `u64` seed (DESIGN.md §7).
//!
//! It owns the cluster under test, the fault schedule, the clients' workload and the invariant
//! checks, which run as the simulation goes: committed prefixes agree on every replica (by
//! checksum), every acknowledged write sits at its acknowledged offset in the final log, view
//! and log view never regress across restarts, offsets are dense, and once faults stop every
//! client completes its requests within a bound. It never reads a clock, spawns a thread or
//! touches a real file, and iterates only ordered collections, so a seed reproduces bit for bit
//! (the trace hash proves it).
//!
//! A run has two phases. The fault phase injects what the seed's [`FaultProfile`] draws —
//! message delay, loss, duplication and reordering; symmetric and one-way partitions and
//! isolation; pauses; crashes at any tick, as a process crash (the page cache survives) or a
//! power loss (the simulated disk's crash semantics), sometimes in the middle of an I/O round;
//! storage faults: bit flips at rest in a crashed node's newest durable records (at most one
//! replica per op until it has cut and repaired them), read errors, a full disk; controlled
//! shutdowns that hand a node's primaries over before it stops — within the fault model of
//! DESIGN.md §6 for the seed's durability mode. The liveness phase heals
//! everything and requires every client to finish and every replica to rejoin; the end checks
//! the final logs and runs the offline checker (`shoal_engine::inspect`) over every disk.
//!
//! Its parts: the options of a run (`options`), the cluster and its hosts (`cluster`), the
//! run and its steps (`steps`), the faults (`faults`), the controlled shutdowns (`shutdowns`),
//! the clients (`clients`), the invariant checks (`checks`), the server's driver above the
//! replicas (`driver`, with the admin group's machine in `admin`), the coverage counters
//! (`coverage`), the trace hash (`trace`), the network (`network`) and the helpers of scripted
//! scenarios (`script`).

mod admin;
mod checks;
mod clients;
mod cluster;
mod coverage;
mod driver;
mod faults;
pub mod network;
mod options;
mod script;
mod shutdowns;
mod steps;
mod trace;

pub use checks::Violation;
pub use cluster::Cluster;
pub use coverage::Coverage;
pub use options::{FaultProfile, Mode, SimOptions};
pub use shutdowns::SHUTDOWN_TICKS_MAX;
pub use steps::{Outcome, RETENTION_INTERVAL_TICKS, run};
