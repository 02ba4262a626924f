//! The DescribeCluster request (key 60), versions 0–1: an admin client asks for the cluster's
//! id, controller and brokers (KIP-700). Every version is flexible. (v2 adds
//! include_fenced_brokers, which Shoal does not serve.)

use crate::error::DecodeError;
use crate::read::Reader;

/// `endpoint_type` asking for the brokers' endpoints (the only type before v1).
pub const BROKERS_ENDPOINT_TYPE: i8 = 1;
/// `endpoint_type` asking for the controllers' endpoints (KIP-919), which a broker refuses.
pub const CONTROLLERS_ENDPOINT_TYPE: i8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeClusterRequest {
    /// Whether to include the operations the client may perform on the cluster.
    pub include_cluster_authorized_operations: bool,
    /// v1+: [`BROKERS_ENDPOINT_TYPE`] or [`CONTROLLERS_ENDPOINT_TYPE`], other values kept as
    /// sent for the handler to refuse; [`BROKERS_ENDPOINT_TYPE`] in v0.
    pub endpoint_type: i8,
}

impl DescribeClusterRequest {
    pub fn decode(
        reader: &mut Reader,
        version: i16,
    ) -> Result<DescribeClusterRequest, DecodeError> {
        let include_cluster_authorized_operations =
            reader.bool("include cluster authorized operations")?;
        let endpoint_type =
            if version >= 1 { reader.i8("endpoint type")? } else { BROKERS_ENDPOINT_TYPE };
        reader.skip_tagged_fields(true)?;
        Ok(DescribeClusterRequest { include_cluster_authorized_operations, endpoint_type })
    }
}
