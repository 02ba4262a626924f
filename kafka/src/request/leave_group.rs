//! The LeaveGroup request (key 13), versions 0–5: members leave a consumer group (classic
//! protocol). v0–2 name the one member sending it; v3+ a batch of members (KIP-345), which an
//! admin client uses to remove static members.

use crate::error::DecodeError;
use crate::read::Reader;

/// Members one LeaveGroup request may name.
pub const LEAVE_GROUP_MEMBERS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupRequest {
    pub group_id: String,
    /// The one member of v0–2, the batch of v3+.
    pub members: Vec<LeavingMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeavingMember {
    /// Empty when a static member is named by its instance id alone.
    pub member_id: String,
    /// v3+: the static member's instance id; `None` for a dynamic member and before v3.
    pub group_instance_id: Option<String>,
}

impl LeaveGroupRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<LeaveGroupRequest, DecodeError> {
        let flexible = version >= 4;
        let group_id = reader.string("group id", flexible)?;
        if version <= 2 {
            let member_id = reader.string("member id", flexible)?;
            return Ok(LeaveGroupRequest {
                group_id,
                members: vec![LeavingMember { member_id, group_instance_id: None }],
            });
        }
        // A member is at least a member id length and an instance id length.
        let count = reader.array_len("leaving members", flexible, 3, LEAVE_GROUP_MEMBERS_MAX)?;
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let member_id = reader.string("member id", flexible)?;
            let group_instance_id = reader.nullable_string("group instance id", flexible)?;
            if version >= 5 {
                // Why the member leaves (KIP-800), for the coordinator's log.
                reader.nullable_string("leave reason", flexible)?;
            }
            reader.skip_tagged_fields(flexible)?;
            members.push(LeavingMember { member_id, group_instance_id });
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(LeaveGroupRequest { group_id, members })
    }
}
