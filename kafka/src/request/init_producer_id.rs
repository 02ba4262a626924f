//! The InitProducerId request (key 22), versions 0–4: an idempotent producer asks for its
//! producer id and epoch.

use crate::error::DecodeError;
use crate::read::Reader;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdRequest {
    /// Set only by transactional producers, which Shoal does not serve yet.
    pub transactional_id: Option<String>,
}

impl InitProducerIdRequest {
    pub fn decode(reader: &mut Reader, version: i16) -> Result<InitProducerIdRequest, DecodeError> {
        let flexible = version >= 2;
        let transactional_id = reader.nullable_string("transactional id", flexible)?;
        reader.i32("transaction timeout")?;
        if version >= 3 {
            // The id and epoch a producer had (KIP-360); Shoal hands out a new id instead of
            // bumping the epoch, which the client accepts alike.
            reader.i64("producer id")?;
            reader.i16("producer epoch")?;
        }
        reader.skip_tagged_fields(flexible)?;
        Ok(InitProducerIdRequest { transactional_id })
    }
}
