//! The Heartbeat request (key 12), versions 0–4: a member of a consumer group (classic
//! protocol) tells the coordinator it is alive in the group's current generation.

use crate::error::DecodeError;
use crate::read::Reader;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    /// v3+: the static member's instance id (KIP-345); `None` for a dynamic member and
    /// before v3.
    pub group_instance_id: Option<String>,
}

impl HeartbeatRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<HeartbeatRequest, DecodeError> {
        let flexible = version >= 4;
        let group_id = reader.string("group id", flexible)?;
        let generation_id = reader.i32("generation id")?;
        let member_id = reader.string("member id", flexible)?;
        let group_instance_id = if version >= 3 {
            reader.nullable_string("group instance id", flexible)?
        } else {
            None
        };
        reader.skip_tagged_fields(flexible)?;
        Ok(HeartbeatRequest { group_id, generation_id, member_id, group_instance_id })
    }
}
