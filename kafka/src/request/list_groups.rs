//! The ListGroups request (key 16), versions 0–5: an admin client lists the groups the broker
//! coordinates, optionally filtered by state (v4+, KIP-518) and by type (v5+, KIP-848). v0–3
//! have no fields.

use crate::error::DecodeError;
use crate::read::Reader;

/// Values one filter of a ListGroups request may list (there are a handful of group states and
/// types).
pub const LIST_GROUPS_FILTER_MAX: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListGroupsRequest {
    /// v4+: the group states to list ("Stable", "Empty", ...; Kafka compares them ignoring
    /// case); empty: every state, and before v4.
    pub states_filter: Vec<String>,
    /// v5+: the group types to list ("classic", "consumer", ...); empty: every type, and
    /// before v5.
    pub types_filter: Vec<String>,
}

impl ListGroupsRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<ListGroupsRequest, DecodeError> {
        let flexible = version >= 3;
        let states_filter = if version >= 4 {
            decode_filter(reader, "list groups states filter")?
        } else {
            Vec::new()
        };
        let types_filter = if version >= 5 {
            decode_filter(reader, "list groups types filter")?
        } else {
            Vec::new()
        };
        reader.skip_tagged_fields(flexible)?;
        Ok(ListGroupsRequest { states_filter, types_filter })
    }
}

/// A compact array of compact strings (both filters are flexible-only fields).
fn decode_filter(reader: &mut Reader, what: &'static str) -> Result<Vec<String>, DecodeError> {
    let count = reader.array_len(what, true, 1, LIST_GROUPS_FILTER_MAX)?;
    let mut values = Vec::with_capacity(count);
    for _ in 0..count {
        values.push(reader.string(what, true)?);
    }
    Ok(values)
}
