//! The per-command bodies of the header's field region (one struct per command) and their codec:
//! encoding a [`Fields`] value into its region and decoding it back. Decoding here trusts the
//! bytes: [`super::Header::decode`] has already checked the checksum, the command and the
//! reserved ranges before it calls in.

use super::layout::*;
use super::{Command, Fields};

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
    /// The group's membership when the op was prepared: every header says which configuration
    /// it belongs to, so a restart finds its group's members in its newest header. Empty in
    /// headers written before the field (version 1): the group's first membership.
    pub membership: Membership,
    /// Non-empty only in a configuration change: the membership the group runs from the next
    /// op on, in the next epoch (`docs/protocol.md`, "Learners and reconfiguration").
    pub reconfigure: Membership,
}

/// A group's members by their indices in the group: bit `i` set names member `i`. The two sets
/// are disjoint in a valid membership, and the replica checks that before using one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Membership {
    /// Members that vote, lead views and count in quorums.
    pub voters: u32,
    /// Members that take the log like backups but never vote or count.
    pub learners: u32,
}

impl Membership {
    /// Members `0..voters` vote and `voters..members` learn.
    ///
    /// # Panics
    /// If `voters > members` or `members > 32`.
    pub fn first(voters: u8, members: u8) -> Membership {
        assert!(voters <= members && members <= 32, "{voters} voters of {members} members");
        let below = |n: u8| if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
        Membership { voters: below(voters), learners: below(members) & !below(voters) }
    }

    /// Whether no member is named (a header without a membership, or no change).
    pub fn is_empty(&self) -> bool {
        self.voters == 0 && self.learners == 0
    }

    /// Every member, voters and learners.
    pub fn members(&self) -> u32 {
        self.voters | self.learners
    }

    /// How many members vote.
    pub fn voter_count(&self) -> u32 {
        self.voters.count_ones()
    }

    /// Whether member `index` votes.
    pub fn is_voter(&self, index: u8) -> bool {
        index < 32 && self.voters & (1 << index) != 0
    }

    /// Whether `index` is a member, voter or learner.
    pub fn is_member(&self, index: u8) -> bool {
        index < 32 && self.members() & (1 << index) != 0
    }

    /// The voters' indices, ascending.
    pub fn voter_indices(&self) -> impl Iterator<Item = u8> + use<> {
        let voters = self.voters;
        (0..32u8).filter(move |&i| voters & (1 << i) != 0)
    }

    /// The learners' indices, ascending.
    pub fn learner_indices(&self) -> impl Iterator<Item = u8> + use<> {
        let learners = self.learners;
        (0..32u8).filter(move |&i| learners & (1 << i) != 0)
    }

    /// The members' indices, ascending.
    pub fn member_indices(&self) -> impl Iterator<Item = u8> + use<> {
        let members = self.members();
        (0..32u8).filter(move |&i| members & (1 << i) != 0)
    }

    /// Both sets in one word, voters in the low half: how storage keeps a group's members.
    pub fn to_word(&self) -> u64 {
        u64::from(self.voters) | u64::from(self.learners) << 32
    }

    /// The sets [`Membership::to_word`] packed.
    pub fn from_word(word: u64) -> Membership {
        Membership { voters: word as u32, learners: (word >> 32) as u32 }
    }
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
    /// The group's members in the epoch of the header's view, as the voter knows them: a
    /// restarted replica that lost them learns them here.
    pub membership: Membership,
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
    /// The group's membership in the epoch of the header's view: a replica still in an older
    /// epoch learns the new members from it.
    pub membership: Membership,
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

/// The per-command fields of a replica bus handshake, the first frame each side of a connection
/// sends. The header's `cluster` is the sender's cluster id, `replica` its node index and `view`
/// 0; the acceptor checks every value against its own (see `docs/protocol.md`, "Replica bus").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Handshake {
    /// The shard index the connection serves, the same on both ends.
    pub shard: u32,
    /// The sender's shard count.
    pub shard_count: u32,
    /// The number of nodes in the sender's cluster configuration.
    pub node_count: u8,
    /// [`HANDSHAKE_FLAG_FORMED`](super::HANDSHAKE_FLAG_FORMED) and nothing else (others are
    /// refused).
    pub flags: u8,
    /// Chosen at random at each process start, so a peer can tell a restart from a reconnect.
    pub incarnation: u64,
}

/// The per-command fields of a refused handshake: the refuser's own identity (the header's
/// `cluster` and `replica` are its cluster id and node index), so the dialer can name both values
/// of the mismatch itself. The body is the reason as UTF-8 text, at most
/// [`HANDSHAKE_REASON_BYTES_MAX`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HandshakeRefused {
    /// The refuser's shard index.
    pub shard: u32,
    /// The refuser's shard count.
    pub shard_count: u32,
    /// The number of nodes in the refuser's cluster configuration.
    pub node_count: u8,
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

pub(super) fn encode_fields(bytes: &mut [u8; HEADER_SIZE], fields: &Fields) {
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
            put_u32(bytes, OFF_START_VIEW_CHANGE_VOTERS, start_view_change.membership.voters);
            put_u32(bytes, OFF_START_VIEW_CHANGE_LEARNERS, start_view_change.membership.learners);
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
            put_u32(bytes, OFF_START_VIEW_VOTERS, start_view.membership.voters);
            put_u32(bytes, OFF_START_VIEW_LEARNERS, start_view.membership.learners);
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
        Fields::Handshake(handshake) => {
            put_u32(bytes, OFF_HANDSHAKE_SHARD, handshake.shard);
            put_u32(bytes, OFF_HANDSHAKE_SHARD_COUNT, handshake.shard_count);
            bytes[OFF_HANDSHAKE_NODE_COUNT] = handshake.node_count;
            bytes[OFF_HANDSHAKE_FLAGS] = handshake.flags;
            put_u64(bytes, OFF_HANDSHAKE_INCARNATION, handshake.incarnation);
        }
        Fields::HandshakeRefused(refused) => {
            put_u32(bytes, OFF_HANDSHAKE_REFUSED_SHARD, refused.shard);
            put_u32(bytes, OFF_HANDSHAKE_REFUSED_SHARD_COUNT, refused.shard_count);
            bytes[OFF_HANDSHAKE_REFUSED_NODE_COUNT] = refused.node_count;
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
pub(super) fn decode_fields(bytes: &[u8; HEADER_SIZE], command: Command) -> Option<Fields> {
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
            membership: Membership {
                voters: get_u32(bytes, OFF_START_VIEW_CHANGE_VOTERS),
                learners: get_u32(bytes, OFF_START_VIEW_CHANGE_LEARNERS),
            },
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
            membership: Membership {
                voters: get_u32(bytes, OFF_START_VIEW_VOTERS),
                learners: get_u32(bytes, OFF_START_VIEW_LEARNERS),
            },
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
        Command::Handshake => Fields::Handshake(Handshake {
            shard: get_u32(bytes, OFF_HANDSHAKE_SHARD),
            shard_count: get_u32(bytes, OFF_HANDSHAKE_SHARD_COUNT),
            node_count: bytes[OFF_HANDSHAKE_NODE_COUNT],
            flags: bytes[OFF_HANDSHAKE_FLAGS],
            incarnation: get_u64(bytes, OFF_HANDSHAKE_INCARNATION),
        }),
        Command::HandshakeRefused => Fields::HandshakeRefused(HandshakeRefused {
            shard: get_u32(bytes, OFF_HANDSHAKE_REFUSED_SHARD),
            shard_count: get_u32(bytes, OFF_HANDSHAKE_REFUSED_SHARD_COUNT),
            node_count: bytes[OFF_HANDSHAKE_REFUSED_NODE_COUNT],
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

pub(super) fn encode_prepare(bytes: &mut [u8; HEADER_SIZE], prepare: &Prepare) {
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
    put_u32(bytes, OFF_PREPARE_VOTERS, prepare.membership.voters);
    put_u32(bytes, OFF_PREPARE_LEARNERS, prepare.membership.learners);
    put_u32(bytes, OFF_PREPARE_NEXT_VOTERS, prepare.reconfigure.voters);
    put_u32(bytes, OFF_PREPARE_NEXT_LEARNERS, prepare.reconfigure.learners);
}

pub(super) fn decode_prepare(bytes: &[u8; HEADER_SIZE]) -> Prepare {
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
        membership: Membership {
            voters: get_u32(bytes, OFF_PREPARE_VOTERS),
            learners: get_u32(bytes, OFF_PREPARE_LEARNERS),
        },
        reconfigure: Membership {
            voters: get_u32(bytes, OFF_PREPARE_NEXT_VOTERS),
            learners: get_u32(bytes, OFF_PREPARE_NEXT_LEARNERS),
        },
    }
}
