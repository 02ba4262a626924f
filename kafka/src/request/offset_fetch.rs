//! The OffsetFetch request (key 9), versions 1–9: the offsets a consumer group has committed,
//! for named partitions or (v2+, a null topic list) every partition it has committed for.
//! v1–7 ask about one group; v8+ about a batch of groups (KIP-709), each read into the same
//! shape.

use crate::error::DecodeError;
use crate::read::Reader;

/// Groups, topics per group, and partitions per topic one OffsetFetch request may name.
pub const OFFSET_FETCH_GROUPS_MAX: usize = 10_000;
pub const OFFSET_FETCH_TOPICS_MAX: usize = 10_000;
pub const OFFSET_FETCH_PARTITIONS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchRequest {
    /// The one group of v1–7, the batch of v8+.
    pub groups: Vec<OffsetFetchGroup>,
    /// v7+: whether offsets of pending transactions must be resolved first (Shoal has no
    /// transactions, so none are pending); `false` before v7.
    pub require_stable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchGroup {
    pub group_id: String,
    /// `None`: every topic the group has committed offsets for (v2+; v1 always names them).
    pub topics: Option<Vec<OffsetFetchTopic>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchTopic {
    pub name: String,
    /// Partition indexes.
    pub partitions: Vec<i32>,
}

impl OffsetFetchRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<OffsetFetchRequest, DecodeError> {
        let flexible = version >= 6;
        let groups = if version <= 7 {
            let group_id = reader.string("group id", flexible)?;
            let at = reader.position();
            let topics = decode_topics(reader, flexible)?;
            if version == 1 && topics.is_none() {
                // "Every topic" came with v2; a v1 client never sends it.
                return Err(DecodeError::Invalid {
                    what: "offset fetch topics",
                    at,
                    reason: "null before v2",
                });
            }
            vec![OffsetFetchGroup { group_id, topics }]
        } else {
            // A group is at least a group id length, a topic count and its tagged fields.
            let count =
                reader.array_len("offset fetch groups", true, 3, OFFSET_FETCH_GROUPS_MAX)?;
            let mut groups = Vec::with_capacity(count);
            for _ in 0..count {
                let group_id = reader.string("group id", true)?;
                if version >= 9 {
                    // The member asking, for the consumer protocol (KIP-848) to check its
                    // epoch; a classic group's offsets are read by anyone.
                    reader.nullable_string("member id", true)?;
                    reader.i32("member epoch")?;
                }
                let topics = decode_topics(reader, true)?;
                reader.skip_tagged_fields(true)?;
                groups.push(OffsetFetchGroup { group_id, topics });
            }
            groups
        };
        let require_stable = if version >= 7 { reader.bool("require stable")? } else { false };
        reader.skip_tagged_fields(flexible)?;
        Ok(OffsetFetchRequest { groups, require_stable })
    }
}

/// A nullable list of topics, each a name and its partition indexes (the same on the wire in
/// v1–7 and in v8+'s groups).
fn decode_topics(
    reader: &mut Reader,
    flexible: bool,
) -> Result<Option<Vec<OffsetFetchTopic>>, DecodeError> {
    // A topic is at least a name length, a partition count and (flexible) its tagged fields.
    let Some(count) =
        reader.nullable_array_len("offset fetch topics", flexible, 3, OFFSET_FETCH_TOPICS_MAX)?
    else {
        return Ok(None);
    };
    let mut topics = Vec::with_capacity(count);
    for _ in 0..count {
        let name = reader.string("topic name", flexible)?;
        let count = reader.array_len(
            "offset fetch partitions",
            flexible,
            4,
            OFFSET_FETCH_PARTITIONS_MAX,
        )?;
        let mut partitions = Vec::with_capacity(count);
        for _ in 0..count {
            partitions.push(reader.i32("partition index")?);
        }
        reader.skip_tagged_fields(flexible)?;
        topics.push(OffsetFetchTopic { name, partitions });
    }
    Ok(Some(topics))
}
