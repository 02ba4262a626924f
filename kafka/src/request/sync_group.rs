//! The SyncGroup request (key 14), versions 0–5: after a JoinGroup, every member asks for its
//! assignment, and the group's leader hands in everyone's.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::read::Reader;

/// Assignments one SyncGroup request may carry (one per member of the group).
pub const SYNC_GROUP_ASSIGNMENTS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    /// v3+: the static member's instance id (KIP-345); `None` for a dynamic member and
    /// before v3.
    pub group_instance_id: Option<String>,
    /// v5+: the protocol type the member joined with, for the coordinator to check; `None`
    /// before v5 (or when the client leaves it out).
    pub protocol_type: Option<String>,
    /// v5+: the assignor the member was told the group chose; `None` before v5.
    pub protocol_name: Option<String>,
    /// Everyone's assignment when the member is the leader; empty otherwise.
    pub assignments: Vec<SyncGroupAssignment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupAssignment {
    pub member_id: String,
    /// The member's assignment, opaque to the broker (a slice of the frame).
    pub assignment: Bytes,
}

impl SyncGroupRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<SyncGroupRequest, DecodeError> {
        let flexible = version >= 4;
        let group_id = reader.string("group id", flexible)?;
        let generation_id = reader.i32("generation id")?;
        let member_id = reader.string("member id", flexible)?;
        let group_instance_id = if version >= 3 {
            reader.nullable_string("group instance id", flexible)?
        } else {
            None
        };
        let (protocol_type, protocol_name) = if version >= 5 {
            let protocol_type = reader.nullable_string("protocol type", flexible)?;
            (protocol_type, reader.nullable_string("protocol name", flexible)?)
        } else {
            (None, None)
        };
        // An assignment is at least a member id length and an assignment length.
        let count =
            reader.array_len("sync group assignments", flexible, 3, SYNC_GROUP_ASSIGNMENTS_MAX)?;
        let mut assignments = Vec::with_capacity(count);
        for _ in 0..count {
            let member_id = reader.string("assignment member id", flexible)?;
            let assignment = reader.bytes("assignment", flexible)?;
            reader.skip_tagged_fields(flexible)?;
            assignments.push(SyncGroupAssignment { member_id, assignment });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(SyncGroupRequest {
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            protocol_type,
            protocol_name,
            assignments,
        })
    }
}
