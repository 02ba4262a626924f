//! The CreatePartitions request (key 37), versions 0–3: an admin client grows topics to a new
//! partition count, optionally naming each new partition's replicas.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics one CreatePartitions request may grow.
pub const CREATE_PARTITIONS_TOPICS_MAX: usize = 10_000;
/// New partitions one topic's assignments may name.
pub const CREATE_PARTITIONS_ASSIGNMENTS_MAX: usize = 10_000;
/// Brokers one new partition's assignment may name.
pub const CREATE_PARTITIONS_BROKER_IDS_MAX: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsRequest {
    pub topics: Vec<CreatePartitionsTopic>,
    /// How long the client waits for the partitions to be created.
    pub timeout_ms: i32,
    /// Check the request without creating anything.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsTopic {
    pub name: String,
    /// The new total partition count.
    pub count: i32,
    /// Each new partition's replica brokers; `None` (null): the broker places them.
    pub assignments: Option<Vec<Vec<i32>>>,
}

impl CreatePartitionsRequest {
    pub fn decode(
        reader: &mut Reader,
        version: i16,
    ) -> Result<CreatePartitionsRequest, DecodeError> {
        let flexible = version >= 2;
        // A topic is at least a name length, the count, an array count and (flexible) its
        // tagged fields.
        let count = reader.array_len(
            "create partitions topics",
            flexible,
            6,
            CREATE_PARTITIONS_TOPICS_MAX,
        )?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            let partitions = reader.i32("count")?;
            // An assignment is at least a broker count and (flexible) its tagged fields.
            let assignments = match reader.nullable_array_len(
                "create partitions assignments",
                flexible,
                1,
                CREATE_PARTITIONS_ASSIGNMENTS_MAX,
            )? {
                None => None,
                Some(count) => {
                    let mut assignments = Vec::with_capacity(count);
                    for _ in 0..count {
                        let brokers = reader.array_len(
                            "create partitions broker ids",
                            flexible,
                            4,
                            CREATE_PARTITIONS_BROKER_IDS_MAX,
                        )?;
                        let mut broker_ids = Vec::with_capacity(brokers);
                        for _ in 0..brokers {
                            broker_ids.push(reader.i32("broker id")?);
                        }
                        reader.skip_tagged_fields(flexible)?;
                        assignments.push(broker_ids);
                    }
                    Some(assignments)
                }
            };
            reader.skip_tagged_fields(flexible)?;
            topics.push(CreatePartitionsTopic { name, count: partitions, assignments });
        }
        let timeout_ms = reader.i32("timeout ms")?;
        let validate_only = reader.bool("validate only")?;
        reader.skip_tagged_fields(flexible)?;
        Ok(CreatePartitionsRequest { topics, timeout_ms, validate_only })
    }
}
