//! Where every field of the 256-byte header sits: the common prefix, each command's field
//! region as a chain of sizes pinned by compile-time checks to the documented offsets, the
//! reserved ranges that must be zero, and the little-endian accessors the codec reads and writes
//! them with. It owns byte positions only; what a field means is `fields`' and `header`'s.

use super::Command;

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
pub(super) const OFF_CHECKSUM_HEADER: usize = 0;
pub(super) const OFF_CHECKSUM_BODY: usize = OFF_CHECKSUM_HEADER + size_of::<u32>();
pub(super) const OFF_CLUSTER: usize = OFF_CHECKSUM_BODY + size_of::<u32>();
pub(super) const OFF_SIZE: usize = OFF_CLUSTER + size_of::<u64>();
pub(super) const OFF_VIEW: usize = OFF_SIZE + size_of::<u32>();
pub(super) const OFF_COMMAND: usize = OFF_VIEW + size_of::<u32>();
pub(super) const OFF_VERSION: usize = OFF_COMMAND + size_of::<u8>();
pub(super) const OFF_REPLICA: usize = OFF_VERSION + size_of::<u8>();
pub(super) const OFF_RESERVED_COMMON: usize = OFF_REPLICA + size_of::<u8>();
pub(super) const SIZE_RESERVED_COMMON: usize = 5;
pub(super) const SIZE_COMMON_PREFIX: usize = OFF_RESERVED_COMMON + SIZE_RESERVED_COMMON;

// `Command::Prepare` region.
pub(super) const OFF_PREPARE_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_PREPARE_OP: usize = OFF_PREPARE_GROUP + size_of::<u64>();
pub(super) const OFF_PREPARE_COMMIT: usize = OFF_PREPARE_OP + size_of::<u64>();
pub(super) const OFF_PREPARE_PARENT: usize = OFF_PREPARE_COMMIT + size_of::<u64>();
pub(super) const OFF_PREPARE_RESERVED_PARENT: usize = OFF_PREPARE_PARENT + size_of::<u32>();
pub(super) const SIZE_PREPARE_RESERVED_PARENT: usize = size_of::<u32>();
pub(super) const OFF_PREPARE_BASE_OFFSET: usize =
    OFF_PREPARE_RESERVED_PARENT + SIZE_PREPARE_RESERVED_PARENT;
pub(super) const OFF_PREPARE_RECORD_COUNT: usize = OFF_PREPARE_BASE_OFFSET + size_of::<u64>();
pub(super) const OFF_PREPARE_RESERVED_RECORD_COUNT: usize =
    OFF_PREPARE_RECORD_COUNT + size_of::<u32>();
pub(super) const SIZE_PREPARE_RESERVED_RECORD_COUNT: usize = size_of::<u32>();
pub(super) const OFF_PREPARE_FIRST_TIMESTAMP_MS: usize =
    OFF_PREPARE_RESERVED_RECORD_COUNT + SIZE_PREPARE_RESERVED_RECORD_COUNT;
pub(super) const OFF_PREPARE_MAX_TIMESTAMP_MS: usize =
    OFF_PREPARE_FIRST_TIMESTAMP_MS + size_of::<i64>();
pub(super) const OFF_PREPARE_APPEND_TIME_MS: usize =
    OFF_PREPARE_MAX_TIMESTAMP_MS + size_of::<i64>();
pub(super) const OFF_PREPARE_CLIENT: usize = OFF_PREPARE_APPEND_TIME_MS + size_of::<i64>();
pub(super) const OFF_PREPARE_SESSION: usize = OFF_PREPARE_CLIENT + size_of::<u64>();
pub(super) const OFF_PREPARE_REQUEST: usize = OFF_PREPARE_SESSION + size_of::<u64>();
pub(super) const OFF_PREPARE_VOTERS: usize = OFF_PREPARE_REQUEST + size_of::<u64>();
pub(super) const OFF_PREPARE_LEARNERS: usize = OFF_PREPARE_VOTERS + size_of::<u32>();
pub(super) const OFF_PREPARE_NEXT_VOTERS: usize = OFF_PREPARE_LEARNERS + size_of::<u32>();
pub(super) const OFF_PREPARE_NEXT_LEARNERS: usize = OFF_PREPARE_NEXT_VOTERS + size_of::<u32>();
pub(super) const OFF_PREPARE_RESERVED_TAIL: usize = OFF_PREPARE_NEXT_LEARNERS + size_of::<u32>();
pub(super) const SIZE_PREPARE_RESERVED_TAIL: usize = 112;
pub(super) const SIZE_PREPARE: usize = OFF_PREPARE_RESERVED_TAIL + SIZE_PREPARE_RESERVED_TAIL;

// `Command::JournalEntry` region: the shard journal's frame around one prepare.
pub(super) const OFF_JOURNAL_SEQ: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_JOURNAL_DURABLE_SEQ: usize = OFF_JOURNAL_SEQ + size_of::<u64>();
pub(super) const OFF_JOURNAL_TAIL_SEQ: usize = OFF_JOURNAL_DURABLE_SEQ + size_of::<u64>();
pub(super) const OFF_JOURNAL_RESERVED_TAIL: usize = OFF_JOURNAL_TAIL_SEQ + size_of::<u64>();
pub(super) const SIZE_JOURNAL_RESERVED_TAIL: usize = HEADER_SIZE - OFF_JOURNAL_RESERVED_TAIL;

// `Command::PrepareOk` region.
pub(super) const OFF_PREPARE_OK_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_PREPARE_OK_OP: usize = OFF_PREPARE_OK_GROUP + size_of::<u64>();
pub(super) const OFF_PREPARE_OK_COMMIT: usize = OFF_PREPARE_OK_OP + size_of::<u64>();
pub(super) const OFF_PREPARE_OK_PREPARE_CHECKSUM: usize = OFF_PREPARE_OK_COMMIT + size_of::<u64>();
pub(super) const OFF_PREPARE_OK_RESERVED_TAIL: usize =
    OFF_PREPARE_OK_PREPARE_CHECKSUM + size_of::<u32>();
pub(super) const SIZE_PREPARE_OK_RESERVED_TAIL: usize = HEADER_SIZE - OFF_PREPARE_OK_RESERVED_TAIL;

// `Command::Commit` region; the entries themselves are the body.
pub(super) const OFF_COMMIT_ENTRY_COUNT: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_COMMIT_RESERVED_TAIL: usize = OFF_COMMIT_ENTRY_COUNT + size_of::<u32>();
pub(super) const SIZE_COMMIT_RESERVED_TAIL: usize = HEADER_SIZE - OFF_COMMIT_RESERVED_TAIL;

// One `CommitEntry` in a `Command::Commit` body, relative to the entry's start.
pub(super) const OFF_ENTRY_GROUP: usize = 0;
pub(super) const OFF_ENTRY_COMMIT: usize = OFF_ENTRY_GROUP + size_of::<u64>();
pub(super) const OFF_ENTRY_COMMIT_CHECKSUM: usize = OFF_ENTRY_COMMIT + size_of::<u64>();
pub(super) const OFF_ENTRY_VIEW: usize = OFF_ENTRY_COMMIT_CHECKSUM + size_of::<u32>();

/// Size in bytes of one [`CommitEntry`] in a [`Command::Commit`] body.
pub const COMMIT_ENTRY_SIZE: usize = OFF_ENTRY_VIEW + size_of::<u32>();

// `Command::StartViewChange` region.
pub(super) const OFF_START_VIEW_CHANGE_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_START_VIEW_CHANGE_VOTERS: usize =
    OFF_START_VIEW_CHANGE_GROUP + size_of::<u64>();
pub(super) const OFF_START_VIEW_CHANGE_LEARNERS: usize =
    OFF_START_VIEW_CHANGE_VOTERS + size_of::<u32>();
pub(super) const OFF_START_VIEW_CHANGE_RESERVED_TAIL: usize =
    OFF_START_VIEW_CHANGE_LEARNERS + size_of::<u32>();
pub(super) const SIZE_START_VIEW_CHANGE_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_START_VIEW_CHANGE_RESERVED_TAIL;

// `Command::DoViewChange` region; the prepare headers and their flags are the body.
pub(super) const OFF_DO_VIEW_CHANGE_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_DO_VIEW_CHANGE_OP: usize = OFF_DO_VIEW_CHANGE_GROUP + size_of::<u64>();
pub(super) const OFF_DO_VIEW_CHANGE_COMMIT: usize = OFF_DO_VIEW_CHANGE_OP + size_of::<u64>();
pub(super) const OFF_DO_VIEW_CHANGE_FAULTY_FROM: usize =
    OFF_DO_VIEW_CHANGE_COMMIT + size_of::<u64>();
pub(super) const OFF_DO_VIEW_CHANGE_LOG_VIEW: usize =
    OFF_DO_VIEW_CHANGE_FAULTY_FROM + size_of::<u64>();
pub(super) const OFF_DO_VIEW_CHANGE_HEADER_COUNT: usize =
    OFF_DO_VIEW_CHANGE_LOG_VIEW + size_of::<u32>();
pub(super) const OFF_DO_VIEW_CHANGE_FLAGS: usize =
    OFF_DO_VIEW_CHANGE_HEADER_COUNT + size_of::<u32>();
pub(super) const OFF_DO_VIEW_CHANGE_RESERVED_PAD: usize =
    OFF_DO_VIEW_CHANGE_FLAGS + size_of::<u32>();
pub(super) const SIZE_DO_VIEW_CHANGE_RESERVED_PAD: usize = size_of::<u32>();
pub(super) const OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP: usize =
    OFF_DO_VIEW_CHANGE_RESERVED_PAD + SIZE_DO_VIEW_CHANGE_RESERVED_PAD;
pub(super) const OFF_DO_VIEW_CHANGE_RESERVED_TAIL: usize =
    OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP + size_of::<u64>();
pub(super) const SIZE_DO_VIEW_CHANGE_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_DO_VIEW_CHANGE_RESERVED_TAIL;

// `Command::StartView` region; the prepare headers are the body.
pub(super) const OFF_START_VIEW_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_START_VIEW_OP: usize = OFF_START_VIEW_GROUP + size_of::<u64>();
pub(super) const OFF_START_VIEW_COMMIT: usize = OFF_START_VIEW_OP + size_of::<u64>();
pub(super) const OFF_START_VIEW_NONCE: usize = OFF_START_VIEW_COMMIT + size_of::<u64>();
pub(super) const OFF_START_VIEW_HEADER_COUNT: usize = OFF_START_VIEW_NONCE + size_of::<u64>();
pub(super) const OFF_START_VIEW_VOTERS: usize = OFF_START_VIEW_HEADER_COUNT + size_of::<u32>();
pub(super) const OFF_START_VIEW_LEARNERS: usize = OFF_START_VIEW_VOTERS + size_of::<u32>();
pub(super) const OFF_START_VIEW_RESERVED_TAIL: usize = OFF_START_VIEW_LEARNERS + size_of::<u32>();
pub(super) const SIZE_START_VIEW_RESERVED_TAIL: usize = HEADER_SIZE - OFF_START_VIEW_RESERVED_TAIL;

// `Command::RequestStartView` region.
pub(super) const OFF_REQUEST_START_VIEW_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_REQUEST_START_VIEW_NONCE: usize =
    OFF_REQUEST_START_VIEW_GROUP + size_of::<u64>();
pub(super) const OFF_REQUEST_START_VIEW_RESERVED_TAIL: usize =
    OFF_REQUEST_START_VIEW_NONCE + size_of::<u64>();
pub(super) const SIZE_REQUEST_START_VIEW_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_REQUEST_START_VIEW_RESERVED_TAIL;

// `Command::RequestPrepare` region.
pub(super) const OFF_REQUEST_PREPARE_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_REQUEST_PREPARE_OP: usize = OFF_REQUEST_PREPARE_GROUP + size_of::<u64>();
pub(super) const OFF_REQUEST_PREPARE_CHECKSUM: usize = OFF_REQUEST_PREPARE_OP + size_of::<u64>();
pub(super) const OFF_REQUEST_PREPARE_FLAGS: usize = OFF_REQUEST_PREPARE_CHECKSUM + size_of::<u32>();
pub(super) const OFF_REQUEST_PREPARE_RESERVED_TAIL: usize =
    OFF_REQUEST_PREPARE_FLAGS + size_of::<u32>();
pub(super) const SIZE_REQUEST_PREPARE_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_REQUEST_PREPARE_RESERVED_TAIL;

// `Command::RangeEvicted` region.
pub(super) const OFF_RANGE_EVICTED_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_RANGE_EVICTED_OP: usize = OFF_RANGE_EVICTED_GROUP + size_of::<u64>();
pub(super) const OFF_RANGE_EVICTED_OP_MIN: usize = OFF_RANGE_EVICTED_OP + size_of::<u64>();
pub(super) const OFF_RANGE_EVICTED_RESERVED_TAIL: usize =
    OFF_RANGE_EVICTED_OP_MIN + size_of::<u64>();
pub(super) const SIZE_RANGE_EVICTED_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_RANGE_EVICTED_RESERVED_TAIL;

// `Command::RequestState` region.
pub(super) const OFF_REQUEST_STATE_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_REQUEST_STATE_OP: usize = OFF_REQUEST_STATE_GROUP + size_of::<u64>();
pub(super) const OFF_REQUEST_STATE_OFFSET_BYTES: usize = OFF_REQUEST_STATE_OP + size_of::<u64>();
pub(super) const OFF_REQUEST_STATE_RESERVED_TAIL: usize =
    OFF_REQUEST_STATE_OFFSET_BYTES + size_of::<u64>();
pub(super) const SIZE_REQUEST_STATE_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_REQUEST_STATE_RESERVED_TAIL;

// `Command::StateChunk` region: one piece of a group's replicated state; the piece is the body.
pub(super) const OFF_STATE_CHUNK_GROUP: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_STATE_CHUNK_OP: usize = OFF_STATE_CHUNK_GROUP + size_of::<u64>();
pub(super) const OFF_STATE_CHUNK_END_OFFSET: usize = OFF_STATE_CHUNK_OP + size_of::<u64>();
pub(super) const OFF_STATE_CHUNK_SIZE_BYTES: usize = OFF_STATE_CHUNK_END_OFFSET + size_of::<u64>();
pub(super) const OFF_STATE_CHUNK_OFFSET_BYTES: usize =
    OFF_STATE_CHUNK_SIZE_BYTES + size_of::<u64>();
pub(super) const OFF_STATE_CHUNK_PREPARE_CHECKSUM: usize =
    OFF_STATE_CHUNK_OFFSET_BYTES + size_of::<u64>();
pub(super) const OFF_STATE_CHUNK_STATE_CHECKSUM: usize =
    OFF_STATE_CHUNK_PREPARE_CHECKSUM + size_of::<u32>();
pub(super) const OFF_STATE_CHUNK_CHUNK_SIZE_BYTES: usize =
    OFF_STATE_CHUNK_STATE_CHECKSUM + size_of::<u32>();
pub(super) const OFF_STATE_CHUNK_RESERVED_TAIL: usize =
    OFF_STATE_CHUNK_CHUNK_SIZE_BYTES + size_of::<u32>();
pub(super) const SIZE_STATE_CHUNK_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_STATE_CHUNK_RESERVED_TAIL;

// `Command::Handshake` region: the first frame each side of a replica bus connection sends.
pub(super) const OFF_HANDSHAKE_SHARD: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_HANDSHAKE_SHARD_COUNT: usize = OFF_HANDSHAKE_SHARD + size_of::<u32>();
pub(super) const OFF_HANDSHAKE_NODE_COUNT: usize = OFF_HANDSHAKE_SHARD_COUNT + size_of::<u32>();
pub(super) const OFF_HANDSHAKE_FLAGS: usize = OFF_HANDSHAKE_NODE_COUNT + size_of::<u8>();
pub(super) const OFF_HANDSHAKE_RESERVED_PAD: usize = OFF_HANDSHAKE_FLAGS + size_of::<u8>();
pub(super) const SIZE_HANDSHAKE_RESERVED_PAD: usize = 6;
/// Handshake flag: the sender's shard holds its groups' state for this cluster (it was formed at
/// the cluster's first start, or rejoined it since), as opposed to a shard with an empty data
/// directory deciding whether the cluster is new.
pub const HANDSHAKE_FLAG_FORMED: u8 = 1;
pub(super) const HANDSHAKE_FLAGS_KNOWN: u8 = HANDSHAKE_FLAG_FORMED;
pub(super) const OFF_HANDSHAKE_INCARNATION: usize =
    OFF_HANDSHAKE_RESERVED_PAD + SIZE_HANDSHAKE_RESERVED_PAD;
pub(super) const OFF_HANDSHAKE_RESERVED_TAIL: usize = OFF_HANDSHAKE_INCARNATION + size_of::<u64>();
pub(super) const SIZE_HANDSHAKE_RESERVED_TAIL: usize = HEADER_SIZE - OFF_HANDSHAKE_RESERVED_TAIL;

// `Command::HandshakeRefused` region: the refuser's own identity, at the same offsets as in a
// `Command::Handshake`; the reason is the body.
pub(super) const OFF_HANDSHAKE_REFUSED_SHARD: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_HANDSHAKE_REFUSED_SHARD_COUNT: usize =
    OFF_HANDSHAKE_REFUSED_SHARD + size_of::<u32>();
pub(super) const OFF_HANDSHAKE_REFUSED_NODE_COUNT: usize =
    OFF_HANDSHAKE_REFUSED_SHARD_COUNT + size_of::<u32>();
pub(super) const OFF_HANDSHAKE_REFUSED_RESERVED_TAIL: usize =
    OFF_HANDSHAKE_REFUSED_NODE_COUNT + size_of::<u8>();
pub(super) const SIZE_HANDSHAKE_REFUSED_RESERVED_TAIL: usize =
    HEADER_SIZE - OFF_HANDSHAKE_REFUSED_RESERVED_TAIL;

/// Most bytes of reason text a [`Command::HandshakeRefused`] body may carry: enough to name both
/// values of any mismatch, small enough that a refusal never strains the reader.
/// [`Header::decode`](super::Header::decode) rejects a larger `size` as
/// [`HeaderError::SizeOverLimit`](super::HeaderError::SizeOverLimit).
pub const HANDSHAKE_REASON_BYTES_MAX: usize = 1024;

// `Command::Request` region: a client's request; the operation's arguments are the body.
pub(super) const OFF_REQUEST_CLIENT: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_REQUEST_SESSION: usize = OFF_REQUEST_CLIENT + size_of::<u64>();
pub(super) const OFF_REQUEST_REQUEST: usize = OFF_REQUEST_SESSION + size_of::<u64>();
pub(super) const OFF_REQUEST_OPERATION: usize = OFF_REQUEST_REQUEST + size_of::<u64>();
pub(super) const OFF_REQUEST_RESERVED_TAIL: usize = OFF_REQUEST_OPERATION + size_of::<u32>();
pub(super) const SIZE_REQUEST_RESERVED_TAIL: usize = HEADER_SIZE - OFF_REQUEST_RESERVED_TAIL;

// `Command::Reply` region: the server's answer; the operation's result (or the error's text)
// is the body.
pub(super) const OFF_REPLY_CLIENT: usize = SIZE_COMMON_PREFIX;
pub(super) const OFF_REPLY_REQUEST: usize = OFF_REPLY_CLIENT + size_of::<u64>();
pub(super) const OFF_REPLY_OPERATION: usize = OFF_REPLY_REQUEST + size_of::<u64>();
pub(super) const OFF_REPLY_ERROR: usize = OFF_REPLY_OPERATION + size_of::<u32>();
pub(super) const OFF_REPLY_RESERVED_TAIL: usize = OFF_REPLY_ERROR + size_of::<u32>();
pub(super) const SIZE_REPLY_RESERVED_TAIL: usize = HEADER_SIZE - OFF_REPLY_RESERVED_TAIL;

/// Flag byte bit of a [`Command::DoViewChange`] body: the sender holds this op's body.
pub const VIEW_HEADER_FLAG_PRESENT: u8 = 1 << 0;
/// Flag byte bit of a [`Command::DoViewChange`] body: the sender provably never acknowledged this
/// op (see `docs/protocol.md`). Never set together with [`VIEW_HEADER_FLAG_PRESENT`].
pub const VIEW_HEADER_FLAG_NACK: u8 = 1 << 1;
pub(super) const VIEW_HEADER_FLAGS_KNOWN: u8 = VIEW_HEADER_FLAG_PRESENT | VIEW_HEADER_FLAG_NACK;

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
pub(super) const DO_VIEW_CHANGE_FLAGS_KNOWN: u32 =
    DO_VIEW_CHANGE_FLAG_LOG_COMPLETE | DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN;
pub(super) const REQUEST_PREPARE_FLAGS_KNOWN: u32 = REQUEST_PREPARE_FLAG_CHECKSUM;

const _: () = assert!(SIZE_COMMON_PREFIX == 32);
const _: () = assert!(OFF_JOURNAL_RESERVED_TAIL == 56);
const _: () = assert!(SIZE_PREPARE == HEADER_SIZE);
// Spot checks against the documented offsets, so a wrong chain link fails the build rather than
// the golden test.
const _: () = assert!(OFF_COMMAND == 24);
const _: () = assert!(OFF_PREPARE_PARENT == 56);
const _: () = assert!(OFF_PREPARE_BASE_OFFSET == 64);
const _: () = assert!(OFF_PREPARE_FIRST_TIMESTAMP_MS == 80);
const _: () = assert!(OFF_PREPARE_VOTERS == 128);
const _: () = assert!(OFF_PREPARE_RESERVED_TAIL == 144);
const _: () = assert!(OFF_PREPARE_OK_PREPARE_CHECKSUM == 56);
const _: () = assert!(OFF_PREPARE_OK_RESERVED_TAIL == 60);
const _: () = assert!(OFF_COMMIT_RESERVED_TAIL == 36);
const _: () = assert!(COMMIT_ENTRY_SIZE == 24);
const _: () = assert!(OFF_START_VIEW_CHANGE_VOTERS == 40);
const _: () = assert!(OFF_START_VIEW_CHANGE_RESERVED_TAIL == 48);
const _: () = assert!(OFF_DO_VIEW_CHANGE_LOG_VIEW == 64);
const _: () = assert!(OFF_DO_VIEW_CHANGE_FLAGS == 72 && OFF_DO_VIEW_CHANGE_RESERVED_PAD == 76);
const _: () =
    assert!(OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP == 80 && OFF_DO_VIEW_CHANGE_RESERVED_TAIL == 88);
const _: () = assert!(OFF_START_VIEW_HEADER_COUNT == 64);
const _: () = assert!(OFF_START_VIEW_VOTERS == 68);
const _: () = assert!(OFF_START_VIEW_RESERVED_TAIL == 76);
const _: () = assert!(OFF_REQUEST_START_VIEW_RESERVED_TAIL == 48);
const _: () = assert!(OFF_REQUEST_PREPARE_FLAGS == 52);
const _: () = assert!(OFF_REQUEST_PREPARE_RESERVED_TAIL == 56);
const _: () = assert!(OFF_RANGE_EVICTED_RESERVED_TAIL == 56);
const _: () = assert!(OFF_REQUEST_STATE_RESERVED_TAIL == 56);
const _: () =
    assert!(OFF_STATE_CHUNK_CHUNK_SIZE_BYTES == 80 && OFF_STATE_CHUNK_RESERVED_TAIL == 84);
const _: () = assert!(OFF_HANDSHAKE_NODE_COUNT == 40 && OFF_HANDSHAKE_FLAGS == 41);
const _: () = assert!(OFF_HANDSHAKE_RESERVED_PAD == 42);
const _: () = assert!(OFF_HANDSHAKE_INCARNATION == 48 && OFF_HANDSHAKE_RESERVED_TAIL == 56);
const _: () = assert!(
    OFF_HANDSHAKE_REFUSED_SHARD == OFF_HANDSHAKE_SHARD
        && OFF_HANDSHAKE_REFUSED_SHARD_COUNT == OFF_HANDSHAKE_SHARD_COUNT
        && OFF_HANDSHAKE_REFUSED_NODE_COUNT == OFF_HANDSHAKE_NODE_COUNT
);
const _: () = assert!(OFF_HANDSHAKE_REFUSED_RESERVED_TAIL == 41);
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
        OFF_HANDSHAKE_RESERVED_TAIL,
        OFF_HANDSHAKE_REFUSED_RESERVED_TAIL,
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
        OFF_HANDSHAKE_INCARNATION,
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
pub(super) const RESERVED_COMMON: [(usize, usize); 1] =
    [(OFF_RESERVED_COMMON, SIZE_RESERVED_COMMON)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Prepare`] header.
pub(super) const RESERVED_PREPARE: [(usize, usize); 3] = [
    (OFF_PREPARE_RESERVED_PARENT, SIZE_PREPARE_RESERVED_PARENT),
    (OFF_PREPARE_RESERVED_RECORD_COUNT, SIZE_PREPARE_RESERVED_RECORD_COUNT),
    (OFF_PREPARE_RESERVED_TAIL, SIZE_PREPARE_RESERVED_TAIL),
];

/// Byte ranges (offset, length) that must be zero in a [`Command::JournalEntry`] header.
pub(super) const RESERVED_JOURNAL: [(usize, usize); 1] =
    [(OFF_JOURNAL_RESERVED_TAIL, SIZE_JOURNAL_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::PrepareOk`] header.
pub(super) const RESERVED_PREPARE_OK: [(usize, usize); 1] =
    [(OFF_PREPARE_OK_RESERVED_TAIL, SIZE_PREPARE_OK_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Commit`] header.
pub(super) const RESERVED_COMMIT: [(usize, usize); 1] =
    [(OFF_COMMIT_RESERVED_TAIL, SIZE_COMMIT_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::StartViewChange`] header.
pub(super) const RESERVED_START_VIEW_CHANGE: [(usize, usize); 1] =
    [(OFF_START_VIEW_CHANGE_RESERVED_TAIL, SIZE_START_VIEW_CHANGE_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::DoViewChange`] header.
pub(super) const RESERVED_DO_VIEW_CHANGE: [(usize, usize); 2] = [
    (OFF_DO_VIEW_CHANGE_RESERVED_PAD, SIZE_DO_VIEW_CHANGE_RESERVED_PAD),
    (OFF_DO_VIEW_CHANGE_RESERVED_TAIL, SIZE_DO_VIEW_CHANGE_RESERVED_TAIL),
];

/// Byte ranges (offset, length) that must be zero in a [`Command::StartView`] header.
pub(super) const RESERVED_START_VIEW: [(usize, usize); 1] =
    [(OFF_START_VIEW_RESERVED_TAIL, SIZE_START_VIEW_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RequestStartView`] header.
pub(super) const RESERVED_REQUEST_START_VIEW: [(usize, usize); 1] =
    [(OFF_REQUEST_START_VIEW_RESERVED_TAIL, SIZE_REQUEST_START_VIEW_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RequestPrepare`] header. (Its
/// `checksum` must also be zero when [`REQUEST_PREPARE_FLAG_CHECKSUM`] is clear; see
/// [`Header::decode`].)
pub(super) const RESERVED_REQUEST_PREPARE: [(usize, usize); 1] =
    [(OFF_REQUEST_PREPARE_RESERVED_TAIL, SIZE_REQUEST_PREPARE_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RangeEvicted`] header.
pub(super) const RESERVED_RANGE_EVICTED: [(usize, usize); 1] =
    [(OFF_RANGE_EVICTED_RESERVED_TAIL, SIZE_RANGE_EVICTED_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::RequestState`] header.
pub(super) const RESERVED_REQUEST_STATE: [(usize, usize); 1] =
    [(OFF_REQUEST_STATE_RESERVED_TAIL, SIZE_REQUEST_STATE_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::StateChunk`] header.
pub(super) const RESERVED_STATE_CHUNK: [(usize, usize); 1] =
    [(OFF_STATE_CHUNK_RESERVED_TAIL, SIZE_STATE_CHUNK_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Handshake`] header.
pub(super) const RESERVED_HANDSHAKE: [(usize, usize); 2] = [
    (OFF_HANDSHAKE_RESERVED_PAD, SIZE_HANDSHAKE_RESERVED_PAD),
    (OFF_HANDSHAKE_RESERVED_TAIL, SIZE_HANDSHAKE_RESERVED_TAIL),
];

/// Byte ranges (offset, length) that must be zero in a [`Command::HandshakeRefused`] header.
pub(super) const RESERVED_HANDSHAKE_REFUSED: [(usize, usize); 1] =
    [(OFF_HANDSHAKE_REFUSED_RESERVED_TAIL, SIZE_HANDSHAKE_REFUSED_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Request`] header.
pub(super) const RESERVED_REQUEST: [(usize, usize); 1] =
    [(OFF_REQUEST_RESERVED_TAIL, SIZE_REQUEST_RESERVED_TAIL)];

/// Byte ranges (offset, length) that must be zero in a [`Command::Reply`] header.
pub(super) const RESERVED_REPLY: [(usize, usize); 1] =
    [(OFF_REPLY_RESERVED_TAIL, SIZE_REPLY_RESERVED_TAIL)];

/// Byte ranges (offset, length) of `command`'s field region that must be zero.
pub(super) fn reserved_ranges(command: Command) -> &'static [(usize, usize)] {
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
        Command::Handshake => &RESERVED_HANDSHAKE,
        Command::HandshakeRefused => &RESERVED_HANDSHAKE_REFUSED,
        Command::Request => &RESERVED_REQUEST,
        Command::Reply => &RESERVED_REPLY,
    }
}

/// Body length of `header_count` view headers, with or without their flag bytes.
pub(super) fn view_headers_body_size(header_count: u32, with_flags: bool) -> u64 {
    let per_header = HEADER_SIZE as u64 + u64::from(with_flags);
    u64::from(header_count) * per_header
}

// Offsets passed to these are the layout constants above, all in bounds of the array they index
// (a header or a commit entry) by the compile-time checks, so the slice indexing cannot fail
// whatever the input bytes are.

pub(super) fn put_u32<const N: usize>(bytes: &mut [u8; N], offset: usize, value: u32) {
    bytes[offset..offset + size_of::<u32>()].copy_from_slice(&value.to_le_bytes());
}

pub(super) fn put_u64<const N: usize>(bytes: &mut [u8; N], offset: usize, value: u64) {
    bytes[offset..offset + size_of::<u64>()].copy_from_slice(&value.to_le_bytes());
}

pub(super) fn get_u32<const N: usize>(bytes: &[u8; N], offset: usize) -> u32 {
    let mut le = [0u8; size_of::<u32>()];
    le.copy_from_slice(&bytes[offset..offset + size_of::<u32>()]);
    u32::from_le_bytes(le)
}

pub(super) fn get_u64<const N: usize>(bytes: &[u8; N], offset: usize) -> u64 {
    let mut le = [0u8; size_of::<u64>()];
    le.copy_from_slice(&bytes[offset..offset + size_of::<u64>()]);
    u64::from_le_bytes(le)
}
