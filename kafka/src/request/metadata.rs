//! The Metadata request (key 3), versions 0–12: which topics the client asks about.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics one Metadata request may name (Kafka has no bound; a client asks for the topics it
/// produces to or consumes from, and "all topics" is the null list, not a long one).
pub const METADATA_TOPICS_MAX: usize = 10_000;

/// One topic asked about: by name, or (v10+) by topic id with a null name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataTopic {
    pub topic_id: [u8; 16],
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataRequest {
    /// `None`: every topic. (In v0 an empty list means every topic; it is read as `None`.)
    pub topics: Option<Vec<MetadataTopic>>,
    /// v4+; before v4 Kafka created topics asked about whenever its auto-creation was on.
    pub allow_auto_topic_creation: bool,
}

impl MetadataRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<MetadataRequest, DecodeError> {
        let flexible = version >= 9;
        let count =
            reader.nullable_array_len("metadata topics", flexible, 2, METADATA_TOPICS_MAX)?;
        let mut topics = count.map(Vec::with_capacity);
        for _ in 0..count.unwrap_or(0) {
            let topic_id = if version >= 10 { reader.uuid("topic id")? } else { [0; 16] };
            let name = if version >= 10 {
                reader.nullable_string("topic name", flexible)?
            } else {
                Some(reader.string("topic name", flexible)?)
            };
            reader.skip_tagged_fields(flexible)?;
            if let Some(topics) = topics.as_mut() {
                topics.push(MetadataTopic { topic_id, name });
            }
        }
        if version == 0 && topics.as_ref().is_some_and(Vec::is_empty) {
            topics = None;
        }
        let allow_auto_topic_creation =
            if version >= 4 { reader.bool("allow auto topic creation")? } else { true };
        if (8..=10).contains(&version) {
            reader.bool("include cluster authorized operations")?;
        }
        if version >= 8 {
            reader.bool("include topic authorized operations")?;
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(MetadataRequest { topics, allow_auto_topic_creation })
    }
}
