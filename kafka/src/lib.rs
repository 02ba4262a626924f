//! The Kafka wire protocol as Shoal's Kafka listener speaks it: the request and response
//! headers, the request bodies Shoal decodes (bounded, from untrusted bytes), the table of APIs
//! and versions it serves, and the encoding of responses. This crate never touches a socket, a
//! shard or the catalog: the server's listener decides what each request does.

mod api;
mod error;
mod fetch_response;
mod header;
mod read;
pub mod request;
mod response;

pub use api::{SERVED, Served, served, serves};
pub use error::DecodeError;
pub use fetch_response::{FetchAnswer, FetchPartitionAnswer, FetchTopicAnswer};
pub use header::RequestHeader;
pub use kafka_protocol;
pub use read::Reader;
pub use response::{EncodeError, api_versions, encode_frame};
pub use uuid::Uuid;

/// The Kafka topic id of a Shoal topic: the cluster id (masked with a tag, so that no id is
/// Kafka's reserved nil or metadata-topic id) and the group of the topic's partition 0, which
/// Shoal never reuses. Stable across restarts; a topic deleted and created again gets a new one.
pub fn topic_id(cluster: u64, first_group: u64) -> [u8; 16] {
    const TAG: u64 = u64::from_be_bytes(*b"shoal-kf");
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&(cluster ^ TAG).to_be_bytes());
    id[8..].copy_from_slice(&first_group.to_be_bytes());
    id
}
