//! The partition log: one VSR group's prepares in a sequence of segment files, with the write
//! buffer, the prepare ring, the sparse indexes, reads, truncation, retention and recovery.
//!
//! It owns the group's files and memory and nothing else: the shard decides when to flush,
//! when to checkpoint and when the superblock is written, and supplies journal entries at
//! recovery. Appends are synchronous memory operations (one copy into the write buffer); the
//! I/O happens in the [`FlushJob`] that [`PartitionLog::begin_flush`] hands the shard's flush
//! cycle, which gives it back to [`PartitionLog::finish_flush`] (and, for a small direct log's
//! space ahead, in the [`ZeroStep`] the shard's zero fill runs beside it). The log
//! checks view, op and commit only for continuity and checksums; it knows nothing of quorums.

mod append;
mod direct;
mod flush;
mod log;
mod read;
mod recover;
mod retention;
mod settle;
mod truncate;
mod zero_fill;

pub use append::WRITE_BUFFER_FULL;
pub use flush::{FlushDone, FlushJob, WRITE_PIECE_BYTES, WriteOutcome};
#[cfg(feature = "inspect")]
pub(crate) use log::spare_holds_records;
pub use log::{FaultyOps, PartitionLog, Shared};
pub use read::{DiskRead, DiskReadDone, ReadPlan};
pub use recover::{GroupRecovery, JournalPrepare};
pub use retention::RETIRED_FILES_MAX;
pub use settle::{CheckpointCandidate, SettleJob};
pub use zero_fill::{ZERO_STEPS_PER_FILL_MAX, ZeroStep, ZeroStepDone};
