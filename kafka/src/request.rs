//! Request bodies Shoal decodes itself, one module per API: each reads exactly the fields of
//! the versions `api::SERVED` lists, bounds every array before allocating it (`Reader`), and
//! hands byte strings (record batches, group protocol metadata and assignments) out as slices
//! of the frame.
//!
//! - producing and fetching: `Produce`, `Fetch`, `ListOffsets`, `Metadata`, `InitProducerId`,
//!   `OffsetForLeaderEpoch`;
//! - consumer groups (classic protocol): `FindCoordinator`, `JoinGroup`, `SyncGroup`,
//!   `Heartbeat`, `LeaveGroup`, `OffsetCommit`, `OffsetFetch`;
//! - administration: `CreateTopics`, `DeleteTopics`, `DescribeConfigs`, `DescribeGroups`,
//!   `ListGroups`, `DescribeCluster`, `DeleteRecords`;
//! - the handshake: `ApiVersions`.
//!
//! Why not the codec crate's decoders: they size a `Vec` from the count a client sends before
//! reading an element, so a 20-byte frame announcing two billion elements aborts the process.
//! Responses, which Shoal builds from its own state, are encoded with the crate.

mod api_versions;
mod create_partitions;
mod create_topics;
mod delete_records;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod describe_groups;
mod fetch;
mod find_coordinator;
mod heartbeat;
mod init_producer_id;
mod join_group;
mod leave_group;
mod list_groups;
mod list_offsets;
mod metadata;
mod offset_commit;
mod offset_fetch;
mod offset_for_leader_epoch;
mod produce;
mod sync_group;

pub use api_versions::ApiVersionsRequest;
pub use create_partitions::{
    CREATE_PARTITIONS_ASSIGNMENTS_MAX, CREATE_PARTITIONS_BROKER_IDS_MAX,
    CREATE_PARTITIONS_TOPICS_MAX, CreatePartitionsRequest, CreatePartitionsTopic,
};
pub use create_topics::{
    CREATE_TOPICS_ASSIGNMENTS_MAX, CREATE_TOPICS_BROKER_IDS_MAX, CREATE_TOPICS_CONFIGS_MAX,
    CREATE_TOPICS_TOPICS_MAX, CreateTopic, CreateTopicConfig, CreateTopicsRequest,
};
pub use delete_records::{
    DELETE_RECORDS_PARTITIONS_MAX, DELETE_RECORDS_TOPICS_MAX, DeleteRecordsPartition,
    DeleteRecordsRequest, DeleteRecordsTopic, HIGH_WATERMARK,
};
pub use delete_topics::{DELETE_TOPICS_TOPICS_MAX, DeleteTopic, DeleteTopicsRequest};
pub use describe_cluster::{
    BROKERS_ENDPOINT_TYPE, CONTROLLERS_ENDPOINT_TYPE, DescribeClusterRequest,
};
pub use describe_configs::{
    BROKER_RESOURCE_TYPE, DESCRIBE_CONFIGS_KEYS_MAX, DESCRIBE_CONFIGS_RESOURCES_MAX,
    DescribeConfigsRequest, DescribeConfigsResource, TOPIC_RESOURCE_TYPE,
};
pub use describe_groups::{DESCRIBE_GROUPS_GROUPS_MAX, DescribeGroupsRequest};
pub use fetch::{FETCH_PARTITIONS_MAX, FETCH_TOPICS_MAX, FetchPartition, FetchRequest, FetchTopic};
pub use find_coordinator::{
    FIND_COORDINATOR_KEYS_MAX, FindCoordinatorRequest, GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE,
};
pub use heartbeat::HeartbeatRequest;
pub use init_producer_id::InitProducerIdRequest;
pub use join_group::{JOIN_GROUP_PROTOCOLS_MAX, JoinGroupProtocol, JoinGroupRequest};
pub use leave_group::{LEAVE_GROUP_MEMBERS_MAX, LeaveGroupRequest, LeavingMember};
pub use list_groups::{LIST_GROUPS_FILTER_MAX, ListGroupsRequest};
pub use list_offsets::{
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, LIST_OFFSETS_PARTITIONS_MAX, LIST_OFFSETS_TOPICS_MAX,
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic, MAX_TIMESTAMP,
};
pub use metadata::{METADATA_TOPICS_MAX, MetadataRequest, MetadataTopic};
pub use offset_commit::{
    OFFSET_COMMIT_PARTITIONS_MAX, OFFSET_COMMIT_TOPICS_MAX, OffsetCommitPartition,
    OffsetCommitRequest, OffsetCommitTopic,
};
pub use offset_fetch::{
    OFFSET_FETCH_GROUPS_MAX, OFFSET_FETCH_PARTITIONS_MAX, OFFSET_FETCH_TOPICS_MAX,
    OffsetFetchGroup, OffsetFetchRequest, OffsetFetchTopic,
};
pub use offset_for_leader_epoch::{
    CONSUMER_REPLICA_ID, DEBUGGING_REPLICA_ID, OFFSET_FOR_LEADER_EPOCH_PARTITIONS_MAX,
    OFFSET_FOR_LEADER_EPOCH_TOPICS_MAX, OffsetForLeaderEpochPartition, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochTopic,
};
pub use produce::{
    PRODUCE_PARTITIONS_MAX, PRODUCE_TOPICS_MAX, ProducePartition, ProduceRequest, ProduceTopic,
};
pub use sync_group::{SYNC_GROUP_ASSIGNMENTS_MAX, SyncGroupAssignment, SyncGroupRequest};

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
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    CreateTopics(CreateTopicsRequest),
    CreatePartitions(CreatePartitionsRequest),
    DeleteTopics(DeleteTopicsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    DescribeGroups(DescribeGroupsRequest),
    ListGroups(ListGroupsRequest),
    DescribeCluster(DescribeClusterRequest),
    DeleteRecords(DeleteRecordsRequest),
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
            ApiKey::OffsetForLeaderEpoch => OffsetForLeaderEpochRequest::decode(reader, version)
                .map(Request::OffsetForLeaderEpoch),
            ApiKey::FindCoordinator => {
                FindCoordinatorRequest::decode(reader, version).map(Request::FindCoordinator)
            }
            ApiKey::JoinGroup => JoinGroupRequest::decode(reader, version).map(Request::JoinGroup),
            ApiKey::SyncGroup => SyncGroupRequest::decode(reader, version).map(Request::SyncGroup),
            ApiKey::Heartbeat => HeartbeatRequest::decode(reader, version).map(Request::Heartbeat),
            ApiKey::LeaveGroup => {
                LeaveGroupRequest::decode(reader, version).map(Request::LeaveGroup)
            }
            ApiKey::OffsetCommit => {
                OffsetCommitRequest::decode(reader, version).map(Request::OffsetCommit)
            }
            ApiKey::OffsetFetch => {
                OffsetFetchRequest::decode(reader, version).map(Request::OffsetFetch)
            }
            ApiKey::CreateTopics => {
                CreateTopicsRequest::decode(reader, version).map(Request::CreateTopics)
            }
            ApiKey::CreatePartitions => {
                CreatePartitionsRequest::decode(reader, version).map(Request::CreatePartitions)
            }
            ApiKey::DeleteTopics => {
                DeleteTopicsRequest::decode(reader, version).map(Request::DeleteTopics)
            }
            ApiKey::DeleteRecords => {
                DeleteRecordsRequest::decode(reader, version).map(Request::DeleteRecords)
            }
            ApiKey::DescribeConfigs => {
                DescribeConfigsRequest::decode(reader, version).map(Request::DescribeConfigs)
            }
            ApiKey::DescribeGroups => {
                DescribeGroupsRequest::decode(reader, version).map(Request::DescribeGroups)
            }
            ApiKey::ListGroups => {
                ListGroupsRequest::decode(reader, version).map(Request::ListGroups)
            }
            ApiKey::DescribeCluster => {
                DescribeClusterRequest::decode(reader, version).map(Request::DescribeCluster)
            }
            _ => unreachable!("{key:?} is served without a decoder"),
        })
    }
}

#[cfg(test)]
mod tests;
