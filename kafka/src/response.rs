//! Responses as frames: the size prefix, the response header for the request, then the body
//! encoded by the codec crate at the request's version.
//!
//! The bodies are built from Shoal's own state, so an encoding failure (a field set that the
//! version cannot carry) is a bug in the listener, reported as `EncodeError` for it to log and
//! close the connection rather than send a half-written frame.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::protocol::Encodable;

use crate::api::SERVED;
use crate::header::RequestHeader;

/// A response body the codec crate refused to encode at the request's version.
#[derive(Debug)]
pub struct EncodeError {
    pub api_key: i16,
    pub api_version: i16,
    pub reason: String,
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot encode the response to api key {} version {}: {}",
            self.api_key, self.api_version, self.reason
        )
    }
}

impl std::error::Error for EncodeError {}

/// The frame answering `header` with `body` at `version` (the request's, except for an
/// ApiVersions request of a version Shoal does not serve, answered at v0).
pub fn encode_frame<B: Encodable>(
    header: &RequestHeader,
    body: &B,
    version: i16,
) -> Result<Bytes, EncodeError> {
    let error = |reason: String| EncodeError {
        api_key: header.api_key,
        api_version: header.api_version,
        reason,
    };
    let mut out = BytesMut::with_capacity(64);
    out.put_i32(0);
    header.encode_response_header(&mut out);
    body.encode(&mut out, version).map_err(|e| error(e.to_string()))?;
    let size = i32::try_from(out.len() - 4).map_err(|_| error("over 2 GiB".to_string()))?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out.freeze())
}

/// The ApiVersions response: every served API with its versions, and `error` (none, or
/// UNSUPPORTED_VERSION when the request's version is not served, KIP-511).
pub fn api_versions(error: Option<ResponseError>) -> ApiVersionsResponse {
    let api_keys = SERVED
        .iter()
        .map(|served| {
            ApiVersion::default()
                .with_api_key(served.key as i16)
                .with_min_version(served.min_version)
                .with_max_version(served.max_version)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error.map_or(0, |e| e.code()))
        .with_api_keys(api_keys)
}
