//! The JoinGroup request (key 11), versions 0–7: a consumer joins a group (classic protocol),
//! naming the assignment protocols it supports with their metadata. (v8+ adds a reason.)

use bytes::Bytes;

use crate::error::DecodeError;
use crate::read::Reader;

/// Protocols one member may offer (a consumer offers its few configured assignors).
pub const JOIN_GROUP_PROTOCOLS_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupRequest {
    pub group_id: String,
    pub session_timeout_ms: i32,
    /// v1+; in v0 the session timeout, as Kafka takes it.
    pub rebalance_timeout_ms: i32,
    /// Empty on a member's first join.
    pub member_id: String,
    /// v5+: the static member's instance id (KIP-345); `None` for a dynamic member and
    /// before v5.
    pub group_instance_id: Option<String>,
    /// "consumer" for consumers, or another client's protocol family.
    pub protocol_type: String,
    pub protocols: Vec<JoinGroupProtocol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupProtocol {
    /// The assignor's name ("range", "cooperative-sticky", ...).
    pub name: String,
    /// The member's subscription for this assignor, opaque to the broker (a slice of the
    /// frame).
    pub metadata: Bytes,
}

impl JoinGroupRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<JoinGroupRequest, DecodeError> {
        let flexible = version >= 6;
        let group_id = reader.string("group id", flexible)?;
        let session_timeout_ms = reader.i32("session timeout")?;
        let rebalance_timeout_ms =
            if version >= 1 { reader.i32("rebalance timeout")? } else { session_timeout_ms };
        let member_id = reader.string("member id", flexible)?;
        let group_instance_id = if version >= 5 {
            reader.nullable_string("group instance id", flexible)?
        } else {
            None
        };
        let protocol_type = reader.string("protocol type", flexible)?;
        // A protocol is at least a name length and a metadata length.
        let count =
            reader.array_len("join group protocols", flexible, 3, JOIN_GROUP_PROTOCOLS_MAX)?;
        let mut protocols = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string("protocol name", flexible)?;
            let metadata = reader.bytes("protocol metadata", flexible)?;
            reader.skip_tagged_fields(flexible)?;
            protocols.push(JoinGroupProtocol { name, metadata });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(JoinGroupRequest {
            group_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            member_id,
            group_instance_id,
            protocol_type,
            protocols,
        })
    }
}
