//! The Fetch request (key 1), versions 4–16: where each partition's consumer is, how long to
//! wait and how much to return.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics, and partitions per topic, one Fetch request may name.
pub const FETCH_TOPICS_MAX: usize = 10_000;
pub const FETCH_PARTITIONS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    /// The whole response's byte bound (at least one batch is returned all the same).
    pub max_bytes: i32,
    /// v7+: the fetch session (KIP-227); Shoal keeps none and answers session 0, so clients
    /// send full requests.
    pub session_id: i32,
    pub topics: Vec<FetchTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchTopic {
    /// The topic's name (v4–12); `None` from v13, which names topics by id.
    pub name: Option<String>,
    /// The topic id (v13+; zero before).
    pub topic_id: [u8; 16],
    pub partitions: Vec<FetchPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPartition {
    pub index: i32,
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
}

impl FetchRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<FetchRequest, DecodeError> {
        let flexible = version >= 12;
        if version <= 14 {
            reader.i32("replica id")?;
        }
        let max_wait_ms = reader.i32("max wait")?;
        let min_bytes = reader.i32("min bytes")?;
        let max_bytes = reader.i32("max bytes")?;
        // read_committed and read_uncommitted read alike: Shoal has no transactions.
        reader.i8("isolation level")?;
        let session_id = if version >= 7 {
            let id = reader.i32("session id")?;
            reader.i32("session epoch")?;
            id
        } else {
            0
        };
        let count = reader.array_len("fetch topics", flexible, 3, FETCH_TOPICS_MAX)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let (name, topic_id) = if version >= 13 {
                (None, reader.uuid("topic id")?)
            } else {
                (Some(reader.string("topic name", flexible)?), [0; 16])
            };
            let count = reader.array_len("fetch partitions", flexible, 16, FETCH_PARTITIONS_MAX)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = reader.i32("partition index")?;
                if version >= 9 {
                    reader.i32("current leader epoch")?;
                }
                let fetch_offset = reader.i64("fetch offset")?;
                if version >= 12 {
                    reader.i32("last fetched epoch")?;
                }
                if version >= 5 {
                    reader.i64("log start offset")?;
                }
                let partition_max_bytes = reader.i32("partition max bytes")?;
                reader.skip_tagged_fields(flexible)?;
                partitions.push(FetchPartition { index, fetch_offset, partition_max_bytes });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(FetchTopic { name, topic_id, partitions });
        }
        if version >= 7 {
            // Topics the client stops fetching in its session; without sessions, nothing to do.
            let count = reader.array_len("forgotten topics", flexible, 3, FETCH_TOPICS_MAX)?;
            for _ in 0..count {
                if version >= 13 {
                    reader.uuid("forgotten topic id")?;
                } else {
                    reader.string("forgotten topic", flexible)?;
                }
                let count =
                    reader.array_len("forgotten partitions", flexible, 4, FETCH_PARTITIONS_MAX)?;
                for _ in 0..count {
                    reader.i32("forgotten partition")?;
                }
                reader.skip_tagged_fields(flexible)?;
            }
        }
        if version >= 11 {
            reader.string("rack id", flexible)?;
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(FetchRequest { max_wait_ms, min_bytes, max_bytes, session_id, topics })
    }
}
