//! One stored record — a prepare header followed by its body — and the checks that make it
//! *valid* (DESIGN.md §3 Recovery): header checksum, body checksum, cluster and group, and its
//! place in the chain (op = previous op + 1, parent = previous checksum, dense offsets).
//!
//! Segments and the journal both hold records; this module owns what a record is, never where
//! it lives or what to do when it is invalid (that is recovery's call).

use crate::superblock::Fence;
use crate::wire::{HEADER_SIZE, Header, Prepare};

/// What the next record of a chain must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainNext {
    /// Cluster id every record carries.
    pub cluster: u64,
    /// The group whose log this is.
    pub group: u64,
    /// The op the next record must hold.
    pub op: u64,
    /// The `checksum_header` the next record must name as its parent.
    pub parent: u32,
    /// The offset the next record must start at.
    pub offset: u64,
}

impl ChainNext {
    /// The chain position after `header`.
    #[must_use]
    pub fn after(&self, header: &Header) -> ChainNext {
        let prepare = prepare_of(header);
        ChainNext {
            cluster: self.cluster,
            group: self.group,
            op: prepare.op + 1,
            parent: header.checksum_header,
            offset: prepare.end_offset(),
        }
    }
}

/// Why bytes are not the next valid record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordFault {
    /// The header region is all zeros: end of data, not damage.
    Zeroed,
    /// Fewer bytes than a header (or than the header's declared size) remain.
    Short,
    /// The header fails to decode (checksum, version, command, reserved bytes).
    BadHeader(String),
    /// The record's size is outside the configured bound.
    TooLarge {
        /// Declared size in bytes.
        size_bytes: u64,
    },
    /// The body's checksum does not match the header.
    BadBody,
    /// A valid record of another cluster or group (a stale or misdirected file).
    Foreign,
    /// A valid record that is not the next link of the chain (stale data past the end, or a
    /// record a truncation fence killed).
    ChainBreak {
        /// The op it holds.
        op: u64,
    },
}

impl RecordFault {
    /// Whether the bytes were a record that is now damaged (torn, or hit by latent damage),
    /// rather than the end of data: zeros, or a valid record that belongs elsewhere.
    pub fn is_damage(&self) -> bool {
        match self {
            RecordFault::Short
            | RecordFault::BadHeader(_)
            | RecordFault::TooLarge { .. }
            | RecordFault::BadBody => true,
            RecordFault::Zeroed | RecordFault::Foreign | RecordFault::ChainBreak { .. } => false,
        }
    }
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordFault::Zeroed => write!(f, "zeroed header (end of data)"),
            RecordFault::Short => write!(f, "record cut short"),
            RecordFault::BadHeader(reason) => write!(f, "bad header: {reason}"),
            RecordFault::TooLarge { size_bytes } => {
                write!(f, "record size {size_bytes} out of bounds")
            }
            RecordFault::BadBody => write!(f, "body checksum mismatch"),
            RecordFault::Foreign => write!(f, "record of another cluster or group"),
            RecordFault::ChainBreak { op } => write!(f, "op {op} does not continue the chain"),
        }
    }
}

/// Decodes and checks the record at the start of `bytes` against `next` (and `fence`). On
/// success returns the header; the record is `header.size` bytes long.
pub fn check_next(
    bytes: &[u8],
    next: &ChainNext,
    fence: &Fence,
    record_size_bytes_max: usize,
) -> Result<Header, RecordFault> {
    let header = check_standalone(bytes, next.cluster, next.group, record_size_bytes_max)?;
    let prepare = prepare_of(&header);
    if prepare.op != next.op
        || prepare.parent != next.parent
        || prepare.base_offset != next.offset
        || fence.kills(prepare.op, header.view)
    {
        return Err(RecordFault::ChainBreak { op: prepare.op });
    }
    Ok(header)
}

/// Decodes and checks a record on its own (checksums, cluster, group, size bound), without
/// asking where it sits in the chain.
pub fn check_standalone(
    bytes: &[u8],
    cluster: u64,
    group: u64,
    record_size_bytes_max: usize,
) -> Result<Header, RecordFault> {
    let Some(head) = bytes.first_chunk::<HEADER_SIZE>() else {
        return if crate::wire::is_zeroed(bytes) {
            Err(RecordFault::Zeroed)
        } else {
            Err(RecordFault::Short)
        };
    };
    if crate::wire::is_zeroed(head) {
        return Err(RecordFault::Zeroed);
    }
    let header = Header::decode(head).map_err(|e| RecordFault::BadHeader(e.to_string()))?;
    let Some(prepare) = header.as_prepare() else {
        return Err(RecordFault::BadHeader("not a prepare".to_string()));
    };
    let size = header.size as usize;
    if size > record_size_bytes_max {
        return Err(RecordFault::TooLarge { size_bytes: u64::from(header.size) });
    }
    if bytes.len() < size {
        return Err(RecordFault::Short);
    }
    header.verify_body(&bytes[HEADER_SIZE..size]).map_err(|_| RecordFault::BadBody)?;
    if header.cluster != cluster || prepare.group != group {
        return Err(RecordFault::Foreign);
    }
    // What follows a record must be computable: the chain's next op and offset never overflow,
    // whatever a damaged but well-formed file claims.
    if prepare.op == u64::MAX
        || prepare.base_offset.checked_add(u64::from(prepare.record_count)).is_none()
    {
        return Err(RecordFault::BadHeader("op or offset out of range".to_string()));
    }
    Ok(header)
}

/// The prepare fields of a header the engine already checked is a prepare.
///
/// # Panics
/// If it is not a prepare: every header reaching this point passed [`check_standalone`] or was
/// built by the engine.
#[must_use]
pub fn prepare_of(header: &Header) -> &Prepare {
    header.as_prepare().expect("engine records are prepares")
}

/// Builds the sealed header of the next prepare of a chain: `fields` supplies what the caller
/// decides (record count, timestamps, client, session, request, commit); group, op, parent and
/// base offset come from `next`.
#[must_use]
pub fn build_prepare(
    next: &ChainNext,
    view: u32,
    replica: u8,
    mut fields: Prepare,
    body: &[u8],
) -> Header {
    fields.group = next.group;
    fields.op = next.op;
    fields.parent = next.parent;
    fields.base_offset = next.offset;
    Header::prepare(next.cluster, view, replica, fields, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(op: u64, base_offset: u64) -> Vec<u8> {
        let fields = Prepare { group: 1, op, base_offset, record_count: 2, ..Prepare::default() };
        let header = Header::prepare(5, 1, 0, fields, b"body");
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(b"body");
        bytes
    }

    #[test]
    fn records_whose_successor_would_overflow_are_refused_not_panicked_on() {
        assert!(check_standalone(&record(7, 10), 5, 1, 1024).is_ok());
        for bytes in [record(u64::MAX, 0), record(3, u64::MAX - 1)] {
            let fault = check_standalone(&bytes, 5, 1, 1024).unwrap_err();
            assert!(matches!(fault, RecordFault::BadHeader(_)), "{fault}");
        }
    }
}
