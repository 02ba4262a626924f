//! The deterministic simulated disk and the single-threaded executor that drives it.
//!
//! It owns an in-memory namespace (directories and files), every file's durable and volatile
//! bytes, the set of I/O operations in flight, a seeded PRNG ([`crate::rng::Rng`]) and the fault counters
//! ([`SimStats`]). Engine code that runs on io_uring runs here unchanged, through [`SimStorage`],
//! and one seed decides everything: which in-flight operation completes next, which reads fail,
//! and what a crash leaves behind. It must never read a clock, spawn a thread, iterate a hash map
//! or otherwise let anything but the seed and the calls made on it change an outcome; a failing
//! seed has to reproduce bit for bit.
//!
//! I/O model: `open`, `write_at`, `read_at`, `sync_data`, `sync_dir`, `rename`, `remove_file` and
//! `create_dir_all` register with the in-flight set on first poll and stay pending. Only when no
//! task is runnable does the executor complete *one* in-flight operation, chosen by the PRNG, and
//! apply its effect then: a write is visible to reads only from its completion on. `size_bytes`,
//! `exists` and `list_dir` are metadata lookups answered at once (they are not counted as I/O
//! completions). A sync makes durable what had *completed when the sync was submitted* (writes to
//! its file for `sync_data`; creates, renames, removes and mkdirs in its directory for
//! `sync_dir`), never anything that completed while it was in flight.
//!
//! Crash semantics ([`Sim::crash`], [`Sim::run_until_crash`]): every task and every open handle is
//! dropped or invalidated. Writes still in flight are treated as completed-but-unsynced writes
//! (the device may have taken them before the power went), provided they fit the capacity. Then,
//! file by file in path-independent inode order, each unsynced write independently survives with
//! probability 1/2, applied in completion order onto the durable bytes; a surviving write that
//! spans at least two sectors is torn with probability `1 / torn_write_one_in`, in which case
//! each sector it touches (sectors are absolute, `sector_size_bytes` each) is independently kept
//! or lost, at least one of each. Each unsynced namespace operation independently survives with
//! probability 1/2, applied in order onto the durable namespace; entries whose parent directory
//! did not survive are dropped. What results is the new durable state and nothing is pending.
//! Other namespace operations in flight are lost.

mod disk;
mod executor;
#[cfg(test)]
mod tests;

pub use disk::{SimConfig, SimFile, SimStats, SimStorage};
pub use executor::{JoinHandle, Sim, Spawner};
