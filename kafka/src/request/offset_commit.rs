//! The OffsetCommit request (key 8), versions 2–9: a consumer group's member commits the
//! offsets it has consumed to, per partition, by topic name.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics, and partitions per topic, one OffsetCommit request may name.
pub const OFFSET_COMMIT_TOPICS_MAX: usize = 10_000;
pub const OFFSET_COMMIT_PARTITIONS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitRequest {
    pub group_id: String,
    /// The classic group's generation (-1 for a commit from outside any generation, as a
    /// standalone consumer or an admin client sends), or the member epoch of the consumer
    /// protocol (KIP-848).
    pub generation_id_or_member_epoch: i32,
    /// Empty for a commit from outside the group.
    pub member_id: String,
    /// v7+: the static member's instance id (KIP-345); `None` for a dynamic member and
    /// before v7.
    pub group_instance_id: Option<String>,
    pub topics: Vec<OffsetCommitTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitTopic {
    pub name: String,
    pub partitions: Vec<OffsetCommitPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitPartition {
    pub index: i32,
    /// The next offset the group will consume.
    pub committed_offset: i64,
    /// v6+: the leader epoch of the last record consumed; -1 when unknown and before v6.
    pub committed_leader_epoch: i32,
    /// The client's own note kept beside the offset (`None`: null).
    pub committed_metadata: Option<String>,
}

impl OffsetCommitRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<OffsetCommitRequest, DecodeError> {
        let flexible = version >= 8;
        let group_id = reader.string("group id", flexible)?;
        let generation_id_or_member_epoch = reader.i32("generation id")?;
        let member_id = reader.string("member id", flexible)?;
        let group_instance_id = if version >= 7 {
            reader.nullable_string("group instance id", flexible)?
        } else {
            None
        };
        if version <= 4 {
            // How long to keep the offsets: ignored, the broker's own retention decides (as
            // it does from v5, which dropped the field).
            reader.i64("retention time")?;
        }
        let count =
            reader.array_len("offset commit topics", flexible, 3, OFFSET_COMMIT_TOPICS_MAX)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            // A partition is at least an index, an offset and a metadata length.
            let count = reader.array_len(
                "offset commit partitions",
                flexible,
                14,
                OFFSET_COMMIT_PARTITIONS_MAX,
            )?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = reader.i32("partition index")?;
                let committed_offset = reader.i64("committed offset")?;
                let committed_leader_epoch =
                    if version >= 6 { reader.i32("committed leader epoch")? } else { -1 };
                let committed_metadata = reader.nullable_string("committed metadata", flexible)?;
                reader.skip_tagged_fields(flexible)?;
                partitions.push(OffsetCommitPartition {
                    index,
                    committed_offset,
                    committed_leader_epoch,
                    committed_metadata,
                });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(OffsetCommitTopic { name, partitions });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(OffsetCommitRequest {
            group_id,
            generation_id_or_member_epoch,
            member_id,
            group_instance_id,
            topics,
        })
    }
}
