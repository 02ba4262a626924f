//! The FindCoordinator request (key 10), versions 0–6: which broker coordinates a consumer
//! group (or a transactional id). v0–3 ask about one key; v4+ about a batch of them (KIP-699).

use crate::error::DecodeError;
use crate::read::Reader;

/// Keys one FindCoordinator request may ask about (an admin client batches the groups it
/// describes; a consumer asks about its one group).
pub const FIND_COORDINATOR_KEYS_MAX: usize = 10_000;

/// `key_type` of a consumer group id (the only type before v1).
pub const GROUP_KEY_TYPE: i8 = 0;
/// `key_type` of a transactional id.
pub const TRANSACTION_KEY_TYPE: i8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindCoordinatorRequest {
    /// [`GROUP_KEY_TYPE`] or [`TRANSACTION_KEY_TYPE`] (v1+; v0 asks about groups only). Other
    /// values are kept as sent, for the handler to refuse.
    pub key_type: i8,
    /// The keys asked about: one in v0–3, the batch of v4+ (possibly empty).
    pub keys: Vec<String>,
}

impl FindCoordinatorRequest {
    pub fn decode(
        reader: &mut Reader,
        version: i16,
    ) -> Result<FindCoordinatorRequest, DecodeError> {
        let flexible = version >= 3;
        let key =
            if version <= 3 { Some(reader.string("coordinator key", flexible)?) } else { None };
        let key_type = if version >= 1 { reader.i8("key type")? } else { GROUP_KEY_TYPE };
        let keys = match key {
            Some(key) => vec![key],
            None => {
                // A key is at least its compact length.
                let count =
                    reader.array_len("coordinator keys", true, 1, FIND_COORDINATOR_KEYS_MAX)?;
                let mut keys = Vec::with_capacity(count);
                for _ in 0..count {
                    keys.push(reader.string("coordinator key", true)?);
                }
                keys
            }
        };
        reader.skip_tagged_fields(flexible)?;
        Ok(FindCoordinatorRequest { key_type, keys })
    }
}
