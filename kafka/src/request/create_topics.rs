//! The CreateTopics request (key 19), versions 2–7: an admin client creates topics, each with
//! a partition count and replication factor or explicit replica assignments, and configs.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics one CreateTopics request may create.
pub const CREATE_TOPICS_TOPICS_MAX: usize = 10_000;
/// Configs one topic may set (Kafka has a few dozen topic configs).
pub const CREATE_TOPICS_CONFIGS_MAX: usize = 1_000;
/// Explicit replica assignments (partitions) one topic may name.
pub const CREATE_TOPICS_ASSIGNMENTS_MAX: usize = 10_000;
/// Brokers one partition's replica assignment may name.
pub const CREATE_TOPICS_BROKER_IDS_MAX: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopicsRequest {
    pub topics: Vec<CreateTopic>,
    /// How long the client waits for the topics to be created.
    pub timeout_ms: i32,
    /// v1+: check the request without creating anything; `false` before v1.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopic {
    pub name: String,
    /// -1 (v4+): the broker's default, or the count the assignments give.
    pub num_partitions: i32,
    /// -1 (v4+): the broker's default, or the count the assignments give.
    pub replication_factor: i16,
    /// Explicit replica assignments, each a partition index and the broker ids of its
    /// replicas; empty when the counts above apply.
    pub assignments: Vec<(i32, Vec<i32>)>,
    pub configs: Vec<CreateTopicConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopicConfig {
    pub name: String,
    /// `None`: null (the default).
    pub value: Option<String>,
}

impl CreateTopicsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<CreateTopicsRequest, DecodeError> {
        let flexible = version >= 5;
        // A topic is at least a name length, the two counts, two array counts and (flexible)
        // its tagged fields.
        let count =
            reader.array_len("create topics topics", flexible, 10, CREATE_TOPICS_TOPICS_MAX)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("topic name", flexible)?;
            let num_partitions = reader.i32("num partitions")?;
            let replication_factor = reader.i16("replication factor")?;
            // An assignment is at least a partition index, a broker count and (flexible) its
            // tagged fields.
            let count = reader.array_len(
                "create topics assignments",
                flexible,
                6,
                CREATE_TOPICS_ASSIGNMENTS_MAX,
            )?;
            let mut assignments = Vec::with_capacity(count);
            for _ in 0..count {
                let partition_index = reader.i32("partition index")?;
                let count = reader.array_len(
                    "create topics broker ids",
                    flexible,
                    4,
                    CREATE_TOPICS_BROKER_IDS_MAX,
                )?;
                let mut broker_ids = Vec::with_capacity(count);
                for _ in 0..count {
                    broker_ids.push(reader.i32("broker id")?);
                }
                reader.skip_tagged_fields(flexible)?;
                assignments.push((partition_index, broker_ids));
            }
            // A config is at least a name length, a value length and (flexible) its tagged
            // fields.
            let count = reader.array_len(
                "create topics configs",
                flexible,
                3,
                CREATE_TOPICS_CONFIGS_MAX,
            )?;
            let mut configs = Vec::with_capacity(count);
            for _ in 0..count {
                let name = reader.string("config name", flexible)?;
                let value = reader.nullable_string("config value", flexible)?;
                reader.skip_tagged_fields(flexible)?;
                configs.push(CreateTopicConfig { name, value });
            }
            reader.skip_tagged_fields(flexible)?;
            topics.push(CreateTopic {
                name,
                num_partitions,
                replication_factor,
                assignments,
                configs,
            });
        }
        let timeout_ms = reader.i32("timeout")?;
        let validate_only = if version >= 1 { reader.bool("validate only")? } else { false };
        reader.skip_tagged_fields(flexible)?;
        Ok(CreateTopicsRequest { topics, timeout_ms, validate_only })
    }
}
