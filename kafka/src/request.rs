//! Request bodies Shoal decodes itself, one module per API: each reads exactly the fields of
//! the versions `api::SERVED` lists, bounds every array before allocating it (`Reader`), and
//! hands byte strings (record batches) out as slices of the frame.
//!
//! Why not the codec crate's decoders: they size a `Vec` from the count a client sends before
//! reading an element, so a 20-byte frame announcing two billion elements aborts the process.
//! Responses, which Shoal builds from its own state, are encoded with the crate.

mod api_versions;
mod fetch;
mod init_producer_id;
mod list_offsets;
mod metadata;
mod produce;

pub use api_versions::ApiVersionsRequest;
pub use fetch::{FETCH_PARTITIONS_MAX, FETCH_TOPICS_MAX, FetchPartition, FetchRequest, FetchTopic};
pub use init_producer_id::InitProducerIdRequest;
pub use list_offsets::{
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, LIST_OFFSETS_PARTITIONS_MAX, LIST_OFFSETS_TOPICS_MAX,
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
pub use metadata::{METADATA_TOPICS_MAX, MetadataRequest, MetadataTopic};
pub use produce::{
    PRODUCE_PARTITIONS_MAX, PRODUCE_TOPICS_MAX, ProducePartition, ProduceRequest, ProduceTopic,
};

use kafka_protocol::messages::ApiKey;

use crate::api::serves;
use crate::error::DecodeError;
use crate::header::RequestHeader;
use crate::read::Reader;

/// A decoded request body of an API Shoal serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    ApiVersions(ApiVersionsRequest),
    Metadata(MetadataRequest),
    Produce(ProduceRequest),
    ListOffsets(ListOffsetsRequest),
    Fetch(FetchRequest),
    InitProducerId(InitProducerIdRequest),
}

impl Request {
    /// The body after `header`, when Shoal serves its key at its version (`None` otherwise:
    /// the caller decides how to refuse it).
    pub fn decode(
        header: &RequestHeader,
        reader: &mut Reader,
    ) -> Option<Result<Request, DecodeError>> {
        let key = header.key()?;
        let version = header.api_version;
        if !serves(key, version) {
            return None;
        }
        Some(match key {
            ApiKey::ApiVersions => {
                ApiVersionsRequest::decode(reader, version).map(Request::ApiVersions)
            }
            ApiKey::Metadata => MetadataRequest::decode(reader, version).map(Request::Metadata),
            ApiKey::Produce => ProduceRequest::decode(reader, version).map(Request::Produce),
            ApiKey::Fetch => FetchRequest::decode(reader, version).map(Request::Fetch),
            ApiKey::InitProducerId => {
                InitProducerIdRequest::decode(reader, version).map(Request::InitProducerId)
            }
            ApiKey::ListOffsets => {
                ListOffsetsRequest::decode(reader, version).map(Request::ListOffsets)
            }
            _ => unreachable!("{key:?} is served without a decoder"),
        })
    }
}

#[cfg(test)]
mod tests;
