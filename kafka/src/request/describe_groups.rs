//! The DescribeGroups request (key 15), versions 0–5: an admin client asks for the state,
//! protocol and members of consumer groups. (v6 adds nothing to the request.)

use crate::error::DecodeError;
use crate::read::Reader;

/// Groups one DescribeGroups request may ask about.
pub const DESCRIBE_GROUPS_GROUPS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeGroupsRequest {
    /// Group ids.
    pub groups: Vec<String>,
    /// v3+: whether to include the operations the client may perform on each group; `false`
    /// before v3.
    pub include_authorized_operations: bool,
}

impl DescribeGroupsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<DescribeGroupsRequest, DecodeError> {
        let flexible = version >= 5;
        let count =
            reader.array_len("describe groups groups", flexible, 1, DESCRIBE_GROUPS_GROUPS_MAX)?;
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            groups.push(reader.string("group id", flexible)?);
        }
        let include_authorized_operations =
            if version >= 3 { reader.bool("include authorized operations")? } else { false };
        reader.skip_tagged_fields(flexible)?;
        Ok(DescribeGroupsRequest { groups, include_authorized_operations })
    }
}
