//! The data-directory checker: walks a node's data directory (or one shard directory) and
//! verifies every file the engine owns — superblock copies, group segments and their indexes, and
//! the shard journal — against the rules recovery relies on (DESIGN.md §3), reporting what it
//! found and, precisely, where the first damage lies.
//!
//! It owns only the *reading* of those files and the classification of what it sees:
//! damage where the fault model says data must be intact (before a group's checkpoint, in the
//! synced part of the journal, a torn superblock copy) is a problem; the torn window past a
//! checkpoint, zeros and stale bytes past the chain's end are notes. `shoal-inspect` and the
//! simulator both call [`inspect`], generic over [`Storage`](crate::storage::Storage), so it runs
//! on real and on simulated disks alike.
//!
//! It must never write, create, rename or remove anything (an operator runs it on a directory
//! that may be evidence), never panic on any file contents or missing files, and never allocate
//! or read by a length it has not bounded first: segments are read in windows, whatever their
//! size.

mod checker;
mod group;
mod journal;
mod report;
mod superblock;
#[cfg(test)]
mod tests;

pub use checker::inspect;
pub use report::{
    CopyInfo, CopyReport, GroupReport, IndexStatus, InspectReport, JournalGroup, JournalReport,
    Note, SegmentEnd, SegmentReport, ShardReport, SuperblockReport,
};
