//! Why bytes were refused as a header ([`HeaderError`]) or a body as belonging to its header
//! ([`BodyError`]): typed, with the field and value that failed, for logs and for the caller's
//! decision (drop the message, mark a record torn or corrupt).

use std::fmt;

use super::Command;
use super::layout::{HEADER_SIZE, VERSION, VERSION_MIN_READ};

/// Why bytes were not accepted as a header, or a body as belonging to its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer than [`HEADER_SIZE`] bytes were available.
    TooShort {
        /// Bytes available.
        len: usize,
    },
    /// `checksum_header` does not match the header bytes: torn write, corruption, or not a header.
    BadChecksum {
        /// Value in bytes 0..4.
        stored: u32,
        /// CRC-32C of bytes 4..256.
        computed: u32,
    },
    /// The header was written by a version this build does not read.
    UnsupportedVersion(u8),
    /// The command byte is [`Command::Reserved`] or not known to this build.
    UnknownCommand(u8),
    /// A reserved byte is not zero.
    ReservedNonZero {
        /// Offset of the first non-zero reserved byte within the header.
        offset: usize,
    },
    /// `size` is smaller than the header itself.
    SizeTooSmall(u32),
    /// A flags field has a bit this build does not define.
    UnknownFlags {
        /// Offset of the flags field within the header.
        offset: usize,
        /// The whole flags field.
        flags: u32,
    },
    /// `size` disagrees with the body the command's fields require (see
    /// [`Fields::body_size_required`]).
    SizeInconsistent {
        /// The `size` field.
        size: u32,
        /// Header plus required body, in bytes (may exceed `u32::MAX`).
        expected: u64,
    },
    /// `size` exceeds what the command's body may be (see
    /// [`Fields::body_size_max`](super::Fields::body_size_max)).
    SizeOverLimit {
        /// The `size` field.
        size: u32,
        /// Header plus largest allowed body, in bytes.
        max: u64,
    },
    /// The body is not `size - HEADER_SIZE` bytes long.
    BodySizeMismatch {
        /// Body length the header promises.
        expected: usize,
        /// Body length supplied.
        actual: usize,
    },
    /// `checksum_body` does not match the body.
    BadBodyChecksum {
        /// Value in the header.
        stored: u32,
        /// CRC-32C of the supplied body.
        computed: u32,
    },
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::TooShort { len } => write!(
                f,
                "header needs {HEADER_SIZE} bytes but only {len} are available; read more before \
                 decoding"
            ),
            HeaderError::BadChecksum { stored, computed } => write!(
                f,
                "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): \
                 the header is torn, corrupt, or not a Shoal header; do not trust any of its fields"
            ),
            HeaderError::UnsupportedVersion(version) => write!(
                f,
                "header format version {version} is not supported (this build reads \
                 {VERSION_MIN_READ}..={VERSION}); upgrade or downgrade one step at a time"
            ),
            HeaderError::UnknownCommand(command) => write!(
                f,
                "unknown header command byte {command}; the peer or file is from a newer build, \
                 or the message is malformed"
            ),
            HeaderError::ReservedNonZero { offset } => write!(
                f,
                "reserved header byte at offset {offset} is not zero; the writer is from a newer \
                 format or is buggy"
            ),
            HeaderError::SizeTooSmall(size) => write!(
                f,
                "header size field is {size}, smaller than the {HEADER_SIZE}-byte header itself; \
                 the writer is buggy"
            ),
            HeaderError::UnknownFlags { offset, flags } => write!(
                f,
                "flags field at header offset {offset} is {flags:#010x}, with bits this build \
                 does not define; the writer is from a newer format or is buggy"
            ),
            HeaderError::SizeInconsistent { size, expected } => write!(
                f,
                "header size field is {size} but its count fields require {expected} bytes; the \
                 message was framed wrongly"
            ),
            HeaderError::SizeOverLimit { size, max } => write!(
                f,
                "header size field is {size}, above the {max} bytes this command allows; the \
                 sender is buggy or hostile"
            ),
            HeaderError::BodySizeMismatch { expected, actual } => write!(
                f,
                "body is {actual} bytes but the header promises {expected}; the message was \
                 truncated or framed wrongly"
            ),
            HeaderError::BadBodyChecksum { stored, computed } => write!(
                f,
                "body checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): \
                 the body is torn or corrupt"
            ),
        }
    }
}

impl std::error::Error for HeaderError {}

/// Why the body of a replica message was not accepted (after its header and body checksum were).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The header passed in is not of the command whose body was asked for.
    WrongCommand {
        /// The command the decoder handles.
        expected: Command,
        /// The header's command.
        actual: Command,
    },
    /// The message's count field exceeds the caller's limit.
    CountOverLimit {
        /// The count field.
        count: u32,
        /// The caller's limit.
        max: usize,
    },
    /// The body is not exactly as long as the count requires.
    LengthMismatch {
        /// Body length the count requires, in bytes.
        expected: u64,
        /// Body length supplied.
        actual: usize,
    },
    /// A header inside the body failed [`Header::decode`].
    Header {
        /// Position of the header in the body, from 0.
        index: usize,
        /// Why it failed.
        error: HeaderError,
    },
    /// A header inside the body is not a [`Command::Prepare`].
    NotPrepare {
        /// Position of the header in the body, from 0.
        index: usize,
        /// Its command.
        command: Command,
    },
    /// A header's op is not above the op of the header before it.
    OpsNotAscending {
        /// Position of the header in the body, from 0.
        index: usize,
        /// Its op.
        op: u64,
        /// The previous header's op.
        previous: u64,
    },
    /// A flag byte has an undefined bit, or both present and nack.
    BadFlags {
        /// Position of the flag byte among the flags, from 0 (the same as its header's).
        index: usize,
        /// The flag byte.
        flags: u8,
    },
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::WrongCommand { expected, actual } => write!(
                f,
                "asked to decode a {expected:?} body under a {actual:?} header; the caller \
                 dispatched wrongly"
            ),
            BodyError::CountOverLimit { count, max } => write!(
                f,
                "message claims {count} records, more than the limit of {max}; the peer is \
                 misconfigured or hostile"
            ),
            BodyError::LengthMismatch { expected, actual } => write!(
                f,
                "body is {actual} bytes but its count requires {expected}; the message was \
                 framed wrongly"
            ),
            BodyError::Header { index, error } => {
                write!(f, "header {index} in the body does not decode: {error}")
            }
            BodyError::NotPrepare { index, command } => write!(
                f,
                "header {index} in the body is a {command:?}, not a Prepare; the sender is buggy"
            ),
            BodyError::OpsNotAscending { index, op, previous } => write!(
                f,
                "header {index} in the body has op {op}, not above the previous op {previous}; \
                 the sender is buggy"
            ),
            BodyError::BadFlags { index, flags } => write!(
                f,
                "flag byte {index} is {flags:#04x}: only present (0x01) or nack (0x02), never \
                 both, are defined; the sender is from a newer format or is buggy"
            ),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Header { error, .. } => Some(error),
            _ => None,
        }
    }
}
