//! The request header every Kafka request starts with, and the response header every answer
//! starts with: which API, which version, and the correlation id the client matches replies by.
//!
//! Header versions follow the API version (flexible versions add tagged fields), except that an
//! ApiVersions response always has header v0 so that a client which does not know the broker's
//! versions yet can read it (KIP-511). This module never decides whether a version is served.

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::ApiKey;

use crate::error::DecodeError;
use crate::read::Reader;

/// The fields of a request header Shoal uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    /// The raw key: an unknown key is still answered (with an error), so it is kept as sent.
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
}

impl RequestHeader {
    /// Reads the header at the start of a frame. Keys Shoal does not know are read as header v1
    /// (no tagged fields): what follows is never parsed, only the correlation id is needed.
    pub fn decode(reader: &mut Reader) -> Result<RequestHeader, DecodeError> {
        let api_key = reader.i16("request api key")?;
        let api_version = reader.i16("request api version")?;
        let correlation_id = reader.i32("correlation id")?;
        let client_id = reader.nullable_string("client id", false)?;
        let header = RequestHeader { api_key, api_version, correlation_id, client_id };
        if header.flexible() {
            reader.skip_tagged_fields(true)?;
        }
        Ok(header)
    }

    /// The API, when Shoal knows its key.
    pub fn key(&self) -> Option<ApiKey> {
        ApiKey::try_from(self.api_key).ok()
    }

    /// Whether this request uses the flexible (tagged-field, compact) encoding.
    pub fn flexible(&self) -> bool {
        self.key().is_some_and(|key| {
            let range = key.valid_versions();
            range.min <= self.api_version
                && self.api_version <= range.max
                && key.request_header_version(self.api_version) >= 2
        })
    }

    /// Writes the response header for this request: v0 (the correlation id) or, for flexible
    /// versions other than ApiVersions, v1 (with an empty tagged-field section).
    pub fn encode_response_header(&self, out: &mut BytesMut) {
        out.put_i32(self.correlation_id);
        if self.key() != Some(ApiKey::ApiVersions) && self.flexible() {
            out.put_u8(0);
        }
    }
}
