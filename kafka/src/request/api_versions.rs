//! The ApiVersions request (key 18), versions 0–4: the first request of every client, asking
//! which APIs and versions the broker serves.

use crate::error::DecodeError;
use crate::read::Reader;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiVersionsRequest {
    /// v3+: the client library's name and version (shown in logs).
    pub client_software_name: Option<String>,
    pub client_software_version: Option<String>,
}

impl ApiVersionsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<ApiVersionsRequest, DecodeError> {
        if version < 3 {
            return Ok(ApiVersionsRequest::default());
        }
        let client_software_name = Some(reader.string("client software name", true)?);
        let client_software_version = Some(reader.string("client software version", true)?);
        reader.skip_tagged_fields(true)?;
        Ok(ApiVersionsRequest { client_software_name, client_software_version })
    }
}
