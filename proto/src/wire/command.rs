//! The command byte and the per-command field enum: what a message is, and therefore how bytes
//! 32..256 of its header are laid out. It never touches bytes; the codec in `fields` does.

use super::fields::*;
use super::layout::*;

/// What a message is, and therefore how bytes 32..256 of its header are laid out.
///
/// Numbers 3..=9 and 12..=14 are the VSR replica messages, 10..=11 the native client protocol,
/// and 15..=16 the replica bus handshake; `docs/protocol.md` says who sends each and what the
/// receiver checks. Later issues add new variants with new numbers (never reusing one), each with
/// its own [`Fields`] variant. Until a command is added here, [`Header::decode`] rejects its byte
/// as [`HeaderError::UnknownCommand`].
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
    /// The first frame each side of a replica bus connection sends: the sender's cluster id,
    /// node index, shard, shard count, node count and incarnation. Empty body.
    Handshake = 15,
    /// The acceptor's answer, before it closes the connection, to a handshake that does not
    /// match its own identity, which it carries. Body: the reason, UTF-8 text of at most
    /// [`HANDSHAKE_REASON_BYTES_MAX`] bytes.
    HandshakeRefused = 16,
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
            15 => Some(Command::Handshake),
            16 => Some(Command::HandshakeRefused),
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
    /// Fields of a [`Command::Handshake`] header.
    Handshake(Handshake),
    /// Fields of a [`Command::HandshakeRefused`] header.
    HandshakeRefused(HandshakeRefused),
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
            Fields::Handshake(_) => Command::Handshake,
            Fields::HandshakeRefused(_) => Command::HandshakeRefused,
            Fields::Request(_) => Command::Request,
            Fields::Reply(_) => Command::Reply,
        }
    }

    /// Body length in bytes these fields require, for commands whose body layout the header fixes
    /// (empty, or a counted list of fixed-size records); `None` for a prepare's batch, a
    /// journal entry's prepare, a client request's or reply's body and a handshake refusal's
    /// reason, whose length only `size` gives. Computed in `u64`, which no count can overflow.
    pub fn body_size_required(&self) -> Option<u64> {
        match self {
            Fields::Prepare(_)
            | Fields::JournalEntry(_)
            | Fields::Request(_)
            | Fields::Reply(_)
            | Fields::HandshakeRefused(_) => None,
            Fields::PrepareOk(_)
            | Fields::StartViewChange(_)
            | Fields::RequestStartView(_)
            | Fields::RequestPrepare(_)
            | Fields::RangeEvicted(_)
            | Fields::RequestState(_)
            | Fields::Handshake(_) => Some(0),
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

    /// Most body bytes these fields allow, for a command whose body length only `size` gives but
    /// the format bounds: a handshake refusal's reason, at most [`HANDSHAKE_REASON_BYTES_MAX`].
    /// `None` where [`Fields::body_size_required`] fixes the length, or only the receiver's
    /// message limit bounds it.
    pub fn body_size_max(&self) -> Option<u64> {
        match self {
            Fields::HandshakeRefused(_) => Some(HANDSHAKE_REASON_BYTES_MAX as u64),
            Fields::Prepare(_)
            | Fields::JournalEntry(_)
            | Fields::PrepareOk(_)
            | Fields::Commit(_)
            | Fields::StartViewChange(_)
            | Fields::DoViewChange(_)
            | Fields::StartView(_)
            | Fields::RequestStartView(_)
            | Fields::RequestPrepare(_)
            | Fields::RangeEvicted(_)
            | Fields::RequestState(_)
            | Fields::StateChunk(_)
            | Fields::Handshake(_)
            | Fields::Request(_)
            | Fields::Reply(_) => None,
        }
    }
}
