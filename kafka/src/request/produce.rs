//! The Produce request (key 0), versions 3–10: record batches for partitions, by topic name.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics one Produce request may name, and partitions per topic (a client batches what it
/// has for one broker; Kafka itself has no bound but the request size).
pub const PRODUCE_TOPICS_MAX: usize = 10_000;
pub const PRODUCE_PARTITIONS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequest {
    /// Set only by transactional producers, which Shoal does not serve yet.
    pub transactional_id: Option<String>,
    /// 0: no response; 1: the leader's append; -1: the whole in-sync set.
    pub acks: i16,
    pub timeout_ms: i32,
    pub topics: Vec<ProduceTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceTopic {
    pub name: String,
    pub partitions: Vec<ProducePartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducePartition {
    pub index: i32,
    /// The partition's record batches as sent (a slice of the frame; `None`: null).
    pub records: Option<Bytes>,
}

impl ProduceRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<ProduceRequest, DecodeError> {
        let flexible = version >= 9;
        let transactional_id = reader.nullable_string("transactional id", flexible)?;
        let acks = reader.i16("acks")?;
        let timeout_ms = reader.i32("timeout")?;
        // A topic is at least a name length and a partition count; a partition an index and a
        // records length.
        let count = reader.array_len("produce topics", flexible, 3, PRODUCE_TOPICS_MAX)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            let count =
                reader.array_len("produce partitions", flexible, 5, PRODUCE_PARTITIONS_MAX)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = reader.i32("partition index")?;
                let records = reader.nullable_bytes("records", flexible)?;
                reader.skip_tagged_fields(flexible)?;
                partitions.push(ProducePartition { index, records });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(ProduceTopic { name, partitions });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(ProduceRequest { transactional_id, acks, timeout_ms, topics })
    }
}
