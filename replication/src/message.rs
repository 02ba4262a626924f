//! The replica's vocabulary: the messages replicas exchange, the client requests and replies,
//! and the outputs a [`crate::Replica`] hands to whoever drives it (the node layer).
//!
//! This module owns plain data only. It never encodes bytes (the node layer maps these to the
//! one wire header of `engine::wire`) and never decides anything.

use bytes::{Bytes, BytesMut};
use shoal_engine::state::GroupState;
use shoal_proto::wire::{Header, Membership};

/// A message between two replicas of one group. `view` is always the sender's view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A prepare: the stored header (its own `view` is the view it was prepared in) and batch.
    /// Also the answer to [`Message::RequestPrepare`].
    Prepare {
        /// The sealed prepare header.
        header: Header,
        /// The record batch.
        body: Bytes,
    },
    /// A backup holds `op` (with header checksum `prepare_checksum`) and every op below it, as
    /// durable as the group's mode requires.
    PrepareOk {
        /// Sender's view.
        view: u32,
        /// The op acknowledged.
        op: u64,
        /// Sender's commit point.
        commit: u64,
        /// `checksum_header` of the acknowledged prepare.
        prepare_checksum: u32,
    },
    /// The primary's commit point; doubles as its heartbeat.
    Commit {
        /// Sender's view.
        view: u32,
        /// Highest committed op.
        commit: u64,
        /// `checksum_header` of the committed op (0 when `commit` is 0).
        commit_checksum: u32,
    },
    /// A vote to leave the sender's log view for `view`, cast on the sender's own timeout.
    StartViewChange {
        /// The view voted for.
        view: u32,
        /// The group's members in the view's epoch, as the voter knows them.
        membership: Membership,
    },
    /// The sender's log, offered to the new primary of `view`.
    DoViewChange {
        /// The view being started.
        view: u32,
        /// The view of the sender's last normal status.
        log_view: u32,
        /// The sender's head op.
        op: u64,
        /// The sender's commit point.
        commit: u64,
        /// Every op from this one on may have existed on the sender's disk and been lost
        /// (faulty): the sender never nacks them.
        faulty_from: Option<u64>,
        /// The sender has not restarted since its log view began for it, so it knows every
        /// header of that view's starting log.
        log_complete: bool,
        /// The head op of the log the sender's log view began with, when it knows it (kept
        /// durably with the log view): every op above it was prepared in that view or later.
        log_view_head_op: Option<u64>,
        /// Headers from the commit point (or the top `view_headers_max`) up to `op`, ascending.
        headers: Vec<Header>,
        /// Per header: [`FLAG_PRESENT`] when the body is held, [`FLAG_NACK`] when the sender
        /// provably never acknowledged it.
        flags: Vec<u8>,
    },
    /// The new primary's log for `view`: install it and rejoin.
    StartView {
        /// The view started.
        view: u32,
        /// The primary's head op.
        op: u64,
        /// The primary's commit point.
        commit: u64,
        /// Echo of a [`Message::RequestStartView`] nonce, 0 when unsolicited.
        nonce: u64,
        /// Headers from the commit point (or the top `view_headers_max`) up to `op`, ascending.
        headers: Vec<Header>,
        /// The group's members in the view's epoch.
        membership: Membership,
    },
    /// A restarted replica asks the primary of `view` (or a later one) for its log.
    RequestStartView {
        /// The asker's view.
        view: u32,
        /// Chosen at boot, echoed in the answer.
        nonce: u64,
    },
    /// Asks for the prepare at `op`; with a checksum, exactly that one; without, the committed
    /// op (only a replica that committed it answers).
    RequestPrepare {
        /// Sender's view.
        view: u32,
        /// The op wanted.
        op: u64,
        /// The wanted header checksum, when known.
        checksum: Option<u32>,
    },
    /// The answer to a [`Message::RequestPrepare`] for an op the sender no longer holds
    /// (retention removed it): the asker must look elsewhere, or take a state transfer.
    RangeEvicted {
        /// Sender's view.
        view: u32,
        /// The op that was asked for.
        op: u64,
        /// The oldest op the sender holds.
        op_min: u64,
    },
    /// A replica whose peers no longer hold the ops it lacks asks for (a piece of) the group's
    /// replicated state: `op` 0 begins a transfer, otherwise it names the state being assembled.
    RequestState {
        /// Sender's view.
        view: u32,
        /// The op of the state being assembled (0: the sender's newest).
        op: u64,
        /// The byte of that state wanted next.
        offset_bytes: u64,
    },
    /// A piece of the sender's replicated state as of `op`, the answer to a
    /// [`Message::RequestState`].
    StateChunk {
        /// Sender's view.
        view: u32,
        /// The last op the state includes.
        op: u64,
        /// The offset after that op's records.
        end_offset: u64,
        /// The whole state's size.
        size_bytes: u64,
        /// Where `chunk` starts within the state.
        offset_bytes: u64,
        /// `checksum_header` of the prepare of `op`.
        prepare_checksum: u32,
        /// CRC-32C of the whole state.
        state_checksum: u32,
        /// The piece.
        chunk: Bytes,
    },
}

/// Flag bit: the body of this header is held.
pub const FLAG_PRESENT: u8 = 1;
/// Flag bit: the sender provably never acknowledged this op.
pub const FLAG_NACK: u8 = 2;

impl Message {
    /// The sender's view carried by the message (a prepare carries its own view).
    pub fn view(&self) -> u32 {
        match self {
            Message::Prepare { header, .. } => header.view,
            Message::PrepareOk { view, .. }
            | Message::Commit { view, .. }
            | Message::StartViewChange { view, .. }
            | Message::DoViewChange { view, .. }
            | Message::StartView { view, .. }
            | Message::RequestStartView { view, .. }
            | Message::RequestPrepare { view, .. }
            | Message::RangeEvicted { view, .. }
            | Message::RequestState { view, .. }
            | Message::StateChunk { view, .. } => *view,
        }
    }

    /// A short name, for traces and counters.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Prepare { .. } => "prepare",
            Message::PrepareOk { .. } => "prepare_ok",
            Message::Commit { .. } => "commit",
            Message::StartViewChange { .. } => "start_view_change",
            Message::DoViewChange { .. } => "do_view_change",
            Message::StartView { .. } => "start_view",
            Message::RequestStartView { .. } => "request_start_view",
            Message::RequestPrepare { .. } => "request_prepare",
            Message::RangeEvicted { .. } => "range_evicted",
            Message::RequestState { .. } => "request_state",
            Message::StateChunk { .. } => "state_chunk",
        }
    }
}

/// A message with its addressing inside one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The sending replica's index.
    pub from: u8,
    /// The receiving replica's index.
    pub to: u8,
    /// The message.
    pub message: Message,
}

/// A client's write, as the node layer hands it to the primary.
#[derive(Debug)]
pub struct Request {
    /// The client id.
    pub client: u64,
    /// The client's session.
    pub session: u64,
    /// The client's request number.
    pub request: u64,
    /// The record batch, already validated by the caller; stamped in place with its base offset
    /// when the group stamps batches.
    pub body: BytesMut,
    /// The CRC-32C of `body` as given, which the caller computed or derived from a checksum it
    /// verified; the replica derives the prepare's body checksum from it instead of reading the
    /// batch again.
    pub body_checksum: u32,
    /// Records in the batch.
    pub record_count: u32,
    /// The batch's first record timestamp.
    pub first_timestamp_ms: i64,
    /// The batch's largest record timestamp.
    pub max_timestamp_ms: i64,
    /// The caller's wall clock when the request arrived (the replica reads no clock).
    pub append_time_ms: i64,
}

/// What happened to a client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyResult {
    /// Committed at this op; the batch starts at this offset.
    Committed {
        /// The op.
        op: u64,
        /// The batch's first offset.
        base_offset: u64,
    },
    /// This replica is not the primary; `primary` is in `view` as far as it knows.
    NotPrimary {
        /// The replica's view.
        view: u32,
        /// The primary of that view.
        primary: u8,
    },
    /// Never entered the log: safe to send anywhere.
    TransientNotAccepted,
    /// Entered the log, outcome unknown: replay the same request number in the same session.
    TransientNotCommitted,
    /// An idempotent batch whose sequence does not follow its producer's newest batch (a gap),
    /// nor repeats one of its last five: refused, never entered the log.
    OutOfOrderSequence,
    /// An idempotent batch with a non-zero sequence from a producer the group does not know
    /// (never seen, expired or evicted): refused, never entered the log. The producer starts
    /// again at sequence 0 (or a new epoch).
    UnknownProducer,
    /// An idempotent batch from an older epoch than its producer's newest: refused, never
    /// entered the log.
    ProducerFenced,
    /// A configuration change the group cannot make (`Replica::on_reconfigure_request`):
    /// refused, never entered the log.
    ReconfigurationRefused {
        /// Why.
        reason: &'static str,
    },
}

/// The answer to one client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The client id.
    pub client: u64,
    /// The client's request number.
    pub request: u64,
    /// The outcome.
    pub result: ReplyResult,
}

/// Something the driver must make durable, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Append this prepare; it continues the log's chain.
    Append {
        /// The prepare header.
        header: Header,
        /// The batch.
        body: Bytes,
    },
    /// Persist the replica's view and log view.
    Views {
        /// The view (the highest the replica has voted for or entered).
        view: u32,
        /// The view of the replica's last normal status.
        log_view: u32,
        /// The head op of the log `log_view` began with, when known.
        log_view_head_op: Option<u64>,
    },
    /// Remove every op above `op`, durably, before any later append; `view` is newer than every
    /// removed prepare's view and no newer than any prepare appended after.
    Truncate {
        /// The last op kept.
        op: u64,
        /// The truncation's fence view.
        view: u32,
    },
    /// Replace the whole log, durably, by one that begins with this prepare (a state transfer):
    /// `state` is the group's replicated state as of its op. Later appends continue from it.
    Install {
        /// The prepare of `state.op`, checked against the checksum its sender named.
        header: Header,
        /// Its batch.
        body: Bytes,
        /// The replicated state (the producer table's encoding) as of that op.
        state: GroupState,
    },
}

/// A completed write, fed back with [`crate::Replica::on_persisted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persisted {
    /// Every appended op up to this one is durable.
    Appended {
        /// The highest durable op.
        op: u64,
    },
    /// The views of a [`Write::Views`] are durable.
    Views {
        /// The durable view.
        view: u32,
        /// The durable log view.
        log_view: u32,
    },
    /// A [`Write::Truncate`] is durable.
    Truncated {
        /// The last op kept.
        op: u64,
    },
    /// A [`Write::Install`] is durable: the log begins at `op`.
    Installed {
        /// The installed log's first op.
        op: u64,
    },
}

/// What the state machine above the replica does next, in stream order: apply a committed op,
/// take a transferred state, or hand its own state to a peer's transfer. The order matters: a
/// `StateWanted` names the op this stream delivered last, so the machine's state at that point
/// of the stream is the state at that op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Committed {
    /// An op committed: apply it. Ops arrive in order, each once, except across a
    /// `Transferred` (which may skip ops) and an unclean recovery (which may repeat them).
    Op {
        /// The committed prepare's header.
        header: Header,
    },
    /// A state transfer installed a log that begins at `header`'s op: the machine's state
    /// becomes `state` (what a peer's machine handed its replica in `StateWanted`'s answer),
    /// as of that op. The next `Op` is the one after it.
    Transferred {
        /// The header of the transferred state's op.
        header: Header,
        /// The peer machine's state as of that op.
        state: Bytes,
    },
    /// A peer takes a state transfer from this replica, frozen at `op` (the op this stream
    /// delivered last). Only with `ReplicaConfig::transfers_carry_driver_state`: the driver
    /// answers with its machine's state through `Replica::on_driver_state` (or the node's), or
    /// refuses, before the peer is served.
    StateWanted {
        /// The frozen op.
        op: u64,
    },
}

impl Committed {
    /// The header of an op delivered (`Op` or `Transferred`).
    pub fn header(&self) -> Option<&Header> {
        match self {
            Committed::Op { header } | Committed::Transferred { header, .. } => Some(header),
            Committed::StateWanted { .. } => None,
        }
    }
}

/// A request to serve a peer a prepare from the log (the replica no longer holds its body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServePrepare {
    /// The peer.
    pub to: u8,
    /// The op.
    pub op: u64,
    /// The checksum the stored prepare must have, when the peer named one.
    pub checksum: Option<u32>,
}

/// Everything a replica produced since it was last drained. The driver handles it in this
/// order: send `messages` now; issue `writes` in order; send `persisted_messages` only once
/// every write issued so far (this batch's and every earlier one's) is durable; apply
/// `committed` in order; deliver `replies`; serve `reads` from the log.
#[derive(Debug, Default)]
pub struct Ready {
    /// Messages that reveal nothing not yet durable: send now.
    pub messages: Vec<Envelope>,
    /// Writes to make durable, in order.
    pub writes: Vec<Write>,
    /// Messages that may leave only after every write issued so far is durable.
    pub persisted_messages: Vec<Envelope>,
    /// Committed ops, in order.
    pub committed: Vec<Committed>,
    /// Client replies.
    pub replies: Vec<Reply>,
    /// Prepares to read from the log and send to a peer.
    pub reads: Vec<ServePrepare>,
}

impl Ready {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.writes.is_empty()
            && self.persisted_messages.is_empty()
            && self.committed.is_empty()
            && self.replies.is_empty()
            && self.reads.is_empty()
    }
}
