//! The DeleteTopics request (key 20), versions 1–6: an admin client deletes topics, by name
//! (v1–5) or (v6) by name or topic id, each read into the same shape.

use crate::error::DecodeError;
use crate::read::Reader;

/// Topics one DeleteTopics request may delete.
pub const DELETE_TOPICS_TOPICS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteTopicsRequest {
    pub topics: Vec<DeleteTopic>,
    /// How long the client waits for the topics to be deleted.
    pub timeout_ms: i32,
}

/// One topic to delete: by name (v1–5 always; the id is then all zeros), or (v6) by name or by
/// topic id with a null name. Neither given (a null name with a zero id) is kept as sent, for
/// the handler to refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteTopic {
    pub name: Option<String>,
    pub topic_id: [u8; 16],
}

impl DeleteTopicsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<DeleteTopicsRequest, DecodeError> {
        let flexible = version >= 4;
        let topics = if version >= 6 {
            // A topic is at least a name length, its id and its tagged fields.
            let count = reader.array_len("delete topics", true, 18, DELETE_TOPICS_TOPICS_MAX)?;
            let mut topics = Vec::with_capacity(count);
            for _ in 0..count {
                let name = reader.nullable_string("topic name", true)?;
                let topic_id = reader.uuid("topic id")?;
                reader.skip_tagged_fields(true)?;
                topics.push(DeleteTopic { name, topic_id });
            }
            topics
        } else {
            let count =
                reader.array_len("delete topic names", flexible, 1, DELETE_TOPICS_TOPICS_MAX)?;
            let mut topics = Vec::with_capacity(count);
            for _ in 0..count {
                let name = reader.string("topic name", flexible)?;
                topics.push(DeleteTopic { name: Some(name), topic_id: [0; 16] });
            }
            topics
        };
        let timeout_ms = reader.i32("timeout")?;
        reader.skip_tagged_fields(flexible)?;
        Ok(DeleteTopicsRequest { topics, timeout_ms })
    }
}
