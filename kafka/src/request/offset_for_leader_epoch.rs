//! The OffsetForLeaderEpoch request (key 23), versions 2–4: for each partition, where a leader
//! epoch ends in the log, which a consumer asks after a leader change to detect truncation
//! (KIP-320).

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics, and partitions per topic, one OffsetForLeaderEpoch request may name.
pub const OFFSET_FOR_LEADER_EPOCH_TOPICS_MAX: usize = 10_000;
pub const OFFSET_FOR_LEADER_EPOCH_PARTITIONS_MAX: usize = 10_000;

/// `replica_id` of a consumer (v3+).
pub const CONSUMER_REPLICA_ID: i32 = -1;
/// `replica_id` read for v2, which does not carry it (Kafka's default, "debugging").
pub const DEBUGGING_REPLICA_ID: i32 = -2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderEpochRequest {
    /// v3+: [`CONSUMER_REPLICA_ID`] from a consumer, a broker id from a follower;
    /// [`DEBUGGING_REPLICA_ID`] in v2.
    pub replica_id: i32,
    pub topics: Vec<OffsetForLeaderEpochTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderEpochTopic {
    pub name: String,
    pub partitions: Vec<OffsetForLeaderEpochPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderEpochPartition {
    pub index: i32,
    /// The leader epoch the client knows (-1: none), to fence a stale leader or client.
    pub current_leader_epoch: i32,
    /// The epoch whose end offset is asked for.
    pub leader_epoch: i32,
}

impl OffsetForLeaderEpochRequest {
    pub fn decode(
        reader: &mut Reader,
        version: i16,
    ) -> Result<OffsetForLeaderEpochRequest, DecodeError> {
        let flexible = version >= 4;
        let replica_id =
            if version >= 3 { reader.i32("replica id")? } else { DEBUGGING_REPLICA_ID };
        let count = reader.array_len(
            "offset for leader epoch topics",
            flexible,
            3,
            OFFSET_FOR_LEADER_EPOCH_TOPICS_MAX,
        )?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            let count = reader.array_len(
                "offset for leader epoch partitions",
                flexible,
                12,
                OFFSET_FOR_LEADER_EPOCH_PARTITIONS_MAX,
            )?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = reader.i32("partition index")?;
                let current_leader_epoch = reader.i32("current leader epoch")?;
                let leader_epoch = reader.i32("leader epoch")?;
                reader.skip_tagged_fields(flexible)?;
                partitions.push(OffsetForLeaderEpochPartition {
                    index,
                    current_leader_epoch,
                    leader_epoch,
                });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(OffsetForLeaderEpochTopic { name, partitions });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(OffsetForLeaderEpochRequest { replica_id, topics })
    }
}
