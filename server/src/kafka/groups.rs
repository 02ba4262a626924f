//! The Kafka consumer group answers: FindCoordinator names the node coordinating every Kafka
//! group (the metadata group's primary), and JoinGroup, SyncGroup, Heartbeat and LeaveGroup go
//! to its shard 0 (`Work::KafkaGroup`), where `crate::kafka_groups` keeps the groups.
//!
//! A node that does not coordinate (now) answers NOT_COORDINATOR, and the client finds the
//! coordinator again. Static membership (`group.instance.id`) is not kept: such a member is
//! served as a dynamic one, so a restart of it rebalances its group.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::find_coordinator_response::Coordinator;
use shoal_kafka::kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use shoal_kafka::kafka_protocol::messages::leave_group_response::MemberResponse;
use shoal_kafka::kafka_protocol::messages::{
    BrokerId, FindCoordinatorResponse, HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse,
    SyncGroupResponse,
};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::{
    FindCoordinatorRequest, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest,
};
use shoal_proto::protocol::NODE_UNKNOWN;

use super::Connection;
use crate::connection::metadata_primary;
use crate::kafka_groups::{GroupAnswer, Join, JoinAnswer, Sync, SyncAnswer};
use crate::shard::{KafkaGroupReply, KafkaGroupRequest, Work};

/// FindCoordinator's key type for a consumer group (1 is a transactional id).
const KEY_TYPE_GROUP: i8 = 0;

/// The FindCoordinator response: the same node for every group key (v4+ answers each key).
pub(super) async fn find_coordinator(
    connection: &Connection,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let found = if request.key_type != KEY_TYPE_GROUP {
        // Transactional ids: Shoal has no transactions yet (InitProducerId refuses them too).
        Err(ResponseError::InvalidRequest)
    } else {
        connection.coordinator().await
    };
    let coordinators: Vec<Coordinator> = request
        .keys
        .iter()
        .map(|key| {
            let entry = Coordinator::default().with_key(StrBytes::from_string(key.clone()));
            match (&found, key.is_empty()) {
                (_, true) => entry
                    .with_node_id(BrokerId(-1))
                    .with_error_code(ResponseError::InvalidGroupId.code()),
                (Ok((node, host, port)), false) => {
                    entry.with_node_id(BrokerId(*node)).with_host(host.clone()).with_port(*port)
                }
                (Err(error), false) => {
                    entry.with_node_id(BrokerId(-1)).with_error_code(error.code())
                }
            }
        })
        .collect();
    if version >= 4 {
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    // v0–3 carry their one key's answer at the top level.
    let first = coordinators.into_iter().next().unwrap_or_default();
    FindCoordinatorResponse::default()
        .with_error_code(first.error_code)
        .with_node_id(first.node_id)
        .with_host(first.host)
        .with_port(first.port)
}

impl Connection {
    /// The coordinating node: its id and Kafka address, from the metadata group's primary as
    /// this node's replica knows it.
    pub(super) async fn coordinator(&self) -> Result<(i32, StrBytes, i32), ResponseError> {
        let cluster = &self.context.config.cluster;
        let node = if cluster.nodes.is_empty() {
            cluster.node
        } else {
            match metadata_primary(&self.context.mesh).await {
                Some((_, primary)) if primary != NODE_UNKNOWN => primary,
                _ => return Err(ResponseError::CoordinatorNotAvailable),
            }
        };
        let catalog = self.context.published.latest();
        let address = match catalog.nodes.kafka_address(cluster, node) {
            Some(address) => address,
            None if node == cluster.node => {
                self.reached.ok_or(ResponseError::CoordinatorNotAvailable)?
            }
            None => return Err(ResponseError::CoordinatorNotAvailable),
        };
        let host = StrBytes::from_string(address.ip().to_string());
        Ok((i32::from(node), host, i32::from(address.port())))
    }

    /// Asks the coordinator (shard 0); a stopped shard or a dropped answer is NOT_COORDINATOR.
    pub(super) async fn ask_coordinator(&self, request: KafkaGroupRequest) -> KafkaGroupReply {
        let (reply, answer) = flume::bounded(1);
        if self.send(0, Work::KafkaGroup { request, reply }).await.is_err() {
            return KafkaGroupReply::NotCoordinator;
        }
        answer.recv_async().await.unwrap_or(KafkaGroupReply::NotCoordinator)
    }
}

/// The JoinGroup response (answered once the rebalance completes).
pub(super) async fn join(
    connection: &Connection,
    request: JoinGroupRequest,
    version: i16,
    client_id: Option<&str>,
) -> JoinGroupResponse {
    let join = Join {
        group: request.group_id,
        member_id: request.member_id.clone(),
        client_id: client_id.unwrap_or("").to_string(),
        session_timeout_ms: request.session_timeout_ms,
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        protocol_type: request.protocol_type,
        protocols: request.protocols.into_iter().map(|p| (p.name, p.metadata)).collect(),
        require_known_member_id: version >= 4,
    };
    let answer = match connection.ask_coordinator(KafkaGroupRequest::Join(join)).await {
        KafkaGroupReply::Answer(GroupAnswer::Join(answer)) => answer,
        KafkaGroupReply::NotCoordinator => {
            JoinAnswer::refused(ResponseError::NotCoordinator, request.member_id)
        }
        other => unexpected(
            other,
            JoinAnswer::refused(ResponseError::UnknownServerError, request.member_id),
        ),
    };
    let members = answer
        .members
        .into_iter()
        .map(|(id, metadata)| {
            JoinGroupResponseMember::default()
                .with_member_id(StrBytes::from_string(id))
                .with_metadata(metadata)
        })
        .collect();
    JoinGroupResponse::default()
        .with_error_code(answer.error.map_or(0, |e| e.code()))
        .with_generation_id(answer.generation)
        .with_protocol_type(answer.protocol_type.map(StrBytes::from_string))
        // Not nullable before v7.
        .with_protocol_name(Some(StrBytes::from_string(answer.protocol_name.unwrap_or_default())))
        .with_leader(StrBytes::from_string(answer.leader))
        .with_member_id(StrBytes::from_string(answer.member_id))
        .with_members(members)
}

/// The SyncGroup response (a follower's waits for the leader's assignment).
pub(super) async fn sync(connection: &Connection, request: SyncGroupRequest) -> SyncGroupResponse {
    let ask = KafkaGroupRequest::Sync(Sync {
        group: request.group_id,
        member_id: request.member_id,
        generation: request.generation_id,
        protocol_type: request.protocol_type,
        protocol_name: request.protocol_name,
        assignments: request.assignments.into_iter().map(|a| (a.member_id, a.assignment)).collect(),
    });
    let refused = |error: ResponseError| SyncAnswer {
        error: Some(error),
        protocol_type: None,
        protocol_name: None,
        assignment: Default::default(),
    };
    let answer = match connection.ask_coordinator(ask).await {
        KafkaGroupReply::Answer(GroupAnswer::Sync(answer)) => answer,
        KafkaGroupReply::NotCoordinator => refused(ResponseError::NotCoordinator),
        other => unexpected(other, refused(ResponseError::UnknownServerError)),
    };
    SyncGroupResponse::default()
        .with_error_code(answer.error.map_or(0, |e| e.code()))
        .with_protocol_type(answer.protocol_type.map(StrBytes::from_string))
        .with_protocol_name(answer.protocol_name.map(StrBytes::from_string))
        .with_assignment(answer.assignment)
}

/// The Heartbeat response.
pub(super) async fn heartbeat(
    connection: &Connection,
    request: HeartbeatRequest,
) -> HeartbeatResponse {
    let ask = KafkaGroupRequest::Heartbeat {
        group: request.group_id,
        member: request.member_id,
        generation: request.generation_id,
    };
    let error = checked(connection.ask_coordinator(ask).await);
    HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code()))
}

/// The LeaveGroup response: each member's result (v3+), and the first error at the top (v0–2
/// name one member).
pub(super) async fn leave(
    connection: &Connection,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let ids: Vec<String> = request.members.iter().map(|m| m.member_id.clone()).collect();
    let ask = KafkaGroupRequest::Leave { group: request.group_id, members: ids.clone() };
    let results = match connection.ask_coordinator(ask).await {
        KafkaGroupReply::Left(results) => results,
        KafkaGroupReply::NotCoordinator => vec![Some(ResponseError::NotCoordinator); ids.len()],
        other => unexpected(other, vec![Some(ResponseError::UnknownServerError); ids.len()]),
    };
    let top = results.iter().flatten().next().copied();
    let response = LeaveGroupResponse::default().with_error_code(top.map_or(0, |e| e.code()));
    if version < 3 {
        return response;
    }
    let members = request
        .members
        .into_iter()
        .zip(results)
        .map(|(member, error)| {
            MemberResponse::default()
                .with_member_id(StrBytes::from_string(member.member_id))
                .with_group_instance_id(member.group_instance_id.map(StrBytes::from_string))
                .with_error_code(error.map_or(0, |e| e.code()))
        })
        .collect();
    response.with_members(members)
}

/// A Heartbeat's or a commit check's error.
pub(super) fn checked(reply: KafkaGroupReply) -> Option<ResponseError> {
    match reply {
        KafkaGroupReply::Checked(error) => error,
        KafkaGroupReply::NotCoordinator => Some(ResponseError::NotCoordinator),
        other => unexpected(other, Some(ResponseError::UnknownServerError)),
    }
}

/// The coordinator answered a request with another request's kind of answer: a bug, logged.
fn unexpected<T>(reply: KafkaGroupReply, fallback: T) -> T {
    tracing::error!(?reply, "the Kafka group coordinator answered out of kind");
    fallback
}
