//! The DeleteRecords request (key 21), versions 0–2: for each partition, the offset below which
//! its records are deleted (−1: the high watermark). Sent to each partition's leader.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics, and partitions per topic, one DeleteRecords request may name.
pub const DELETE_RECORDS_TOPICS_MAX: usize = 10_000;
pub const DELETE_RECORDS_PARTITIONS_MAX: usize = 10_000;

/// The `offset` that names the high watermark.
pub const HIGH_WATERMARK: i64 = -1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsRequest {
    pub topics: Vec<DeleteRecordsTopic>,
    pub timeout_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsTopic {
    pub name: String,
    pub partitions: Vec<DeleteRecordsPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsPartition {
    pub index: i32,
    /// Records below this offset are deleted; [`HIGH_WATERMARK`]: all of them.
    pub offset: i64,
}

impl DeleteRecordsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<DeleteRecordsRequest, DecodeError> {
        let flexible = version >= 2;
        let count =
            reader.array_len("delete records topics", flexible, 3, DELETE_RECORDS_TOPICS_MAX)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            let count = reader.array_len(
                "delete records partitions",
                flexible,
                12,
                DELETE_RECORDS_PARTITIONS_MAX,
            )?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = reader.i32("partition index")?;
                let offset = reader.i64("offset")?;
                reader.skip_tagged_fields(flexible)?;
                partitions.push(DeleteRecordsPartition { index, offset });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(DeleteRecordsTopic { name, partitions });
        }
        let timeout_ms = reader.i32("timeout")?;
        reader.skip_tagged_fields(flexible)?;
        Ok(DeleteRecordsRequest { topics, timeout_ms })
    }
}
