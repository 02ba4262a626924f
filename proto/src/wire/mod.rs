//! The wire header: the one fixed-size, 256-byte, little-endian header that precedes every message
//! Shoal puts on a socket or on disk: prepares in segment files and the shard journal, and the VSR
//! replica messages (`PrepareOk`, `Commit`, the view-change messages, `RequestStartView` and
//! `RequestPrepare`), the replica bus handshake (`Handshake`, `HandshakeRefused`), and client
//! requests and replies.
//!
//! This module owns three things: the byte layout of those 256 bytes, the two CRC-32C checksums
//! that make them trustworthy, and the fixed-record bodies of the replica messages (the entries of
//! a `Commit`, the prepare headers of a `DoViewChange` or `StartView`). [`Header::decode`] is the
//! only door from untrusted bytes to a [`Header`], and it verifies the header checksum before it
//! believes any other field, so everything downstream may assume a decoded header is internally
//! consistent; [`decode_commit_entries`] and [`decode_view_headers`] are the only doors to those
//! bodies, and they bound every count by a caller-given limit before allocating. The module must
//! never interpret any other body (it only checks a body's length and checksum), never allocate
//! per header, never impose a message size limit beyond the format's own bounds (a handshake
//! refusal's reason, [`HANDSHAKE_REASON_BYTES_MAX`]; the rest is the caller's policy, passed in
//! by the caller), never decide what a message means to a replica (that is `replication`'s), and
//! never panic on any input bytes. The byte-by-byte layout, checksum rules and version log are mirrored
//! in `docs/storage-format.md`, and the replica protocol in `docs/protocol.md`; change them
//! together.
//!
//! Files: `layout` (byte positions), `command` (the command byte and field enum), `fields` (one
//! struct per command and the field-region codec), `header` (the header and its decode), `body`
//! (commit entries and view headers), `error` (why bytes were refused).

mod body;
mod command;
mod error;
mod fields;
mod header;
mod layout;
#[cfg(test)]
mod tests;

pub use body::{
    decode_commit_entries, decode_view_headers, encode_commit_entries, encode_view_headers,
};
pub use command::{Command, Fields};
pub use error::{BodyError, HeaderError};
pub use fields::{
    ClientReply, ClientRequest, Commit, CommitEntry, DoViewChange, Handshake, HandshakeRefused,
    JournalEntry, Membership, Prepare, PrepareOk, RangeEvicted, RequestPrepare, RequestStartView,
    RequestState, StartView, StartViewChange, StateChunk,
};
pub use header::{Header, checksum_header, is_zeroed};
pub use layout::{
    COMMIT_ENTRY_SIZE, DO_VIEW_CHANGE_FLAG_LOG_COMPLETE, DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN,
    HANDSHAKE_FLAG_FORMED, HANDSHAKE_REASON_BYTES_MAX, HEADER_SIZE, REQUEST_PREPARE_FLAG_CHECKSUM,
    VERSION, VERSION_MIN_READ, VIEW_HEADER_FLAG_NACK, VIEW_HEADER_FLAG_PRESENT,
};
