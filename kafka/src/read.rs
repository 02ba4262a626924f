//! `Reader`: Kafka's primitive types read from one request body, every length and count bounded
//! by the bytes that are left before anything is allocated.
//!
//! A Kafka array or string announces its length up front; a hostile client can announce two
//! billion elements in a 20-byte frame. Every element of every array Shoal decodes takes at
//! least one byte on the wire, so a count larger than the bytes left is refused here, and the
//! caller's own bound (`array_len`'s `max`) applies on top. This module never panics on input
//! and never copies a byte string it can hand out as a slice of the frame.

use bytes::Bytes;

use crate::error::DecodeError;

/// A cursor over one request body (the frame after its size prefix).
#[derive(Debug)]
pub struct Reader {
    frame: Bytes,
    at: usize,
}

impl Reader {
    pub fn new(frame: Bytes) -> Self {
        Reader { frame, at: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.frame.len() - self.at
    }

    /// Position in the frame, for error messages.
    pub fn position(&self) -> usize {
        self.at
    }

    fn take(&mut self, len: usize, what: &'static str) -> Result<&[u8], DecodeError> {
        if len > self.remaining() {
            return Err(DecodeError::Truncated { what, at: self.at });
        }
        let start = self.at;
        self.at += len;
        Ok(&self.frame[start..self.at])
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub fn i8(&mut self, what: &'static str) -> Result<i8, DecodeError> {
        Ok(i8::from_be_bytes(self.array(what)?))
    }

    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        Ok(self.i8(what)? != 0)
    }

    pub fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    pub fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    pub fn uuid(&mut self, what: &'static str) -> Result<[u8; 16], DecodeError> {
        self.array(what)
    }

    /// An unsigned varint of at most 5 bytes (a `u32`), as flexible versions frame lengths.
    pub fn uvarint(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let mut value: u32 = 0;
        for index in 0..5 {
            let byte = self.array::<1>(what)?[0];
            let bits = u32::from(byte & 0x7f);
            if index == 4 && bits > 0x0f {
                return Err(DecodeError::Invalid {
                    what,
                    at: self.at,
                    reason: "varint over 32 bits",
                });
            }
            value |= bits << (7 * index);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Invalid { what, at: self.at, reason: "varint over 5 bytes" })
    }

    /// A length-prefixed byte string: `i16` (or compact, a varint of length + 1) for strings,
    /// `i32` (or compact) for bytes. `None` is null.
    fn sized(
        &mut self,
        what: &'static str,
        compact: bool,
        wide: bool,
    ) -> Result<Option<Bytes>, DecodeError> {
        let at = self.at;
        let len: i64 = if compact {
            i64::from(self.uvarint(what)?) - 1
        } else if wide {
            i64::from(self.i32(what)?)
        } else {
            i64::from(self.i16(what)?)
        };
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| DecodeError::Invalid {
            what,
            at,
            reason: "negative length",
        })?;
        if len > self.remaining() {
            return Err(DecodeError::Truncated { what, at });
        }
        let start = self.at;
        self.at += len;
        Ok(Some(self.frame.slice(start..self.at)))
    }

    /// A nullable string (`STRING`/`NULLABLE_STRING`, or their compact forms when `flexible`),
    /// checked to be UTF-8.
    pub fn nullable_string(
        &mut self,
        what: &'static str,
        flexible: bool,
    ) -> Result<Option<String>, DecodeError> {
        let at = self.at;
        match self.sized(what, flexible, false)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes.to_vec())
                .map(Some)
                .map_err(|_| DecodeError::Invalid { what, at, reason: "not UTF-8" }),
        }
    }

    /// A string that must not be null.
    pub fn string(&mut self, what: &'static str, flexible: bool) -> Result<String, DecodeError> {
        let at = self.at;
        self.nullable_string(what, flexible)?.ok_or(DecodeError::Invalid {
            what,
            at,
            reason: "null string",
        })
    }

    /// `BYTES`/`NULLABLE_BYTES`/`RECORDS` (or compact): a slice of the frame, no copy.
    pub fn nullable_bytes(
        &mut self,
        what: &'static str,
        flexible: bool,
    ) -> Result<Option<Bytes>, DecodeError> {
        self.sized(what, flexible, true)
    }

    /// Bytes that must not be null.
    pub fn bytes(&mut self, what: &'static str, flexible: bool) -> Result<Bytes, DecodeError> {
        let at = self.at;
        self.nullable_bytes(what, flexible)?.ok_or(DecodeError::Invalid {
            what,
            at,
            reason: "null bytes",
        })
    }

    /// An array's element count (`i32`, or compact), `None` for a null array. Refused when over
    /// `max` or over the bytes left (each element takes at least `min_element_bytes`).
    pub fn nullable_array_len(
        &mut self,
        what: &'static str,
        flexible: bool,
        min_element_bytes: usize,
        max: usize,
    ) -> Result<Option<usize>, DecodeError> {
        let at = self.at;
        let len: i64 =
            if flexible { i64::from(self.uvarint(what)?) - 1 } else { i64::from(self.i32(what)?) };
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| DecodeError::Invalid {
            what,
            at,
            reason: "negative count",
        })?;
        if len > max {
            return Err(DecodeError::TooMany { what, at, count: len, max });
        }
        if len.saturating_mul(min_element_bytes.max(1)) > self.remaining() {
            return Err(DecodeError::Truncated { what, at });
        }
        Ok(Some(len))
    }

    /// An array's element count; a null array reads as empty.
    pub fn array_len(
        &mut self,
        what: &'static str,
        flexible: bool,
        min_element_bytes: usize,
        max: usize,
    ) -> Result<usize, DecodeError> {
        Ok(self.nullable_array_len(what, flexible, min_element_bytes, max)?.unwrap_or(0))
    }

    /// Skips a flexible version's tagged fields (none of which Shoal reads): a count, then per
    /// field a tag and a size. Does nothing when not `flexible`.
    pub fn skip_tagged_fields(&mut self, flexible: bool) -> Result<(), DecodeError> {
        if !flexible {
            return Ok(());
        }
        let count = self.uvarint("tagged field count")?;
        if count as usize > self.remaining() {
            return Err(DecodeError::Truncated { what: "tagged fields", at: self.at });
        }
        for _ in 0..count {
            self.uvarint("tag")?;
            let size = self.uvarint("tagged field size")? as usize;
            self.take(size, "tagged field")?;
        }
        Ok(())
    }
}
