//! The engine's error type: what can legitimately go wrong at the storage layer, each with the
//! facts an operator needs to act on it.
//!
//! Programming errors are not here: they are `assert!`s. Input from a file is never asserted:
//! a damaged file is a [`Corruption`], never a panic.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Damage found where the fault model says data must be intact: before a file's torn window.
/// Never truncated away; the partition refuses service until an operator (or replication)
/// repairs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    /// The damaged file.
    pub file: PathBuf,
    /// Byte position of the first damaged record (or block) in the file.
    pub position_bytes: u64,
    /// The message offset the damaged record should start at, when known.
    pub offset: Option<u64>,
    /// The op the damaged record should hold, when known.
    pub op: Option<u64>,
    /// What check failed.
    pub reason: String,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corruption in {} at byte {}", self.file.display(), self.position_bytes)?;
        if let Some(offset) = self.offset {
            write!(f, " (offset {offset})")?;
        }
        if let Some(op) = self.op {
            write!(f, " (op {op})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// An engine error.
#[derive(Debug)]
pub enum Error {
    /// An I/O call failed. The partition (or shard file) it came from is now fail-stop until it
    /// is reopened.
    Io {
        /// What the engine was doing.
        context: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// The disk has no room to make space ready ahead of the tail (or to create a file or an
    /// index before anything depends on it): the one clean, retryable failure of an append.
    /// Nothing written is affected; the step is retried once space may be back.
    StorageFull,
    /// Stored data failed its checks before the torn window.
    Corruption(Corruption),
    /// The partition refuses work: it hit an I/O failure or corruption earlier.
    Faulty {
        /// The group whose log refuses work.
        group: u64,
        /// Why, as first reported.
        reason: String,
    },
    /// A request the engine's limits or state refuse; the message says which.
    Invalid(String),
    /// A bounded table or buffer is full.
    LimitReached(String),
    /// The data directory belongs to another configuration (shard count, cluster).
    Mismatch(String),
}

impl Error {
    /// Wraps an I/O error with what the engine was doing. ENOSPC stays an I/O error here: a data
    /// write, a sync, a journal or superblock write that runs out of space broke the promise
    /// that writes only go into space made ready, so it is fail-stop like any other failure
    /// (after a failed sync the page cache may already have dropped the data).
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// Wraps an I/O error of a step that only *prepares* space — reserving it ahead of a
    /// segment's tail, creating a segment file or a group directory, writing a rebuildable
    /// index file — where no data depends on the outcome yet. There, and only there, ENOSPC
    /// (or an exhausted quota, EDQUOT) is the clean, retryable [`Error::StorageFull`].
    pub fn preparing(context: impl Into<String>, source: io::Error) -> Self {
        const ENOSPC: i32 = 28;
        const EDQUOT: i32 = 122;
        let full = matches!(source.raw_os_error(), Some(ENOSPC | EDQUOT))
            || matches!(source.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded);
        if full {
            return Error::StorageFull;
        }
        Error::io(context, source)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { context, source } => write!(f, "I/O error while {context}: {source}"),
            Error::StorageFull => write!(f, "storage full: free disk space, then retry"),
            Error::Corruption(corruption) => corruption.fmt(f),
            Error::Faulty { group, reason } => {
                write!(f, "group {group} refuses work until it is recovered: {reason}")
            }
            Error::Invalid(reason) => write!(f, "invalid request: {reason}"),
            Error::LimitReached(reason) => write!(f, "limit reached: {reason}"),
            Error::Mismatch(reason) => write!(f, "data directory mismatch: {reason}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
