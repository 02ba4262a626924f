//! The ListOffsets request (key 2), versions 1–7: for each partition, the offset at a time,
//! or the earliest, latest or (v7, KIP-734) largest-timestamp offset. v7 reads as v6: it only
//! allows the new timestamp.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics, and partitions per topic, one ListOffsets request may name.
pub const LIST_OFFSETS_TOPICS_MAX: usize = 10_000;
pub const LIST_OFFSETS_PARTITIONS_MAX: usize = 10_000;

/// `timestamp` asking for the latest offset (the end of the committed log).
pub const LATEST_TIMESTAMP: i64 = -1;
/// `timestamp` asking for the earliest offset still held.
pub const EARLIEST_TIMESTAMP: i64 = -2;
/// `timestamp` asking for the record with the largest timestamp (v7).
pub const MAX_TIMESTAMP: i64 = -3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsRequest {
    pub topics: Vec<ListOffsetsTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsTopic {
    pub name: String,
    pub partitions: Vec<ListOffsetsPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsPartition {
    pub index: i32,
    /// A time in ms since the Unix epoch, [`LATEST_TIMESTAMP`] or [`EARLIEST_TIMESTAMP`].
    pub timestamp: i64,
}

impl ListOffsetsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<ListOffsetsRequest, DecodeError> {
        let flexible = version >= 6;
        reader.i32("replica id")?;
        if version >= 2 {
            // read_committed and read_uncommitted read alike: Shoal has no transactions.
            reader.i8("isolation level")?;
        }
        let count =
            reader.array_len("list offsets topics", flexible, 3, LIST_OFFSETS_TOPICS_MAX)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            let count = reader.array_len(
                "list offsets partitions",
                flexible,
                12,
                LIST_OFFSETS_PARTITIONS_MAX,
            )?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = reader.i32("partition index")?;
                if version >= 4 {
                    reader.i32("current leader epoch")?;
                }
                let timestamp = reader.i64("timestamp")?;
                reader.skip_tagged_fields(flexible)?;
                partitions.push(ListOffsetsPartition { index, timestamp });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(ListOffsetsTopic { name, partitions });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(ListOffsetsRequest { topics })
    }
}
