//! The wire header: the one fixed-size, 256-byte, little-endian header that precedes every message
//! Shoal puts on a socket or on disk (prepares in segment files and the shard journal today;
//! client requests, replies and replica messages later).
//!
//! This module owns exactly two things: the byte layout of those 256 bytes and the two CRC-32C
//! checksums that make them trustworthy. [`Header::decode`] is the only door from untrusted bytes
//! to a [`Header`], and it verifies the header checksum before it believes any other field, so
//! everything downstream may assume a decoded header is internally consistent. The module must
//! never interpret the body (it only checks the body's length and checksum), never allocate per
//! header, never impose a message size limit (that is the caller's policy, passed in by the
//! caller), and never panic on any input bytes. The byte-by-byte layout, checksum rules and
//! version log are mirrored in `docs/storage-format.md`; change both together.

use std::fmt;

/// Size of every header in bytes, on disk and on the wire.
pub const HEADER_SIZE: usize = 256;

/// The format version this build writes into every header it authors.
///
/// Rule "read N−1, write N": [`Header::decode`] accepts [`VERSION`] and `VERSION − 1` (when
/// `VERSION > 1`), so a rolling upgrade never meets a peer or a file it cannot read. Bump it when
/// the meaning or position of any byte changes, and record the bump in `docs/storage-format.md`.
pub const VERSION: u8 = 1;

/// Oldest version [`Header::decode`] accepts; see [`VERSION`].
pub const VERSION_MIN_READ: u8 = if VERSION > 1 { VERSION - 1 } else { VERSION };

// Offsets are chained from sizes so that inserting or resizing a field cannot silently leave a
// stale literal behind; the assertions below pin the result to the documented layout.

// Common prefix, shared by all commands.
const OFF_CHECKSUM_HEADER: usize = 0;
const OFF_CHECKSUM_BODY: usize = OFF_CHECKSUM_HEADER + size_of::<u32>();
const OFF_CLUSTER: usize = OFF_CHECKSUM_BODY + size_of::<u32>();
const OFF_SIZE: usize = OFF_CLUSTER + size_of::<u64>();
const OFF_VIEW: usize = OFF_SIZE + size_of::<u32>();
const OFF_COMMAND: usize = OFF_VIEW + size_of::<u32>();
const OFF_VERSION: usize = OFF_COMMAND + size_of::<u8>();
const OFF_REPLICA: usize = OFF_VERSION + size_of::<u8>();
const OFF_RESERVED_COMMON: usize = OFF_REPLICA + size_of::<u8>();
const SIZE_RESERVED_COMMON: usize = 5;
const SIZE_COMMON_PREFIX: usize = OFF_RESERVED_COMMON + SIZE_RESERVED_COMMON;

// `Command::Prepare` region.
const OFF_PREPARE_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_PREPARE_OP: usize = OFF_PREPARE_GROUP + size_of::<u64>();
const OFF_PREPARE_COMMIT: usize = OFF_PREPARE_OP + size_of::<u64>();
const OFF_PREPARE_PARENT: usize = OFF_PREPARE_COMMIT + size_of::<u64>();
const OFF_PREPARE_RESERVED_PARENT: usize = OFF_PREPARE_PARENT + size_of::<u32>();
const SIZE_PREPARE_RESERVED_PARENT: usize = size_of::<u32>();
const OFF_PREPARE_BASE_OFFSET: usize = OFF_PREPARE_RESERVED_PARENT + SIZE_PREPARE_RESERVED_PARENT;
const OFF_PREPARE_RECORD_COUNT: usize = OFF_PREPARE_BASE_OFFSET + size_of::<u64>();
const OFF_PREPARE_RESERVED_RECORD_COUNT: usize = OFF_PREPARE_RECORD_COUNT + size_of::<u32>();
const SIZE_PREPARE_RESERVED_RECORD_COUNT: usize = size_of::<u32>();
const OFF_PREPARE_FIRST_TIMESTAMP_MS: usize =
    OFF_PREPARE_RESERVED_RECORD_COUNT + SIZE_PREPARE_RESERVED_RECORD_COUNT;
const OFF_PREPARE_MAX_TIMESTAMP_MS: usize = OFF_PREPARE_FIRST_TIMESTAMP_MS + size_of::<i64>();
const OFF_PREPARE_APPEND_TIME_MS: usize = OFF_PREPARE_MAX_TIMESTAMP_MS + size_of::<i64>();
const OFF_PREPARE_CLIENT: usize = OFF_PREPARE_APPEND_TIME_MS + size_of::<i64>();
const OFF_PREPARE_SESSION: usize = OFF_PREPARE_CLIENT + size_of::<u64>();
const OFF_PREPARE_REQUEST: usize = OFF_PREPARE_SESSION + size_of::<u64>();
const OFF_PREPARE_RESERVED_TAIL: usize = OFF_PREPARE_REQUEST + size_of::<u64>();
const SIZE_PREPARE_RESERVED_TAIL: usize = 128;
const SIZE_PREPARE: usize = OFF_PREPARE_RESERVED_TAIL + SIZE_PREPARE_RESERVED_TAIL;

// `Command::JournalEntry` region: the shard journal's frame around one prepare.
const OFF_JOURNAL_SEQ: usize = SIZE_COMMON_PREFIX;
const OFF_JOURNAL_DURABLE_SEQ: usize = OFF_JOURNAL_SEQ + size_of::<u64>();
const OFF_JOURNAL_TAIL_SEQ: usize = OFF_JOURNAL_DURABLE_SEQ + size_of::<u64>();
const OFF_JOURNAL_RESERVED_TAIL: usize = OFF_JOURNAL_TAIL_SEQ + size_of::<u64>();
const SIZE_JOURNAL_RESERVED_TAIL: usize = HEADER_SIZE - OFF_JOURNAL_RESERVED_TAIL;

const _: () = assert!(SIZE_COMMON_PREFIX == 32);
const _: () = assert!(OFF_JOURNAL_RESERVED_TAIL == 56);
const _: () = assert!(SIZE_PREPARE == HEADER_SIZE);
// Spot checks against the documented offsets, so a wrong chain link fails the build rather than
// the golden test.
const _: () = assert!(OFF_COMMAND == 24);
const _: () = assert!(OFF_PREPARE_PARENT == 56);
const _: () = assert!(OFF_PREPARE_BASE_OFFSET == 64);
const _: () = assert!(OFF_PREPARE_FIRST_TIMESTAMP_MS == 80);
const _: () = assert!(OFF_PREPARE_RESERVED_TAIL == 128);
// Natural alignment keeps a zero-copy view of the header possible later.
const _: () = {
    let offsets_u64 = [
        OFF_CLUSTER,
        OFF_PREPARE_GROUP,
        OFF_PREPARE_OP,
        OFF_PREPARE_COMMIT,
        OFF_PREPARE_BASE_OFFSET,
        OFF_PREPARE_FIRST_TIMESTAMP_MS,
        OFF_PREPARE_MAX_TIMESTAMP_MS,
        OFF_PREPARE_APPEND_TIME_MS,
        OFF_PREPARE_CLIENT,
        OFF_PREPARE_SESSION,
        OFF_PREPARE_REQUEST,
    ];
    let mut i = 0;
    while i < offsets_u64.len() {
        assert!(offsets_u64[i].is_multiple_of(size_of::<u64>()));
        i += 1;
    }
};

/// Byte ranges (offset, length) that must be zero in every header.
const RESERVED_COMMON: [(usize, usize); 1] = [(OFF_RESERVED_COMMON, SIZE_RESERVED_COMMON)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Prepare`] header.
const RESERVED_PREPARE: [(usize, usize); 3] = [
    (OFF_PREPARE_RESERVED_PARENT, SIZE_PREPARE_RESERVED_PARENT),
    (OFF_PREPARE_RESERVED_RECORD_COUNT, SIZE_PREPARE_RESERVED_RECORD_COUNT),
    (OFF_PREPARE_RESERVED_TAIL, SIZE_PREPARE_RESERVED_TAIL),
];

/// Byte ranges (offset, length) that must be zero in a [`Command::JournalEntry`] header.
const RESERVED_JOURNAL: [(usize, usize); 1] =
    [(OFF_JOURNAL_RESERVED_TAIL, SIZE_JOURNAL_RESERVED_TAIL)];

/// What a message is, and therefore how bytes 32..256 of its header are laid out.
///
/// Later issues add `Request`, `Reply`, `PrepareOk`, `Commit`, `StartViewChange`, `DoViewChange`,
/// `StartView`, `RequestStartView`, `RequestPrepare`, `Ping`, … as new variants with new numbers
/// (never reusing one), each with its own [`Fields`] variant. Until a command is added here,
/// [`Header::decode`] rejects its byte as [`HeaderError::UnknownCommand`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Never valid on the wire: a zeroed header must not decode as a real message.
    Reserved = 0,
    /// A replicated operation carrying one record batch for one VSR group.
    Prepare = 1,
    /// The shard journal's frame around one prepare (header and body): never sent on a socket.
    JournalEntry = 2,
}

impl Command {
    /// The command a wire byte denotes, or `None` for [`Command::Reserved`] and unknown bytes.
    pub fn from_u8(byte: u8) -> Option<Command> {
        match byte {
            1 => Some(Command::Prepare),
            2 => Some(Command::JournalEntry),
            _ => None,
        }
    }
}

/// Per-command fields, stored in bytes 32..256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fields {
    /// Fields of a [`Command::Prepare`] header.
    Prepare(Prepare),
    /// Fields of a [`Command::JournalEntry`] header.
    JournalEntry(JournalEntry),
}

impl Fields {
    /// The command whose layout these fields use.
    pub fn command(&self) -> Command {
        match self {
            Fields::Prepare(_) => Command::Prepare,
            Fields::JournalEntry(_) => Command::JournalEntry,
        }
    }
}

/// The per-command fields of a prepare: one batch of records appended to one VSR group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Prepare {
    /// VSR group id: one group per partition, plus one for metadata.
    pub group: u64,
    /// Op number of this prepare within its group.
    pub op: u64,
    /// Highest op the primary knew to be committed when it sent this prepare.
    pub commit: u64,
    /// `checksum_header` of the previous op's header in this group: the hash chain that lets
    /// recovery and replicas prove the log has no gaps or forks.
    pub parent: u32,
    /// Offset of the first record in the batch.
    pub base_offset: u64,
    /// Number of records in the batch.
    pub record_count: u32,
    /// Timestamp of the first record, in milliseconds since the Unix epoch.
    pub first_timestamp_ms: i64,
    /// Largest record timestamp in the batch, in milliseconds since the Unix epoch.
    pub max_timestamp_ms: i64,
    /// When the primary appended the batch, in milliseconds since the Unix epoch.
    pub append_time_ms: i64,
    /// Id of the client that sent the request.
    pub client: u64,
    /// The client's session number.
    pub session: u64,
    /// The client's request number within its session.
    pub request: u64,
}

/// The per-command fields of a journal entry. The body is one whole prepare (header and
/// batch), so the journal holds the very bytes the segment holds.
///
/// Sequence numbers let recovery tell the journal's synced region from its torn window:
/// every entry with `seq <= durable_seq` of the newest entry was synced before that entry was
/// written, and entries below `tail_seq` may already have been overwritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct JournalEntry {
    /// Position of this entry in the shard's journal order, starting at 1.
    pub seq: u64,
    /// Highest `seq` made durable by a completed sync when this entry was written.
    pub durable_seq: u64,
    /// Lowest `seq` still needed (not yet covered by a checkpoint) when this entry was written.
    pub tail_seq: u64,
}

/// A decoded (or about-to-be-encoded) wire header.
///
/// Invariant: `command == fields.command()`. [`Header::prepare`] and [`Header::decode`] uphold it;
/// code building a `Header` by hand must too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// CRC-32C over header bytes 4..256. Because that range includes `checksum_body`, this one
    /// value commits to the whole message, which is why the hash chain can use it alone.
    pub checksum_header: u32,
    /// CRC-32C of the body following the header (`0` for an empty body).
    pub checksum_body: u32,
    /// Cluster id, so messages and files from another cluster are never mistaken for ours.
    pub cluster: u64,
    /// Header plus body, in bytes; at least [`HEADER_SIZE`].
    pub size: u32,
    /// VSR view number.
    pub view: u32,
    /// What the message is; selects the layout of `fields`.
    pub command: Command,
    /// Format version the header was written with.
    pub version: u8,
    /// Index of the replica that sent the message.
    pub replica: u8,
    /// The per-command fields.
    pub fields: Fields,
}

impl Header {
    /// Builds a sealed prepare header for `body`: `size` and `checksum_body` come from the body,
    /// `version` is [`VERSION`], and `checksum_header` is computed last.
    ///
    /// # Panics
    ///
    /// If `body` is longer than `u32::MAX - HEADER_SIZE` bytes; callers enforce their own, far
    /// smaller, message limit before getting here.
    pub fn prepare(cluster: u64, view: u32, replica: u8, fields: Prepare, body: &[u8]) -> Header {
        let size = body
            .len()
            .checked_add(HEADER_SIZE)
            .and_then(|size| u32::try_from(size).ok())
            .expect("message body exceeds the u32 size field");
        let mut header = Header {
            checksum_header: 0,
            checksum_body: crc32c::crc32c(body),
            cluster,
            size,
            view,
            command: Command::Prepare,
            version: VERSION,
            replica,
            fields: Fields::Prepare(fields),
        };
        header.seal();
        header
    }

    /// Builds a sealed journal entry header framing `body` (one encoded prepare).
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn journal_entry(cluster: u64, fields: JournalEntry, body: &[u8]) -> Header {
        let mut header = Header::prepare(cluster, 0, 0, Prepare::default(), body);
        header.command = Command::JournalEntry;
        header.fields = Fields::JournalEntry(fields);
        header.seal();
        header
    }

    /// Recomputes `checksum_header` from every other field. Call it after changing any field;
    /// [`Header::encode`] deliberately does not, so that re-encoding a decoded header reproduces
    /// its bytes exactly (replicas and the hash chain depend on that).
    pub fn seal(&mut self) {
        self.checksum_header = checksum_header(&self.encode());
    }

    /// Serializes the header as it is, `checksum_header` and `version` included. A header that was
    /// not sealed after its last change encodes to bytes that [`Header::decode`] rejects.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut bytes = [0u8; HEADER_SIZE];
        put_u32(&mut bytes, OFF_CHECKSUM_HEADER, self.checksum_header);
        put_u32(&mut bytes, OFF_CHECKSUM_BODY, self.checksum_body);
        put_u64(&mut bytes, OFF_CLUSTER, self.cluster);
        put_u32(&mut bytes, OFF_SIZE, self.size);
        put_u32(&mut bytes, OFF_VIEW, self.view);
        // The fields decide the layout of bytes 32..256, so they decide the command byte too;
        // writing `self.command` could label a prepare layout as something else.
        debug_assert_eq!(self.command, self.fields.command());
        bytes[OFF_COMMAND] = self.fields.command() as u8;
        bytes[OFF_VERSION] = self.version;
        bytes[OFF_REPLICA] = self.replica;
        match &self.fields {
            Fields::Prepare(prepare) => encode_prepare(&mut bytes, prepare),
            Fields::JournalEntry(entry) => {
                put_u64(&mut bytes, OFF_JOURNAL_SEQ, entry.seq);
                put_u64(&mut bytes, OFF_JOURNAL_DURABLE_SEQ, entry.durable_seq);
                put_u64(&mut bytes, OFF_JOURNAL_TAIL_SEQ, entry.tail_seq);
            }
        }
        bytes
    }

    /// Parses and validates a header. Checks run in this order, and the first failure is returned:
    /// `checksum_header` (nothing else is trusted before it passes), version, command, reserved
    /// bytes zero, `size >= HEADER_SIZE`. The body is not checked; see [`Header::verify_body`].
    pub fn decode(bytes: &[u8; HEADER_SIZE]) -> Result<Header, HeaderError> {
        let stored = get_u32(bytes, OFF_CHECKSUM_HEADER);
        let computed = checksum_header(bytes);
        if stored != computed {
            return Err(HeaderError::BadChecksum { stored, computed });
        }

        let version = bytes[OFF_VERSION];
        if !(VERSION_MIN_READ..=VERSION).contains(&version) {
            return Err(HeaderError::UnsupportedVersion(version));
        }

        let command_byte = bytes[OFF_COMMAND];
        let command =
            Command::from_u8(command_byte).ok_or(HeaderError::UnknownCommand(command_byte))?;

        let reserved_command: &[(usize, usize)] = match command {
            Command::Prepare => &RESERVED_PREPARE,
            Command::JournalEntry => &RESERVED_JOURNAL,
            // `from_u8` never yields `Reserved`; treat it as unknown rather than trusting that.
            Command::Reserved => return Err(HeaderError::UnknownCommand(command_byte)),
        };
        for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_command) {
            if let Some(nonzero) = bytes[offset..offset + len].iter().position(|&b| b != 0) {
                return Err(HeaderError::ReservedNonZero { offset: offset + nonzero });
            }
        }

        let size = get_u32(bytes, OFF_SIZE);
        if (size as usize) < HEADER_SIZE {
            return Err(HeaderError::SizeTooSmall(size));
        }

        let fields = match command {
            Command::Prepare => Fields::Prepare(decode_prepare(bytes)),
            Command::JournalEntry => Fields::JournalEntry(JournalEntry {
                seq: get_u64(bytes, OFF_JOURNAL_SEQ),
                durable_seq: get_u64(bytes, OFF_JOURNAL_DURABLE_SEQ),
                tail_seq: get_u64(bytes, OFF_JOURNAL_TAIL_SEQ),
            }),
            Command::Reserved => return Err(HeaderError::UnknownCommand(command_byte)),
        };
        Ok(Header {
            checksum_header: stored,
            checksum_body: get_u32(bytes, OFF_CHECKSUM_BODY),
            cluster: get_u64(bytes, OFF_CLUSTER),
            size,
            view: get_u32(bytes, OFF_VIEW),
            command,
            version,
            replica: bytes[OFF_REPLICA],
            fields,
        })
    }

    /// Like [`Header::decode`], for the first [`HEADER_SIZE`] bytes of a longer buffer (a socket
    /// read or a file region). Bytes after the header are ignored.
    pub fn decode_prefix(bytes: &[u8]) -> Result<Header, HeaderError> {
        match bytes.first_chunk::<HEADER_SIZE>() {
            Some(header) => Header::decode(header),
            None => Err(HeaderError::TooShort { len: bytes.len() }),
        }
    }

    /// Length of the body that follows this header, in bytes. It is not capped here: compare it
    /// with your own message limit before allocating or reading that many bytes.
    pub fn body_size(&self) -> usize {
        // Saturating so a hand-built header with a bogus size cannot panic; decoded headers
        // always have `size >= HEADER_SIZE`.
        (self.size as usize).saturating_sub(HEADER_SIZE)
    }

    /// Checks that `body` is exactly [`Header::body_size`] bytes and matches `checksum_body`.
    pub fn verify_body(&self, body: &[u8]) -> Result<(), HeaderError> {
        let expected = self.body_size();
        if body.len() != expected {
            return Err(HeaderError::BodySizeMismatch { expected, actual: body.len() });
        }
        let computed = crc32c::crc32c(body);
        if computed != self.checksum_body {
            return Err(HeaderError::BadBodyChecksum { stored: self.checksum_body, computed });
        }
        Ok(())
    }

    /// The prepare fields, if this is a [`Command::Prepare`] header.
    pub fn as_prepare(&self) -> Option<&Prepare> {
        match &self.fields {
            Fields::Prepare(prepare) => Some(prepare),
            Fields::JournalEntry(_) => None,
        }
    }

    /// The journal entry fields, if this is a journal entry header.
    pub fn as_journal_entry(&self) -> Option<&JournalEntry> {
        match &self.fields {
            Fields::JournalEntry(entry) => Some(entry),
            Fields::Prepare(_) => None,
        }
    }
}

/// The `checksum_header` that encoded header `bytes` should carry: CRC-32C over bytes 4..256.
/// Useful when only raw bytes are at hand, e.g. to check a parent link without a full decode.
pub fn checksum_header(bytes: &[u8; HEADER_SIZE]) -> u32 {
    crc32c::crc32c(&bytes[OFF_CHECKSUM_BODY..])
}

/// True if every byte is zero (and for an empty slice).
///
/// Recovery treats an all-zero header region as the end of written data (space preallocated but
/// never written), which is a normal stop, whereas a header failing [`Header::decode`] means a torn
/// or corrupt write, which is not. An all-zero header never decodes, since its checksum field
/// (0) differs from the CRC of 252 zero bytes.
pub fn is_zeroed(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

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

fn encode_prepare(bytes: &mut [u8; HEADER_SIZE], prepare: &Prepare) {
    put_u64(bytes, OFF_PREPARE_GROUP, prepare.group);
    put_u64(bytes, OFF_PREPARE_OP, prepare.op);
    put_u64(bytes, OFF_PREPARE_COMMIT, prepare.commit);
    put_u32(bytes, OFF_PREPARE_PARENT, prepare.parent);
    put_u64(bytes, OFF_PREPARE_BASE_OFFSET, prepare.base_offset);
    put_u32(bytes, OFF_PREPARE_RECORD_COUNT, prepare.record_count);
    put_u64(bytes, OFF_PREPARE_FIRST_TIMESTAMP_MS, prepare.first_timestamp_ms as u64);
    put_u64(bytes, OFF_PREPARE_MAX_TIMESTAMP_MS, prepare.max_timestamp_ms as u64);
    put_u64(bytes, OFF_PREPARE_APPEND_TIME_MS, prepare.append_time_ms as u64);
    put_u64(bytes, OFF_PREPARE_CLIENT, prepare.client);
    put_u64(bytes, OFF_PREPARE_SESSION, prepare.session);
    put_u64(bytes, OFF_PREPARE_REQUEST, prepare.request);
}

fn decode_prepare(bytes: &[u8; HEADER_SIZE]) -> Prepare {
    Prepare {
        group: get_u64(bytes, OFF_PREPARE_GROUP),
        op: get_u64(bytes, OFF_PREPARE_OP),
        commit: get_u64(bytes, OFF_PREPARE_COMMIT),
        parent: get_u32(bytes, OFF_PREPARE_PARENT),
        base_offset: get_u64(bytes, OFF_PREPARE_BASE_OFFSET),
        record_count: get_u32(bytes, OFF_PREPARE_RECORD_COUNT),
        first_timestamp_ms: get_u64(bytes, OFF_PREPARE_FIRST_TIMESTAMP_MS) as i64,
        max_timestamp_ms: get_u64(bytes, OFF_PREPARE_MAX_TIMESTAMP_MS) as i64,
        append_time_ms: get_u64(bytes, OFF_PREPARE_APPEND_TIME_MS) as i64,
        client: get_u64(bytes, OFF_PREPARE_CLIENT),
        session: get_u64(bytes, OFF_PREPARE_SESSION),
        request: get_u64(bytes, OFF_PREPARE_REQUEST),
    }
}

// Offsets passed to these are the layout constants above, all in bounds by the compile-time
// checks, so the slice indexing cannot fail whatever the input bytes are.

fn put_u32(bytes: &mut [u8; HEADER_SIZE], offset: usize, value: u32) {
    bytes[offset..offset + size_of::<u32>()].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8; HEADER_SIZE], offset: usize, value: u64) {
    bytes[offset..offset + size_of::<u64>()].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(bytes: &[u8; HEADER_SIZE], offset: usize) -> u32 {
    let mut le = [0u8; size_of::<u32>()];
    le.copy_from_slice(&bytes[offset..offset + size_of::<u32>()]);
    u32::from_le_bytes(le)
}

fn get_u64(bytes: &[u8; HEADER_SIZE], offset: usize) -> u64 {
    let mut le = [0u8; size_of::<u64>()];
    le.copy_from_slice(&bytes[offset..offset + size_of::<u64>()]);
    u64::from_le_bytes(le)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_prepare() -> impl Strategy<Value = Prepare> {
        (
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()),
            (any::<u64>(), any::<u32>()),
            (any::<i64>(), any::<i64>(), any::<i64>()),
            (any::<u64>(), any::<u64>(), any::<u64>()),
        )
            .prop_map(
                |(
                    (group, op, commit, parent),
                    (base_offset, record_count),
                    (first_timestamp_ms, max_timestamp_ms, append_time_ms),
                    (client, session, request),
                )| Prepare {
                    group,
                    op,
                    commit,
                    parent,
                    base_offset,
                    record_count,
                    first_timestamp_ms,
                    max_timestamp_ms,
                    append_time_ms,
                    client,
                    session,
                    request,
                },
            )
    }

    fn arb_header_and_body() -> impl Strategy<Value = (Header, Vec<u8>)> {
        (
            any::<u64>(),
            any::<u32>(),
            any::<u8>(),
            arb_prepare(),
            proptest::collection::vec(any::<u8>(), 0..512),
        )
            .prop_map(|(cluster, view, replica, prepare, body)| {
                (Header::prepare(cluster, view, replica, prepare, &body), body)
            })
    }

    /// Re-seals raw bytes so that the check under test, not the checksum, is what fires.
    fn reseal(bytes: &mut [u8; HEADER_SIZE]) {
        let checksum = checksum_header(bytes);
        bytes[OFF_CHECKSUM_HEADER..OFF_CHECKSUM_BODY].copy_from_slice(&checksum.to_le_bytes());
    }

    fn sample_prepare() -> Prepare {
        Prepare {
            group: 0x1112_1314_1516_1718,
            op: 0x2122_2324_2526_2728,
            commit: 0x3132_3334_3536_3738,
            parent: 0x4142_4344,
            base_offset: 0x5152_5354_5556_5758,
            record_count: 0x6162_6364,
            first_timestamp_ms: 0x7172_7374_7576_7778,
            max_timestamp_ms: -2,
            append_time_ms: 1_700_000_000_000,
            client: 0x8182_8384_8586_8788,
            session: 0x9192_9394_9596_9798,
            request: 0xa1a2_a3a4_a5a6_a7a8,
        }
    }

    fn sample_header() -> Header {
        Header::prepare(0x0102_0304_0506_0708, 0x0a0b_0c0d, 3, sample_prepare(), b"shoal")
    }

    fn from_hex(hex: &str) -> Vec<u8> {
        let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    proptest! {
        #[test]
        fn wire_round_trip((header, body) in arb_header_and_body()) {
            let bytes = header.encode();
            let decoded = Header::decode(&bytes).unwrap();
            prop_assert_eq!(decoded, header);
            prop_assert_eq!(decoded.version, VERSION);
            prop_assert_eq!(decoded.body_size(), body.len());
            prop_assert_eq!(decoded.verify_body(&body), Ok(()));
            prop_assert_eq!(decoded.encode(), bytes);

            let mut message = bytes.to_vec();
            message.extend_from_slice(&body);
            prop_assert_eq!(Header::decode_prefix(&message), Ok(header));
        }

        #[test]
        fn wire_bit_flip_rejected(
            (header, _body) in arb_header_and_body(),
            bit in 0..HEADER_SIZE * 8,
        ) {
            let mut bytes = header.encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            let result = Header::decode(&bytes);
            let rejected = matches!(result, Err(HeaderError::BadChecksum { .. }));
            prop_assert!(rejected, "bit {} flip not caught", bit);
        }

        #[test]
        fn wire_decode_arbitrary_never_panics(
            raw in proptest::collection::vec(any::<u8>(), HEADER_SIZE),
        ) {
            let bytes: [u8; HEADER_SIZE] = raw.try_into().unwrap();
            let _ = Header::decode(&bytes);
        }

        /// Arbitrary bytes almost never pass the checksum, so re-seal them to reach every later
        /// check; anything that then decodes must re-encode to the very same bytes.
        #[test]
        fn wire_decode_arbitrary_sealed_is_canonical(
            raw in proptest::collection::vec(any::<u8>(), HEADER_SIZE),
            command in prop_oneof![Just(1u8), any::<u8>()],
            version in prop_oneof![Just(VERSION), any::<u8>()],
            zero_reserved in any::<bool>(),
        ) {
            let mut bytes: [u8; HEADER_SIZE] = raw.try_into().unwrap();
            bytes[OFF_COMMAND] = command;
            bytes[OFF_VERSION] = version;
            if zero_reserved {
                for &(offset, len) in RESERVED_COMMON.iter().chain(&RESERVED_PREPARE) {
                    bytes[offset..offset + len].fill(0);
                }
            }
            reseal(&mut bytes);
            if let Ok(header) = Header::decode(&bytes) {
                prop_assert_eq!(header.encode(), bytes);
                let _ = header.verify_body(&[]);
            }
        }

        #[test]
        fn wire_decode_prefix_any_length_never_panics(
            raw in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let result = Header::decode_prefix(&raw);
            if raw.len() < HEADER_SIZE {
                prop_assert_eq!(result, Err(HeaderError::TooShort { len: raw.len() }));
            }
        }
    }

    #[test]
    fn wire_every_single_bit_flip_rejected() {
        let bytes = sample_header().encode();
        for bit in 0..HEADER_SIZE * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(Header::decode(&flipped), Err(HeaderError::BadChecksum { .. })),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn wire_checksum_checked_before_anything_else() {
        let mut bytes = sample_header().encode();
        bytes[OFF_VERSION] = 0xee;
        bytes[OFF_COMMAND] = 0xee;
        let computed = checksum_header(&bytes);
        assert_eq!(
            Header::decode(&bytes),
            Err(HeaderError::BadChecksum { stored: sample_header().checksum_header, computed })
        );
    }

    #[test]
    fn wire_wrong_version_rejected() {
        for version in [0, VERSION_MIN_READ.wrapping_sub(1), VERSION + 1, u8::MAX] {
            if (VERSION_MIN_READ..=VERSION).contains(&version) {
                continue;
            }
            let mut bytes = sample_header().encode();
            bytes[OFF_VERSION] = version;
            reseal(&mut bytes);
            assert_eq!(Header::decode(&bytes), Err(HeaderError::UnsupportedVersion(version)));
        }
    }

    #[test]
    fn wire_readable_versions_accepted() {
        for version in VERSION_MIN_READ..=VERSION {
            let mut bytes = sample_header().encode();
            bytes[OFF_VERSION] = version;
            reseal(&mut bytes);
            assert_eq!(Header::decode(&bytes).unwrap().version, version);
        }
    }

    #[test]
    fn wire_unknown_command_rejected() {
        for command in [Command::Reserved as u8, 3, 0x7f, u8::MAX] {
            let mut bytes = sample_header().encode();
            bytes[OFF_COMMAND] = command;
            reseal(&mut bytes);
            assert_eq!(Header::decode(&bytes), Err(HeaderError::UnknownCommand(command)));
        }
    }

    #[test]
    fn wire_every_reserved_byte_checked() {
        let mut reserved_offsets = Vec::new();
        for &(offset, len) in RESERVED_COMMON.iter().chain(&RESERVED_PREPARE) {
            reserved_offsets.extend(offset..offset + len);
        }
        assert_eq!(reserved_offsets.len(), 5 + 4 + 4 + 128);
        for offset in reserved_offsets {
            let mut bytes = sample_header().encode();
            bytes[offset] = 0x80;
            reseal(&mut bytes);
            assert_eq!(Header::decode(&bytes), Err(HeaderError::ReservedNonZero { offset }));
        }
    }

    #[test]
    fn wire_size_too_small_rejected() {
        for size in [0, 1, HEADER_SIZE as u32 - 1] {
            let mut bytes = sample_header().encode();
            bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
            reseal(&mut bytes);
            assert_eq!(Header::decode(&bytes), Err(HeaderError::SizeTooSmall(size)));
        }
        let mut bytes = sample_header().encode();
        bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes).unwrap().body_size(), 0);
    }

    #[test]
    fn wire_body_mismatch_rejected() {
        let header = sample_header();
        assert_eq!(header.verify_body(b"shoal"), Ok(()));
        assert_eq!(
            header.verify_body(b"shoa"),
            Err(HeaderError::BodySizeMismatch { expected: 5, actual: 4 })
        );
        assert_eq!(
            header.verify_body(b"shoal!"),
            Err(HeaderError::BodySizeMismatch { expected: 5, actual: 6 })
        );
        assert_eq!(
            header.verify_body(b"shoaL"),
            Err(HeaderError::BadBodyChecksum {
                stored: crc32c::crc32c(b"shoal"),
                computed: crc32c::crc32c(b"shoaL"),
            })
        );
    }

    #[test]
    fn wire_empty_body() {
        let header = Header::prepare(1, 2, 0, Prepare::default(), &[]);
        assert_eq!(header.checksum_body, 0);
        assert_eq!(header.size as usize, HEADER_SIZE);
        assert_eq!(header.body_size(), 0);
        assert_eq!(header.verify_body(&[]), Ok(()));
    }

    #[test]
    fn wire_seal_after_change() {
        let mut header = sample_header();
        header.view += 1;
        assert!(matches!(Header::decode(&header.encode()), Err(HeaderError::BadChecksum { .. })));
        header.seal();
        assert_eq!(Header::decode(&header.encode()), Ok(header));
    }

    #[test]
    fn wire_zeroed_header_is_end_of_data_not_a_header() {
        let zero = [0u8; HEADER_SIZE];
        assert!(is_zeroed(&zero));
        assert!(is_zeroed(&[]));
        assert!(!is_zeroed(&sample_header().encode()));
        let mut one = zero;
        one[HEADER_SIZE - 1] = 1;
        assert!(!is_zeroed(&one));
        assert!(matches!(Header::decode(&zero), Err(HeaderError::BadChecksum { stored: 0, .. })));
    }

    #[test]
    fn wire_decode_prefix_lengths() {
        let mut message = sample_header().encode().to_vec();
        assert_eq!(
            Header::decode_prefix(&message[..HEADER_SIZE - 1]),
            Err(HeaderError::TooShort { len: HEADER_SIZE - 1 })
        );
        assert_eq!(Header::decode_prefix(&[]), Err(HeaderError::TooShort { len: 0 }));
        message.extend_from_slice(b"shoal");
        let header = Header::decode_prefix(&message).unwrap();
        assert_eq!(header.verify_body(&message[HEADER_SIZE..]), Ok(()));
    }

    #[test]
    fn wire_little_endian_at_known_offsets() {
        let bytes = sample_header().encode();
        assert_eq!(bytes[8..16], [0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01]);
        assert_eq!(bytes[16..20], (HEADER_SIZE as u32 + 5).to_le_bytes());
        assert_eq!(bytes[20..24], [0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(bytes[24], Command::Prepare as u8);
        assert_eq!(bytes[25], VERSION);
        assert_eq!(bytes[26], 3);
        assert_eq!(bytes[56..60], [0x44, 0x43, 0x42, 0x41]);
        assert_eq!(bytes[88..96], [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    }

    /// Pins the exact bytes of one header. If this fails, the layout changed: that is a format
    /// change, which needs a VERSION bump and a docs/storage-format.md entry, not a new literal.
    #[test]
    fn wire_golden_bytes() {
        const GOLDEN: &str = "
            5779bfb4 c39066f1 08070605 04030201 05010000 0d0c0b0a 01010300 00000000
            18171615 14131211 28272625 24232221 38373635 34333231 44434241 00000000
            58575655 54535251 64636261 00000000 78777675 74737271 feffffff ffffffff
            0068e5cf 8b010000 88878685 84838281 98979695 94939291 a8a7a6a5 a4a3a2a1
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
        ";
        let golden = from_hex(GOLDEN);
        assert_eq!(golden.len(), HEADER_SIZE);
        let header = sample_header();
        assert_eq!(header.encode().to_vec(), golden);
        let golden: [u8; HEADER_SIZE] = golden.try_into().unwrap();
        assert_eq!(Header::decode(&golden), Ok(header));
    }

    #[test]
    fn wire_as_prepare_and_command() {
        let header = sample_header();
        assert_eq!(header.command, Command::Prepare);
        assert_eq!(header.fields.command(), Command::Prepare);
        assert_eq!(header.as_prepare(), Some(&sample_prepare()));
        assert_eq!(Command::from_u8(0), None);
        assert_eq!(Command::from_u8(1), Some(Command::Prepare));
    }

    #[test]
    fn wire_errors_display_and_are_errors() {
        let errors = [
            HeaderError::TooShort { len: 3 },
            HeaderError::BadChecksum { stored: 1, computed: 2 },
            HeaderError::UnsupportedVersion(9),
            HeaderError::UnknownCommand(9),
            HeaderError::ReservedNonZero { offset: 130 },
            HeaderError::SizeTooSmall(7),
            HeaderError::BodySizeMismatch { expected: 1, actual: 2 },
            HeaderError::BadBodyChecksum { stored: 1, computed: 2 },
        ];
        for error in errors {
            let boxed: Box<dyn std::error::Error> = Box::new(error.clone());
            assert!(!boxed.to_string().is_empty());
            assert_ne!(boxed.to_string(), format!("{error:?}"));
        }
    }

    #[test]
    fn wire_journal_entry_round_trips_and_frames_a_prepare() {
        let prepare = sample_header();
        let body = prepare.encode();
        let fields = JournalEntry { seq: 7, durable_seq: 5, tail_seq: 2 };
        let header = Header::journal_entry(0xC1, fields, &body);
        let decoded = Header::decode(&header.encode()).unwrap();
        assert_eq!(decoded, header);
        assert_eq!(decoded.as_journal_entry(), Some(&fields));
        assert_eq!(decoded.as_prepare(), None);
        decoded.verify_body(&body).unwrap();
        let mut bytes = header.encode();
        bytes[OFF_JOURNAL_RESERVED_TAIL] = 1;
        reseal(&mut bytes);
        assert_eq!(
            Header::decode(&bytes),
            Err(HeaderError::ReservedNonZero { offset: OFF_JOURNAL_RESERVED_TAIL })
        );
    }
}
