//! The wire header: the one fixed-size, 256-byte, little-endian header that precedes every message
//! Shoal puts on a socket or on disk: prepares in segment files and the shard journal, and the VSR
//! replica messages (`PrepareOk`, `Commit`, the view-change messages, `RequestStartView` and
//! `RequestPrepare`). Client requests and replies arrive with the server.
//!
//! This module owns three things: the byte layout of those 256 bytes, the two CRC-32C checksums
//! that make them trustworthy, and the fixed-record bodies of the replica messages (the entries of
//! a `Commit`, the prepare headers of a `DoViewChange` or `StartView`). [`Header::decode`] is the
//! only door from untrusted bytes to a [`Header`], and it verifies the header checksum before it
//! believes any other field, so everything downstream may assume a decoded header is internally
//! consistent; [`decode_commit_entries`] and [`decode_view_headers`] are the only doors to those
//! bodies, and they bound every count by a caller-given limit before allocating. The module must
//! never interpret any other body (it only checks a body's length and checksum), never allocate
//! per header, never impose a message size limit (that is the caller's policy, passed in by the
//! caller), never decide what a message means to a replica (that is `replication`'s), and never
//! panic on any input bytes. The byte-by-byte layout, checksum rules and version log are mirrored
//! in `docs/storage-format.md`, and the replica protocol in `docs/protocol.md`; change them
//! together.

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

// `Command::PrepareOk` region.
const OFF_PREPARE_OK_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_PREPARE_OK_OP: usize = OFF_PREPARE_OK_GROUP + size_of::<u64>();
const OFF_PREPARE_OK_COMMIT: usize = OFF_PREPARE_OK_OP + size_of::<u64>();
const OFF_PREPARE_OK_PREPARE_CHECKSUM: usize = OFF_PREPARE_OK_COMMIT + size_of::<u64>();
const OFF_PREPARE_OK_RESERVED_TAIL: usize = OFF_PREPARE_OK_PREPARE_CHECKSUM + size_of::<u32>();
const SIZE_PREPARE_OK_RESERVED_TAIL: usize = HEADER_SIZE - OFF_PREPARE_OK_RESERVED_TAIL;

// `Command::Commit` region; the entries themselves are the body.
const OFF_COMMIT_ENTRY_COUNT: usize = SIZE_COMMON_PREFIX;
const OFF_COMMIT_RESERVED_TAIL: usize = OFF_COMMIT_ENTRY_COUNT + size_of::<u32>();
const SIZE_COMMIT_RESERVED_TAIL: usize = HEADER_SIZE - OFF_COMMIT_RESERVED_TAIL;

// One `CommitEntry` in a `Command::Commit` body, relative to the entry's start.
const OFF_ENTRY_GROUP: usize = 0;
const OFF_ENTRY_COMMIT: usize = OFF_ENTRY_GROUP + size_of::<u64>();
const OFF_ENTRY_COMMIT_CHECKSUM: usize = OFF_ENTRY_COMMIT + size_of::<u64>();
const OFF_ENTRY_VIEW: usize = OFF_ENTRY_COMMIT_CHECKSUM + size_of::<u32>();

/// Size in bytes of one [`CommitEntry`] in a [`Command::Commit`] body.
pub const COMMIT_ENTRY_SIZE: usize = OFF_ENTRY_VIEW + size_of::<u32>();

// `Command::StartViewChange` region.
const OFF_START_VIEW_CHANGE_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_START_VIEW_CHANGE_RESERVED_TAIL: usize = OFF_START_VIEW_CHANGE_GROUP + size_of::<u64>();
const SIZE_START_VIEW_CHANGE_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_START_VIEW_CHANGE_RESERVED_TAIL;

// `Command::DoViewChange` region; the prepare headers and their flags are the body.
const OFF_DO_VIEW_CHANGE_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_DO_VIEW_CHANGE_OP: usize = OFF_DO_VIEW_CHANGE_GROUP + size_of::<u64>();
const OFF_DO_VIEW_CHANGE_COMMIT: usize = OFF_DO_VIEW_CHANGE_OP + size_of::<u64>();
const OFF_DO_VIEW_CHANGE_FAULTY_FROM: usize = OFF_DO_VIEW_CHANGE_COMMIT + size_of::<u64>();
const OFF_DO_VIEW_CHANGE_LOG_VIEW: usize = OFF_DO_VIEW_CHANGE_FAULTY_FROM + size_of::<u64>();
const OFF_DO_VIEW_CHANGE_HEADER_COUNT: usize = OFF_DO_VIEW_CHANGE_LOG_VIEW + size_of::<u32>();
const OFF_DO_VIEW_CHANGE_FLAGS: usize = OFF_DO_VIEW_CHANGE_HEADER_COUNT + size_of::<u32>();
const OFF_DO_VIEW_CHANGE_RESERVED_PAD: usize = OFF_DO_VIEW_CHANGE_FLAGS + size_of::<u32>();
const SIZE_DO_VIEW_CHANGE_RESERVED_PAD: usize = size_of::<u32>();
const OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP: usize =
    OFF_DO_VIEW_CHANGE_RESERVED_PAD + SIZE_DO_VIEW_CHANGE_RESERVED_PAD;
const OFF_DO_VIEW_CHANGE_RESERVED_TAIL: usize =
    OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP + size_of::<u64>();
const SIZE_DO_VIEW_CHANGE_RESERVED_TAIL: usize = HEADER_SIZE - OFF_DO_VIEW_CHANGE_RESERVED_TAIL;

// `Command::StartView` region; the prepare headers are the body.
const OFF_START_VIEW_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_START_VIEW_OP: usize = OFF_START_VIEW_GROUP + size_of::<u64>();
const OFF_START_VIEW_COMMIT: usize = OFF_START_VIEW_OP + size_of::<u64>();
const OFF_START_VIEW_NONCE: usize = OFF_START_VIEW_COMMIT + size_of::<u64>();
const OFF_START_VIEW_HEADER_COUNT: usize = OFF_START_VIEW_NONCE + size_of::<u64>();
const OFF_START_VIEW_RESERVED_TAIL: usize = OFF_START_VIEW_HEADER_COUNT + size_of::<u32>();
const SIZE_START_VIEW_RESERVED_TAIL: usize = HEADER_SIZE - OFF_START_VIEW_RESERVED_TAIL;

// `Command::RequestStartView` region.
const OFF_REQUEST_START_VIEW_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_REQUEST_START_VIEW_NONCE: usize = OFF_REQUEST_START_VIEW_GROUP + size_of::<u64>();
const OFF_REQUEST_START_VIEW_RESERVED_TAIL: usize = OFF_REQUEST_START_VIEW_NONCE + size_of::<u64>();
const SIZE_REQUEST_START_VIEW_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_REQUEST_START_VIEW_RESERVED_TAIL;

// `Command::RequestPrepare` region.
const OFF_REQUEST_PREPARE_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_REQUEST_PREPARE_OP: usize = OFF_REQUEST_PREPARE_GROUP + size_of::<u64>();
const OFF_REQUEST_PREPARE_CHECKSUM: usize = OFF_REQUEST_PREPARE_OP + size_of::<u64>();
const OFF_REQUEST_PREPARE_FLAGS: usize = OFF_REQUEST_PREPARE_CHECKSUM + size_of::<u32>();
const OFF_REQUEST_PREPARE_RESERVED_TAIL: usize = OFF_REQUEST_PREPARE_FLAGS + size_of::<u32>();
const SIZE_REQUEST_PREPARE_RESERVED_TAIL: usize = HEADER_SIZE - OFF_REQUEST_PREPARE_RESERVED_TAIL;

// `Command::RangeEvicted` region.
const OFF_RANGE_EVICTED_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_RANGE_EVICTED_OP: usize = OFF_RANGE_EVICTED_GROUP + size_of::<u64>();
const OFF_RANGE_EVICTED_OP_MIN: usize = OFF_RANGE_EVICTED_OP + size_of::<u64>();
const OFF_RANGE_EVICTED_RESERVED_TAIL: usize = OFF_RANGE_EVICTED_OP_MIN + size_of::<u64>();
const SIZE_RANGE_EVICTED_RESERVED_TAIL: usize = HEADER_SIZE - OFF_RANGE_EVICTED_RESERVED_TAIL;

// `Command::RequestState` region.
const OFF_REQUEST_STATE_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_REQUEST_STATE_OP: usize = OFF_REQUEST_STATE_GROUP + size_of::<u64>();
const OFF_REQUEST_STATE_OFFSET_BYTES: usize = OFF_REQUEST_STATE_OP + size_of::<u64>();
const OFF_REQUEST_STATE_RESERVED_TAIL: usize = OFF_REQUEST_STATE_OFFSET_BYTES + size_of::<u64>();
const SIZE_REQUEST_STATE_RESERVED_TAIL: usize = HEADER_SIZE - OFF_REQUEST_STATE_RESERVED_TAIL;

// `Command::StateChunk` region: one piece of a group's replicated state; the piece is the body.
const OFF_STATE_CHUNK_GROUP: usize = SIZE_COMMON_PREFIX;
const OFF_STATE_CHUNK_OP: usize = OFF_STATE_CHUNK_GROUP + size_of::<u64>();
const OFF_STATE_CHUNK_END_OFFSET: usize = OFF_STATE_CHUNK_OP + size_of::<u64>();
const OFF_STATE_CHUNK_SIZE_BYTES: usize = OFF_STATE_CHUNK_END_OFFSET + size_of::<u64>();
const OFF_STATE_CHUNK_OFFSET_BYTES: usize = OFF_STATE_CHUNK_SIZE_BYTES + size_of::<u64>();
const OFF_STATE_CHUNK_PREPARE_CHECKSUM: usize = OFF_STATE_CHUNK_OFFSET_BYTES + size_of::<u64>();
const OFF_STATE_CHUNK_STATE_CHECKSUM: usize = OFF_STATE_CHUNK_PREPARE_CHECKSUM + size_of::<u32>();
const OFF_STATE_CHUNK_CHUNK_SIZE_BYTES: usize = OFF_STATE_CHUNK_STATE_CHECKSUM + size_of::<u32>();
const OFF_STATE_CHUNK_RESERVED_TAIL: usize = OFF_STATE_CHUNK_CHUNK_SIZE_BYTES + size_of::<u32>();
const SIZE_STATE_CHUNK_RESERVED_TAIL: usize = HEADER_SIZE - OFF_STATE_CHUNK_RESERVED_TAIL;

// `Command::Request` region: a client's request; the operation's arguments are the body.
const OFF_REQUEST_CLIENT: usize = SIZE_COMMON_PREFIX;
const OFF_REQUEST_SESSION: usize = OFF_REQUEST_CLIENT + size_of::<u64>();
const OFF_REQUEST_REQUEST: usize = OFF_REQUEST_SESSION + size_of::<u64>();
const OFF_REQUEST_OPERATION: usize = OFF_REQUEST_REQUEST + size_of::<u64>();
const OFF_REQUEST_RESERVED_TAIL: usize = OFF_REQUEST_OPERATION + size_of::<u32>();
const SIZE_REQUEST_RESERVED_TAIL: usize = HEADER_SIZE - OFF_REQUEST_RESERVED_TAIL;

// `Command::Reply` region: the server's answer; the operation's result (or the error's text)
// is the body.
const OFF_REPLY_CLIENT: usize = SIZE_COMMON_PREFIX;
const OFF_REPLY_REQUEST: usize = OFF_REPLY_CLIENT + size_of::<u64>();
const OFF_REPLY_OPERATION: usize = OFF_REPLY_REQUEST + size_of::<u64>();
const OFF_REPLY_ERROR: usize = OFF_REPLY_OPERATION + size_of::<u32>();
const OFF_REPLY_RESERVED_TAIL: usize = OFF_REPLY_ERROR + size_of::<u32>();
const SIZE_REPLY_RESERVED_TAIL: usize = HEADER_SIZE - OFF_REPLY_RESERVED_TAIL;

/// Flag byte bit of a [`Command::DoViewChange`] body: the sender holds this op's body.
pub const VIEW_HEADER_FLAG_PRESENT: u8 = 1 << 0;
/// Flag byte bit of a [`Command::DoViewChange`] body: the sender provably never acknowledged this
/// op (see `docs/protocol.md`). Never set together with [`VIEW_HEADER_FLAG_PRESENT`].
pub const VIEW_HEADER_FLAG_NACK: u8 = 1 << 1;
const VIEW_HEADER_FLAGS_KNOWN: u8 = VIEW_HEADER_FLAG_PRESENT | VIEW_HEADER_FLAG_NACK;

/// [`RequestPrepare::flags`] bit: `checksum` names the wanted prepare. Without it the request asks
/// for the op the responder has committed, and `checksum` must be zero.
pub const REQUEST_PREPARE_FLAG_CHECKSUM: u32 = 1 << 0;
/// [`DoViewChange::flags`] bit: the sender has not restarted since its log view began for it
/// (it installed that view's StartView or started the view), so it knows every header of that
/// view's starting log; a restart loses those headers it held without bodies.
pub const DO_VIEW_CHANGE_FLAG_LOG_COMPLETE: u32 = 1 << 0;
/// [`DoViewChange::flags`] bit: [`DoViewChange::log_view_head_op`] holds the head op of the log
/// the sender's log view began with (kept durably with the log view, so it survives restarts);
/// clear, the field is zero and the head unknown.
pub const DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN: u32 = 1 << 1;
const DO_VIEW_CHANGE_FLAGS_KNOWN: u32 =
    DO_VIEW_CHANGE_FLAG_LOG_COMPLETE | DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN;
const REQUEST_PREPARE_FLAGS_KNOWN: u32 = REQUEST_PREPARE_FLAG_CHECKSUM;

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
const _: () = assert!(OFF_PREPARE_OK_PREPARE_CHECKSUM == 56);
const _: () = assert!(OFF_PREPARE_OK_RESERVED_TAIL == 60);
const _: () = assert!(OFF_COMMIT_RESERVED_TAIL == 36);
const _: () = assert!(COMMIT_ENTRY_SIZE == 24);
const _: () = assert!(OFF_START_VIEW_CHANGE_RESERVED_TAIL == 40);
const _: () = assert!(OFF_DO_VIEW_CHANGE_LOG_VIEW == 64);
const _: () = assert!(OFF_DO_VIEW_CHANGE_FLAGS == 72 && OFF_DO_VIEW_CHANGE_RESERVED_PAD == 76);
const _: () =
    assert!(OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP == 80 && OFF_DO_VIEW_CHANGE_RESERVED_TAIL == 88);
const _: () = assert!(OFF_START_VIEW_HEADER_COUNT == 64);
const _: () = assert!(OFF_START_VIEW_RESERVED_TAIL == 68);
const _: () = assert!(OFF_REQUEST_START_VIEW_RESERVED_TAIL == 48);
const _: () = assert!(OFF_REQUEST_PREPARE_FLAGS == 52);
const _: () = assert!(OFF_REQUEST_PREPARE_RESERVED_TAIL == 56);
const _: () = assert!(OFF_RANGE_EVICTED_RESERVED_TAIL == 56);
const _: () = assert!(OFF_REQUEST_STATE_RESERVED_TAIL == 56);
const _: () =
    assert!(OFF_STATE_CHUNK_CHUNK_SIZE_BYTES == 80 && OFF_STATE_CHUNK_RESERVED_TAIL == 84);
const _: () = assert!(OFF_REQUEST_OPERATION == 56 && OFF_REQUEST_RESERVED_TAIL == 60);
const _: () = assert!(OFF_REPLY_ERROR == 52 && OFF_REPLY_RESERVED_TAIL == 56);
// Every region ends inside the header (a reserved tail of at least one byte is left by each).
const _: () = {
    let tails = [
        OFF_JOURNAL_RESERVED_TAIL,
        OFF_PREPARE_OK_RESERVED_TAIL,
        OFF_COMMIT_RESERVED_TAIL,
        OFF_START_VIEW_CHANGE_RESERVED_TAIL,
        OFF_DO_VIEW_CHANGE_RESERVED_TAIL,
        OFF_START_VIEW_RESERVED_TAIL,
        OFF_REQUEST_START_VIEW_RESERVED_TAIL,
        OFF_REQUEST_PREPARE_RESERVED_TAIL,
        OFF_RANGE_EVICTED_RESERVED_TAIL,
        OFF_REQUEST_STATE_RESERVED_TAIL,
        OFF_STATE_CHUNK_RESERVED_TAIL,
        OFF_REQUEST_RESERVED_TAIL,
        OFF_REPLY_RESERVED_TAIL,
    ];
    let mut i = 0;
    while i < tails.len() {
        assert!(tails[i] < HEADER_SIZE);
        i += 1;
    }
};
// Natural alignment keeps a zero-copy view of the header possible later. Bodies start at
// `HEADER_SIZE`, a multiple of 8, and commit entries are a multiple of 8 long, so the u64 fields of
// every entry in a body are aligned too.
const _: () = assert!(HEADER_SIZE.is_multiple_of(size_of::<u64>()));
const _: () = assert!(COMMIT_ENTRY_SIZE.is_multiple_of(size_of::<u64>()));
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
        OFF_JOURNAL_SEQ,
        OFF_JOURNAL_DURABLE_SEQ,
        OFF_JOURNAL_TAIL_SEQ,
        OFF_PREPARE_OK_GROUP,
        OFF_PREPARE_OK_OP,
        OFF_PREPARE_OK_COMMIT,
        OFF_ENTRY_GROUP,
        OFF_ENTRY_COMMIT,
        OFF_START_VIEW_CHANGE_GROUP,
        OFF_DO_VIEW_CHANGE_GROUP,
        OFF_DO_VIEW_CHANGE_OP,
        OFF_DO_VIEW_CHANGE_COMMIT,
        OFF_DO_VIEW_CHANGE_FAULTY_FROM,
        OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP,
        OFF_START_VIEW_GROUP,
        OFF_START_VIEW_OP,
        OFF_START_VIEW_COMMIT,
        OFF_START_VIEW_NONCE,
        OFF_REQUEST_START_VIEW_GROUP,
        OFF_REQUEST_START_VIEW_NONCE,
        OFF_REQUEST_PREPARE_GROUP,
        OFF_REQUEST_PREPARE_OP,
        OFF_RANGE_EVICTED_GROUP,
        OFF_RANGE_EVICTED_OP,
        OFF_RANGE_EVICTED_OP_MIN,
        OFF_REQUEST_STATE_GROUP,
        OFF_REQUEST_STATE_OP,
        OFF_REQUEST_STATE_OFFSET_BYTES,
        OFF_STATE_CHUNK_GROUP,
        OFF_STATE_CHUNK_OP,
        OFF_STATE_CHUNK_END_OFFSET,
        OFF_STATE_CHUNK_SIZE_BYTES,
        OFF_STATE_CHUNK_OFFSET_BYTES,
        OFF_REQUEST_CLIENT,
        OFF_REQUEST_SESSION,
        OFF_REQUEST_REQUEST,
        OFF_REPLY_CLIENT,
        OFF_REPLY_REQUEST,
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

/// Byte ranges (offset, length) that must be zero in a [`Command::PrepareOk`] header.
const RESERVED_PREPARE_OK: [(usize, usize); 1] =
    [(OFF_PREPARE_OK_RESERVED_TAIL, SIZE_PREPARE_OK_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Commit`] header.
const RESERVED_COMMIT: [(usize, usize); 1] =
    [(OFF_COMMIT_RESERVED_TAIL, SIZE_COMMIT_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::StartViewChange`] header.
const RESERVED_START_VIEW_CHANGE: [(usize, usize); 1] =
    [(OFF_START_VIEW_CHANGE_RESERVED_TAIL, SIZE_START_VIEW_CHANGE_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::DoViewChange`] header.
const RESERVED_DO_VIEW_CHANGE: [(usize, usize); 2] = [
    (OFF_DO_VIEW_CHANGE_RESERVED_PAD, SIZE_DO_VIEW_CHANGE_RESERVED_PAD),
    (OFF_DO_VIEW_CHANGE_RESERVED_TAIL, SIZE_DO_VIEW_CHANGE_RESERVED_TAIL),
];

/// Byte ranges (offset, length) that must be zero in a [`Command::StartView`] header.
const RESERVED_START_VIEW: [(usize, usize); 1] =
    [(OFF_START_VIEW_RESERVED_TAIL, SIZE_START_VIEW_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RequestStartView`] header.
const RESERVED_REQUEST_START_VIEW: [(usize, usize); 1] =
    [(OFF_REQUEST_START_VIEW_RESERVED_TAIL, SIZE_REQUEST_START_VIEW_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RequestPrepare`] header. (Its
/// `checksum` must also be zero when [`REQUEST_PREPARE_FLAG_CHECKSUM`] is clear; see
/// [`Header::decode`].)
const RESERVED_REQUEST_PREPARE: [(usize, usize); 1] =
    [(OFF_REQUEST_PREPARE_RESERVED_TAIL, SIZE_REQUEST_PREPARE_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RangeEvicted`] header.
const RESERVED_RANGE_EVICTED: [(usize, usize); 1] =
    [(OFF_RANGE_EVICTED_RESERVED_TAIL, SIZE_RANGE_EVICTED_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RequestState`] header.
const RESERVED_REQUEST_STATE: [(usize, usize); 1] =
    [(OFF_REQUEST_STATE_RESERVED_TAIL, SIZE_REQUEST_STATE_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::StateChunk`] header.
const RESERVED_STATE_CHUNK: [(usize, usize); 1] =
    [(OFF_STATE_CHUNK_RESERVED_TAIL, SIZE_STATE_CHUNK_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Request`] header.
const RESERVED_REQUEST: [(usize, usize); 1] =
    [(OFF_REQUEST_RESERVED_TAIL, SIZE_REQUEST_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Reply`] header.
const RESERVED_REPLY: [(usize, usize); 1] = [(OFF_REPLY_RESERVED_TAIL, SIZE_REPLY_RESERVED_TAIL)];

/// What a message is, and therefore how bytes 32..256 of its header are laid out.
///
/// Numbers 3..=9 are the VSR replica messages and 10..=11 the native client protocol;
/// `docs/protocol.md` says who sends each and what the receiver checks. Later issues add new
/// variants with new numbers (never reusing one), each with its own [`Fields`] variant. Until a command is added
/// here, [`Header::decode`] rejects its byte as [`HeaderError::UnknownCommand`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Never valid on the wire: a zeroed header must not decode as a real message.
    Reserved = 0,
    /// A replicated operation carrying one record batch for one VSR group.
    Prepare = 1,
    /// The shard journal's frame around one prepare (header and body): never sent on a socket.
    JournalEntry = 2,
    /// A backup acknowledges a prepare it holds. Empty body.
    PrepareOk = 3,
    /// The commit points of many groups between two nodes, doubling as the heartbeat. Body:
    /// [`CommitEntry`] records.
    Commit = 4,
    /// A replica's vote to leave the current view of a group. Empty body.
    StartViewChange = 5,
    /// A replica's log summary for the new primary. Body: prepare headers and their flags.
    DoViewChange = 6,
    /// The new primary's log above commit, which starts the view. Body: prepare headers.
    StartView = 7,
    /// A recovering replica asks the primary of its view for a `StartView`. Empty body.
    RequestStartView = 8,
    /// Asks a peer for one stored prepare. Empty body; the answer is the `Prepare` itself.
    RequestPrepare = 9,
    /// A client's request. Body: the operation's arguments (`engine::protocol`).
    Request = 10,
    /// The server's answer to one request. Body: the operation's result, or an error's text.
    Reply = 11,
    /// The answer to a `RequestPrepare` for an op the responder no longer holds (retention
    /// removed it): names the oldest op it still holds. Empty body.
    RangeEvicted = 12,
    /// A replica that needs a state transfer asks a peer for (a piece of) its group's
    /// replicated state. Empty body.
    RequestState = 13,
    /// One piece of a group's replicated state as of one op, the answer to a `RequestState`.
    /// Body: the piece.
    StateChunk = 14,
}

impl Command {
    /// The command a wire byte denotes, or `None` for [`Command::Reserved`] and unknown bytes.
    pub fn from_u8(byte: u8) -> Option<Command> {
        match byte {
            1 => Some(Command::Prepare),
            2 => Some(Command::JournalEntry),
            3 => Some(Command::PrepareOk),
            4 => Some(Command::Commit),
            5 => Some(Command::StartViewChange),
            6 => Some(Command::DoViewChange),
            7 => Some(Command::StartView),
            8 => Some(Command::RequestStartView),
            9 => Some(Command::RequestPrepare),
            12 => Some(Command::RangeEvicted),
            13 => Some(Command::RequestState),
            14 => Some(Command::StateChunk),
            10 => Some(Command::Request),
            11 => Some(Command::Reply),
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
    /// Fields of a [`Command::PrepareOk`] header.
    PrepareOk(PrepareOk),
    /// Fields of a [`Command::Commit`] header.
    Commit(Commit),
    /// Fields of a [`Command::StartViewChange`] header.
    StartViewChange(StartViewChange),
    /// Fields of a [`Command::DoViewChange`] header.
    DoViewChange(DoViewChange),
    /// Fields of a [`Command::StartView`] header.
    StartView(StartView),
    /// Fields of a [`Command::RequestStartView`] header.
    RequestStartView(RequestStartView),
    /// Fields of a [`Command::RequestPrepare`] header.
    RequestPrepare(RequestPrepare),
    /// Fields of a [`Command::RangeEvicted`] header.
    RangeEvicted(RangeEvicted),
    /// Fields of a [`Command::RequestState`] header.
    RequestState(RequestState),
    /// Fields of a [`Command::StateChunk`] header.
    StateChunk(StateChunk),
    /// Fields of a [`Command::Request`] header.
    Request(ClientRequest),
    /// Fields of a [`Command::Reply`] header.
    Reply(ClientReply),
}

impl Fields {
    /// The command whose layout these fields use.
    pub fn command(&self) -> Command {
        match self {
            Fields::Prepare(_) => Command::Prepare,
            Fields::JournalEntry(_) => Command::JournalEntry,
            Fields::PrepareOk(_) => Command::PrepareOk,
            Fields::Commit(_) => Command::Commit,
            Fields::StartViewChange(_) => Command::StartViewChange,
            Fields::DoViewChange(_) => Command::DoViewChange,
            Fields::StartView(_) => Command::StartView,
            Fields::RequestStartView(_) => Command::RequestStartView,
            Fields::RequestPrepare(_) => Command::RequestPrepare,
            Fields::RangeEvicted(_) => Command::RangeEvicted,
            Fields::RequestState(_) => Command::RequestState,
            Fields::StateChunk(_) => Command::StateChunk,
            Fields::Request(_) => Command::Request,
            Fields::Reply(_) => Command::Reply,
        }
    }

    /// Body length in bytes these fields require, for commands whose body layout the header fixes
    /// (empty, or a counted list of fixed-size records); `None` for a prepare's batch and a
    /// journal entry's prepare, whose length only `size` gives. Computed in `u64`, which no count
    /// can overflow.
    pub fn body_size_required(&self) -> Option<u64> {
        match self {
            Fields::Prepare(_)
            | Fields::JournalEntry(_)
            | Fields::Request(_)
            | Fields::Reply(_) => None,
            Fields::PrepareOk(_)
            | Fields::StartViewChange(_)
            | Fields::RequestStartView(_)
            | Fields::RequestPrepare(_)
            | Fields::RangeEvicted(_)
            | Fields::RequestState(_) => Some(0),
            Fields::StateChunk(chunk) => Some(u64::from(chunk.chunk_size_bytes)),
            Fields::Commit(commit) => {
                Some(u64::from(commit.entry_count) * COMMIT_ENTRY_SIZE as u64)
            }
            Fields::DoViewChange(dvc) => Some(view_headers_body_size(dvc.header_count, true)),
            Fields::StartView(start_view) => {
                Some(view_headers_body_size(start_view.header_count, false))
            }
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

impl Prepare {
    /// The offset after the batch's records: where the next prepare's batch begins.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
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

/// The per-command fields of a prepare-ok: a backup holds the prepare `op` whose header checksum
/// is `prepare_checksum`, as durably as the group's mode requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PrepareOk {
    /// VSR group id.
    pub group: u64,
    /// Op number of the acknowledged prepare.
    pub op: u64,
    /// Highest op the sender knows to be committed.
    pub commit: u64,
    /// `checksum_header` of the acknowledged prepare, so an acknowledgement of a different
    /// prepare with the same op (from another view) is never counted.
    pub prepare_checksum: u32,
}

/// The per-command fields of a commit message. Its body is `entry_count` [`CommitEntry`]
/// records (see [`encode_commit_entries`] and [`decode_commit_entries`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Commit {
    /// Number of [`CommitEntry`] records in the body.
    pub entry_count: u32,
}

/// One group's commit point inside a [`Command::Commit`] body ([`COMMIT_ENTRY_SIZE`] bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CommitEntry {
    /// VSR group id.
    pub group: u64,
    /// Highest op of the group that the sender, its primary, has committed.
    pub commit: u64,
    /// `checksum_header` of the prepare at `commit`, so a backup can tell whether the op it
    /// holds there is the committed one.
    pub commit_checksum: u32,
    /// The sender's view of this group.
    pub view: u32,
}

/// The per-command fields of a start-view-change: the sender votes to move `group` to the view
/// in the header's `view` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StartViewChange {
    /// VSR group id.
    pub group: u64,
}

/// The per-command fields of a do-view-change, sent to the primary of the new view (the
/// header's `view`). Its body is `header_count` prepare headers in ascending op order, then
/// `header_count` flag bytes (see [`encode_view_headers`] and [`decode_view_headers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DoViewChange {
    /// VSR group id.
    pub group: u64,
    /// Highest op in the sender's log.
    pub op: u64,
    /// Highest op the sender knows to be committed.
    pub commit: u64,
    /// First op of the sender's faulty suffix (ops it may have acknowledged but cannot vouch
    /// for), or `0` if it has none.
    pub faulty_from: u64,
    /// The view in which the sender's log was last brought up to date by a primary.
    pub log_view: u32,
    /// Number of prepare headers (and flag bytes) in the body.
    pub header_count: u32,
    /// Bit set: [`DO_VIEW_CHANGE_FLAG_LOG_COMPLETE`], [`DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN`];
    /// other bits must be zero.
    pub flags: u32,
    /// The head op of the log `log_view` began with, under
    /// [`DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN`]; zero otherwise.
    pub log_view_head_op: u64,
}

/// The per-command fields of a start-view: the primary of the header's `view` announces its
/// log. Its body is `header_count` prepare headers in ascending op order (see
/// [`encode_view_headers`] and [`decode_view_headers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StartView {
    /// VSR group id.
    pub group: u64,
    /// Highest op in the new primary's log.
    pub op: u64,
    /// Highest op the new primary knows to be committed.
    pub commit: u64,
    /// The `nonce` of the [`RequestStartView`] this answers, or `0` if unsolicited.
    pub nonce: u64,
    /// Number of prepare headers in the body.
    pub header_count: u32,
}

/// The per-command fields of a request-start-view, sent by a recovering replica to the primary
/// of the view in the header's `view` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RequestStartView {
    /// VSR group id.
    pub group: u64,
    /// Chosen by the requester at boot; the answering [`StartView`] echoes it, so the requester
    /// can tell an answer to this boot's request from an older message.
    pub nonce: u64,
}

/// The per-command fields of a request-prepare. The answer is the stored [`Command::Prepare`]
/// message itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RequestPrepare {
    /// VSR group id.
    pub group: u64,
    /// Op number of the wanted prepare.
    pub op: u64,
    /// `checksum_header` of the wanted prepare when [`REQUEST_PREPARE_FLAG_CHECKSUM`] is set;
    /// zero otherwise.
    pub checksum: u32,
    /// Bit set: only [`REQUEST_PREPARE_FLAG_CHECKSUM`] is defined; other bits must be zero.
    pub flags: u32,
}

impl RequestPrepare {
    /// A request for the prepare `op` whose header checksum is `checksum`.
    pub fn by_checksum(group: u64, op: u64, checksum: u32) -> RequestPrepare {
        RequestPrepare { group, op, checksum, flags: REQUEST_PREPARE_FLAG_CHECKSUM }
    }

    /// A request for whichever prepare the responder has committed at `op`.
    pub fn committed(group: u64, op: u64) -> RequestPrepare {
        RequestPrepare { group, op, checksum: 0, flags: 0 }
    }

    /// The wanted header checksum, or `None` when the committed op is wanted.
    pub fn checksum_given(&self) -> Option<u32> {
        (self.flags & REQUEST_PREPARE_FLAG_CHECKSUM != 0).then_some(self.checksum)
    }
}

/// The per-command fields of a range-evicted answer: the responder was asked for `op` but holds
/// its group's log only from `op_min` on (retention removed the rest), so the asker must look
/// elsewhere or take a state transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RangeEvicted {
    /// VSR group id.
    pub group: u64,
    /// The op that was asked for.
    pub op: u64,
    /// The oldest op the responder holds (above `op`).
    pub op_min: u64,
}

/// The per-command fields of a state request: a replica whose peers no longer hold the ops it
/// lacks asks one of them for its group's replicated state, piece by piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RequestState {
    /// VSR group id.
    pub group: u64,
    /// The op of the state being assembled, or 0 to begin a transfer (the responder then
    /// answers with its newest state).
    pub op: u64,
    /// The byte of that state the asker wants next.
    pub offset_bytes: u64,
}

/// The per-command fields of a state chunk: bytes `offset_bytes..offset_bytes +
/// chunk_size_bytes` of a group's replicated state as of op `op` (the body), and what the
/// asker needs to install it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StateChunk {
    /// VSR group id.
    pub group: u64,
    /// The last op the state includes: the first op of the log the asker installs.
    pub op: u64,
    /// The offset after that op's records.
    pub end_offset: u64,
    /// The whole state's size.
    pub size_bytes: u64,
    /// Where this piece starts within the state.
    pub offset_bytes: u64,
    /// `checksum_header` of the prepare of `op`, which the asker fetches next.
    pub prepare_checksum: u32,
    /// CRC-32C of the whole state.
    pub state_checksum: u32,
    /// This piece's size: the body's.
    pub chunk_size_bytes: u32,
}

/// The per-command fields of a client request. Which operation it is, and so how its body is
/// laid out, is `operation` (see `engine::protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClientRequest {
    /// The client's id, chosen at random by the client and kept for its lifetime.
    pub client: u64,
    /// The session the server registered for the client (`0` before registration).
    pub session: u64,
    /// The client's request number: increasing within a connection; the reply echoes it.
    pub request: u64,
    /// The operation code.
    pub operation: u32,
}

/// The per-command fields of a reply to a client request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClientReply {
    /// The requesting client's id.
    pub client: u64,
    /// The request number answered.
    pub request: u64,
    /// The operation answered.
    pub operation: u32,
    /// `0` on success; otherwise an error code, and the body is the error's text.
    pub error: u32,
}

/// A decoded (or about-to-be-encoded) wire header.
///
/// Invariant: `command == fields.command()`. The constructors and [`Header::decode`] uphold it;
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
    /// VSR view number: for a replica message, the sender's view of the message's group (`0` in
    /// a [`Command::Commit`], whose entries carry one view per group).
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
        Header::sealed(cluster, view, replica, Fields::Prepare(fields), body)
    }

    /// [`Header::prepare`] for a body whose CRC-32C the caller already holds, so the body is
    /// not read again.
    pub fn prepare_checksummed(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: Prepare,
        body: &[u8],
        checksum_body: u32,
    ) -> Header {
        Header::sealed_checksummed(
            cluster,
            view,
            replica,
            Fields::Prepare(fields),
            body,
            checksum_body,
        )
    }

    /// Builds a sealed journal entry header framing `body` (one encoded prepare).
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn journal_entry(cluster: u64, fields: JournalEntry, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, 0, Fields::JournalEntry(fields), body)
    }

    /// [`Header::journal_entry`] for a body whose CRC-32C the caller already holds.
    pub fn journal_entry_checksummed(
        cluster: u64,
        fields: JournalEntry,
        body: &[u8],
        checksum_body: u32,
    ) -> Header {
        Header::sealed_checksummed(cluster, 0, 0, Fields::JournalEntry(fields), body, checksum_body)
    }

    /// Builds a sealed prepare-ok header (empty body).
    pub fn prepare_ok(cluster: u64, view: u32, replica: u8, fields: PrepareOk) -> Header {
        Header::sealed(cluster, view, replica, Fields::PrepareOk(fields), &[])
    }

    /// Builds a sealed commit header for `body`, the output of [`encode_commit_entries`]. The
    /// header's `view` is `0`: each entry carries its group's view. `replica` identifies the
    /// sending node (see `docs/protocol.md`).
    ///
    /// # Panics
    ///
    /// If `body` is not exactly `fields.entry_count` entries long: the sender must never build
    /// a message that [`decode_commit_entries`] rejects.
    pub fn commit(cluster: u64, replica: u8, fields: Commit, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, replica, Fields::Commit(fields), body)
    }

    /// Builds a sealed start-view-change header (empty body): `replica` votes to move `group` to
    /// `view`.
    pub fn start_view_change(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: StartViewChange,
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::StartViewChange(fields), &[])
    }

    /// Builds a sealed do-view-change header for `body`, the output of [`encode_view_headers`]
    /// with flags.
    ///
    /// # Panics
    ///
    /// If `body` is not exactly `fields.header_count` headers and flag bytes long.
    pub fn do_view_change(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: DoViewChange,
        body: &[u8],
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::DoViewChange(fields), body)
    }

    /// Builds a sealed start-view header for `body`, the output of [`encode_view_headers`]
    /// without flags.
    ///
    /// # Panics
    ///
    /// If `body` is not exactly `fields.header_count` headers long.
    pub fn start_view(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: StartView,
        body: &[u8],
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::StartView(fields), body)
    }

    /// Builds a sealed request-start-view header (empty body).
    pub fn request_start_view(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: RequestStartView,
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::RequestStartView(fields), &[])
    }

    /// Builds a sealed request-prepare header (empty body). [`RequestPrepare::by_checksum`] and
    /// [`RequestPrepare::committed`] build valid fields.
    ///
    /// # Panics
    ///
    /// If `fields.flags` has a bit other than [`REQUEST_PREPARE_FLAG_CHECKSUM`], or `checksum` is
    /// not zero while that flag is clear.
    pub fn request_prepare(cluster: u64, view: u32, replica: u8, fields: RequestPrepare) -> Header {
        Header::sealed(cluster, view, replica, Fields::RequestPrepare(fields), &[])
    }

    /// Builds a sealed range-evicted header (empty body).
    pub fn range_evicted(cluster: u64, view: u32, replica: u8, fields: RangeEvicted) -> Header {
        Header::sealed(cluster, view, replica, Fields::RangeEvicted(fields), &[])
    }

    /// Builds a sealed state request header (empty body).
    pub fn request_state(cluster: u64, view: u32, replica: u8, fields: RequestState) -> Header {
        Header::sealed(cluster, view, replica, Fields::RequestState(fields), &[])
    }

    /// Builds a sealed state chunk header for `chunk` (`fields.chunk_size_bytes` is set from it).
    ///
    /// # Panics
    ///
    /// If `chunk` is longer than `u32::MAX` bytes.
    pub fn state_chunk(
        cluster: u64,
        view: u32,
        replica: u8,
        mut fields: StateChunk,
        chunk: &[u8],
    ) -> Header {
        fields.chunk_size_bytes = u32::try_from(chunk.len()).expect("a chunk fits in u32");
        Header::sealed(cluster, view, replica, Fields::StateChunk(fields), chunk)
    }

    /// Builds a sealed client request header for `body`.
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn request(cluster: u64, fields: ClientRequest, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, 0, Fields::Request(fields), body)
    }

    /// Builds a sealed reply header for `body`.
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn reply(cluster: u64, fields: ClientReply, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, 0, Fields::Reply(fields), body)
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
        encode_fields(&mut bytes, &self.fields);
        bytes
    }

    /// Parses and validates a header. Checks run in this order, and the first failure is returned:
    /// `checksum_header` (nothing else is trusted before it passes), version, command, reserved
    /// bytes zero, `size >= HEADER_SIZE`, the command's own field rules (a request-prepare's
    /// flags), and `size` matching the body the fields require (empty, or their count of
    /// fixed-size records; see [`Fields::body_size_required`]). The body itself is not checked;
    /// see [`Header::verify_body`].
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

        if command == Command::Reserved {
            // `from_u8` never yields `Reserved`; treat it as unknown rather than trusting that.
            return Err(HeaderError::UnknownCommand(command_byte));
        }
        let reserved_command = reserved_ranges(command);
        for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_command) {
            if let Some(nonzero) = bytes[offset..offset + len].iter().position(|&b| b != 0) {
                return Err(HeaderError::ReservedNonZero { offset: offset + nonzero });
            }
        }

        let size = get_u32(bytes, OFF_SIZE);
        if (size as usize) < HEADER_SIZE {
            return Err(HeaderError::SizeTooSmall(size));
        }

        let fields = match decode_fields(bytes, command) {
            Some(fields) => fields,
            None => return Err(HeaderError::UnknownCommand(command_byte)),
        };
        if let Fields::DoViewChange(dvc) = &fields
            && dvc.flags & !DO_VIEW_CHANGE_FLAGS_KNOWN != 0
        {
            return Err(HeaderError::UnknownFlags {
                offset: OFF_DO_VIEW_CHANGE_FLAGS,
                flags: dvc.flags,
            });
        }
        if let Fields::DoViewChange(dvc) = &fields
            && dvc.flags & DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN == 0
            && dvc.log_view_head_op != 0
        {
            // Without its flag the field is unused, so it is held to zero like reserved bytes.
            return Err(HeaderError::ReservedNonZero {
                offset: OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP,
            });
        }
        if let Fields::RequestPrepare(request) = &fields {
            let unknown = request.flags & !REQUEST_PREPARE_FLAGS_KNOWN;
            if unknown != 0 {
                return Err(HeaderError::UnknownFlags {
                    offset: OFF_REQUEST_PREPARE_FLAGS,
                    flags: request.flags,
                });
            }
            if request.checksum_given().is_none() && request.checksum != 0 {
                // Without the flag the checksum field is unused, and unused bytes must be zero.
                let nonzero = request.checksum.to_le_bytes().iter().position(|&b| b != 0);
                let offset = OFF_REQUEST_PREPARE_CHECKSUM + nonzero.unwrap_or(0);
                return Err(HeaderError::ReservedNonZero { offset });
            }
        }
        if let Some(body_size) = fields.body_size_required() {
            let expected = HEADER_SIZE as u64 + body_size;
            if u64::from(size) != expected {
                return Err(HeaderError::SizeInconsistent { size, expected });
            }
        }

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
            _ => None,
        }
    }

    /// The journal entry fields, if this is a journal entry header.
    pub fn as_journal_entry(&self) -> Option<&JournalEntry> {
        match &self.fields {
            Fields::JournalEntry(entry) => Some(entry),
            _ => None,
        }
    }

    /// The prepare-ok fields, if this is a [`Command::PrepareOk`] header.
    pub fn as_prepare_ok(&self) -> Option<&PrepareOk> {
        match &self.fields {
            Fields::PrepareOk(prepare_ok) => Some(prepare_ok),
            _ => None,
        }
    }

    /// The commit fields, if this is a [`Command::Commit`] header.
    pub fn as_commit(&self) -> Option<&Commit> {
        match &self.fields {
            Fields::Commit(commit) => Some(commit),
            _ => None,
        }
    }

    /// The start-view-change fields, if this is a [`Command::StartViewChange`] header.
    pub fn as_start_view_change(&self) -> Option<&StartViewChange> {
        match &self.fields {
            Fields::StartViewChange(start_view_change) => Some(start_view_change),
            _ => None,
        }
    }

    /// The do-view-change fields, if this is a [`Command::DoViewChange`] header.
    pub fn as_do_view_change(&self) -> Option<&DoViewChange> {
        match &self.fields {
            Fields::DoViewChange(do_view_change) => Some(do_view_change),
            _ => None,
        }
    }

    /// The start-view fields, if this is a [`Command::StartView`] header.
    pub fn as_start_view(&self) -> Option<&StartView> {
        match &self.fields {
            Fields::StartView(start_view) => Some(start_view),
            _ => None,
        }
    }

    /// The request-start-view fields, if this is a [`Command::RequestStartView`] header.
    pub fn as_request_start_view(&self) -> Option<&RequestStartView> {
        match &self.fields {
            Fields::RequestStartView(request) => Some(request),
            _ => None,
        }
    }

    /// The request-prepare fields, if this is a [`Command::RequestPrepare`] header.
    pub fn as_request_prepare(&self) -> Option<&RequestPrepare> {
        match &self.fields {
            Fields::RequestPrepare(request) => Some(request),
            _ => None,
        }
    }

    /// The range-evicted fields, if this is a [`Command::RangeEvicted`] header.
    pub fn as_range_evicted(&self) -> Option<&RangeEvicted> {
        match &self.fields {
            Fields::RangeEvicted(evicted) => Some(evicted),
            _ => None,
        }
    }

    /// The state request fields, if this is a [`Command::RequestState`] header.
    pub fn as_request_state(&self) -> Option<&RequestState> {
        match &self.fields {
            Fields::RequestState(request) => Some(request),
            _ => None,
        }
    }

    /// The state chunk fields, if this is a [`Command::StateChunk`] header.
    pub fn as_state_chunk(&self) -> Option<&StateChunk> {
        match &self.fields {
            Fields::StateChunk(chunk) => Some(chunk),
            _ => None,
        }
    }

    /// The client request fields, if this is a request.
    pub fn as_request(&self) -> Option<&ClientRequest> {
        match &self.fields {
            Fields::Request(request) => Some(request),
            _ => None,
        }
    }

    /// The reply fields, if this is a reply.
    pub fn as_reply(&self) -> Option<&ClientReply> {
        match &self.fields {
            Fields::Reply(reply) => Some(reply),
            _ => None,
        }
    }

    /// Builds a sealed header of any command for `body`, checking first (in every build) that the
    /// fields are ones [`Header::decode`] accepts with this body length: a sender must never
    /// put on the wire what its peer will reject.
    fn sealed(cluster: u64, view: u32, replica: u8, fields: Fields, body: &[u8]) -> Header {
        Header::sealed_checksummed(cluster, view, replica, fields, body, crc32c::crc32c(body))
    }

    /// [`Header::sealed`] with the body's CRC-32C already known (derived from checksums verified
    /// on receipt, see [`crate::checksum`]); debug builds recompute it.
    fn sealed_checksummed(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: Fields,
        body: &[u8],
        checksum_body: u32,
    ) -> Header {
        debug_assert_eq!(crc32c::crc32c(body), checksum_body, "a derived body checksum is wrong");
        let size = body
            .len()
            .checked_add(HEADER_SIZE)
            .and_then(|size| u32::try_from(size).ok())
            .expect("message body exceeds the u32 size field");
        if let Some(required) = fields.body_size_required() {
            assert_eq!(
                body.len() as u64,
                required,
                "{:?} body length disagrees with its count field",
                fields.command()
            );
        }
        if let Fields::DoViewChange(dvc) = &fields {
            assert_eq!(dvc.flags & !DO_VIEW_CHANGE_FLAGS_KNOWN, 0, "unknown flags");
            assert!(
                dvc.flags & DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN != 0
                    || dvc.log_view_head_op == 0,
                "a log view head without its flag"
            );
        }
        if let Fields::RequestPrepare(request) = &fields {
            assert_eq!(request.flags & !REQUEST_PREPARE_FLAGS_KNOWN, 0, "unknown flags");
            assert!(
                request.checksum_given().is_some() || request.checksum == 0,
                "checksum without REQUEST_PREPARE_FLAG_CHECKSUM"
            );
        }
        let mut header = Header {
            checksum_header: 0,
            checksum_body,
            cluster,
            size,
            view,
            command: fields.command(),
            version: VERSION,
            replica,
            fields,
        };
        header.seal();
        header
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

/// The body of a [`Command::Commit`] carrying `entries`, in order; pass it to [`Header::commit`]
/// with `entry_count = entries.len()`.
pub fn encode_commit_entries(entries: &[CommitEntry]) -> Vec<u8> {
    let mut body = Vec::with_capacity(entries.len() * COMMIT_ENTRY_SIZE);
    for entry in entries {
        let mut bytes = [0u8; COMMIT_ENTRY_SIZE];
        put_u64(&mut bytes, OFF_ENTRY_GROUP, entry.group);
        put_u64(&mut bytes, OFF_ENTRY_COMMIT, entry.commit);
        put_u32(&mut bytes, OFF_ENTRY_COMMIT_CHECKSUM, entry.commit_checksum);
        put_u32(&mut bytes, OFF_ENTRY_VIEW, entry.view);
        body.extend_from_slice(&bytes);
    }
    body
}

/// Decodes the entries of a [`Command::Commit`] message whose `body` the caller has already
/// checked with [`Header::verify_body`]. Before allocating, it checks that `header` is a commit,
/// that `entry_count <= entries_max`, and that `body` is exactly `entry_count` entries long.
pub fn decode_commit_entries(
    header: &Header,
    body: &[u8],
    entries_max: usize,
) -> Result<Vec<CommitEntry>, BodyError> {
    let Some(commit) = header.as_commit() else {
        return Err(BodyError::WrongCommand { expected: Command::Commit, actual: header.command });
    };
    let count = commit.entry_count;
    if count as usize > entries_max {
        return Err(BodyError::CountOverLimit { count, max: entries_max });
    }
    let expected = u64::from(count) * COMMIT_ENTRY_SIZE as u64;
    if body.len() as u64 != expected {
        return Err(BodyError::LengthMismatch { expected, actual: body.len() });
    }
    let (chunks, rest) = body.as_chunks::<COMMIT_ENTRY_SIZE>();
    debug_assert!(rest.is_empty());
    let entries = chunks
        .iter()
        .map(|bytes| CommitEntry {
            group: get_u64(bytes, OFF_ENTRY_GROUP),
            commit: get_u64(bytes, OFF_ENTRY_COMMIT),
            commit_checksum: get_u32(bytes, OFF_ENTRY_COMMIT_CHECKSUM),
            view: get_u32(bytes, OFF_ENTRY_VIEW),
        })
        .collect();
    Ok(entries)
}

/// The body of a [`Command::DoViewChange`] (`flags` given, one byte per header, see
/// [`VIEW_HEADER_FLAG_PRESENT`] and [`VIEW_HEADER_FLAG_NACK`]) or a [`Command::StartView`]
/// (`flags` `None`): every header as encoded (so relayed headers keep their exact bytes and
/// checksums), then the flag bytes. Pass it to the matching constructor with
/// `header_count = headers.len()`.
///
/// # Panics
///
/// If the input is something [`decode_view_headers`] would reject: a header that is not a
/// prepare, ops not strictly ascending, a flag slice of another length than `headers`, or a flag
/// byte with unknown bits or with both present and nack set.
pub fn encode_view_headers(headers: &[Header], flags: Option<&[u8]>) -> Vec<u8> {
    let mut previous: Option<u64> = None;
    for header in headers {
        let prepare = header.as_prepare().expect("view headers must be prepares");
        assert!(previous.is_none_or(|previous| prepare.op > previous), "ops must ascend");
        previous = Some(prepare.op);
    }
    if let Some(flags) = flags {
        assert_eq!(flags.len(), headers.len(), "one flag byte per header");
        for &flag in flags {
            assert!(view_header_flag_valid(flag), "invalid view header flags {flag:#04x}");
        }
    }
    let per_header = HEADER_SIZE + usize::from(flags.is_some());
    let mut body = Vec::with_capacity(headers.len() * per_header);
    for header in headers {
        body.extend_from_slice(&header.encode());
    }
    if let Some(flags) = flags {
        body.extend_from_slice(flags);
    }
    body
}

/// Decodes the body of a [`Command::DoViewChange`] (`with_flags`) or a [`Command::StartView`]:
/// `header_count` prepare headers, then (`with_flags`) as many flag bytes. Returns the headers
/// and the flags (empty without flags). The caller has already checked the body with
/// [`Header::verify_body`] and passes the count from the message's fields.
///
/// Before allocating it checks `header_count <= headers_max` and that `body` is exactly as long
/// as the count requires; then every header must pass [`Header::decode`], be a
/// [`Command::Prepare`], and have a higher op than the one before it, and every flag byte must
/// have only known bits, never present and nack together. Whether the headers belong to the
/// message's group and lie in its op range is the receiver's to check.
pub fn decode_view_headers(
    body: &[u8],
    header_count: u32,
    with_flags: bool,
    headers_max: usize,
) -> Result<(Vec<Header>, Vec<u8>), BodyError> {
    if header_count as usize > headers_max {
        return Err(BodyError::CountOverLimit { count: header_count, max: headers_max });
    }
    let expected = view_headers_body_size(header_count, with_flags);
    if body.len() as u64 != expected {
        return Err(BodyError::LengthMismatch { expected, actual: body.len() });
    }
    let headers_len = header_count as usize * HEADER_SIZE;
    let (header_bytes, flag_bytes) = body.split_at(headers_len);
    let (chunks, rest) = header_bytes.as_chunks::<HEADER_SIZE>();
    debug_assert!(rest.is_empty());

    let mut headers = Vec::with_capacity(chunks.len());
    let mut previous: Option<u64> = None;
    for (index, bytes) in chunks.iter().enumerate() {
        let header = Header::decode(bytes).map_err(|error| BodyError::Header { index, error })?;
        let Some(prepare) = header.as_prepare() else {
            return Err(BodyError::NotPrepare { index, command: header.command });
        };
        if let Some(previous) = previous
            && prepare.op <= previous
        {
            return Err(BodyError::OpsNotAscending { index, op: prepare.op, previous });
        }
        previous = Some(prepare.op);
        headers.push(header);
    }
    if let Some(index) = flag_bytes.iter().position(|&flag| !view_header_flag_valid(flag)) {
        return Err(BodyError::BadFlags { index, flags: flag_bytes[index] });
    }
    Ok((headers, flag_bytes.to_vec()))
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

/// Byte ranges (offset, length) of `command`'s field region that must be zero.
fn reserved_ranges(command: Command) -> &'static [(usize, usize)] {
    match command {
        Command::Reserved => &[],
        Command::Prepare => &RESERVED_PREPARE,
        Command::JournalEntry => &RESERVED_JOURNAL,
        Command::PrepareOk => &RESERVED_PREPARE_OK,
        Command::Commit => &RESERVED_COMMIT,
        Command::StartViewChange => &RESERVED_START_VIEW_CHANGE,
        Command::DoViewChange => &RESERVED_DO_VIEW_CHANGE,
        Command::StartView => &RESERVED_START_VIEW,
        Command::RequestStartView => &RESERVED_REQUEST_START_VIEW,
        Command::RequestPrepare => &RESERVED_REQUEST_PREPARE,
        Command::RangeEvicted => &RESERVED_RANGE_EVICTED,
        Command::RequestState => &RESERVED_REQUEST_STATE,
        Command::StateChunk => &RESERVED_STATE_CHUNK,
        Command::Request => &RESERVED_REQUEST,
        Command::Reply => &RESERVED_REPLY,
    }
}

/// Body length of `header_count` view headers, with or without their flag bytes.
fn view_headers_body_size(header_count: u32, with_flags: bool) -> u64 {
    let per_header = HEADER_SIZE as u64 + u64::from(with_flags);
    u64::from(header_count) * per_header
}

fn view_header_flag_valid(flag: u8) -> bool {
    flag & !VIEW_HEADER_FLAGS_KNOWN == 0 && flag != VIEW_HEADER_FLAG_PRESENT | VIEW_HEADER_FLAG_NACK
}

fn encode_fields(bytes: &mut [u8; HEADER_SIZE], fields: &Fields) {
    match fields {
        Fields::Prepare(prepare) => encode_prepare(bytes, prepare),
        Fields::JournalEntry(entry) => {
            put_u64(bytes, OFF_JOURNAL_SEQ, entry.seq);
            put_u64(bytes, OFF_JOURNAL_DURABLE_SEQ, entry.durable_seq);
            put_u64(bytes, OFF_JOURNAL_TAIL_SEQ, entry.tail_seq);
        }
        Fields::PrepareOk(prepare_ok) => {
            put_u64(bytes, OFF_PREPARE_OK_GROUP, prepare_ok.group);
            put_u64(bytes, OFF_PREPARE_OK_OP, prepare_ok.op);
            put_u64(bytes, OFF_PREPARE_OK_COMMIT, prepare_ok.commit);
            put_u32(bytes, OFF_PREPARE_OK_PREPARE_CHECKSUM, prepare_ok.prepare_checksum);
        }
        Fields::Commit(commit) => put_u32(bytes, OFF_COMMIT_ENTRY_COUNT, commit.entry_count),
        Fields::StartViewChange(start_view_change) => {
            put_u64(bytes, OFF_START_VIEW_CHANGE_GROUP, start_view_change.group);
        }
        Fields::DoViewChange(dvc) => {
            put_u64(bytes, OFF_DO_VIEW_CHANGE_GROUP, dvc.group);
            put_u64(bytes, OFF_DO_VIEW_CHANGE_OP, dvc.op);
            put_u64(bytes, OFF_DO_VIEW_CHANGE_COMMIT, dvc.commit);
            put_u64(bytes, OFF_DO_VIEW_CHANGE_FAULTY_FROM, dvc.faulty_from);
            put_u32(bytes, OFF_DO_VIEW_CHANGE_LOG_VIEW, dvc.log_view);
            put_u32(bytes, OFF_DO_VIEW_CHANGE_HEADER_COUNT, dvc.header_count);
            put_u32(bytes, OFF_DO_VIEW_CHANGE_FLAGS, dvc.flags);
            put_u64(bytes, OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP, dvc.log_view_head_op);
        }
        Fields::StartView(start_view) => {
            put_u64(bytes, OFF_START_VIEW_GROUP, start_view.group);
            put_u64(bytes, OFF_START_VIEW_OP, start_view.op);
            put_u64(bytes, OFF_START_VIEW_COMMIT, start_view.commit);
            put_u64(bytes, OFF_START_VIEW_NONCE, start_view.nonce);
            put_u32(bytes, OFF_START_VIEW_HEADER_COUNT, start_view.header_count);
        }
        Fields::RequestStartView(request) => {
            put_u64(bytes, OFF_REQUEST_START_VIEW_GROUP, request.group);
            put_u64(bytes, OFF_REQUEST_START_VIEW_NONCE, request.nonce);
        }
        Fields::RequestPrepare(request) => {
            put_u64(bytes, OFF_REQUEST_PREPARE_GROUP, request.group);
            put_u64(bytes, OFF_REQUEST_PREPARE_OP, request.op);
            put_u32(bytes, OFF_REQUEST_PREPARE_CHECKSUM, request.checksum);
            put_u32(bytes, OFF_REQUEST_PREPARE_FLAGS, request.flags);
        }
        Fields::RangeEvicted(evicted) => {
            put_u64(bytes, OFF_RANGE_EVICTED_GROUP, evicted.group);
            put_u64(bytes, OFF_RANGE_EVICTED_OP, evicted.op);
            put_u64(bytes, OFF_RANGE_EVICTED_OP_MIN, evicted.op_min);
        }
        Fields::RequestState(request) => {
            put_u64(bytes, OFF_REQUEST_STATE_GROUP, request.group);
            put_u64(bytes, OFF_REQUEST_STATE_OP, request.op);
            put_u64(bytes, OFF_REQUEST_STATE_OFFSET_BYTES, request.offset_bytes);
        }
        Fields::StateChunk(chunk) => {
            put_u64(bytes, OFF_STATE_CHUNK_GROUP, chunk.group);
            put_u64(bytes, OFF_STATE_CHUNK_OP, chunk.op);
            put_u64(bytes, OFF_STATE_CHUNK_END_OFFSET, chunk.end_offset);
            put_u64(bytes, OFF_STATE_CHUNK_SIZE_BYTES, chunk.size_bytes);
            put_u64(bytes, OFF_STATE_CHUNK_OFFSET_BYTES, chunk.offset_bytes);
            put_u32(bytes, OFF_STATE_CHUNK_PREPARE_CHECKSUM, chunk.prepare_checksum);
            put_u32(bytes, OFF_STATE_CHUNK_STATE_CHECKSUM, chunk.state_checksum);
            put_u32(bytes, OFF_STATE_CHUNK_CHUNK_SIZE_BYTES, chunk.chunk_size_bytes);
        }
        Fields::Request(request) => {
            put_u64(bytes, OFF_REQUEST_CLIENT, request.client);
            put_u64(bytes, OFF_REQUEST_SESSION, request.session);
            put_u64(bytes, OFF_REQUEST_REQUEST, request.request);
            put_u32(bytes, OFF_REQUEST_OPERATION, request.operation);
        }
        Fields::Reply(reply) => {
            put_u64(bytes, OFF_REPLY_CLIENT, reply.client);
            put_u64(bytes, OFF_REPLY_REQUEST, reply.request);
            put_u32(bytes, OFF_REPLY_OPERATION, reply.operation);
            put_u32(bytes, OFF_REPLY_ERROR, reply.error);
        }
    }
}

/// The fields of `command` read from `bytes`; `None` only for [`Command::Reserved`].
fn decode_fields(bytes: &[u8; HEADER_SIZE], command: Command) -> Option<Fields> {
    let fields = match command {
        Command::Reserved => return None,
        Command::Prepare => Fields::Prepare(decode_prepare(bytes)),
        Command::JournalEntry => Fields::JournalEntry(JournalEntry {
            seq: get_u64(bytes, OFF_JOURNAL_SEQ),
            durable_seq: get_u64(bytes, OFF_JOURNAL_DURABLE_SEQ),
            tail_seq: get_u64(bytes, OFF_JOURNAL_TAIL_SEQ),
        }),
        Command::PrepareOk => Fields::PrepareOk(PrepareOk {
            group: get_u64(bytes, OFF_PREPARE_OK_GROUP),
            op: get_u64(bytes, OFF_PREPARE_OK_OP),
            commit: get_u64(bytes, OFF_PREPARE_OK_COMMIT),
            prepare_checksum: get_u32(bytes, OFF_PREPARE_OK_PREPARE_CHECKSUM),
        }),
        Command::Commit => {
            Fields::Commit(Commit { entry_count: get_u32(bytes, OFF_COMMIT_ENTRY_COUNT) })
        }
        Command::StartViewChange => Fields::StartViewChange(StartViewChange {
            group: get_u64(bytes, OFF_START_VIEW_CHANGE_GROUP),
        }),
        Command::DoViewChange => Fields::DoViewChange(DoViewChange {
            group: get_u64(bytes, OFF_DO_VIEW_CHANGE_GROUP),
            op: get_u64(bytes, OFF_DO_VIEW_CHANGE_OP),
            commit: get_u64(bytes, OFF_DO_VIEW_CHANGE_COMMIT),
            faulty_from: get_u64(bytes, OFF_DO_VIEW_CHANGE_FAULTY_FROM),
            log_view: get_u32(bytes, OFF_DO_VIEW_CHANGE_LOG_VIEW),
            header_count: get_u32(bytes, OFF_DO_VIEW_CHANGE_HEADER_COUNT),
            flags: get_u32(bytes, OFF_DO_VIEW_CHANGE_FLAGS),
            log_view_head_op: get_u64(bytes, OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP),
        }),
        Command::StartView => Fields::StartView(StartView {
            group: get_u64(bytes, OFF_START_VIEW_GROUP),
            op: get_u64(bytes, OFF_START_VIEW_OP),
            commit: get_u64(bytes, OFF_START_VIEW_COMMIT),
            nonce: get_u64(bytes, OFF_START_VIEW_NONCE),
            header_count: get_u32(bytes, OFF_START_VIEW_HEADER_COUNT),
        }),
        Command::RequestStartView => Fields::RequestStartView(RequestStartView {
            group: get_u64(bytes, OFF_REQUEST_START_VIEW_GROUP),
            nonce: get_u64(bytes, OFF_REQUEST_START_VIEW_NONCE),
        }),
        Command::RequestPrepare => Fields::RequestPrepare(RequestPrepare {
            group: get_u64(bytes, OFF_REQUEST_PREPARE_GROUP),
            op: get_u64(bytes, OFF_REQUEST_PREPARE_OP),
            checksum: get_u32(bytes, OFF_REQUEST_PREPARE_CHECKSUM),
            flags: get_u32(bytes, OFF_REQUEST_PREPARE_FLAGS),
        }),
        Command::RangeEvicted => Fields::RangeEvicted(RangeEvicted {
            group: get_u64(bytes, OFF_RANGE_EVICTED_GROUP),
            op: get_u64(bytes, OFF_RANGE_EVICTED_OP),
            op_min: get_u64(bytes, OFF_RANGE_EVICTED_OP_MIN),
        }),
        Command::RequestState => Fields::RequestState(RequestState {
            group: get_u64(bytes, OFF_REQUEST_STATE_GROUP),
            op: get_u64(bytes, OFF_REQUEST_STATE_OP),
            offset_bytes: get_u64(bytes, OFF_REQUEST_STATE_OFFSET_BYTES),
        }),
        Command::StateChunk => Fields::StateChunk(StateChunk {
            group: get_u64(bytes, OFF_STATE_CHUNK_GROUP),
            op: get_u64(bytes, OFF_STATE_CHUNK_OP),
            end_offset: get_u64(bytes, OFF_STATE_CHUNK_END_OFFSET),
            size_bytes: get_u64(bytes, OFF_STATE_CHUNK_SIZE_BYTES),
            offset_bytes: get_u64(bytes, OFF_STATE_CHUNK_OFFSET_BYTES),
            prepare_checksum: get_u32(bytes, OFF_STATE_CHUNK_PREPARE_CHECKSUM),
            state_checksum: get_u32(bytes, OFF_STATE_CHUNK_STATE_CHECKSUM),
            chunk_size_bytes: get_u32(bytes, OFF_STATE_CHUNK_CHUNK_SIZE_BYTES),
        }),
        Command::Request => Fields::Request(ClientRequest {
            client: get_u64(bytes, OFF_REQUEST_CLIENT),
            session: get_u64(bytes, OFF_REQUEST_SESSION),
            request: get_u64(bytes, OFF_REQUEST_REQUEST),
            operation: get_u32(bytes, OFF_REQUEST_OPERATION),
        }),
        Command::Reply => Fields::Reply(ClientReply {
            client: get_u64(bytes, OFF_REPLY_CLIENT),
            request: get_u64(bytes, OFF_REPLY_REQUEST),
            operation: get_u32(bytes, OFF_REPLY_OPERATION),
            error: get_u32(bytes, OFF_REPLY_ERROR),
        }),
    };
    Some(fields)
}

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

// Offsets passed to these are the layout constants above, all in bounds of the array they index
// (a header or a commit entry) by the compile-time checks, so the slice indexing cannot fail
// whatever the input bytes are.

fn put_u32<const N: usize>(bytes: &mut [u8; N], offset: usize, value: u32) {
    bytes[offset..offset + size_of::<u32>()].copy_from_slice(&value.to_le_bytes());
}

fn put_u64<const N: usize>(bytes: &mut [u8; N], offset: usize, value: u64) {
    bytes[offset..offset + size_of::<u64>()].copy_from_slice(&value.to_le_bytes());
}

fn get_u32<const N: usize>(bytes: &[u8; N], offset: usize) -> u32 {
    let mut le = [0u8; size_of::<u32>()];
    le.copy_from_slice(&bytes[offset..offset + size_of::<u32>()]);
    u32::from_le_bytes(le)
}

fn get_u64<const N: usize>(bytes: &[u8; N], offset: usize) -> u64 {
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
            command in prop_oneof![1u8..=9, any::<u8>()],
            version in prop_oneof![Just(VERSION), any::<u8>()],
            zero_reserved in any::<bool>(),
            small_counts in any::<bool>(),
        ) {
            let mut bytes: [u8; HEADER_SIZE] = raw.try_into().unwrap();
            bytes[OFF_COMMAND] = command;
            bytes[OFF_VERSION] = version;
            if zero_reserved && let Some(command) = Command::from_u8(command) {
                for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_ranges(command)) {
                    bytes[offset..offset + len].fill(0);
                }
            }
            if small_counts {
                // Counts below 256 (whichever command's count sits there), so that the size
                // fix-up below fits in `u32`.
                for offset in [
                    OFF_COMMIT_ENTRY_COUNT,
                    OFF_DO_VIEW_CHANGE_HEADER_COUNT,
                    OFF_START_VIEW_HEADER_COUNT,
                ] {
                    bytes[offset + 1..offset + 4].fill(0);
                }
            }
            reseal(&mut bytes);
            let mut result = Header::decode(&bytes);
            // Take the size the fields ask for, to reach what lies past the size check.
            if let Err(HeaderError::SizeInconsistent { expected, .. }) = result
                && let Ok(size) = u32::try_from(expected)
            {
                bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
                reseal(&mut bytes);
                result = Header::decode(&bytes);
                let inconsistent = matches!(result, Err(HeaderError::SizeInconsistent { .. }));
                prop_assert!(!inconsistent);
            }
            if let Ok(header) = result {
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
        for command in [Command::Reserved as u8, 15, 0x7f, u8::MAX] {
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
            HeaderError::UnknownFlags { offset: 52, flags: 6 },
            HeaderError::SizeInconsistent { size: 300, expected: 256 },
            HeaderError::BodySizeMismatch { expected: 1, actual: 2 },
            HeaderError::BadBodyChecksum { stored: 1, computed: 2 },
        ];
        for error in errors {
            let boxed: Box<dyn std::error::Error> = Box::new(error.clone());
            assert!(!boxed.to_string().is_empty());
            assert_ne!(boxed.to_string(), format!("{error:?}"));
        }
        let errors = [
            BodyError::WrongCommand { expected: Command::Commit, actual: Command::Prepare },
            BodyError::CountOverLimit { count: 9, max: 8 },
            BodyError::LengthMismatch { expected: 24, actual: 23 },
            BodyError::Header { index: 1, error: HeaderError::UnknownCommand(77) },
            BodyError::NotPrepare { index: 0, command: Command::Commit },
            BodyError::OpsNotAscending { index: 1, op: 3, previous: 3 },
            BodyError::BadFlags { index: 2, flags: 0x80 },
        ];
        for error in errors {
            let boxed: Box<dyn std::error::Error> = Box::new(error.clone());
            assert!(!boxed.to_string().is_empty());
            assert_ne!(boxed.to_string(), format!("{error:?}"));
            assert_eq!(boxed.source().is_some(), matches!(error, BodyError::Header { .. }));
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

    // Replica messages (commands 3..=9).

    const CLUSTER: u64 = 0x0102_0304_0506_0708;
    const VIEW: u32 = 0x0a0b_0c0d;

    fn sample_prepare_ok() -> Header {
        let fields = PrepareOk {
            group: 0x1112_1314_1516_1718,
            op: 0x2122_2324_2526_2728,
            commit: 0x3132_3334_3536_3738,
            prepare_checksum: 0x4142_4344,
        };
        Header::prepare_ok(CLUSTER, VIEW, 2, fields)
    }

    fn sample_commit_entries() -> Vec<CommitEntry> {
        vec![
            CommitEntry {
                group: 0x1112_1314_1516_1718,
                commit: 0x2122_2324_2526_2728,
                commit_checksum: 0x3132_3334,
                view: 0x4142_4344,
            },
            CommitEntry { group: 7, commit: 0, commit_checksum: 0, view: 1 },
        ]
    }

    fn commit_message(entries: &[CommitEntry]) -> (Header, Vec<u8>) {
        let body = encode_commit_entries(entries);
        let fields = Commit { entry_count: entries.len() as u32 };
        (Header::commit(CLUSTER, 1, fields, &body), body)
    }

    fn sample_commit() -> (Header, Vec<u8>) {
        commit_message(&sample_commit_entries())
    }

    fn sample_start_view_change() -> Header {
        Header::start_view_change(
            CLUSTER,
            VIEW,
            0,
            StartViewChange { group: 0x1112_1314_1516_1718 },
        )
    }

    /// A chain of `count` prepares of group 5 from op 10, each with a small body.
    fn sample_view_prepares(count: u64) -> Vec<Header> {
        let mut parent = 0x5152_5354;
        (0..count)
            .map(|i| {
                let fields =
                    Prepare { group: 5, op: 10 + i, commit: 9, parent, ..Prepare::default() };
                let header = Header::prepare(CLUSTER, 3, 1, fields, format!("op {i}").as_bytes());
                parent = header.checksum_header;
                header
            })
            .collect()
    }

    fn do_view_change_message(headers: &[Header], flags: &[u8]) -> (Header, Vec<u8>) {
        let body = encode_view_headers(headers, Some(flags));
        let fields = DoViewChange {
            group: 5,
            op: 0x2122_2324_2526_2728,
            commit: 9,
            faulty_from: 0x3132_3334_3536_3738,
            log_view: 3,
            header_count: headers.len() as u32,
            flags: 0,
            log_view_head_op: 0,
        };
        (Header::do_view_change(CLUSTER, 4, 2, fields, &body), body)
    }

    fn sample_do_view_change() -> (Header, Vec<u8>) {
        do_view_change_message(
            &sample_view_prepares(2),
            &[VIEW_HEADER_FLAG_PRESENT, VIEW_HEADER_FLAG_NACK],
        )
    }

    fn sample_start_view() -> (Header, Vec<u8>) {
        let headers = sample_view_prepares(2);
        let body = encode_view_headers(&headers, None);
        let fields = StartView {
            group: 5,
            op: 11,
            commit: 9,
            nonce: 0x4142_4344_4546_4748,
            header_count: headers.len() as u32,
        };
        (Header::start_view(CLUSTER, 4, 1, fields, &body), body)
    }

    fn sample_request_start_view() -> Header {
        let fields =
            RequestStartView { group: 0x1112_1314_1516_1718, nonce: 0x2122_2324_2526_2728 };
        Header::request_start_view(CLUSTER, VIEW, 2, fields)
    }

    fn sample_request_prepare() -> Header {
        let fields =
            RequestPrepare::by_checksum(0x1112_1314_1516_1718, 0x2122_2324_2526_2728, 0x3132_3334);
        Header::request_prepare(CLUSTER, VIEW, 1, fields)
    }

    /// One sample message of every command, with its body.
    fn sample_messages() -> Vec<(Header, Vec<u8>)> {
        let prepare_body = b"shoal".to_vec();
        let journal_body = sample_header().encode().to_vec();
        let journal = Header::journal_entry(CLUSTER, JournalEntry::default(), &journal_body);
        vec![
            (sample_header(), prepare_body),
            (journal, journal_body),
            (sample_prepare_ok(), Vec::new()),
            sample_commit(),
            (sample_start_view_change(), Vec::new()),
            sample_do_view_change(),
            sample_start_view(),
            (sample_request_start_view(), Vec::new()),
            (sample_request_prepare(), Vec::new()),
            sample_client_request(),
            sample_client_reply(),
            (sample_range_evicted(), Vec::new()),
            (sample_request_state(), Vec::new()),
            sample_state_chunk(),
        ]
    }

    fn sample_request_state() -> Header {
        let fields = RequestState {
            group: 0x1112_1314_1516_1718,
            op: 0x2122_2324_2526_2728,
            offset_bytes: 0x3132_3334_3536_3738,
        };
        Header::request_state(CLUSTER, VIEW, 1, fields)
    }

    fn sample_state_chunk() -> (Header, Vec<u8>) {
        let chunk = b"producer table piece".to_vec();
        let fields = StateChunk {
            group: 0x1112_1314_1516_1718,
            op: 0x2122_2324_2526_2728,
            end_offset: 0x3132_3334_3536_3738,
            size_bytes: 0x4142_4344_4546_4748,
            offset_bytes: 0x5152_5354_5556_5758,
            prepare_checksum: 0x6162_6364,
            state_checksum: 0x7172_7374,
            chunk_size_bytes: 0,
        };
        (Header::state_chunk(CLUSTER, VIEW, 2, fields, &chunk), chunk)
    }

    fn sample_range_evicted() -> Header {
        let fields = RangeEvicted {
            group: 0x1112_1314_1516_1718,
            op: 0x2122_2324_2526_2728,
            op_min: 0x3132_3334_3536_3738,
        };
        Header::range_evicted(CLUSTER, VIEW, 2, fields)
    }

    fn sample_client_request() -> (Header, Vec<u8>) {
        let fields = ClientRequest {
            client: 0x1112_1314_1516_1718,
            session: 0x2122_2324_2526_2728,
            request: 0x3132_3334_3536_3738,
            operation: 0x4142_4344,
        };
        let body = b"request body".to_vec();
        (Header::request(CLUSTER, fields, &body), body)
    }

    fn sample_client_reply() -> (Header, Vec<u8>) {
        let fields = ClientReply {
            client: 0x1112_1314_1516_1718,
            request: 0x3132_3334_3536_3738,
            operation: 0x4142_4344,
            error: 0x5152_5354,
        };
        let body = b"reply body".to_vec();
        (Header::reply(CLUSTER, fields, &body), body)
    }

    /// The one round-trip check for every command: header bytes, body, and (for commands with a
    /// record body) the body decoders, which must give back exactly what was encoded.
    fn check_message(header: &Header, body: &[u8]) -> Result<(), TestCaseError> {
        let bytes = header.encode();
        let decoded = Header::decode(&bytes);
        prop_assert_eq!(&decoded, &Ok(*header));
        prop_assert_eq!(header.version, VERSION);
        prop_assert_eq!(header.command, header.fields.command());
        prop_assert_eq!(header.body_size(), body.len());
        prop_assert_eq!(header.verify_body(body), Ok(()));
        let mut message = bytes.to_vec();
        message.extend_from_slice(body);
        prop_assert_eq!(Header::decode_prefix(&message), Ok(*header));

        match header.fields {
            Fields::Commit(commit) => {
                let entries = decode_commit_entries(header, body, commit.entry_count as usize);
                prop_assert_eq!(encode_commit_entries(&entries.unwrap()), body);
            }
            Fields::DoViewChange(dvc) => {
                let decoded = decode_view_headers(body, dvc.header_count, true, 128);
                let (headers, flags) = decoded.unwrap();
                prop_assert_eq!(headers.len(), dvc.header_count as usize);
                prop_assert_eq!(encode_view_headers(&headers, Some(&flags)), body);
            }
            Fields::StartView(start_view) => {
                let decoded = decode_view_headers(body, start_view.header_count, false, 128);
                let (headers, flags) = decoded.unwrap();
                prop_assert!(flags.is_empty());
                prop_assert_eq!(encode_view_headers(&headers, None), body);
            }
            _ => prop_assert_eq!(decode_commit_entries(header, body, 8).is_err(), true),
        }
        Ok(())
    }

    /// Checks that `header` encodes to `golden_hex` followed by zeros, and that those bytes decode
    /// back to `header`. Each golden was cross-checked against an independent encoder written
    /// from docs/storage-format.md; if one fails, the layout changed (see `wire_golden_bytes`).
    fn check_golden(header: &Header, golden_hex: &str) {
        let golden = from_hex(golden_hex);
        let bytes = header.encode();
        assert_eq!(bytes[..golden.len()], golden[..], "{:?}", header.command);
        assert!(is_zeroed(&bytes[golden.len()..]), "{:?}", header.command);
        assert_eq!(Header::decode(&bytes), Ok(*header));
    }

    fn arb_commit_entry() -> impl Strategy<Value = CommitEntry> {
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
            |(group, commit, commit_checksum, view)| CommitEntry {
                group,
                commit,
                commit_checksum,
                view,
            },
        )
    }

    /// Up to four prepare headers with strictly ascending ops.
    fn arb_view_headers() -> impl Strategy<Value = Vec<Header>> {
        let item = (arb_prepare(), 1..1_000u64, proptest::collection::vec(any::<u8>(), 0..16));
        (0..u64::MAX / 2, any::<u32>(), proptest::collection::vec(item, 0..5)).prop_map(
            |(mut op, view, items)| {
                items
                    .into_iter()
                    .map(|(fields, step, body)| {
                        op += step;
                        Header::prepare(CLUSTER, view, 0, Prepare { op, ..fields }, &body)
                    })
                    .collect()
            },
        )
    }

    fn arb_view_flag() -> impl Strategy<Value = u8> {
        prop_oneof![Just(0), Just(VIEW_HEADER_FLAG_PRESENT), Just(VIEW_HEADER_FLAG_NACK)]
    }

    fn arb_replica_message() -> impl Strategy<Value = (Header, Vec<u8>)> {
        let prefix = (any::<u64>(), any::<u32>(), any::<u8>());
        prop_oneof![
            (prefix, any::<(u64, u64, u64, u32)>()).prop_map(
                |((cluster, view, replica), (group, op, commit, prepare_checksum))| {
                    let fields = PrepareOk { group, op, commit, prepare_checksum };
                    (Header::prepare_ok(cluster, view, replica, fields), Vec::new())
                }
            ),
            (any::<u64>(), any::<u8>(), proptest::collection::vec(arb_commit_entry(), 0..6))
                .prop_map(|(cluster, replica, entries)| {
                    let body = encode_commit_entries(&entries);
                    let fields = Commit { entry_count: entries.len() as u32 };
                    (Header::commit(cluster, replica, fields, &body), body)
                }),
            (prefix, any::<u64>()).prop_map(|((cluster, view, replica), group)| {
                let fields = StartViewChange { group };
                (Header::start_view_change(cluster, view, replica, fields), Vec::new())
            }),
            (
                prefix,
                any::<(u64, u64, u64, u64, u32)>(),
                arb_view_headers(),
                proptest::collection::vec(arb_view_flag(), 4),
            )
                .prop_map(
                    |(
                        (cluster, view, replica),
                        (group, op, commit, faulty_from, log_view),
                        headers,
                        flags,
                    )| {
                        let flags = &flags[..headers.len()];
                        let body = encode_view_headers(&headers, Some(flags));
                        let header_count = headers.len() as u32;
                        let fields = DoViewChange {
                            group,
                            op,
                            commit,
                            faulty_from,
                            log_view,
                            header_count,
                            flags: (op & 1) as u32 | ((commit & 1) << 1) as u32,
                            log_view_head_op: if commit & 1 == 1 { op ^ commit } else { 0 },
                        };
                        (Header::do_view_change(cluster, view, replica, fields, &body), body)
                    }
                ),
            (prefix, any::<(u64, u64, u64, u64)>(), arb_view_headers()).prop_map(
                |((cluster, view, replica), (group, op, commit, nonce), headers)| {
                    let body = encode_view_headers(&headers, None);
                    let header_count = headers.len() as u32;
                    let fields = StartView { group, op, commit, nonce, header_count };
                    (Header::start_view(cluster, view, replica, fields, &body), body)
                }
            ),
            (prefix, any::<(u64, u64)>()).prop_map(|((cluster, view, replica), (group, nonce))| {
                let fields = RequestStartView { group, nonce };
                (Header::request_start_view(cluster, view, replica, fields), Vec::new())
            }),
            (prefix, any::<(u64, u64, Option<u32>)>()).prop_map(
                |((cluster, view, replica), (group, op, checksum))| {
                    let fields = match checksum {
                        Some(checksum) => RequestPrepare::by_checksum(group, op, checksum),
                        None => RequestPrepare::committed(group, op),
                    };
                    (Header::request_prepare(cluster, view, replica, fields), Vec::new())
                }
            ),
            (prefix, any::<(u64, u64, u64)>()).prop_map(
                |((cluster, view, replica), (group, op, op_min))| {
                    let fields = RangeEvicted { group, op, op_min };
                    (Header::range_evicted(cluster, view, replica, fields), Vec::new())
                }
            ),
            (prefix, any::<(u64, u64, u64)>()).prop_map(
                |((cluster, view, replica), (group, op, offset_bytes))| {
                    let fields = RequestState { group, op, offset_bytes };
                    (Header::request_state(cluster, view, replica, fields), Vec::new())
                }
            ),
            (
                prefix,
                any::<(u64, u64, u64, u64, u64, u32, u32)>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|((cluster, view, replica), fields, chunk)| {
                    let (
                        group,
                        op,
                        end_offset,
                        size_bytes,
                        offset_bytes,
                        prepare_checksum,
                        state_checksum,
                    ) = fields;
                    let fields = StateChunk {
                        group,
                        op,
                        end_offset,
                        size_bytes,
                        offset_bytes,
                        prepare_checksum,
                        state_checksum,
                        chunk_size_bytes: 0,
                    };
                    (Header::state_chunk(cluster, view, replica, fields, &chunk), chunk)
                }),
        ]
    }

    proptest! {
        #[test]
        fn wire_replica_messages_round_trip((header, body) in arb_replica_message()) {
            check_message(&header, &body)?;
        }

        #[test]
        fn wire_replica_message_bit_flip_rejected(
            (header, _body) in arb_replica_message(),
            bit in 0..HEADER_SIZE * 8,
        ) {
            let mut bytes = header.encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            let rejected = matches!(Header::decode(&bytes), Err(HeaderError::BadChecksum { .. }));
            prop_assert!(rejected, "bit {} flip not caught", bit);
        }

        #[test]
        fn wire_decode_view_headers_arbitrary_never_panics(
            body in proptest::collection::vec(any::<u8>(), 0..1_100),
            header_count in prop_oneof![0..6u32, any::<u32>()],
            with_flags in any::<bool>(),
            headers_max in prop_oneof![0..6usize, Just(usize::MAX)],
        ) {
            if let Ok((headers, flags)) =
                decode_view_headers(&body, header_count, with_flags, headers_max)
            {
                prop_assert_eq!(headers.len(), header_count as usize);
                prop_assert_eq!(flags.len(), if with_flags { headers.len() } else { 0 });
            }
        }

        /// Arbitrary bytes never get past the first header's checksum, so start from a valid
        /// body and damage one byte of it (re-sealing the header it falls in, half of the time).
        #[test]
        fn wire_decode_view_headers_damaged_never_panics(
            (header, body) in arb_replica_message(),
            position in any::<prop::sample::Index>(),
            value in any::<u8>(),
            reseal_header in any::<bool>(),
        ) {
            let (count, with_flags) = match header.fields {
                Fields::DoViewChange(dvc) => (dvc.header_count, true),
                Fields::StartView(start_view) => (start_view.header_count, false),
                _ => return Ok(()),
            };
            let mut body = body;
            if body.is_empty() {
                return Ok(());
            }
            let position = position.index(body.len());
            body[position] = value;
            let index = position / HEADER_SIZE;
            if reseal_header && index < count as usize {
                let start = index * HEADER_SIZE;
                let chunk: &mut [u8; HEADER_SIZE] =
                    (&mut body[start..start + HEADER_SIZE]).try_into().unwrap();
                reseal(chunk);
            }
            let _ = decode_view_headers(&body, count, with_flags, usize::MAX);
        }

        #[test]
        fn wire_decode_commit_entries_arbitrary_never_panics(
            entry_count in prop_oneof![0..6u32, any::<u32>()],
            body in proptest::collection::vec(any::<u8>(), 0..200),
            entries_max in prop_oneof![0..6usize, Just(usize::MAX)],
        ) {
            // A hand-built header: the decoder must not trust `size` to match the body.
            let header = Header {
                checksum_header: 0,
                checksum_body: 0,
                cluster: 0,
                size: HEADER_SIZE as u32,
                view: 0,
                command: Command::Commit,
                version: VERSION,
                replica: 0,
                fields: Fields::Commit(Commit { entry_count }),
            };
            if let Ok(entries) = decode_commit_entries(&header, &body, entries_max) {
                prop_assert_eq!(entries.len() * COMMIT_ENTRY_SIZE, body.len());
            }
        }
    }

    #[test]
    fn wire_every_command_round_trips() {
        let messages = sample_messages();
        assert_eq!(messages.len(), 14);
        for (i, (header, body)) in messages.iter().enumerate() {
            assert_eq!(header.command as u8, i as u8 + 1);
            check_message(header, body).unwrap();
        }
    }

    #[test]
    fn wire_every_command_single_bit_flip_rejected() {
        for (header, _body) in sample_messages() {
            let bytes = header.encode();
            for bit in 0..HEADER_SIZE * 8 {
                let mut flipped = bytes;
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    matches!(Header::decode(&flipped), Err(HeaderError::BadChecksum { .. })),
                    "{:?} bit {bit}",
                    header.command
                );
            }
        }
    }

    #[test]
    fn wire_every_command_reserved_byte_checked() {
        let reserved_field_bytes = [
            (Command::Prepare, 4 + 4 + 128),
            (Command::JournalEntry, 200),
            (Command::PrepareOk, 196),
            (Command::Commit, 220),
            (Command::StartViewChange, 216),
            (Command::DoViewChange, 4 + 168),
            (Command::StartView, 188),
            (Command::RequestStartView, 208),
            (Command::RequestPrepare, 200),
            (Command::Request, 196),
            (Command::Reply, 200),
            (Command::RangeEvicted, 200),
            (Command::RequestState, 200),
            (Command::StateChunk, 172),
        ];
        for ((header, _body), (command, field_bytes)) in
            sample_messages().into_iter().zip(reserved_field_bytes)
        {
            assert_eq!(header.command, command);
            let mut reserved_offsets = Vec::new();
            for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_ranges(command)) {
                reserved_offsets.extend(offset..offset + len);
            }
            assert_eq!(reserved_offsets.len(), 5 + field_bytes, "{command:?}");
            for offset in reserved_offsets {
                let mut bytes = header.encode();
                bytes[offset] = 0x80;
                reseal(&mut bytes);
                assert_eq!(
                    Header::decode(&bytes),
                    Err(HeaderError::ReservedNonZero { offset }),
                    "{command:?}"
                );
            }
        }
    }

    #[test]
    fn wire_replica_message_size_must_match_counts() {
        let cases = [
            (sample_prepare_ok(), HEADER_SIZE as u64),
            (sample_commit().0, (HEADER_SIZE + 2 * COMMIT_ENTRY_SIZE) as u64),
            (sample_start_view_change(), HEADER_SIZE as u64),
            (sample_do_view_change().0, (HEADER_SIZE + 2 * (HEADER_SIZE + 1)) as u64),
            (sample_start_view().0, (HEADER_SIZE + 2 * HEADER_SIZE) as u64),
            (sample_request_start_view(), HEADER_SIZE as u64),
            (sample_request_prepare(), HEADER_SIZE as u64),
        ];
        for (header, expected) in cases {
            assert_eq!(u64::from(header.size), expected, "{:?}", header.command);
            // One byte short of a header is `SizeTooSmall`, checked before the counts.
            let short = expected - 1;
            for size in [short, expected + 1, u64::from(u32::MAX)] {
                if short < HEADER_SIZE as u64 && size == short {
                    continue;
                }
                let size = u32::try_from(size).unwrap();
                let mut bytes = header.encode();
                bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
                reseal(&mut bytes);
                assert_eq!(
                    Header::decode(&bytes),
                    Err(HeaderError::SizeInconsistent { size, expected }),
                    "{:?}",
                    header.command
                );
            }
        }
        // A count whose body cannot fit in the size field at all.
        let mut bytes = sample_commit().0.encode();
        bytes[OFF_COMMIT_ENTRY_COUNT..OFF_COMMIT_ENTRY_COUNT + 4]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        reseal(&mut bytes);
        let expected = HEADER_SIZE as u64 + u64::from(u32::MAX) * COMMIT_ENTRY_SIZE as u64;
        assert!(expected > u64::from(u32::MAX));
        let size = (HEADER_SIZE + 2 * COMMIT_ENTRY_SIZE) as u32;
        assert_eq!(Header::decode(&bytes), Err(HeaderError::SizeInconsistent { size, expected }));
    }

    #[test]
    fn wire_as_accessors_match_only_their_command() {
        for (header, _body) in sample_messages() {
            let command = header.command;
            assert_eq!(header.as_prepare().is_some(), command == Command::Prepare);
            assert_eq!(header.as_journal_entry().is_some(), command == Command::JournalEntry);
            assert_eq!(header.as_prepare_ok().is_some(), command == Command::PrepareOk);
            assert_eq!(header.as_commit().is_some(), command == Command::Commit);
            assert_eq!(
                header.as_start_view_change().is_some(),
                command == Command::StartViewChange
            );
            assert_eq!(header.as_do_view_change().is_some(), command == Command::DoViewChange);
            assert_eq!(header.as_start_view().is_some(), command == Command::StartView);
            assert_eq!(
                header.as_request_start_view().is_some(),
                command == Command::RequestStartView
            );
            assert_eq!(header.as_request_prepare().is_some(), command == Command::RequestPrepare);
            assert_eq!(header.as_request().is_some(), command == Command::Request);
            assert_eq!(header.as_reply().is_some(), command == Command::Reply);
            assert_eq!(header.as_range_evicted().is_some(), command == Command::RangeEvicted);
            assert_eq!(header.as_request_state().is_some(), command == Command::RequestState);
            assert_eq!(header.as_state_chunk().is_some(), command == Command::StateChunk);
            assert_eq!(Command::from_u8(command as u8), Some(command));
        }
        assert_eq!(Command::from_u8(15), None);
        assert_eq!(sample_prepare_ok().as_prepare_ok().unwrap().prepare_checksum, 0x4142_4344);
        assert_eq!(sample_commit().0.as_commit(), Some(&Commit { entry_count: 2 }));
        assert_eq!(sample_start_view().0.as_start_view().unwrap().nonce, 0x4142_4344_4546_4748);
        assert_eq!(sample_do_view_change().0.as_do_view_change().unwrap().log_view, 3);
        assert_eq!(
            sample_request_start_view().as_request_start_view().unwrap().nonce,
            0x2122_2324_2526_2728
        );
    }

    #[test]
    fn do_view_change_log_view_head_is_held_to_its_flag() {
        let (header, body) = sample_do_view_change();
        let mut fields = *header.as_do_view_change().unwrap();
        fields.flags = DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN;
        fields.log_view_head_op = 0x0102_0304_0506_0708;
        let known = Header::do_view_change(CLUSTER, 4, 2, fields, &body);
        let bytes = known.encode();
        assert_eq!(bytes[80..88], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(Header::decode(&bytes).unwrap().as_do_view_change(), Some(&fields));
        // Without its flag the field is unused and must be zero, like reserved bytes.
        let mut unflagged = bytes;
        unflagged[OFF_DO_VIEW_CHANGE_FLAGS..OFF_DO_VIEW_CHANGE_FLAGS + 4].fill(0);
        reseal(&mut unflagged);
        assert_eq!(
            Header::decode(&unflagged),
            Err(HeaderError::ReservedNonZero { offset: OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP })
        );
        // The pad before it is reserved, and so is a flag bit beyond the two known.
        let mut padded = bytes;
        padded[OFF_DO_VIEW_CHANGE_RESERVED_PAD + 3] = 1;
        reseal(&mut padded);
        assert_eq!(
            Header::decode(&padded),
            Err(HeaderError::ReservedNonZero { offset: OFF_DO_VIEW_CHANGE_RESERVED_PAD + 3 })
        );
        let mut flagged = bytes;
        flagged[OFF_DO_VIEW_CHANGE_FLAGS] = 0b111;
        reseal(&mut flagged);
        assert_eq!(
            Header::decode(&flagged),
            Err(HeaderError::UnknownFlags { offset: OFF_DO_VIEW_CHANGE_FLAGS, flags: 0b111 })
        );
    }

    #[test]
    fn wire_replica_golden_bytes() {
        check_golden(
            &sample_prepare_ok(),
            "cd1cec94 00000000 08070605 04030201 00010000 0d0c0b0a 03010200 00000000
             18171615 14131211 28272625 24232221 38373635 34333231 44434241 00000000",
        );
        check_golden(
            &sample_commit().0,
            "354dde87 483c95be 08070605 04030201 30010000 00000000 04010100 00000000
             02000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000",
        );
        check_golden(
            &sample_start_view_change(),
            "f2a10dab 00000000 08070605 04030201 00010000 0d0c0b0a 05010000 00000000
             18171615 14131211 00000000 00000000 00000000 00000000 00000000 00000000",
        );
        check_golden(
            &sample_do_view_change().0,
            "4f6b78b1 db501f10 08070605 04030201 02030000 04000000 06010200 00000000
             05000000 00000000 28272625 24232221 09000000 00000000 38373635 34333231
             03000000 02000000 00000000 00000000 00000000 00000000 00000000 00000000",
        );
        check_golden(
            &sample_start_view().0,
            "227240b3 8567523b 08070605 04030201 00030000 04000000 07010100 00000000
             05000000 00000000 0b000000 00000000 09000000 00000000 48474645 44434241
             02000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000",
        );
        check_golden(
            &sample_request_start_view(),
            "e5ae2892 00000000 08070605 04030201 00010000 0d0c0b0a 08010200 00000000
             18171615 14131211 28272625 24232221 00000000 00000000 00000000 00000000",
        );
        check_golden(
            &sample_request_prepare(),
            "8c6bbd14 00000000 08070605 04030201 00010000 0d0c0b0a 09010100 00000000
             18171615 14131211 28272625 24232221 34333231 01000000 00000000 00000000",
        );
    }

    /// Pins the body layouts: a commit entry and the flag bytes after the view headers.
    #[test]
    fn wire_replica_body_golden_bytes() {
        let body = encode_commit_entries(&sample_commit_entries());
        assert_eq!(
            body,
            from_hex(
                "18171615 14131211 28272625 24232221 34333231 44434241
             07000000 00000000 00000000 00000000 00000000 01000000"
            )
        );
        let (_, body) = sample_do_view_change();
        let headers = sample_view_prepares(2);
        assert_eq!(body.len(), 2 * HEADER_SIZE + 2);
        assert_eq!(body[..HEADER_SIZE], headers[0].encode());
        assert_eq!(body[HEADER_SIZE..2 * HEADER_SIZE], headers[1].encode());
        assert_eq!(body[2 * HEADER_SIZE..], [0x01, 0x02]);
        let (_, body) = sample_start_view();
        assert_eq!(body.len(), 2 * HEADER_SIZE);
        assert_eq!(body[HEADER_SIZE..], headers[1].encode());
    }

    #[test]
    fn wire_commit_entries_count_over_limit_rejected() {
        let (header, body) = sample_commit();
        assert_eq!(decode_commit_entries(&header, &body, 2), Ok(sample_commit_entries()));
        assert_eq!(
            decode_commit_entries(&header, &body, 1),
            Err(BodyError::CountOverLimit { count: 2, max: 1 })
        );
        let (empty, body) = commit_message(&[]);
        assert_eq!(decode_commit_entries(&empty, &body, 0), Ok(Vec::new()));
    }

    #[test]
    fn wire_commit_entries_wrong_body_length_rejected() {
        let (header, body) = sample_commit();
        let expected = 2 * COMMIT_ENTRY_SIZE as u64;
        for actual in [0, body.len() - 1, body.len() + 1, body.len() + COMMIT_ENTRY_SIZE] {
            let mut wrong = body.clone();
            wrong.resize(actual, 0);
            assert_eq!(
                decode_commit_entries(&header, &wrong, usize::MAX),
                Err(BodyError::LengthMismatch { expected, actual })
            );
        }
    }

    #[test]
    fn wire_commit_entries_wrong_command_rejected() {
        assert_eq!(
            decode_commit_entries(&sample_prepare_ok(), &[], 8),
            Err(BodyError::WrongCommand { expected: Command::Commit, actual: Command::PrepareOk })
        );
    }

    #[test]
    fn wire_view_headers_count_over_limit_rejected() {
        let (_, body) = sample_do_view_change();
        assert!(decode_view_headers(&body, 2, true, 2).is_ok());
        assert_eq!(
            decode_view_headers(&body, 2, true, 1),
            Err(BodyError::CountOverLimit { count: 2, max: 1 })
        );
        // A huge count with a generous limit fails on the length check, before any allocation.
        assert_eq!(
            decode_view_headers(&body, u32::MAX, true, usize::MAX),
            Err(BodyError::LengthMismatch {
                expected: u64::from(u32::MAX) * (HEADER_SIZE as u64 + 1),
                actual: body.len(),
            })
        );
        assert_eq!(decode_view_headers(&[], 0, true, 0), Ok((Vec::new(), Vec::new())));
    }

    #[test]
    fn wire_view_headers_wrong_body_length_rejected() {
        let (_, dvc_body) = sample_do_view_change();
        let (_, start_view_body) = sample_start_view();
        let dvc_expected = 2 * (HEADER_SIZE as u64 + 1);
        let start_view_expected = 2 * HEADER_SIZE as u64;
        let cases = [
            (&dvc_body[..dvc_body.len() - 1], true, dvc_expected),
            (&start_view_body[..], true, dvc_expected),
            (&dvc_body[..], false, start_view_expected),
            (&start_view_body[..HEADER_SIZE], false, start_view_expected),
        ];
        for (body, with_flags, expected) in cases {
            assert_eq!(
                decode_view_headers(body, 2, with_flags, 128),
                Err(BodyError::LengthMismatch { expected, actual: body.len() })
            );
        }
        let mut longer = start_view_body.clone();
        longer.push(0);
        assert_eq!(
            decode_view_headers(&longer, 2, false, 128),
            Err(BodyError::LengthMismatch { expected: start_view_expected, actual: longer.len() })
        );
    }

    #[test]
    fn wire_view_headers_bad_flag_bits_rejected() {
        let headers = sample_view_prepares(2);
        for flag in [0, VIEW_HEADER_FLAG_PRESENT, VIEW_HEADER_FLAG_NACK] {
            let (_, body) = do_view_change_message(&headers, &[0, flag]);
            assert_eq!(decode_view_headers(&body, 2, true, 128).unwrap().1, [0, flag]);
        }
        let (_, body) = sample_do_view_change();
        for flag in [0x04, 0x80, 0xff, VIEW_HEADER_FLAG_PRESENT | VIEW_HEADER_FLAG_NACK] {
            let mut bad = body.clone();
            *bad.last_mut().unwrap() = flag;
            assert_eq!(
                decode_view_headers(&bad, 2, true, 128),
                Err(BodyError::BadFlags { index: 1, flags: flag })
            );
        }
    }

    #[test]
    fn wire_view_headers_non_prepare_rejected() {
        let journal = Header::journal_entry(CLUSTER, JournalEntry::default(), &[]);
        for stranger in [sample_prepare_ok(), sample_start_view_change(), journal] {
            let mut body = encode_view_headers(&sample_view_prepares(1), None);
            body.extend_from_slice(&stranger.encode());
            assert_eq!(
                decode_view_headers(&body, 2, false, 128),
                Err(BodyError::NotPrepare { index: 1, command: stranger.command })
            );
        }
    }

    #[test]
    fn wire_view_headers_corrupt_header_rejected() {
        let (_, mut body) = sample_start_view();
        body[HEADER_SIZE + 40] ^= 1;
        assert!(matches!(
            decode_view_headers(&body, 2, false, 128),
            Err(BodyError::Header { index: 1, error: HeaderError::BadChecksum { .. } })
        ));
    }

    #[test]
    fn wire_view_headers_ops_not_ascending_rejected() {
        let headers = sample_view_prepares(2);
        for pair in [[headers[0], headers[0]], [headers[1], headers[0]]] {
            let mut body = pair[0].encode().to_vec();
            body.extend_from_slice(&pair[1].encode());
            assert_eq!(
                decode_view_headers(&body, 2, false, 128),
                Err(BodyError::OpsNotAscending {
                    index: 1,
                    op: pair[1].as_prepare().unwrap().op,
                    previous: pair[0].as_prepare().unwrap().op,
                })
            );
        }
    }

    #[test]
    #[should_panic(expected = "view headers must be prepares")]
    fn wire_encode_view_headers_refuses_non_prepare() {
        encode_view_headers(&[sample_prepare_ok()], None);
    }

    #[test]
    #[should_panic(expected = "ops must ascend")]
    fn wire_encode_view_headers_refuses_descending_ops() {
        let headers = sample_view_prepares(2);
        encode_view_headers(&[headers[1], headers[0]], None);
    }

    #[test]
    #[should_panic(expected = "one flag byte per header")]
    fn wire_encode_view_headers_refuses_missing_flags() {
        encode_view_headers(&sample_view_prepares(2), Some(&[0]));
    }

    #[test]
    #[should_panic(expected = "invalid view header flags")]
    fn wire_encode_view_headers_refuses_present_and_nack() {
        encode_view_headers(&sample_view_prepares(1), Some(&[3]));
    }

    #[test]
    #[should_panic(expected = "body length disagrees with its count field")]
    fn wire_commit_constructor_refuses_wrong_count() {
        let body = encode_commit_entries(&sample_commit_entries());
        Header::commit(CLUSTER, 0, Commit { entry_count: 1 }, &body);
    }

    #[test]
    fn wire_request_prepare_flags() {
        let by_checksum = RequestPrepare::by_checksum(5, 10, 0xabcd);
        assert_eq!(by_checksum.checksum_given(), Some(0xabcd));
        let committed = RequestPrepare::committed(5, 10);
        assert_eq!(committed.checksum_given(), None);
        assert_eq!(committed.checksum, 0);
        let header = Header::request_prepare(CLUSTER, 1, 0, committed);
        check_message(&header, &[]).unwrap();

        // Unknown flag bits.
        for flags in [0b10, 0b11, 1 << 31] {
            let mut bytes = sample_request_prepare().encode();
            bytes[OFF_REQUEST_PREPARE_FLAGS..OFF_REQUEST_PREPARE_FLAGS + 4]
                .copy_from_slice(&u32::to_le_bytes(flags));
            reseal(&mut bytes);
            assert_eq!(
                Header::decode(&bytes),
                Err(HeaderError::UnknownFlags { offset: OFF_REQUEST_PREPARE_FLAGS, flags })
            );
        }
        // A checksum without the flag that says it is given.
        for (checksum, first_nonzero) in [(1u32, 0), (0x0100, 1), (0xff00_0000, 3)] {
            let mut bytes = header.encode();
            bytes[OFF_REQUEST_PREPARE_CHECKSUM..OFF_REQUEST_PREPARE_CHECKSUM + 4]
                .copy_from_slice(&checksum.to_le_bytes());
            reseal(&mut bytes);
            assert_eq!(
                Header::decode(&bytes),
                Err(HeaderError::ReservedNonZero {
                    offset: OFF_REQUEST_PREPARE_CHECKSUM + first_nonzero
                })
            );
        }
    }

    #[test]
    #[should_panic(expected = "checksum without REQUEST_PREPARE_FLAG_CHECKSUM")]
    fn wire_request_prepare_constructor_refuses_stray_checksum() {
        let fields = RequestPrepare { group: 1, op: 2, checksum: 3, flags: 0 };
        Header::request_prepare(CLUSTER, 0, 0, fields);
    }
}
