//! What Shoal's Kafka listener serves: each API key with the versions it implements. ApiVersions
//! advertises exactly this table. An ApiVersions request outside it is answered
//! UNSUPPORTED_VERSION (KIP-511); any other request outside it closes its connection, as Kafka
//! does.
//!
//! A key joins the table only with its handler: advertising a version a client then uses and
//! Shoal cannot answer would fail that client in ways harder to diagnose than a missing key.
//! Telemetry (71/72), SASL and transactions stay out until Shoal has them.

use kafka_protocol::messages::ApiKey;

/// An API key and the versions Shoal serves, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub key: ApiKey,
    pub min_version: i16,
    pub max_version: i16,
}

/// Every API Shoal serves.
pub const SERVED: &[Served] = &[
    Served { key: ApiKey::Produce, min_version: 3, max_version: 10 },
    Served { key: ApiKey::Fetch, min_version: 4, max_version: 16 },
    Served { key: ApiKey::ListOffsets, min_version: 1, max_version: 7 },
    Served { key: ApiKey::Metadata, min_version: 0, max_version: 12 },
    Served { key: ApiKey::OffsetCommit, min_version: 2, max_version: 9 },
    Served { key: ApiKey::OffsetFetch, min_version: 1, max_version: 9 },
    Served { key: ApiKey::FindCoordinator, min_version: 0, max_version: 6 },
    Served { key: ApiKey::JoinGroup, min_version: 0, max_version: 7 },
    Served { key: ApiKey::Heartbeat, min_version: 0, max_version: 4 },
    Served { key: ApiKey::LeaveGroup, min_version: 0, max_version: 5 },
    Served { key: ApiKey::SyncGroup, min_version: 0, max_version: 5 },
    Served { key: ApiKey::ApiVersions, min_version: 0, max_version: 4 },
    Served { key: ApiKey::InitProducerId, min_version: 0, max_version: 4 },
    Served { key: ApiKey::OffsetForLeaderEpoch, min_version: 2, max_version: 4 },
    Served { key: ApiKey::DescribeGroups, min_version: 0, max_version: 5 },
    Served { key: ApiKey::ListGroups, min_version: 0, max_version: 5 },
    Served { key: ApiKey::CreateTopics, min_version: 2, max_version: 7 },
    Served { key: ApiKey::CreatePartitions, min_version: 0, max_version: 3 },
    Served { key: ApiKey::DeleteTopics, min_version: 1, max_version: 6 },
    Served { key: ApiKey::DescribeConfigs, min_version: 1, max_version: 4 },
    Served { key: ApiKey::DescribeCluster, min_version: 0, max_version: 1 },
    Served { key: ApiKey::DeleteRecords, min_version: 0, max_version: 2 },
];

/// The versions Shoal serves of `key`, if any.
pub fn served(key: ApiKey) -> Option<Served> {
    SERVED.iter().copied().find(|served| served.key == key)
}

/// Whether Shoal serves `version` of the API `key`.
pub fn serves(key: ApiKey, version: i16) -> bool {
    served(key).is_some_and(|s| s.min_version <= version && version <= s.max_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shoal never serves a version the codec crate cannot encode a response for.
    #[test]
    fn every_served_version_is_one_the_codec_knows() {
        for served in SERVED {
            let known = served.key.valid_versions();
            assert!(
                known.min <= served.min_version && served.max_version <= known.max,
                "{served:?}"
            );
        }
    }
}
