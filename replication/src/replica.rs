//! One replica of one VSR group: the sans-IO state machine of normal operation, view change,
//! restart and repair ("Viewstamped Replication Revisited", Liskov & Cowling 2012, with the
//! deviations of DESIGN.md §4).
//!
//! It owns the group's protocol state (status, view, log view, the headers of its recent log,
//! the primary's pipeline, votes, the new primary's merge) and never performs I/O, reads a clock
//! or draws unseeded randomness: inputs arrive through `on_*` methods, time as ticks, and
//! everything it wants done leaves through [`Ready`], drained by [`Replica::take_ready`].
//!
//! # Call protocol
//!
//! The driver calls [`Replica::on_message`], [`Replica::on_tick`],
//! [`Replica::on_client_request`] and [`Replica::on_persisted`] in any order, then drains
//! [`Replica::take_ready`] and handles it in the order [`Ready`] documents: messages now, writes
//! in order, `persisted_messages` only once every write issued so far is durable.
//!
//! # Send only after persist
//!
//! A message that reveals state (a view, a log view, an acknowledged op) may leave only once
//! that state is durable. [`Replica::send`] is the one place that decides: it queues a message
//! in `Ready::messages` when everything it reveals is durable, and in
//! `Ready::persisted_messages` otherwise. Nothing else pushes to either list.

use std::collections::BTreeMap;

use bytes::Bytes;
use shoal_engine::rng::Rng;
use shoal_engine::state::{GroupState, STATE_SIZE_BYTES_MAX};
use shoal_proto::wire::{HEADER_SIZE, Header, Membership, Prepare};

use crate::config::{EPOCH_MAX, ReplicaConfig, epoch_of, first_view_of};
use crate::lag::{GroupStatus, LagTracker};
use crate::message::{
    Committed, Envelope, FLAG_NACK, FLAG_PRESENT, Message, Persisted, Ready, Reply, ReplyResult,
    Request, ServePrepare, Write,
};
use crate::producers::{self, Check, ProducerBatch, ProducerTable};
use crate::transfer::{self, Accepted, Chunk};

/// Stops on a protocol state that must be impossible, naming where it happened.
macro_rules! fatal {
    ($replica:expr, $($arg:tt)+) => {
        panic!(
            "replica {} group {} view {} op {}: {}",
            $replica.config.replica,
            $replica.config.group,
            $replica.view,
            $replica.op,
            format_args!($($arg)+)
        )
    };
}

/// Where the replica stands in the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Serving `view`: the primary prepares, backups acknowledge.
    Normal,
    /// Voting for, or assembling, `view`.
    ViewChange,
    /// Restarted: out of every quorum until a StartView (or, after unanswered probes, its own
    /// view change) brings it back.
    Recovering,
    /// No longer a member: a configuration change it committed (or a newer epoch's StartView)
    /// left it out. It takes no part in the group again; its driver removes it.
    Removed,
}

/// What a restarted replica found in its storage.
#[derive(Clone, Debug, Default)]
pub struct RecoveredLog {
    /// The persisted view.
    pub view: u32,
    /// The persisted log view.
    pub log_view: u32,
    /// The newest headers of the log, ascending and contiguous, ending at the head (at most
    /// `view_headers_max`; empty for an empty log).
    pub headers: Vec<Header>,
    /// Every op from this one on may have existed and been lost (DESIGN.md §3, faulty).
    pub faulty_from: Option<u64>,
    /// Every op up to this one is committed and applied (0: unknown): the op of the state a
    /// transfer installed, where the log begins.
    pub commit_min: u64,
    /// The persisted head op of the log `log_view` began with, when known.
    pub log_view_head_op: Option<u64>,
}

/// Counters of the branches a replica took, for coverage and status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaCounters {
    /// View changes this replica voted for on its own timeout.
    pub votes_cast: u64,
    /// Votes withdrawn on a fresh heartbeat.
    pub votes_withdrawn: u64,
    /// Views this replica started as the new primary.
    pub views_started: u64,
    /// StartView messages installed.
    pub start_views_installed: u64,
    /// Ops dropped by a nack quorum while merging.
    pub ops_nacked: u64,
    /// Bodies the new primary fetched before StartView.
    pub bodies_fetched_for_view: u64,
    /// Merges that waited because an op could be neither proven dead nor found.
    pub merges_stalled: u64,
    /// Older-view ops a merge took from a replica of a lower log view, where no canonical
    /// replica could refute them (`Replica::older_form`).
    pub older_ops_found: u64,
    /// Prepares retransmitted.
    pub retransmissions: u64,
    /// Repair requests sent.
    pub repairs_requested: u64,
    /// Repair rounds started (each asks one peer for up to `repair_prepares_max` ops).
    pub repair_rounds: u64,
    /// Repair rounds that ended without progress, so the next asked another peer.
    pub repair_rounds_unanswered: u64,
    /// Repair rounds given another interval at their deadline because answers were arriving.
    pub repair_rounds_extended: u64,
    /// Answers that a peer no longer holds an op asked for.
    pub ranges_evicted: u64,
    /// Truncations issued.
    pub truncations: u64,
    /// Ops committed.
    pub commits: u64,
    /// Recovering replicas that fell back to a view change.
    pub recovery_view_changes: u64,
    /// View changes a primary started because a member was bound to a later view.
    pub views_yielded: u64,
    /// Ops possibly lost to `unclean_recovery`.
    pub unclean_ops_lost: u64,
    /// Prepares dropped while recovering.
    pub prepares_dropped_recovering: u64,
    /// Headers from a peer that did not continue the appended chain (dropped).
    pub chain_mismatches: u64,
    /// Prepares of an older view above the log view's start, dropped as a dead branch.
    pub stale_prepares_dropped: u64,
    /// Backups the primary flagged lagging (in sync or dead before).
    pub backups_lagging: u64,
    /// Backups the primary flagged dead.
    pub backups_dead: u64,
    /// Lagging or dead backups back in sync.
    pub backups_back_in_sync: u64,
    /// Retried batches answered with the original op's offsets, without entering the log.
    pub duplicates: u64,
    /// Idempotent batches refused (out of order, unknown producer, fenced epoch).
    pub sequence_refusals: u64,
    /// State transfers begun (a first `RequestState` to some peer).
    pub transfers_started: u64,
    /// State transfer requests that went unanswered, so the next asked another peer.
    pub transfer_rounds_unanswered: u64,
    /// Peer states refused (contradicting pieces, failed checksum, no use, undecodable).
    pub transfer_states_rejected: u64,
    /// State transfers handed to storage as `Write::Install`.
    pub transfers_installed: u64,
    /// States frozen for a peer's transfer that were not served: the driver refused its part,
    /// or the whole was over the state bound.
    pub driver_states_refused: u64,
    /// State pieces this replica served to peers.
    pub state_chunks_served: u64,
    /// Hand-overs this primary began ([`Replica::hand_over`]): it stopped taking requests and
    /// waited for its target to catch up.
    pub hand_overs_begun: u64,
    /// Hand-overs in which this primary, its target caught up, left its view for the target's.
    pub hand_overs_done: u64,
    /// Hand-overs given up: the target did not acknowledge the head within
    /// `hand_over_ticks_max`, or the primary lost its view first.
    pub hand_overs_abandoned: u64,
    /// View changes this replica joined at once because the primary of its view voted for one
    /// (that primary left the view: a hand-over, or a primary that heard from no quorum).
    pub abdications_joined: u64,
    /// PrepareOks this primary took from learners: their progress, never a quorum's.
    pub learner_acks: u64,
    /// Configuration changes this primary prepared (`Replica::on_reconfigure_request`).
    pub reconfigurations_prepared: u64,
    /// Configuration epochs entered by committing the change that opens them.
    pub epochs_entered: u64,
    /// Configuration epochs entered by installing a StartView of a newer epoch.
    pub epochs_installed: u64,
    /// Messages of an older epoch answered with this epoch's StartView.
    pub older_epochs_answered: u64,
    /// Messages of a newer epoch this replica could not take, answered with a probe.
    pub newer_epochs_probed: u64,
    /// Requests refused because the log's head is a configuration change not yet committed.
    pub requests_refused_epoch_closing: u64,
}

/// Why [`Replica::hand_over`] (or the node's) did not begin a hand-over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandOverRefused {
    /// The group is not on this node, or the engine stopped it (from the node layer only).
    GroupUnavailable {
        /// The group.
        group: u64,
    },
    /// This replica is not the serving primary of its view: only the primary hands over.
    NotPrimary,
    /// The target is this replica, a learner, or not a member of the group.
    NotAPeer {
        /// The target asked for.
        to: u8,
    },
    /// A hand-over is already under way.
    InProgress {
        /// Its target.
        to: u8,
    },
}

impl std::fmt::Display for HandOverRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandOverRefused::GroupUnavailable { group } => {
                write!(f, "group {group} is not on this node or has stopped")
            }
            HandOverRefused::NotPrimary => write!(f, "only the serving primary hands over"),
            HandOverRefused::NotAPeer { to } => write!(f, "replica {to} is not a peer"),
            HandOverRefused::InProgress { to } => write!(f, "already handing over to {to}"),
        }
    }
}

impl std::error::Error for HandOverRefused {}

/// One log entry the replica keeps in memory: a header, and its body while it is needed.
#[derive(Clone, Debug)]
struct Entry {
    header: Header,
    /// Held while the op is above the commit point (or waits to be appended).
    body: Option<Bytes>,
    /// The batch's idempotence fields, read from the body when it arrived (or handed over by
    /// the driver at restart), kept after the body is dropped: the uncommitted pipeline's
    /// producers are checked against these, and commit applies them to the producer table.
    producer: Option<ProducerBatch>,
}

impl Entry {
    fn with_body(header: Header, body: Bytes) -> Entry {
        let producer = ProducerBatch::from_body(&body);
        Entry { header, body: Some(body), producer }
    }

    fn header_only(header: Header) -> Entry {
        Entry { header, body: None, producer: None }
    }
}

/// Retried requests that may wait for one in-flight op (a duplicate of a batch still in the
/// pipeline gets the original op's reply when it commits); beyond, a duplicate is answered
/// `TransientNotAccepted` and retried by its client.
const DUPLICATES_WAITING_MAX: usize = 4;

/// Doublings of a repair round's deadline at most after rounds in a row that brought nothing.
const REPAIR_BACKOFF_MAX: u32 = 3;

/// A repair round's deadline is at most this many repair intervals before its backoff (see
/// `Replica::repair_deadline_ticks`).
const REPAIR_DEADLINE_INTERVALS_MAX: u64 = 8;

/// A prepare of the primary's pipeline, waiting for its quorum.
#[derive(Clone, Debug)]
struct InFlight {
    /// Replicas (bit per index) that acknowledged it, the primary excluded.
    acks: u32,
    next_retry_tick: u64,
    retry_ticks: u64,
    /// The client request it answers, when prepared in this view: (client, request).
    request: Option<(u64, u64)>,
    /// Retries of the same batch that arrived while it was in flight (at most
    /// [`DUPLICATES_WAITING_MAX`]): they get the same reply.
    duplicates: Vec<(u64, u64)>,
}

/// A DoViewChange received (or built) by the new primary.
#[derive(Clone, Debug)]
struct DoViewChange {
    log_view: u32,
    op: u64,
    commit: u64,
    faulty_from: Option<u64>,
    log_complete: bool,
    log_view_head_op: Option<u64>,
    headers: BTreeMap<u64, (Header, u8)>,
}

impl DoViewChange {
    /// Whether the sender may have acknowledged an op at `op` that it no longer holds. Above
    /// the head of a complete log there is none: its sender has been normal in its log view
    /// since its last restart, and acknowledges only what it appended there, which its headers
    /// show; an op of an older view above that head is one its log view's start already
    /// judged uncommitted. So a faulty suffix that a damage cut (or a torn tail) began, then
    /// a StartView covered, makes its sender faulty only up to its head: it can nack what lies
    /// beyond, and a second replica's faulty suffix does not stall the merge (seed 505).
    fn faulty(&self, op: u64) -> bool {
        self.faulty_from.is_some_and(|from| op >= from) && !(self.log_complete && op > self.op)
    }

    /// Whether the sender provably never acknowledged `header` at `op` (DESIGN.md §4): it was
    /// never normal in a view that could have acknowledged it (its log view is below the view
    /// the op was prepared in), or — outside its faulty suffix — it lacks the op, holds another
    /// prepare there, or holds the header without the body.
    fn nacks(&self, op: u64, header: Option<&Header>) -> bool {
        if header.is_some_and(|h| self.log_view < h.view) {
            return true;
        }
        if self.faulty(op) {
            return false;
        }
        if op > self.op {
            return true;
        }
        match (self.headers.get(&op), header) {
            (Some((_, flags)), _) if flags & FLAG_NACK != 0 => true,
            (Some((own, _)), Some(canonical)) => own.checksum_header != canonical.checksum_header,
            // Below its header window: it holds the op, cannot tell which.
            _ => false,
        }
    }
}

/// A backup's repair round in flight: the ops it asked one peer for.
#[derive(Clone, Copy, Debug)]
struct RepairRound {
    to: u8,
    /// The highest op asked for: the round is over once the log is appended up to it.
    op_high: u64,
    /// The appended head when the round was sent, or last made progress: no progress past it
    /// by the deadline means the next round asks another peer.
    op_appended_at_send: u64,
    /// When it was sent, to measure how long a round takes.
    sent_tick: u64,
    deadline_tick: u64,
}

/// A backup's state transfer: the peer's state assembled so far and the request in flight.
#[derive(Clone, Debug)]
struct TransferRound {
    incoming: transfer::Incoming,
    /// The request in flight is unanswered until then; past it the next asks another peer.
    deadline_tick: u64,
    /// The request in flight was answered: the next goes out at the next grant.
    answered: bool,
    /// The state and its prepare went to storage as `Write::Install`; waiting for it to be
    /// durable.
    installing: bool,
    /// The assembled state's producer table and driver's part, split and decoded once the
    /// state was whole.
    table: Option<(ProducerTable, Bytes)>,
}

/// A state frozen for peers' transfers, waiting for the driver's part
/// (`Committed::StateWanted`).
#[derive(Clone, Debug)]
struct PendingSource {
    op: u64,
    end_offset: u64,
    prepare_checksum: u32,
    producers: Vec<u8>,
    /// Peers that asked meanwhile: each gets the first piece once the state is whole.
    askers: Vec<u8>,
}

/// The peers that acknowledged the primary's head op with its commit point, while the group's
/// `(view, op, commit)` is the one recorded: once every peer has, the group is settled and its
/// heartbeat slows to `idle_heartbeat_interval_ticks`. Any new op or commit starts it afresh.
#[derive(Clone, Copy, Debug, Default)]
struct Settled {
    /// The group's `(view, op, commit)` the bits are for.
    at: (u32, u64, u64),
    /// One bit per peer index.
    peers: u32,
}

/// A hand-over under way (see [`Replica::hand_over`]): the primary takes no new request until
/// its target has acknowledged the head and everything is committed, then votes for `view`.
#[derive(Clone, Copy, Debug)]
struct HandOver {
    to: u8,
    /// The first view after the current one whose primary is `to`.
    view: u32,
    /// The highest op the target acknowledged since the hand-over began.
    acknowledged: Option<u64>,
    deadline_tick: u64,
}

/// The new primary's work between a DoViewChange quorum and StartView.
#[derive(Clone, Debug)]
struct Merge {
    /// The head op of the merged log.
    op: u64,
    next_fetch_tick: u64,
}

/// One replica of one group. See the module documentation for the call protocol.
pub struct Replica {
    config: ReplicaConfig,
    rng: Rng,
    tick: u64,
    status: Status,
    view: u32,
    log_view: u32,
    /// The highest view ever handed to the driver to persist (a withdrawn vote leaves `view`
    /// below it; what is persisted never goes back).
    view_promised: u32,
    view_durable: u32,
    log_view_durable: u32,
    /// Highest op whose header is in the log (the head).
    op: u64,
    /// Highest op handed to the driver to append: every op up to it has its body in storage.
    op_appended: u64,
    /// Highest op storage reported durable.
    op_durable: u64,
    /// Highest op applied (committed locally, in order).
    commit: u64,
    /// Highest op known committed in the group.
    commit_max: u64,
    faulty_from: Option<u64>,
    /// The head of the last StartView installed: once every body up to it is appended, the
    /// faulty suffix is gone (everything acknowledged before a restart is at or below it, or
    /// was proven dead by the view change that produced it).
    faulty_clear_op: Option<u64>,
    log: BTreeMap<u64, Entry>,
    /// Committed ops a repair brought ahead of their predecessors (at most
    /// `repair_prepares_max`), waiting for the chain to reach them.
    repaired: BTreeMap<u64, (Header, Bytes)>,
    // Primary.
    pipeline: BTreeMap<u64, InFlight>,
    last_heard_tick: Vec<u64>,
    lag: LagTracker,
    next_commit_tick: u64,
    settled: Settled,
    hand_over: Option<HandOver>,
    // Backup.
    heartbeat_deadline_tick: u64,
    repair_round: Option<RepairRound>,
    /// The peer the next repair round asks: the primary first, the next peer after a round
    /// that brought nothing or an answer that the range is gone.
    repair_target: u8,
    /// Rounds in a row that brought nothing (at most `REPAIR_BACKOFF_MAX`): each doubles the
    /// next round's interval, so peers that are slow to answer (a busy disk) are not asked
    /// again and again for what they are still reading.
    repair_backoff: u32,
    /// How long the recent repair rounds took from request to their last op, smoothed; a
    /// round's deadline is at least twice it, so peers that take longer than the repair
    /// interval to answer (a large round read from a busy disk) are not asked twice.
    repair_round_ticks: u64,
    /// When the ops the next round asks for were first asked for, if a round that brought
    /// nothing asked for them already.
    repair_asked_tick: Option<u64>,
    /// The size of the newest prepare appended: a repair round counts each op whose header it
    /// does not know yet as this big against `repair_bytes_max`.
    recent_prepare_size_bytes: u64,
    /// Set by a driver that rations repair across its groups: a round then starts only inside
    /// [`Replica::grant_repair`].
    repair_rationed: bool,
    repair_granted: bool,
    /// The bytes the round the last grant started asks for (see [`Replica::grant_repair`]).
    repair_granted_bytes: u64,
    /// A round is due but waits for the driver's grant.
    repair_wanted: bool,
    /// Per peer, the oldest op it said it still holds (0: never said).
    peer_op_min: Vec<u64>,
    /// The head op of the log this replica's log view began with (the StartView's, or the
    /// merged log's on the primary that started it), persisted with the log view; `None` when
    /// unknown (a superblock written before it was kept). Every op above it was prepared in
    /// the log view, so a prepare of an older view there is a dead branch however high the
    /// commit point is, and a view change can prove it dead (see `try_merge`).
    log_view_head_op: Option<u64>,
    /// The state transfer this backup is taking, once every peer evicted what it lacks.
    transfer: Option<TransferRound>,
    /// This replica's state as served to peers taking a transfer, frozen at the first request
    /// so that every piece belongs to one op.
    transfer_source: Option<transfer::Outgoing>,
    /// A state frozen for a peer's transfer whose driver part has not come yet.
    transfer_source_pending: Option<PendingSource>,
    next_request_start_view_tick: u64,
    // Configuration epochs.
    /// The op of the configuration change that opened this replica's epoch, while known: the
    /// head of the log every view of the epoch extends, which any member may hand a replica
    /// still in an older epoch (`answer_older_epoch`).
    epoch_start_op: Option<u64>,
    /// A configuration change committed by this replica, entered once the input that committed
    /// it has been handled (`finish_epoch_change`).
    epoch_change: Option<(u64, Membership)>,
    /// Whether the members of this replica's epoch are known: a restart whose log names no
    /// membership for its epoch learns it from a StartView, and votes in nothing until then.
    members_known: bool,
    /// Per peer, the tick before which an older-epoch message from it goes unanswered.
    older_epoch_answer_tick: Vec<u64>,
    // View change.
    votes: BTreeMap<u8, (u32, u64)>,
    do_view_change_sent: bool,
    /// No DoViewChange this replica sent (this incarnation, or before its restart: its durable
    /// view then) names a view above this one, so it may still serve in any view from here up:
    /// a mere vote binds nothing, a DoViewChange binds its log to its view.
    view_floor: u32,
    do_view_changes: BTreeMap<u8, DoViewChange>,
    view_change_deadline_tick: u64,
    next_vote_tick: u64,
    merge: Option<Merge>,
    // Recovering.
    /// Set by a restart; cleared only by a StartView (or by starting a view as primary): until
    /// then a vote cannot be withdrawn into a normal status.
    needs_start_view: bool,
    boot_nonce: u64,
    probes_sent: u32,
    next_probe_tick: u64,
    /// The committed producer table: every committed idempotent batch applied, in op order.
    producers: ProducerTable,
    ready: Ready,
    counters: ReplicaCounters,
}

impl Replica {
    /// A replica of a group created just now: normal in view 0 with an empty log.
    ///
    /// # Panics
    /// On an invalid config (a caller bug: configs are validated where they are read).
    pub fn new(config: ReplicaConfig, seed: u64) -> Replica {
        let mut replica = Replica::blank(config, seed);
        replica.enter_normal_as_is();
        replica
    }

    /// A replica restarted on a recovered log: `Recovering` until a StartView from the primary
    /// of its view (or a later one) brings it back, probing every interval; after
    /// `start_view_probes_max` unanswered probes it starts a view change itself.
    ///
    /// # Panics
    /// On an invalid config, or headers that are not a contiguous ascending chain.
    pub fn recover(config: ReplicaConfig, recovered: RecoveredLog, seed: u64) -> Replica {
        let mut replica = Replica::blank(config, seed);
        replica.view = recovered.view.max(recovered.log_view);
        replica.log_view = recovered.log_view;
        replica.view_promised = replica.view;
        replica.view_floor = replica.view;
        replica.view_durable = replica.view;
        replica.log_view_durable = recovered.log_view;
        for pair in recovered.headers.windows(2) {
            let (a, b) = (prepare(&pair[0]), prepare(&pair[1]));
            assert!(b.op == a.op + 1 && b.parent == pair[0].checksum_header, "recovered chain");
        }
        let mut commit = 0;
        for header in &recovered.headers {
            let fields = prepare(header);
            commit = commit.max(fields.commit.min(fields.op));
            replica.log.insert(fields.op, Entry::header_only(*header));
        }
        let head = recovered.headers.last().map_or(0, |h| prepare(h).op);
        replica.op = head;
        replica.op_appended = head;
        replica.op_durable = head;
        let commit = commit.max(recovered.commit_min.min(head));
        replica.commit = commit;
        replica.commit_max = commit;
        replica.faulty_from = recovered.faulty_from;
        replica.status = Status::Recovering;
        replica.needs_start_view = true;
        replica.log_view_head_op = recovered.log_view_head_op;
        replica.boot_nonce = replica.rng.next_u64() | 1;
        replica.recover_members(&recovered.headers);
        if replica.members_known && !replica.config.members.is_member(replica.config.replica) {
            replica.status = Status::Removed;
        }
        replica
    }

    /// Finds the members of the restarted replica's epoch in its newest headers: a prepare of
    /// the epoch names them, and so does the change that opened it. Epoch 0's are the
    /// configured ones; an epoch found nowhere (a log cut short by damage or a transfer) is
    /// learned from the next StartView.
    fn recover_members(&mut self, headers: &[Header]) {
        let epoch = self.epoch();
        let mut found = None;
        for header in headers.iter().rev() {
            let fields = prepare(header);
            let prepared_in = epoch_of(header.view);
            if prepared_in == epoch && !fields.membership.is_empty() {
                found = found.or(Some(fields.membership));
            }
            if prepared_in + 1 == epoch && !fields.reconfigure.is_empty() {
                found = found.or(Some(fields.reconfigure));
                self.epoch_start_op = Some(fields.op);
                break;
            }
            if prepared_in < epoch && found.is_some() {
                break;
            }
        }
        match found {
            Some(members) => self.config.members = members,
            None if epoch > 0 => {
                // Neither the change that opened this epoch nor anything after it survived:
                // the log lacks a committed change the new voters may never have held, so
                // nothing above its head may be nacked (it is faulty) until repair brings it.
                self.members_known = false;
                let from = self.op + 1;
                self.faulty_from = Some(self.faulty_from.map_or(from, |f| f.min(from)));
            }
            None => {}
        }
    }

    fn blank(config: ReplicaConfig, seed: u64) -> Replica {
        if let Err(reason) = config.validate() {
            panic!("invalid replica config: {reason}");
        }
        Replica {
            config,
            rng: Rng::new(seed ^ (u64::from(config.replica) << 56) ^ config.group),
            tick: 0,
            status: Status::Recovering,
            view: 0,
            log_view: 0,
            view_promised: 0,
            view_durable: 0,
            log_view_durable: 0,
            op: 0,
            op_appended: 0,
            op_durable: 0,
            commit: 0,
            commit_max: 0,
            faulty_from: None,
            faulty_clear_op: None,
            log: BTreeMap::new(),
            repaired: BTreeMap::new(),
            pipeline: BTreeMap::new(),
            last_heard_tick: vec![0; usize::from(config.replica_count)],
            lag: LagTracker::new(&config),
            next_commit_tick: 0,
            settled: Settled::default(),
            hand_over: None,
            heartbeat_deadline_tick: 0,
            repair_round: None,
            repair_target: config.primary_of(0),
            repair_backoff: 0,
            repair_round_ticks: 0,
            repair_asked_tick: None,
            repair_granted_bytes: 0,
            recent_prepare_size_bytes: 0,
            repair_rationed: false,
            repair_granted: false,
            repair_wanted: false,
            peer_op_min: vec![0; usize::from(config.replica_count)],
            log_view_head_op: Some(0),
            transfer: None,
            transfer_source: None,
            transfer_source_pending: None,
            next_request_start_view_tick: 0,
            epoch_start_op: None,
            epoch_change: None,
            members_known: true,
            older_epoch_answer_tick: vec![0; usize::from(config.replica_count)],
            votes: BTreeMap::new(),
            do_view_change_sent: false,
            view_floor: 0,
            do_view_changes: BTreeMap::new(),
            view_change_deadline_tick: 0,
            next_vote_tick: 0,
            merge: None,
            needs_start_view: false,
            boot_nonce: 0,
            probes_sent: 0,
            next_probe_tick: 0,
            producers: ProducerTable::new(config.producer_limits()),
            ready: Ready::default(),
            counters: ReplicaCounters::default(),
        }
    }

    // --- Observers -------------------------------------------------------------------------

    /// The head op this replica's log view began with, when known: the primary of that view
    /// holds every op an earlier primary may have acknowledged at or below it.
    pub fn log_view_head_op(&self) -> Option<u64> {
        self.log_view_head_op
    }

    /// The settings.
    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }
    /// The protocol status.
    pub fn status(&self) -> Status {
        self.status
    }
    /// The current view.
    pub fn view(&self) -> u32 {
        self.view
    }
    /// The configuration epoch this replica is in: its view's.
    pub fn epoch(&self) -> u32 {
        epoch_of(self.view)
    }
    /// The view of the last normal status.
    pub fn log_view(&self) -> u32 {
        self.log_view
    }
    /// The head op.
    pub fn op(&self) -> u64 {
        self.op
    }
    /// The highest op applied.
    pub fn commit(&self) -> u64 {
        self.commit
    }
    /// The highest op whose body (and every body below it) is in storage.
    pub fn op_appended(&self) -> u64 {
        self.op_appended
    }
    /// Whether storage reporting the log durable through `op` would change anything: it holds
    /// appended ops above what is known durable, up to `op`.
    pub fn durable_news(&self, op: u64) -> bool {
        op.min(self.op_appended) > self.op_durable
    }
    /// The view and log view storage reported durable.
    pub fn durable_views(&self) -> (u32, u32) {
        (self.view_durable, self.log_view_durable)
    }
    /// The first op of the faulty suffix a restart left, until repair clears it.
    pub fn faulty_from(&self) -> Option<u64> {
        self.faulty_from
    }
    /// Whether a repair round is due and waits for [`Replica::grant_repair`].
    pub fn repair_wanted(&self) -> bool {
        self.repair_wanted
    }
    /// Whether a repair round is in flight: sent, neither complete nor past its deadline.
    pub fn repair_in_flight(&self) -> bool {
        let transfer = self.transfer.as_ref().is_some_and(|round| {
            !round.installing && !round.answered && self.tick < round.deadline_tick
        });
        transfer
            || self.repair_round.is_some_and(|round| {
                self.op_appended < round.op_high && self.tick < round.deadline_tick
            })
    }
    /// Whether this backup misses ops that every peer, or the primary, said it no longer holds:
    /// only a state transfer can bring it up to date.
    pub fn needs_state_transfer(&self) -> bool {
        let next = self.op_appended + 1;
        let evicted = |peer: u8| self.peer_op_min[usize::from(peer)] > next;
        // The primary holds every committed op its retention kept: once it has removed the
        // next one, the other backups may lack it too (they answer nothing for an op they never
        // had), and the primary's state is always there to take.
        next <= self.op.max(self.commit_max)
            && (self.peers().all(evicted)
                || (!self.is_primary() && evicted(self.config.primary_of(self.view))))
    }
    /// Whether a restart still waits for a StartView.
    pub fn needs_start_view(&self) -> bool {
        self.needs_start_view
    }
    /// Whether this replica is the primary of its view and serving.
    pub fn is_primary(&self) -> bool {
        self.status == Status::Normal && self.config.primary_of(self.view) == self.config.replica
    }
    /// The target of the hand-over under way, if any.
    pub fn handing_over(&self) -> Option<u8> {
        self.hand_over.map(|h| h.to)
    }
    /// On the serving primary, how long member `replica` has been in sync without a break, by
    /// the evidence of its acknowledgements in this view (DESIGN.md §4 "Lag"); `None` when it is
    /// not in sync, has not proven it yet in this view, or this replica is not the primary.
    pub fn in_sync_ticks(&self, replica: u8) -> Option<u64> {
        if !self.is_primary() || replica == self.config.replica {
            return None;
        }
        self.lag.in_sync_ticks(replica, self.tick)
    }
    /// On the serving primary, the ticks since anything was heard from member `replica` (its
    /// failure detector's figure); `None` for itself, or when this replica is not the primary.
    pub fn silent_ticks(&self, replica: u8) -> Option<u64> {
        if !self.is_primary() || replica == self.config.replica {
            return None;
        }
        let heard = self.last_heard_tick.get(usize::from(replica))?;
        Some(self.tick.saturating_sub(*heard))
    }
    /// The header of `op`, while the replica holds it in memory.
    pub fn header(&self, op: u64) -> Option<&Header> {
        self.log.get(&op).map(|entry| &entry.header)
    }
    /// The committed producer table (DESIGN.md §4), as of [`ProducerTable::op`].
    pub fn producers(&self) -> &ProducerTable {
        &self.producers
    }

    /// Hands a restarted replica its producer table, which its driver rebuilt from storage: the
    /// table as of some op at or below [`Replica::commit`] (applied up to it), or past it when
    /// the log lost committed ops that the table holds (applying them again when they return
    /// changes nothing: [`ProducerTable::apply`] skips ops at or below its op), and the
    /// idempotence fields of the recovered ops above the commit point, which the replica holds
    /// as headers only. Call right after [`Replica::recover`], before any input.
    pub fn recover_producers(
        &mut self,
        table: ProducerTable,
        uncommitted: &[(u64, ProducerBatch)],
    ) {
        self.producers = table;
        for (op, batch) in uncommitted {
            if let Some(entry) = self.log.get_mut(op) {
                entry.producer = Some(*batch);
            }
        }
    }

    /// Branch counters.
    pub fn counters(&self) -> ReplicaCounters {
        self.counters
    }
    /// The ticks seen.
    pub fn tick(&self) -> u64 {
        self.tick
    }
    /// The group as this replica sees it: view, status, commit point and head; and, on the
    /// serving primary only, every member's acknowledged op, lag and state (DESIGN.md §4 "Lag").
    pub fn group_status(&self) -> GroupStatus {
        self.group_status_after(0)
    }

    /// [`Replica::group_status`] as it will read once the replica is handed `ticks` ticks that
    /// only count ([`Replica::ticks_only_counting`]): the peers' silence and lag grow by them.
    /// A driver that let the replica sleep reads it so.
    pub fn group_status_after(&self, ticks: u64) -> GroupStatus {
        let primary = self.is_primary();
        let replicas = if primary {
            self.lag.progress(self.tick + ticks, &self.last_heard_tick, self.op_durable)
        } else {
            Vec::new()
        };
        let members = self.config.members;
        let replicas = replicas.into_iter().filter(|p| members.is_member(p.replica)).collect();
        GroupStatus {
            group: self.config.group,
            replica: self.config.replica,
            view: self.view,
            status: self.status,
            primary,
            commit: self.commit,
            head: self.op,
            replicas,
        }
    }

    /// Everything produced since the last call.
    pub fn take_ready(&mut self) -> Ready {
        std::mem::take(&mut self.ready)
    }

    /// Whether [`Replica::take_ready`] would return anything (an idle group's tick produces
    /// nothing, and a shard of 10,000 groups asks this 10,000 times a tick).
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The lag bound changes (a topic's own, given after the replica was made): backups are
    /// judged by it from the next tick on.
    pub fn set_replica_lag_ticks_max(&mut self, ticks: u64) {
        assert!(
            ticks > self.config.idle_heartbeat_interval_ticks,
            "a lag bound within a heartbeat"
        );
        self.config.replica_lag_ticks_max = ticks;
        self.lag.set_lag_ticks_max(ticks);
    }

    /// From now on a repair round starts only when the driver grants it (DESIGN.md §4: repair
    /// is rationed per shard so it never starves client traffic); the replica then reports a
    /// due round through [`Replica::repair_wanted`].
    pub fn ration_repair(&mut self) {
        self.repair_rationed = true;
    }

    /// The driver's grant: start the repair round that is due, if one still is. Returns the
    /// bytes the round asks for, as far as known (the headers' sizes, an unknown one counted as
    /// big as the newest prepare appended; a state transfer's piece as its bound): what a
    /// driver rationing repair by bytes charges for it. 0 when no round started.
    pub fn grant_repair(&mut self) -> u64 {
        self.repair_granted = true;
        self.repair_granted_bytes = 0;
        self.repair();
        self.repair_granted = false;
        self.repair_granted_bytes
    }

    // --- Inputs ----------------------------------------------------------------------------

    /// Hands the group to member `to` by a deliberate view change (DESIGN.md §8): the driver's
    /// decision, taken by the group's current primary (moving a group back to its home, or off
    /// a node that shuts down). Returns the view `to` will lead.
    ///
    /// From now on the primary refuses new requests (`TransientNotAccepted`) and prompts its
    /// backups for acknowledgements; once `to` has acknowledged the head and everything is
    /// committed, the primary leaves its view — status view change, nothing more prepared or
    /// acknowledged in it — and votes for the first view `to` leads. The backups join at once on
    /// that vote (it comes from the primary of their view), send their logs to `to` and the view
    /// change runs as any other: nothing committed can be lost, and `to`, which holds the whole
    /// log, needs to fetch nothing. A target that does not catch up within
    /// `hand_over_ticks_max` is given up on and the primary serves on; a view change that does
    /// not complete moves on by its ordinary timeouts.
    pub fn hand_over(&mut self, to: u8) -> Result<u32, HandOverRefused> {
        if !self.is_primary() {
            return Err(HandOverRefused::NotPrimary);
        }
        if !self.config.is_voter(to) || to == self.config.replica {
            return Err(HandOverRefused::NotAPeer { to });
        }
        if let Some(current) = self.hand_over {
            return Err(HandOverRefused::InProgress { to: current.to });
        }
        let view = self.config.next_view_led_by(self.view, to);
        self.hand_over = Some(HandOver {
            to,
            view,
            acknowledged: None,
            deadline_tick: self.tick + self.config.hand_over_ticks_max,
        });
        self.counters.hand_overs_begun += 1;
        // A heartbeat now: the target answers with its durable head at once.
        self.next_commit_tick = self.tick + self.config.commit_interval_ticks;
        self.broadcast_commit();
        Ok(view)
    }

    /// A client's write. Only the primary of a normal view with a quorum in touch and room in
    /// its pipeline accepts it; every other case is answered at once.
    pub fn on_client_request(&mut self, request: Request) {
        self.prepare_request(request, Membership::default());
    }

    /// A configuration change (DESIGN.md §8): the group runs with `next` as its members from
    /// the op after this request's, in the next epoch. It is prepared and committed like a
    /// client's write, by the current voters; until it commits, the primary takes no other
    /// request, so the change is its epoch's last op. Refused (`ReconfigurationRefused`) when
    /// `next` is not a valid membership of the group, names no change, or the epochs ran out.
    pub fn on_reconfigure_request(&mut self, request: Request, next: Membership) {
        if next.is_empty() {
            let result = ReplyResult::ReconfigurationRefused { reason: "no members" };
            let (client, request) = (request.client, request.request);
            self.ready.replies.push(Reply { client, request, result });
            return;
        }
        self.prepare_request(request, next);
    }

    /// Why the group cannot change its members to `next`, if it cannot.
    fn reconfiguration_refusal(&self, next: Membership) -> Option<&'static str> {
        if (ReplicaConfig { members: next, ..self.config }).validate().is_err() {
            Some("the membership is not valid for this group")
        } else if next == self.config.members {
            Some("the membership is the group's already")
        } else if self.epoch() >= EPOCH_MAX {
            Some("the group has used up its configuration epochs")
        } else {
            None
        }
    }

    /// The one path into the log for a request: a client's write, or (`reconfigure` not empty)
    /// a configuration change.
    fn prepare_request(&mut self, mut request: Request, reconfigure: Membership) {
        let refuse = |result| Reply { client: request.client, request: request.request, result };
        match self.status {
            Status::Normal if !self.is_primary() => {
                let primary = self.config.primary_of(self.view);
                self.ready
                    .replies
                    .push(refuse(ReplyResult::NotPrimary { view: self.view, primary }));
                return;
            }
            // Handing over: nothing new enters the log of a view about to be left.
            Status::Normal if self.hand_over.is_some() => {
                self.ready.replies.push(refuse(ReplyResult::TransientNotAccepted));
                return;
            }
            Status::Normal => {}
            Status::ViewChange | Status::Recovering | Status::Removed => {
                self.ready.replies.push(refuse(ReplyResult::TransientNotAccepted));
                return;
            }
        }
        // Canary (DESIGN.md §7): take requests past the epoch's last op.
        if self.epoch_closing() && !cfg!(feature = "canary-epoch-unclosed") {
            // Nothing may follow a configuration change in its epoch: the next epoch's first
            // view starts from it.
            self.counters.requests_refused_epoch_closing += 1;
            self.ready.replies.push(refuse(ReplyResult::TransientNotAccepted));
            return;
        }
        let producer = ProducerBatch::from_body(&request.body);
        if let Some(batch) = &producer {
            let (client, number) = (request.client, request.request);
            match self.check_producer(batch, request.append_time_ms) {
                Check::New => {}
                Check::Duplicate { op, base_offset } => {
                    self.counters.duplicates += 1;
                    self.answer_duplicate(client, number, op, base_offset);
                    return;
                }
                refused => {
                    self.counters.sequence_refusals += 1;
                    let result = match refused {
                        Check::UnknownProducer => ReplyResult::UnknownProducer,
                        Check::ProducerFenced => ReplyResult::ProducerFenced,
                        _ => ReplyResult::OutOfOrderSequence,
                    };
                    self.ready.replies.push(Reply { client, request: number, result });
                    return;
                }
            }
        }
        // After the duplicate check: a retried change that committed is answered as such.
        if let Some(reason) =
            (!reconfigure.is_empty()).then(|| self.reconfiguration_refusal(reconfigure)).flatten()
        {
            self.ready.replies.push(refuse(ReplyResult::ReconfigurationRefused { reason }));
            return;
        }
        if self.op - self.commit >= self.config.pipeline_prepares_max || !self.quorum_in_touch() {
            self.ready.replies.push(refuse(ReplyResult::TransientNotAccepted));
            return;
        }
        debug_assert_eq!(self.op, self.op_appended, "a normal primary holds every body");
        let (parent, base_offset) = self.next_link();
        let mut checksum_body = request.body_checksum;
        if self.config.stamp_batches {
            checksum_body = shoal_proto::batch::stamp_checksummed(
                &mut request.body,
                base_offset,
                self.view,
                checksum_body,
            );
        }
        let body = request.body.freeze();
        let fields = Prepare {
            group: self.config.group,
            op: self.op + 1,
            commit: self.commit,
            parent,
            base_offset,
            record_count: request.record_count,
            first_timestamp_ms: request.first_timestamp_ms,
            max_timestamp_ms: request.max_timestamp_ms,
            append_time_ms: request.append_time_ms,
            client: request.client,
            session: request.session,
            request: request.request,
            membership: self.config.members,
            reconfigure,
        };
        if !reconfigure.is_empty() {
            self.counters.reconfigurations_prepared += 1;
        }
        let header = Header::prepare_checksummed(
            self.config.cluster,
            self.view,
            self.config.replica,
            fields,
            &body,
            checksum_body,
        );
        self.op += 1;
        self.log.insert(self.op, Entry { header, body: Some(body.clone()), producer });
        self.op_appended = self.op;
        self.lag.prepared(self.op, self.tick);
        self.ready.writes.push(Write::Append { header, body: body.clone() });
        let retry_ticks = self.config.prepare_retry_ticks_min;
        self.pipeline.insert(
            self.op,
            InFlight {
                acks: 0,
                next_retry_tick: self.tick + retry_ticks,
                retry_ticks,
                request: Some((request.client, request.request)),
                duplicates: Vec::new(),
            },
        );
        for to in self.peers() {
            self.send(to, Message::Prepare { header, body: body.clone() });
        }
        // A settled group's next heartbeat may be an idle interval away: its commit point
        // goes out at the usual pace again.
        self.next_commit_tick =
            self.next_commit_tick.min(self.tick + self.config.commit_interval_ticks);
    }

    /// A completed write.
    pub fn on_persisted(&mut self, persisted: Persisted) {
        self.persisted(persisted);
        self.finish_epoch_change();
    }

    fn persisted(&mut self, persisted: Persisted) {
        match persisted {
            Persisted::Appended { op } => {
                if !self.durable_news(op) {
                    return;
                }
                self.op_durable = op.min(self.op_appended);
                if self.is_primary() {
                    self.primary_commit();
                    self.advance_hand_over();
                } else if self.status == Status::Normal {
                    self.acknowledge_head();
                }
                self.maybe_start_view();
            }
            Persisted::Views { view, log_view } => {
                self.view_durable = self.view_durable.max(view);
                self.log_view_durable = self.log_view_durable.max(log_view);
            }
            Persisted::Truncated { op } => {
                self.op_durable = self.op_durable.min(op);
            }
            Persisted::Installed { op } => {
                let installing = self.transfer.take_if(|t| t.installing && t.incoming.op() == op);
                assert!(installing.is_some(), "an install this replica did not ask for");
                // Appends after the install may have completed with it.
                self.op_durable = self.op_durable.max(op).min(self.op_appended);
                if self.status == Status::Normal && !self.is_primary() {
                    self.acknowledge_head();
                }
                self.repair();
            }
        }
    }

    /// One tick of time.
    pub fn on_tick(&mut self) {
        self.tick += 1;
        self.tick_status();
        self.finish_epoch_change();
    }

    /// How many of the next ticks would do nothing but count, were no input to arrive first:
    /// no timer of its status fires, nothing is sent, retried or repaired. The driver may stop
    /// ticking the replica for that many ticks and call [`Replica::skip_ticks`] before its next
    /// input or tick (a shard of 10,000 groups would otherwise walk them all every tick).
    ///
    /// - `u64::MAX` for the primary of a one-replica group (its commit broadcast reaches no
    ///   one) and a removed replica.
    /// - For a normal backup that misses nothing, the ticks before its heartbeat deadline: an
    ///   idle group's backups then wake once per heartbeat, which is an input.
    /// - For a normal primary with peers and nothing in its pipeline or handing over, the ticks
    ///   before its next heartbeat, before it would lose touch with a quorum, and before a
    ///   peer's lag state would change. Its peers' silence and lag grow meanwhile: a driver
    ///   reads them through [`Replica::group_status_after`] and the ticks it has not handed on.
    /// - 0 for everything else.
    pub fn ticks_only_counting(&self) -> u64 {
        if self.epoch_change.is_some() {
            return 0;
        }
        if self.config.replica_count == 1 && self.is_primary() {
            return u64::MAX;
        }
        match self.status {
            Status::Removed => u64::MAX,
            Status::Normal if self.is_primary() => {
                if self.hand_over.is_some() || !self.pipeline.is_empty() {
                    return 0;
                }
                // The first of the next ticks (1: the next) at which `tick_status` works.
                let members = self.config.members.members();
                let first_due = self
                    .next_commit_tick
                    .saturating_sub(self.tick)
                    .max(1)
                    .min(self.quorum_lost_in_ticks())
                    .min(self.lag.ticks_until_change(self.tick, members, &self.last_heard_tick));
                first_due - 1
            }
            Status::Normal => {
                // Before the deadline a backup's tick only repairs: nothing to do while it
                // misses nothing and no round or transfer is open.
                if self.repair_wanted
                    || self.repair_round.is_some()
                    || self.transfer.is_some()
                    || self.needs_state_transfer()
                    || !self.missing_requests().0.is_empty()
                {
                    return 0;
                }
                self.heartbeat_deadline_tick.saturating_sub(self.tick + 1)
            }
            _ => 0,
        }
    }

    /// `ticks` ticks at once, for a replica whose next `ticks` ticks only count
    /// ([`Replica::ticks_only_counting`]): it ends in the state `ticks` calls of
    /// [`Replica::on_tick`] would leave it in.
    pub fn skip_ticks(&mut self, ticks: u64) {
        assert!(
            ticks <= self.ticks_only_counting(),
            "ticks skipped on a replica whose tick does work"
        );
        if ticks == 0 {
            return;
        }
        let last = self.tick + ticks;
        // The commit timer fired at the first skipped tick at or past it, then every interval.
        let first = self.next_commit_tick.max(self.tick + 1);
        if first <= last {
            // At least 1, as the config's check requires; the same at every skipped tick, since
            // nothing but the count changes.
            let interval = self.heartbeat_interval_ticks();
            self.next_commit_tick = first + ((last - first) / interval + 1) * interval;
        }
        self.tick = last;
    }

    fn tick_status(&mut self) {
        match self.status {
            Status::Normal if self.is_primary() => {
                // The primary's own failure detector: no quorum heard from for a heartbeat
                // timeout (a one-way cut backup still acknowledges, so it never fires this).
                if !self.quorum_in_touch() {
                    self.start_view_change(self.view + 1);
                    return;
                }
                if self.tick >= self.next_commit_tick {
                    self.next_commit_tick = self.tick + self.heartbeat_interval_ticks();
                    self.broadcast_commit();
                }
                if self.config.replica_count > 1 {
                    self.retransmit();
                    self.lag.update(
                        self.tick,
                        self.config.members.members(),
                        &self.last_heard_tick,
                        &mut self.counters,
                    );
                    self.advance_hand_over();
                }
            }
            Status::Normal => {
                if self.tick < self.heartbeat_deadline_tick {
                    self.repair();
                } else if self.is_learner() {
                    // A learner never votes: it asks the voters for the view they are in, and
                    // the primary among them answers with a StartView.
                    self.arm_heartbeat();
                    self.probe_voters();
                } else {
                    self.start_view_change(self.view + 1);
                }
            }
            Status::ViewChange => {
                if self.tick >= self.view_change_deadline_tick {
                    let next = self.view + 1;
                    self.start_view_change(next);
                    return;
                }
                if self.tick >= self.next_vote_tick {
                    self.next_vote_tick = self.tick + self.config.commit_interval_ticks;
                    self.repeat_vote();
                }
                if self.merge.is_some() {
                    self.fetch_for_view();
                }
            }
            Status::Recovering => {
                // Canary (DESIGN.md §7): vote at once, as if the restart had lost nothing.
                #[cfg(feature = "canary-vote-while-recovering")]
                let probes_max = 0;
                #[cfg(not(feature = "canary-vote-while-recovering"))]
                let probes_max = self.config.start_view_probes_max;
                if self.tick >= self.next_probe_tick {
                    // A learner probes until a primary answers: it may not start a view. Nor
                    // may a replica that does not know its epoch's members.
                    if self.probes_sent >= probes_max && !self.is_learner() && self.members_known {
                        self.counters.recovery_view_changes += 1;
                        let next = self.view + 1;
                        self.start_view_change(next);
                        return;
                    }
                    self.probes_sent += 1;
                    self.next_probe_tick = self.tick + self.config.start_view_probe_interval_ticks;
                    self.probe_voters();
                }
            }
            Status::Removed => {}
        }
    }

    /// A message from replica `from` of this group. Network input: anything unexpected is
    /// dropped, never asserted.
    pub fn on_message(&mut self, from: u8, message: Message) {
        if from >= self.config.replica_count || from == self.config.replica {
            return;
        }
        if self.crosses_epochs(from, &message) {
            return;
        }
        if let Message::StartViewChange { membership, .. } = &message
            && !self.members_known
        {
            // A voter of this epoch knows its members (one that does not, never votes).
            self.learn_members(*membership);
        }
        // A removed replica rejoins only through a newer epoch's StartView naming it again, and
        // one that does not know its epoch's members learns them from a StartView or a vote.
        // A removed replica still serves what it holds: the new members may need it.
        let serves =
            matches!(message, Message::RequestPrepare { .. } | Message::RequestState { .. });
        let removed_serving = self.status == Status::Removed && serves;
        if (self.status == Status::Removed || !self.members_known)
            && !removed_serving
            && !matches!(message, Message::StartView { .. })
        {
            return;
        }
        self.dispatch(from, message);
        self.finish_epoch_change();
    }

    /// Whether `message` belongs to another configuration epoch than this replica's, having
    /// answered it: a replica of an older epoch is handed this epoch's StartView, and one of a
    /// newer epoch is asked for its own (only a newer epoch's StartView is taken as it comes).
    /// A relayed prepare carries the view it was made in, not its sender's: one of an older
    /// epoch is a repair answer like any other.
    fn crosses_epochs(&mut self, from: u8, message: &Message) -> bool {
        let view = match message {
            Message::Prepare { header, .. } => header.view,
            Message::PrepareOk { view, .. }
            | Message::Commit { view, .. }
            | Message::StartViewChange { view, .. }
            | Message::DoViewChange { view, .. }
            | Message::RequestStartView { view, .. } => *view,
            // A state is of its sender's epoch: one that passed a configuration change would
            // carry a laggard over it without the change, so transfers stay within an epoch.
            Message::RequestState { view, .. } | Message::StateChunk { view, .. } => *view,
            // A committed prepare is the same in every epoch: repair crosses them.
            Message::StartView { .. }
            | Message::RequestPrepare { .. }
            | Message::RangeEvicted { .. } => return false,
        };
        let (theirs, ours) = (epoch_of(view), self.epoch());
        if theirs > ours {
            self.probe_newer_epoch(from);
            return true;
        }
        if theirs < ours && !matches!(message, Message::Prepare { .. }) {
            self.answer_older_epoch(from);
            return true;
        }
        false
    }

    fn dispatch(&mut self, from: u8, message: Message) {
        // View changes are the voters' alone: a learner neither casts nor takes a vote.
        if matches!(message, Message::StartViewChange { .. } | Message::DoViewChange { .. })
            && (self.is_learner() || !self.config.is_voter(from))
        {
            return;
        }
        match message {
            Message::Prepare { header, body } => self.on_prepare(from, header, body),
            Message::PrepareOk { view, op, commit, prepare_checksum } => {
                self.on_prepare_ok(from, view, op, commit, prepare_checksum);
            }
            Message::Commit { view, commit, commit_checksum } => {
                self.on_commit(from, view, commit, commit_checksum);
            }
            Message::StartViewChange { view, .. } => self.on_start_view_change(from, view),
            message @ Message::DoViewChange { .. } => self.accept_do_view_change(from, message),
            Message::StartView { view, op, commit, nonce, headers, membership } => {
                if headers.len() > self.config.view_headers_max {
                    return;
                }
                let Some(headers) = self.checked_headers(&headers, None) else { return };
                let taken = self.take_start_view_membership(
                    from, view, op, commit, nonce, membership, &headers,
                );
                if !taken {
                    return;
                }
                self.on_start_view(from, view, op, commit, nonce, headers);
            }
            Message::RequestStartView { view, nonce } => {
                self.on_request_start_view(from, view, nonce);
            }
            Message::RequestPrepare { op, checksum, .. } => {
                self.on_request_prepare(from, op, checksum);
            }
            Message::RangeEvicted { op, op_min, .. } => self.on_range_evicted(from, op, op_min),
            Message::RequestState { op, offset_bytes, .. } => {
                self.on_request_state(from, op, offset_bytes);
            }
            Message::StateChunk {
                op,
                end_offset,
                size_bytes,
                offset_bytes,
                prepare_checksum,
                state_checksum,
                chunk,
                ..
            } => {
                let chunk = Chunk {
                    op,
                    end_offset,
                    size_bytes,
                    offset_bytes,
                    prepare_checksum,
                    state_checksum,
                    bytes: chunk,
                };
                self.on_state_chunk(from, chunk);
            }
        }
    }

    // --- Normal operation ------------------------------------------------------------------

    fn on_prepare(&mut self, from: u8, header: Header, body: Bytes) {
        let Some(fields) = header.as_prepare() else { return };
        let fields = *fields;
        if header.cluster != self.config.cluster
            || fields.group != self.config.group
            || header.verify_body(&body).is_err()
            || fields.op == 0
        {
            return;
        }
        if self.status == Status::Recovering {
            self.counters.prepares_dropped_recovering += 1;
            return;
        }
        if self.transfer.as_ref().is_some_and(|t| {
            t.incoming.from == from
                && !t.installing
                && t.incoming.is_complete()
                && t.incoming.op() == fields.op
        }) {
            self.install_transfer(header, body);
            return;
        }
        if header.view > self.view {
            self.request_start_view(header.view);
            return;
        }
        // A body for a header already in the log (retransmission, repair, view change fetch).
        if let Some(entry) = self.log.get_mut(&fields.op) {
            if entry.header.checksum_header != header.checksum_header {
                return;
            }
            if entry.body.is_none() && fields.op > self.op_appended {
                entry.producer = ProducerBatch::from_body(&body);
                entry.body = Some(body);
                if self.merge.is_some() {
                    self.counters.bodies_fetched_for_view += 1;
                }
                self.append_ready_bodies();
            } else if self.status == Status::Normal
                && !self.is_primary()
                && fields.op <= self.op_durable
            {
                // The primary retransmits what it has no acknowledgement for: ours was lost.
                self.acknowledge_head();
            }
            return;
        }
        // A new op joins the log only as this view's next prepare from its primary, or as a
        // committed op (canonical wherever it comes from) continuing the appended chain.
        let from_primary = self.status == Status::Normal
            && header.view == self.view
            && from == self.config.primary_of(self.view)
            && !self.is_primary();
        if from_primary && fields.op == self.op + 1 && self.log_links(&header) {
            if self.op - self.op_appended >= self.window_ops() {
                return;
            }
            self.arm_heartbeat();
            self.log.insert(fields.op, Entry::with_body(header, body));
            self.op = fields.op;
            self.commit_max = self.commit_max.max(fields.commit);
        } else if fields.op > self.op_appended
            && fields.op <= self.commit_max
            && fields.op - self.op_appended <= self.config.repair_prepares_max as u64
        {
            if header.view < self.log_view && self.log_view_head_op.is_some_and(|h| fields.op > h) {
                // An older view's prepare above the log view's start: a dead branch (an old
                // primary's retransmission), not the committed op, although it links to the
                // same parent.
                self.counters.stale_prepares_dropped += 1;
                return;
            }
            // A committed op (canonical wherever it comes from), perhaps ahead of its
            // predecessors: it joins the log once the chain reaches and vouches for it.
            self.repaired.insert(fields.op, (header, body));
        } else {
            return;
        }
        self.append_ready_bodies();
        self.commit_up_to(self.commit_max);
        #[cfg(feature = "canary-send-before-persist")]
        if self.status == Status::Normal && !self.is_primary() {
            self.acknowledge_head();
        }
    }

    fn on_prepare_ok(&mut self, from: u8, view: u32, op: u64, commit: u64, checksum: u32) {
        if !self.is_primary() || view != self.view {
            return;
        }
        self.last_heard_tick[usize::from(from)] = self.tick;
        // Op 0 is the empty log every replica holds: a backup of an idle, empty group answering
        // the heartbeat acknowledges the head.
        let matches = if op == 0 {
            checksum == 0
        } else {
            self.log.get(&op).is_some_and(|e| e.header.checksum_header == checksum)
        };
        if matches {
            self.lag.acknowledged(from, op, self.op, self.tick);
            self.note_settled(from, op, commit);
            if let Some(hand_over) = self.hand_over.as_mut().filter(|h| h.to == from) {
                hand_over.acknowledged = Some(hand_over.acknowledged.unwrap_or(0).max(op));
            }
        }
        // Heard from, and perhaps caught up: a dead or lagging backup may be back in sync.
        self.lag.update(
            self.tick,
            self.config.members.members(),
            &self.last_heard_tick,
            &mut self.counters,
        );
        if !matches {
            return;
        }
        if !self.config.is_voter(from) {
            self.counters.learner_acks += 1;
        }
        // A learner's bit stops the op's retransmissions to it; only voters' bits commit.
        let bit = 1u32 << from;
        for (_, in_flight) in self.pipeline.range_mut(..=op) {
            in_flight.acks |= bit;
        }
        self.primary_commit();
        self.advance_hand_over();
    }

    /// Leaves the view for the hand-over's once its target holds the whole log and everything
    /// is committed; gives the hand-over up at its deadline.
    fn advance_hand_over(&mut self) {
        let Some(hand_over) = self.hand_over else { return };
        if self.tick >= hand_over.deadline_tick {
            self.hand_over = None;
            self.counters.hand_overs_abandoned += 1;
            // Not caught up when asked: the return policy waits for a new run in sync.
            self.lag.forget_in_sync(hand_over.to);
            return;
        }
        let caught_up = hand_over.acknowledged.is_some_and(|op| op >= self.op);
        if !caught_up || self.commit < self.op {
            return;
        }
        self.hand_over = None;
        self.counters.hand_overs_done += 1;
        // Canary (DESIGN.md §7): hand over as Raft's TimeoutNow would, without leaving the view:
        // the target gets this replica's vote and log for the new view while this primary keeps
        // serving the old one, so what it commits there may be missing from the new view's log.
        #[cfg(feature = "canary-handover-unsafe")]
        {
            let view = hand_over.view;
            let mut message = self.build_do_view_change();
            if let Message::DoViewChange { view: offered, .. } = &mut message {
                *offered = view;
            }
            let membership = self.config.members;
            self.send(hand_over.to, Message::StartViewChange { view, membership });
            self.send(hand_over.to, message);
        }
        #[cfg(not(feature = "canary-handover-unsafe"))]
        self.start_view_change(hand_over.view);
    }

    fn on_commit(&mut self, from: u8, view: u32, commit: u64, checksum: u32) {
        if from != self.config.primary_of(view) {
            return;
        }
        let newer_log = view > self.log_view && view >= self.view_floor;
        if view > self.view || (self.status == Status::ViewChange && view < self.view && newer_log)
        {
            // A view this replica missed the start of: ask its primary for the log.
            if self.status != Status::Recovering {
                self.request_start_view(view);
            }
            return;
        }
        // A vote not yet turned into a DoViewChange is withdrawn on a fresh heartbeat from the
        // primary it voted against.
        if self.status == Status::ViewChange
            && !self.do_view_change_sent
            && !self.needs_start_view
            && view == self.log_view
            && self.log_view >= self.view_floor
            && self.merge.is_none()
        {
            self.counters.votes_withdrawn += 1;
            self.votes.remove(&self.config.replica);
            self.view = self.log_view;
            self.status = Status::Normal;
        }
        if self.status == Status::ViewChange && view >= self.log_view && view < self.view {
            // Bound to a later view (its DoViewChange may already be merged there), this
            // replica can never serve in the primary's view, while the healthy members there
            // never leave it: ask that primary to move the group on.
            self.request_view_at_least(from);
            return;
        }
        if self.status != Status::Normal || view != self.view || self.is_primary() {
            return;
        }
        self.arm_heartbeat();
        if commit > self.commit_max {
            self.commit_max = commit;
        }
        let _ = checksum;
        self.commit_up_to(self.commit_max);
        // The answer tells the primary this backup is alive and how far it is.
        self.acknowledge_head();
        self.repair();
    }

    /// The primary commits every op a quorum holds durably, in order.
    fn primary_commit(&mut self) {
        let quorum = self.config.quorum();
        // Canary (DESIGN.md §7): count a learner's acknowledgement in the quorum.
        let voters = if cfg!(feature = "canary-learner-acks") {
            u32::MAX
        } else {
            self.config.members.voters
        };
        while let Some((&op, in_flight)) = self.pipeline.first_key_value() {
            let own = usize::from(self.op_durable >= op);
            if (in_flight.acks & voters).count_ones() as usize + own < quorum {
                break;
            }
            let in_flight = self.pipeline.remove(&op).expect("first key");
            self.commit_max = self.commit_max.max(op);
            self.commit_up_to(op);
            let base_offset = prepare(&self.log[&op].header).base_offset;
            for (client, request) in in_flight.request.into_iter().chain(in_flight.duplicates) {
                self.ready.replies.push(Reply {
                    client,
                    request,
                    result: ReplyResult::Committed { op, base_offset },
                });
            }
        }
    }

    /// Applies committed ops the log holds, in order, up to `target`.
    fn commit_up_to(&mut self, target: u64) {
        let target = target.min(self.op_appended);
        // A committed configuration change ends its epoch: nothing after it commits before the
        // replica has entered the next one.
        while self.commit < target && self.epoch_change.is_none() {
            self.commit += 1;
            let Some(entry) = self.log.get_mut(&self.commit) else {
                fatal!(self, "committing op {} without its header", self.commit);
            };
            entry.body = None;
            if let Some(batch) = &entry.producer {
                let fields = prepare(&entry.header);
                self.producers.apply(batch, fields.op, fields.base_offset, fields.append_time_ms);
            }
            self.counters.commits += 1;
            let header = entry.header;
            self.ready.committed.push(Committed::Op { header });
            let next = prepare(&header).reconfigure;
            if !next.is_empty() && epoch_of(header.view) == self.epoch() {
                self.epoch_change = Some((self.commit, next));
            }
        }
        self.prune();
    }

    // --- Configuration epochs ----------------------------------------------------------------

    /// Whether the log's head is a configuration change of this epoch not yet committed: the
    /// epoch's last op, which nothing may follow.
    fn epoch_closing(&self) -> bool {
        self.op > self.commit
            && self.log.get(&self.op).is_some_and(|entry| {
                !prepare(&entry.header).reconfigure.is_empty()
                    && epoch_of(entry.header.view) == self.epoch()
            })
    }

    /// Enters the epoch a committed configuration change opened, once the input that
    /// committed it has been handled: every member enters the epoch's first view with the log
    /// ending at the change, normal, and its primary announces the view at once. A replica the
    /// change leaves out is removed.
    fn finish_epoch_change(&mut self) {
        let Some((op, next)) = self.epoch_change.take() else { return };
        if self.op != op {
            fatal!(self, "a configuration change at op {op} committed below the log's head");
        }
        let epoch = self.epoch() + 1;
        self.counters.epochs_entered += 1;
        self.drop_hand_over();
        self.fail_pipeline();
        self.config.members = next;
        self.members_known = true;
        self.epoch_start_op = Some(op);
        self.enter_view_log(first_view_of(epoch), op);
        self.view_floor = self.view;
        self.faulty_from = None;
        if !next.is_member(self.config.replica) {
            self.status = Status::Removed;
            self.persist_views();
            return;
        }
        self.status = Status::Normal;
        self.persist_views();
        self.last_heard_tick.fill(self.tick);
        self.lag.start_view(self.tick);
        self.arm_heartbeat();
        self.repair_target = self.config.primary_of(self.view);
        if self.is_primary() {
            self.next_commit_tick = self.tick;
            let message = self.build_start_view(0);
            for to in self.peers() {
                self.send(to, message.clone());
            }
        }
    }

    /// The StartView of this epoch's first view as it began — the log up to the change that
    /// opened the epoch, all of it committed — which every view of the epoch extends, so any
    /// member may hand it on; `None` when the change's header has left memory.
    fn build_epoch_start(&self) -> Option<Message> {
        let start = self.epoch_start_op?;
        self.log.get(&start)?;
        let first = start.saturating_sub(self.config.view_headers_max as u64 - 1).max(1);
        let headers: Vec<Header> =
            self.log.range(first..=start).map(|(_, entry)| entry.header).collect();
        Some(Message::StartView {
            view: first_view_of(self.epoch()),
            op: start,
            commit: start,
            nonce: 0,
            headers,
            membership: self.config.members,
        })
    }

    /// A member still in an older epoch, whose peers may all have moved on: the primary sends
    /// its view, any other member the epoch's opening, rate-limited per asker.
    fn answer_older_epoch(&mut self, to: u8) {
        let slot = usize::from(to);
        if self.tick < self.older_epoch_answer_tick[slot] {
            return;
        }
        let message = if self.is_primary() {
            Some(self.build_start_view(0))
        } else {
            self.build_epoch_start()
        };
        let Some(message) = message else { return };
        self.older_epoch_answer_tick[slot] = self.tick + self.config.repair_interval_ticks;
        self.counters.older_epochs_answered += 1;
        self.send(to, message);
    }

    /// Takes a same-epoch voter's word for the members this restarted replica lost.
    fn learn_members(&mut self, membership: Membership) {
        if (ReplicaConfig { members: membership, ..self.config }).validate().is_err() {
            return;
        }
        self.config.members = membership;
        self.members_known = true;
        if !membership.is_member(self.config.replica) {
            self.status = Status::Removed;
        }
    }

    /// A message of an epoch this replica has not entered: ask its sender, with this
    /// replica's own (older) view, for the newer epoch's StartView.
    fn probe_newer_epoch(&mut self, to: u8) {
        if self.tick < self.next_request_start_view_tick {
            return;
        }
        self.next_request_start_view_tick = self.tick + self.config.repair_interval_ticks;
        self.counters.newer_epochs_probed += 1;
        let (view, nonce) = (self.view, self.boot_nonce);
        self.send(to, Message::RequestStartView { view, nonce });
    }

    /// Checks a StartView's membership and takes it when the StartView opens a newer epoch
    /// (or names the members a restarted replica did not find). A StartView of a newer epoch
    /// comes from that view's primary, or — the epoch's opening — from any member; a
    /// replica it leaves out is removed. Returns whether the StartView is to be installed.
    #[allow(clippy::too_many_arguments)]
    fn take_start_view_membership(
        &mut self,
        from: u8,
        view: u32,
        op: u64,
        commit: u64,
        nonce: u64,
        membership: Membership,
        headers: &BTreeMap<u64, (Header, u8)>,
    ) -> bool {
        let epoch = epoch_of(view);
        if epoch < self.epoch() {
            return false;
        }
        if epoch == self.epoch() && self.members_known {
            // A removed replica rejoins only through a newer epoch, and a StartView of this
            // epoch that leaves this replica out has nothing for it to install.
            return self.status != Status::Removed
                && membership == self.config.members
                && membership.is_member(self.config.replica);
        }
        let candidate = ReplicaConfig { members: membership, ..self.config };
        if candidate.validate().is_err() {
            return false;
        }
        if from != candidate.primary_of(view) && !self.is_epoch_opening(view, op, commit) {
            return false;
        }
        if epoch > self.epoch() {
            // Everything `on_start_view` would check, before anything changes here (a newer
            // epoch's view is above this replica's, so its view checks hold).
            if !self.start_view_sound(op, commit, nonce, headers) {
                return false;
            }
            self.counters.epochs_installed += 1;
            self.epoch_change = None;
            self.epoch_start_op = headers.iter().find_map(|(&at, (header, _))| {
                let change = prepare(header).reconfigure;
                (change == membership && epoch_of(header.view) + 1 == epoch).then_some(at)
            });
        }
        self.config.members = membership;
        self.members_known = true;
        if !membership.is_member(self.config.replica) {
            self.drop_hand_over();
            self.fail_pipeline();
            self.enter_view_log(view, op);
            self.status = Status::Removed;
            self.persist_views();
            return false;
        }
        true
    }

    /// Whether a StartView is a newer epoch's opening (its first view as it began, the log all
    /// committed), which any member may hand on (`answer_older_epoch`).
    fn is_epoch_opening(&self, view: u32, op: u64, commit: u64) -> bool {
        let epoch = epoch_of(view);
        epoch > self.epoch() && view == first_view_of(epoch) && op == commit
    }

    /// The checks of a StartView's own content: an answer to this boot's probe when
    /// recovering, headers that end at its op, a commit point within its log, and a log that
    /// holds everything this replica committed. Under `unclean_recovery` a view may have given
    /// up ops this replica committed (the documented loss); the replica follows it rather than
    /// stay out of the group for good.
    fn start_view_sound(
        &self,
        op: u64,
        commit: u64,
        nonce: u64,
        headers: &BTreeMap<u64, (Header, u8)>,
    ) -> bool {
        let probe_answered =
            self.status != Status::Recovering || nonce == 0 || nonce == self.boot_nonce;
        probe_answered
            && headers.keys().next_back().is_none_or(|&top| top == op)
            && !(headers.is_empty() && op > commit)
            && (op >= self.commit || self.config.unclean_recovery)
            && commit <= op
    }

    /// The primary's ticks until its next heartbeat: the idle interval once the group is
    /// settled — nothing in flight or handing over, and every peer has acknowledged the head
    /// with the commit point the heartbeats carry, so they tell no one anything new — else
    /// the commit interval.
    fn heartbeat_interval_ticks(&self) -> u64 {
        let all = self.peer_bits();
        let settled = self.pipeline.is_empty()
            && self.hand_over.is_none()
            && self.settled.at == (self.view, self.op, self.commit)
            && self.settled.peers & all == all;
        if settled {
            self.config.idle_heartbeat_interval_ticks
        } else {
            self.config.commit_interval_ticks
        }
    }

    /// Peer `from` acknowledged `op` holding `commit`: it holds the head and the commit point
    /// if those are the primary's own.
    fn note_settled(&mut self, from: u8, op: u64, commit: u64) {
        let now = (self.view, self.op, self.commit);
        if self.settled.at != now {
            self.settled = Settled { at: now, peers: 0 };
        }
        if op == self.op && commit == self.commit {
            self.settled.peers |= 1 << from;
        }
    }

    fn broadcast_commit(&mut self) {
        let (commit, commit_checksum) = (self.commit, self.checksum_at(self.commit));
        for to in self.peers() {
            self.send(to, Message::Commit { view: self.view, commit, commit_checksum });
        }
    }

    fn retransmit(&mut self) {
        let all = self.peer_bits();
        let mut due = Vec::new();
        for (&op, in_flight) in &mut self.pipeline {
            if in_flight.next_retry_tick > self.tick || in_flight.acks & all == all {
                continue;
            }
            in_flight.retry_ticks =
                (in_flight.retry_ticks * 2).min(self.config.prepare_retry_ticks_max);
            let jitter = self.rng.below(in_flight.retry_ticks / 2 + 1);
            in_flight.next_retry_tick = self.tick + in_flight.retry_ticks + jitter;
            due.push((op, in_flight.acks));
        }
        for (op, acks) in due {
            let Some(Entry { header, body: Some(body), .. }) = self.log.get(&op).cloned() else {
                continue;
            };
            for to in self.peers() {
                if acks & (1 << to) == 0 {
                    self.counters.retransmissions += 1;
                    self.send(to, Message::Prepare { header, body: body.clone() });
                }
            }
        }
    }

    /// A backup acknowledges its durable head (cumulative: every op below it too).
    fn acknowledge_head(&mut self) {
        if self.log_view != self.view {
            return;
        }
        // Canary (DESIGN.md §7): acknowledge what is appended, before it is durable.
        #[cfg(feature = "canary-send-before-persist")]
        let op = self.op_appended;
        #[cfg(not(feature = "canary-send-before-persist"))]
        let op = self.op_durable;
        let message = Message::PrepareOk {
            view: self.view,
            op,
            commit: self.commit,
            prepare_checksum: self.checksum_at(op),
        };
        self.send(self.config.primary_of(self.view), message);
    }

    /// A backup behind the commit point, or holding headers without bodies, asks one peer (the
    /// primary first) for the lowest missing ops, one round at a time: the next round starts
    /// as soon as this one is appended, or at its deadline, when a round that brought nothing
    /// makes the next ask another peer.
    fn repair(&mut self) {
        if self.status != Status::Normal || self.is_primary() {
            self.repair_wanted = false;
            return;
        }
        if self.transfer.is_some() || self.needs_state_transfer() {
            self.transfer_round();
            return;
        }
        if let Some(round) = self.repair_round {
            let done = self.op_appended >= round.op_high;
            if !done && self.tick < round.deadline_tick {
                return;
            }
            if !done && self.op_appended > round.op_appended_at_send {
                // Answers are still arriving (a large round from a busy peer): the round lives
                // on for another interval instead of asking again for what is on its way, which
                // would double the peers' reads just when they are slow.
                self.counters.repair_rounds_extended += 1;
                self.repair_backoff = 0;
                self.repair_round = Some(RepairRound {
                    op_appended_at_send: self.op_appended,
                    deadline_tick: self.tick + self.repair_deadline_ticks(),
                    ..round
                });
                return;
            }
            if !done && self.op_appended <= round.op_appended_at_send {
                self.counters.repair_rounds_unanswered += 1;
                self.repair_target = self.next_peer(round.to);
                self.repair_backoff = (self.repair_backoff + 1).min(REPAIR_BACKOFF_MAX);
                // The next round asks for the same ops: it is timed from this one's request,
                // since this one's answers may be what completes it.
                self.repair_asked_tick = Some(round.sent_tick);
            } else {
                self.repair_backoff = 0;
            }
            if done {
                // A slower round counts at once, a faster one by halves: a deadline that is
                // too short costs a whole round of reads twice, one that is long costs nothing
                // while answers arrive.
                let took = self.tick.saturating_sub(round.sent_tick);
                let took =
                    took.min(self.config.repair_interval_ticks * REPAIR_DEADLINE_INTERVALS_MAX);
                self.repair_round_ticks = took.max((self.repair_round_ticks + took) / 2);
            }
            self.repair_round = None;
        }
        let (requests, size_bytes) = self.missing_requests();
        let Some(op_high) = requests.iter().rev().find_map(|message| match message {
            Message::RequestPrepare { op, .. } => Some(*op),
            _ => None,
        }) else {
            self.repair_wanted = false;
            return;
        };
        if !self.take_repair_grant() {
            return;
        }
        if self.repair_target == self.config.replica {
            self.repair_target = self.next_peer(self.config.replica);
        }
        let to = self.repair_target;
        self.repair_round = Some(RepairRound {
            to,
            op_high,
            op_appended_at_send: self.op_appended,
            sent_tick: self.repair_asked_tick.take().unwrap_or(self.tick),
            deadline_tick: self.tick + (self.repair_deadline_ticks() << self.repair_backoff),
        });
        self.repair_granted_bytes = size_bytes;
        self.counters.repair_rounds += 1;
        self.counters.repairs_requested += requests.len() as u64;
        for message in requests {
            self.send(to, message);
        }
    }

    /// A peer no longer holds an op this replica asked for: the round moves on to another
    /// peer at once, and once every peer has said so, only a state transfer can help.
    fn on_range_evicted(&mut self, from: u8, op: u64, op_min: u64) {
        if op == 0 || op_min <= op {
            return;
        }
        self.counters.ranges_evicted += 1;
        let known = &mut self.peer_op_min[usize::from(from)];
        *known = (*known).max(op_min);
        if let Some(round) = self.repair_round
            && round.to == from
            && op == self.op_appended + 1
        {
            self.repair_target = self.next_peer(from);
            self.repair_round = None;
            self.repair();
        }
    }

    /// How long a repair round waits for progress before asking again: the repair interval,
    /// or twice what recent rounds took when that is longer, and never more than
    /// `REPAIR_DEADLINE_INTERVALS_MAX` intervals (a round that spanned a partition or a pause
    /// says nothing about the next).
    fn repair_deadline_ticks(&self) -> u64 {
        let interval = self.config.repair_interval_ticks;
        (2 * self.repair_round_ticks).clamp(interval, interval * REPAIR_DEADLINE_INTERVALS_MAX)
    }

    /// Whether a due round may start now: always when unrationed; when rationed, only inside
    /// the driver's grant, and otherwise the round is reported as wanted.
    fn take_repair_grant(&mut self) -> bool {
        let granted = !self.repair_rationed || self.repair_granted;
        self.repair_wanted = !granted;
        granted
    }

    /// A backup no peer can repair takes a state transfer, one request per round, rationed
    /// like repair rounds: its first asks the repair target for its newest state; each answer
    /// asks the same peer for the next piece, then for the prepare of the state's op; a request
    /// unanswered by its deadline starts again with the next peer.
    fn transfer_round(&mut self) {
        if let Some(round) = &self.transfer
            && (round.installing || (!round.answered && self.tick < round.deadline_tick))
        {
            self.repair_wanted = false;
            return;
        }
        if !self.take_repair_grant() {
            return;
        }
        let deadline_tick = self.tick + self.config.repair_interval_ticks;
        let mut round = match self.transfer.take() {
            Some(round) if round.answered => round,
            unanswered => {
                if let Some(round) = unanswered {
                    self.counters.transfer_rounds_unanswered += 1;
                    self.repair_target = self.next_peer(round.incoming.from);
                }
                if self.repair_target == self.config.replica {
                    self.repair_target = self.next_peer(self.config.replica);
                }
                self.counters.transfers_started += 1;
                let incoming = transfer::Incoming::new(self.repair_target);
                TransferRound {
                    incoming,
                    deadline_tick,
                    answered: false,
                    installing: false,
                    table: None,
                }
            }
        };
        round.answered = false;
        round.deadline_tick = deadline_tick;
        let (to, view, op) = (round.incoming.from, self.view, round.incoming.op());
        let message = match round.incoming.state() {
            Some(state) => {
                Message::RequestPrepare { view, op, checksum: Some(state.prepare_checksum) }
            }
            None => Message::RequestState { view, op, offset_bytes: round.incoming.offset_bytes() },
        };
        self.transfer = Some(round);
        self.repair_granted_bytes = self.config.state_chunk_bytes_max as u64;
        self.counters.repair_rounds += 1;
        self.send(to, message);
    }

    /// A piece of the state this backup asked a peer for.
    fn on_state_chunk(&mut self, from: u8, chunk: Chunk) {
        if self.status != Status::Normal || self.is_primary() {
            return;
        }
        let op_floor = self.op_appended;
        let Some(round) = self.transfer.as_mut().filter(|r| r.incoming.from == from) else {
            return;
        };
        if round.installing || round.answered {
            return;
        }
        match round.incoming.accept(chunk, op_floor) {
            Accepted::Ignored => return,
            Accepted::More => round.answered = true,
            Accepted::Complete => {
                let state = round.incoming.state().expect("complete");
                let limits = self.config.producer_limits();
                let decoded = transfer::decode_transfer_state(&state.state).and_then(
                    |(producers, driver)| {
                        let table = ProducerTable::decode(producers, limits).ok()?;
                        Some((table, state.state.slice_ref(driver)))
                    },
                );
                let Some(decoded) = decoded else {
                    self.reject_transfer();
                    return;
                };
                round.table = Some(decoded);
                round.answered = true;
            }
            Accepted::Rejected => {
                self.reject_transfer();
                return;
            }
        }
        self.repair();
    }

    /// The peer's state is of no use: the next round starts again with another peer.
    fn reject_transfer(&mut self) {
        self.counters.transfer_states_rejected += 1;
        if let Some(round) = self.transfer.take() {
            self.repair_target = self.next_peer(round.incoming.from);
        }
    }

    /// The prepare of the assembled state's op: the log now begins there. Everything at or
    /// below it is covered by the state, so the backup's log, commit point and producer table
    /// jump to it at once, and the driver replaces the stored log before any later append.
    fn install_transfer(&mut self, header: Header, body: Bytes) {
        let round = self.transfer.as_mut().expect("checked by the caller");
        let state = round.incoming.state().expect("checked by the caller");
        let op = state.op;
        let fields = prepare(&header);
        // A state past a configuration change of this epoch (or of a later epoch) would carry
        // this replica over the change without entering the next epoch.
        let epoch = epoch_of(self.view);
        let crosses_epoch = epoch_of(header.view) > epoch
            || (!fields.reconfigure.is_empty() && epoch_of(header.view) == epoch);
        if header.checksum_header != state.prepare_checksum
            || fields.end_offset() != state.end_offset
            || op <= self.op_appended
            || crosses_epoch
        {
            self.reject_transfer();
            return;
        }
        assert!(self.commit <= self.op_appended, "commit never passes the appended head");
        let (table, driver) = round.table.take().expect("decoded when the state completed");
        // Canary (DESIGN.md §7): keep the backup's own table, in memory and in the stored state.
        #[cfg(feature = "canary-transfer-keeps-table")]
        let (table, state) = {
            let _ = table;
            let bytes = transfer::encode_transfer_state(&self.producers.encode(), &driver);
            (self.producers.clone(), transfer::Outgoing { state: Bytes::from(bytes), ..state })
        };
        round.installing = true;
        self.log.retain(|&held, _| held > op);
        self.log.insert(op, Entry::header_only(header));
        self.repaired.retain(|&held, _| held > op);
        self.op = self.op.max(op);
        self.op_appended = op;
        self.commit = op;
        self.commit_max = self.commit_max.max(op);
        self.producers = table;
        self.faulty_from = self.faulty_from.map(|from| from.max(op + 1));
        self.peer_op_min.iter_mut().for_each(|known| *known = 0);
        self.counters.transfers_installed += 1;
        let state = GroupState { op, end_offset: state.end_offset, bytes: state.state.to_vec() };
        self.ready.writes.push(Write::Install { header, body, state });
        self.ready.committed.push(Committed::Transferred { header, state: driver });
        self.append_ready_bodies();
        self.commit_up_to(self.commit_max);
    }

    /// A peer taking a state transfer asks for a piece of this replica's state: the state frozen
    /// at its first request (or a fresh one, at this replica's commit point, when the asker
    /// begins or names a state no longer kept). Served only while normal, and only for a commit
    /// point whose header is still in memory. With `transfers_carry_driver_state`, a fresh
    /// state waits for the driver's part ([`Replica::on_driver_state`]) before anyone is served.
    fn on_request_state(&mut self, from: u8, op: u64, offset_bytes: u64) {
        if !matches!(self.status, Status::Normal | Status::Removed) {
            return;
        }
        if self.transfer_source.as_ref().is_some_and(|s| op != 0 && s.op == op) {
            self.serve_state_chunk(from, offset_bytes);
            return;
        }
        if let Some(pending) = self.transfer_source_pending.as_mut() {
            if !pending.askers.contains(&from) {
                pending.askers.push(from);
            }
            return;
        }
        let Some(entry) = self.log.get(&self.commit).filter(|_| self.commit > 0) else {
            return;
        };
        let fields = prepare(&entry.header);
        let pending = PendingSource {
            op: self.commit,
            end_offset: fields.end_offset(),
            prepare_checksum: entry.header.checksum_header,
            producers: {
                let mut table = self.producers.clone();
                table.advance_to(self.commit);
                table.encode()
            },
            askers: vec![from],
        };
        if self.config.transfers_carry_driver_state {
            self.ready.committed.push(Committed::StateWanted { op: pending.op });
            self.transfer_source_pending = Some(pending);
        } else {
            self.transfer_source_pending = Some(pending);
            self.on_driver_state(self.commit, Some(Bytes::new()));
        }
    }

    /// The driver's answer to `Committed::StateWanted { op }`: its machine's state as of `op`,
    /// or `None` when it cannot give it (the peers that asked then hear nothing and ask
    /// another replica). The state is served to every peer that asked meanwhile. A state too
    /// big for a transfer is refused the same way.
    pub fn on_driver_state(&mut self, op: u64, state: Option<Bytes>) {
        let Some(pending) = self.transfer_source_pending.take_if(|p| p.op == op) else { return };
        let Some(state) = state else {
            self.counters.driver_states_refused += 1;
            return;
        };
        // Canary (DESIGN.md §7): serve the producer table alone.
        #[cfg(feature = "canary-transfer-drops-driver-state")]
        let state = {
            let _ = state;
            Bytes::new()
        };
        let bytes = transfer::encode_transfer_state(&pending.producers, &state);
        if bytes.len() > STATE_SIZE_BYTES_MAX {
            self.counters.driver_states_refused += 1;
            return;
        }
        self.transfer_source = Some(transfer::Outgoing::new(
            pending.op,
            pending.end_offset,
            pending.prepare_checksum,
            Bytes::from(bytes),
        ));
        if self.status != Status::Normal {
            return;
        }
        for asker in pending.askers {
            self.serve_state_chunk(asker, 0);
        }
    }

    /// Sends `to` the piece of the frozen state starting at `offset_bytes`.
    fn serve_state_chunk(&mut self, to: u8, offset_bytes: u64) {
        let source = self.transfer_source.as_ref().expect("served only once frozen");
        let Some(chunk) = source.chunk(offset_bytes, self.config.state_chunk_bytes_max) else {
            return;
        };
        let message = Message::StateChunk {
            view: self.view,
            op: source.op,
            end_offset: source.end_offset,
            size_bytes: source.state.len() as u64,
            offset_bytes,
            prepare_checksum: source.prepare_checksum,
            state_checksum: source.state_checksum,
            chunk,
        };
        self.counters.state_chunks_served += 1;
        self.send(to, message);
    }

    /// The member after `replica` in index order, wrapping (never this replica; any slot while
    /// this replica does not know its epoch's members). Slots past the members are skipped, so
    /// a group of three in a cluster of many never asks a node that holds none of it.
    fn next_peer(&self, replica: u8) -> u8 {
        let count = self.config.replica_count;
        let members = if self.members_known { self.config.members.members() } else { u32::MAX };
        let own = self.config.replica;
        (1..=count)
            .map(|step| ((u16::from(replica) + u16::from(step)) % u16::from(count)) as u8)
            .find(|&slot| slot != own && members & (1 << slot) != 0)
            .unwrap_or(own)
    }

    /// Requests for the lowest bodies the log lacks (at most `repair_prepares_max`, and at most
    /// `repair_bytes_max` by the sizes the known headers state, an unknown one counted as big
    /// as the newest prepare appended): by checksum where the header is known, as "the
    /// committed op" where it is not.
    fn missing_requests(&self) -> (Vec<Message>, u64) {
        let mut requests = Vec::new();
        let mut size_bytes = 0;
        // A prepare is at least its header, whatever is known.
        let unknown_size_bytes = self
            .log
            .get(&self.op_appended)
            .map_or(0, |entry| u64::from(entry.header.size))
            .max(self.recent_prepare_size_bytes)
            .max(HEADER_SIZE as u64);
        let last = self.op.max(self.commit_max);
        let mut op = self.op_appended + 1;
        while op <= last && requests.len() < self.config.repair_prepares_max {
            let (checksum, size) = match self.log.get(&op) {
                Some(entry) if entry.body.is_none() => {
                    (Some(Some(entry.header.checksum_header)), u64::from(entry.header.size))
                }
                Some(_) => (None, 0),
                None if op <= self.commit_max && !self.repaired.contains_key(&op) => {
                    (Some(None), unknown_size_bytes)
                }
                None => (None, 0),
            };
            if let Some(checksum) = checksum {
                if !requests.is_empty() && size_bytes + size > self.config.repair_bytes_max {
                    break;
                }
                size_bytes += size;
                requests.push(Message::RequestPrepare { view: self.view, op, checksum });
            }
            op += 1;
        }
        (requests, size_bytes)
    }

    fn on_request_prepare(&mut self, from: u8, op: u64, checksum: Option<u32>) {
        if self.status == Status::Recovering || op == 0 {
            return;
        }
        let wrong_checksum =
            |wanted: u32| self.log.get(&op).is_some_and(|e| e.header.checksum_header != wanted);
        match checksum {
            None if op > self.commit => return,
            Some(wanted) if wrong_checksum(wanted) => return,
            _ => {}
        }
        match self.log.get(&op) {
            Some(Entry { header, body: Some(body), .. }) => {
                let message = Message::Prepare { header: *header, body: body.clone() };
                self.send(from, message);
            }
            _ if op <= self.op_appended => {
                self.ready.reads.push(ServePrepare { to: from, op, checksum });
            }
            _ => {}
        }
    }

    // --- View change -----------------------------------------------------------------------

    fn start_view_change(&mut self, view: u32) {
        assert!(!self.is_learner(), "a learner never starts a view change");
        if epoch_of(view) != self.epoch() {
            // The epoch's views are used up: only a configuration change (from a StartView)
            // moves this replica on.
            return;
        }
        // Joining a higher view others voted for is allowed on one's own timeout.
        let fresh_max = self
            .votes
            .iter()
            .filter(|(_, (_, tick))| self.tick.saturating_sub(*tick) <= self.config.vote_ttl_ticks)
            .map(|(_, (voted, _))| *voted)
            .max()
            .unwrap_or(0);
        let view = view.max(fresh_max);
        assert!(view > self.log_view, "a view change moves past the log view");
        self.drop_hand_over();
        self.fail_pipeline();
        self.status = Status::ViewChange;
        self.view = view;
        self.do_view_change_sent = false;
        self.do_view_changes.clear();
        self.merge = None;
        let spread = self.rng.below(self.config.view_change_timeout_ticks / 2 + 1);
        self.view_change_deadline_tick = self.tick + self.config.view_change_timeout_ticks + spread;
        self.next_vote_tick = self.tick + self.config.commit_interval_ticks;
        self.counters.votes_cast += 1;
        self.votes.insert(self.config.replica, (view, self.tick));
        self.persist_views();
        self.send_vote(view);
        self.check_votes();
    }

    /// A StartViewChange to every other voter (a learner drops it unread).
    fn send_vote(&mut self, view: u32) {
        for to in self.voter_peers() {
            let membership = self.config.members;
            self.send(to, Message::StartViewChange { view, membership });
        }
    }

    fn repeat_vote(&mut self) {
        let view = self.view;
        self.votes.insert(self.config.replica, (view, self.tick));
        self.send_vote(view);
        let primary = self.config.primary_of(view);
        if self.do_view_change_sent && primary != self.config.replica {
            let message = self.build_do_view_change();
            self.send(primary, message);
        }
    }

    fn on_start_view_change(&mut self, from: u8, view: u32) {
        if self.votes.get(&from).is_none_or(|(voted, _)| *voted <= view) {
            self.votes.insert(from, (view, self.tick));
        }
        // The primary of this replica's view voted: it left the view (a hand-over, or a primary
        // that heard from no quorum) and serves it no more, so joining at once deposes nobody;
        // it only spares the group the heartbeat timeout. A vote from anyone else joins nothing.
        if self.status == Status::Normal
            && view > self.view
            && from == self.config.primary_of(self.view)
        {
            self.counters.abdications_joined += 1;
            self.start_view_change(view);
            return;
        }
        // Canary (DESIGN.md §7): join a view change on receipt, as the paper does, so a backup
        // cut off one way can depose a healthy primary.
        #[cfg(feature = "canary-join-on-receipt")]
        if self.status == Status::Normal && view > self.view {
            self.start_view_change(view);
            return;
        }
        // No joining on receipt: only a replica that voted on its own timeout counts votes.
        if self.status == Status::ViewChange && view == self.view {
            self.check_votes();
        }
    }

    fn check_votes(&mut self) {
        if self.status != Status::ViewChange || self.do_view_change_sent {
            return;
        }
        let view = self.view;
        let fresh = self
            .votes
            .iter()
            .filter(|(_, (voted, tick))| {
                *voted == view && self.tick.saturating_sub(*tick) <= self.config.vote_ttl_ticks
            })
            .count();
        let own = self.votes.get(&self.config.replica).is_some_and(|(v, _)| *v == view);
        if fresh < self.config.quorum() || !own {
            return;
        }
        self.do_view_change_sent = true;
        self.view_floor = self.view_floor.max(view);
        let primary = self.config.primary_of(view);
        let message = self.build_do_view_change();
        if primary == self.config.replica {
            self.accept_do_view_change(primary, message);
        } else {
            self.send(primary, message);
        }
    }

    /// This replica's log, as offered to the new primary.
    fn build_do_view_change(&self) -> Message {
        let (headers, flags) = self.headers_for_view();
        // Everything up to the change that opened this epoch is committed, bodies here or not:
        // the new voters may never have held it, so a nack quorum of them must not drop it.
        let epoch_start = self.epoch_start_op.unwrap_or(0).min(self.op);
        Message::DoViewChange {
            view: self.view,
            log_view: self.log_view,
            op: self.op,
            commit: self.commit_max.min(self.op_appended).max(epoch_start),
            faulty_from: self.faulty_from,
            log_complete: !self.needs_start_view,
            log_view_head_op: self.log_view_head_op,
            headers,
            flags,
        }
    }

    /// The top `view_headers_max` headers of the log with present/nack flags.
    fn headers_for_view(&self) -> (Vec<Header>, Vec<u8>) {
        let low = (self.op + 1).saturating_sub(self.config.view_headers_max as u64).max(1);
        let mut headers = Vec::new();
        let mut flags = Vec::new();
        if self.op == 0 {
            return (headers, flags);
        }
        // Only the chain that ends at the head: a log missing headers below it (a backup that
        // was repairing when the view changed) offers what it can vouch for, since a gap would
        // make every receiver, itself included, refuse the whole DoViewChange.
        let mut child: Option<&Header> = None;
        for (&op, entry) in self.log.range(low..=self.op).rev() {
            if child.is_some_and(|c| {
                prepare(c).op != op + 1 || prepare(c).parent != entry.header.checksum_header
            }) {
                break;
            }
            let present = op <= self.op_appended;
            let faulty = self.faulty_from.is_some_and(|from| op >= from);
            let committed = self.epoch_start_op.is_some_and(|start| op <= start);
            headers.push(entry.header);
            flags.push(if present {
                FLAG_PRESENT
            } else if faulty || committed {
                0
            } else {
                FLAG_NACK
            });
            child = Some(&entry.header);
        }
        headers.reverse();
        flags.reverse();
        (headers, flags)
    }

    /// Checks a DoViewChange (a peer's, or this replica's own) and hands it to the merge.
    fn accept_do_view_change(&mut self, from: u8, message: Message) {
        let Message::DoViewChange {
            view,
            log_view,
            op,
            commit,
            faulty_from,
            log_complete,
            log_view_head_op,
            headers,
            flags,
        } = message
        else {
            return;
        };
        if headers.len() != flags.len() || headers.len() > self.config.view_headers_max {
            return;
        }
        let Some(headers) = self.checked_headers(&headers, Some(&flags)) else { return };
        let dvc = DoViewChange {
            log_view,
            op,
            commit,
            faulty_from,
            log_complete,
            log_view_head_op,
            headers,
        };
        self.on_do_view_change(from, view, dvc);
    }

    fn on_do_view_change(&mut self, from: u8, view: u32, dvc: DoViewChange) {
        // A DoViewChange is also its sender's vote.
        if self.votes.get(&from).is_none_or(|(voted, _)| *voted <= view) {
            self.votes.insert(from, (view, self.tick));
        }
        if self.status != Status::ViewChange
            || view != self.view
            || self.config.primary_of(view) != self.config.replica
        {
            return;
        }
        self.do_view_changes.insert(from, dvc);
        self.check_votes();
        self.try_merge();
    }

    /// The new primary merges a quorum of DoViewChange (its own among them) into the log of
    /// the new view: the log of the highest log view, minus the ops a nack quorum proves were
    /// never committed. Waits (for more DoViewChange, or forever: unavailable beats wrong)
    /// while an op above the merged head could be neither proven dead nor found.
    fn try_merge(&mut self) {
        if self.merge.is_some()
            || !self.do_view_changes.contains_key(&self.config.replica)
            || self.do_view_changes.len() < self.config.quorum()
        {
            return;
        }
        let dvcs = &self.do_view_changes;
        let log_view = dvcs.values().map(|d| d.log_view).max().expect("quorum");
        let best = dvcs
            .values()
            .filter(|d| d.log_view == log_view)
            .max_by_key(|d| d.op)
            .expect("one has the highest log view");
        let mut canonical: BTreeMap<u64, Header> = BTreeMap::new();
        for dvc in dvcs.values().filter(|d| d.log_view == log_view) {
            for (&op, (header, _)) in &dvc.headers {
                let slot = canonical.entry(op).or_insert(*header);
                if header.view > slot.view {
                    *slot = *header;
                }
            }
        }
        // Committed ops belong to every later log, wherever they are found: a canonical
        // replica that restarted may know less of its view's log than another replica
        // committed.
        let committer = dvcs.values().max_by_key(|d| d.commit).expect("quorum");
        let commit_max = committer.commit;
        for (&op, (header, _)) in committer.headers.range(..=commit_max) {
            canonical.insert(op, *header);
        }
        let mut top = best.op.max(commit_max);
        let nack_quorum = self.config.nack_quorum();
        // The op above the merged head must be provably dead in both its possible forms, or
        // found: one prepared in the canonical log view or later (only replicas normal in that
        // view could have acknowledged it), and one of an older view that a replica with a
        // lower log view holds or may have lost (committed only if the canonical view's
        // starting log held it: a canonical replica that never restarted since knows that
        // log's headers, and any canonical replica that kept the log's head op knows whether
        // it reaches that far). An older form that cannot be refuted is found instead when its
        // holders can be trusted to have it (see `older_form`), and the walk goes on above it.
        loop {
            let unknown = top + 1;
            let newer_nacks = dvcs
                .values()
                .filter(|d| d.log_view < log_view || (!d.faulty(unknown) && d.op < unknown))
                .count();
            let older_possible = dvcs
                .values()
                .any(|d| d.log_view < log_view && (d.faulty(unknown) || d.op >= unknown));
            let refuted = dvcs.values().any(|d| {
                d.log_view == log_view
                    && (d.log_complete || d.log_view_head_op.is_some_and(|head| head < unknown))
            });
            #[cfg(feature = "canary-refute-any-head")]
            let refuted = refuted
                || dvcs.values().any(|d| d.log_view == log_view && d.log_view_head_op.is_some());
            // Whatever its view, no op there committed if a nack quorum of senders lacks the
            // op outright (not faulty there): none of them ever acknowledged one.
            let lacking = dvcs.values().filter(|d| !d.faulty(unknown) && d.op < unknown).count();
            if newer_nacks >= nack_quorum {
                if !older_possible || refuted || lacking >= nack_quorum {
                    break;
                }
                if let Some(header) = self.older_form(log_view, unknown, canonical.get(&top)) {
                    self.counters.older_ops_found += 1;
                    canonical.insert(unknown, header);
                    top = unknown;
                    continue;
                }
            }
            if !self.config.unclean_recovery {
                self.counters.merges_stalled += 1;
                return;
            }
            self.counters.unclean_ops_lost += 1;
            break;
        }
        let dvcs = &self.do_view_changes;
        let nacks =
            |op: u64, header: &Header| dvcs.values().filter(|d| d.nacks(op, Some(header))).count();
        while top > commit_max {
            let Some(header) = canonical.get(&top) else {
                // Neither known nor provably dead: wait.
                self.counters.merges_stalled += 1;
                return;
            };
            let count = nacks(top, header);
            #[cfg(feature = "canary-nack-faulty")]
            let count = count.max(dvcs.values().filter(|d| d.faulty(top)).count());
            if count < nack_quorum {
                break;
            }
            self.counters.ops_nacked += 1;
            top -= 1;
        }
        let canonical: BTreeMap<u64, Header> =
            canonical.into_iter().filter(|(op, _)| *op <= top).collect();
        self.commit_max = self.commit_max.max(commit_max.min(top));
        self.adopt_log(&canonical, top);
        self.merge = Some(Merge { op: top, next_fetch_tick: self.tick });
        self.fetch_for_view();
        self.maybe_start_view();
    }

    /// The older-view op at `op` that the merge may take although no canonical replica can
    /// refute it (DESIGN.md §4: found, not proven dead): the header the replica of the highest
    /// log view below `log_view` holds there. `None` (wait) unless those holders can be
    /// trusted to have it: an op committed before `log_view` began was acknowledged by a
    /// quorum; every DoViewChange sender that is not faulty at `op` and lacks it never
    /// acknowledged any op there, and a canonical one holding it would have raised the
    /// merged head; so unless the faulty senders and the replicas not heard from could make
    /// that quorum alone, a sender of a lower log view acknowledged it and still holds it —
    /// and the holder of the highest lower log view holds the same op (its log view's log
    /// took the committed op, or it is the view the op committed in). It must also continue
    /// `parent`, the merged header below it.
    fn older_form(&self, log_view: u32, op: u64, parent: Option<&Header>) -> Option<Header> {
        let dvcs = &self.do_view_changes;
        let faulty = dvcs.values().filter(|d| d.faulty(op)).count();
        let unheard = self.config.voter_count() - dvcs.len();
        // Canary (DESIGN.md §7): trust the holder whoever may have committed something else.
        if faulty + unheard >= self.config.quorum() && !cfg!(feature = "canary-find-trusts-faulty")
        {
            return None;
        }
        let holders = dvcs.values().filter(|d| d.log_view < log_view && d.op >= op);
        let highest = holders.clone().map(|d| d.log_view).max()?;
        let header = holders
            .filter(|d| d.log_view == highest)
            .filter_map(|d| d.headers.get(&op).map(|(header, _)| *header))
            .max_by_key(|header| header.view)?;
        let parent = parent?;
        (prepare(&header).parent == parent.checksum_header).then_some(header)
    }

    /// Makes the log agree with `canonical` (headers of the new view's log, ending at `top`):
    /// cuts the divergent suffix durably, keeps what agrees, and records headers still
    /// lacking bodies.
    fn adopt_log(&mut self, canonical: &BTreeMap<u64, Header>, top: u64) {
        // The highest op this replica holds that belongs to the canonical log: what matches a
        // canonical header (the chain vouches for everything below it), what links to the
        // lowest canonical header, and the committed prefix; anything unverifiable goes.
        let mut keep = self.op_appended.min(top);
        let low = canonical.keys().next().copied();
        // Only an unclean view may have given up committed ops (see `on_start_view`).
        let floor = if self.config.unclean_recovery { 0 } else { self.commit };
        while keep > floor {
            let ours = self.log.get(&keep).map(|e| e.header.checksum_header);
            match canonical.get(&keep) {
                Some(theirs) if Some(theirs.checksum_header) == ours => break,
                Some(_) => keep -= 1,
                None => {
                    let links = low.is_some_and(|low| {
                        keep + 1 == low && ours == Some(prepare(&canonical[&low]).parent)
                    });
                    if !links {
                        // Clean: the committed prefix is in every later log. Unclean: nothing
                        // below the canonical headers can be vouched for.
                        keep = floor;
                    }
                    break;
                }
            }
        }
        if keep < self.op_appended {
            let removed_view_max = self
                .log
                .range(keep + 1..=self.op_appended)
                .map(|(_, e)| e.header.view)
                .max()
                .unwrap_or(0);
            // Newer than every removed prepare, so a crash before the cut is durable kills them
            // all; the engine lets anything appended after the cut through, whatever its view.
            let fence_view = removed_view_max + 1;
            if keep < self.commit {
                if !self.config.unclean_recovery {
                    fatal!(self, "truncating below the commit point {}", self.commit);
                }
                // The documented loss of an unclean recovery: this replica committed ops the
                // group gave up. It follows the group instead of staying out of it for good.
                self.counters.unclean_ops_lost += self.commit - keep;
                self.commit = keep;
                self.commit_max = keep;
            }
            self.counters.truncations += 1;
            self.ready.writes.push(Write::Truncate { op: keep, view: fence_view });
            self.op_appended = keep;
            self.op_durable = self.op_durable.min(keep);
        }
        // Entries above what we keep: replaced by the canonical headers (bodies kept on match).
        let above: Vec<u64> = self.log.range(keep + 1..).map(|(&op, _)| op).collect();
        for op in above {
            let entry = self.log.remove(&op).expect("listed");
            if let Some(header) = canonical.get(&op)
                && header.checksum_header == entry.header.checksum_header
            {
                self.log.insert(op, entry);
            }
        }
        for (&op, header) in canonical.range(keep + 1..) {
            self.log.entry(op).or_insert(Entry::header_only(*header));
        }
        self.op = top.max(keep);
        self.append_ready_bodies();
    }

    /// The new primary asks for every body its merged log lacks.
    fn fetch_for_view(&mut self) {
        let Some(merge) = &mut self.merge else { return };
        if self.tick < merge.next_fetch_tick {
            return;
        }
        merge.next_fetch_tick = self.tick + self.config.repair_interval_ticks;
        for message in self.missing_requests().0 {
            self.counters.repairs_requested += 1;
            for to in self.peers() {
                self.send(to, message.clone());
            }
        }
    }

    /// Once the merged log is whole, the new primary persists its log view and sends
    /// StartView (held by [`Replica::send`] until the log view is durable).
    fn maybe_start_view(&mut self) {
        let Some(merge) = &self.merge else { return };
        #[cfg(feature = "canary-skip-body-fetch")]
        let whole = true;
        #[cfg(not(feature = "canary-skip-body-fetch"))]
        let whole = self.op_appended >= merge.op;
        if !whole {
            return;
        }
        let top = merge.op;
        self.merge = None;
        self.counters.views_started += 1;
        self.status = Status::Normal;
        self.log_view = self.view;
        self.log_view_head_op = Some(top);
        self.faulty_from = None;
        self.needs_start_view = false;
        self.votes.clear();
        self.persist_views();
        self.pipeline.clear();
        let retry_ticks = self.config.prepare_retry_ticks_min;
        for op in self.commit_max + 1..=top {
            let in_flight = InFlight {
                acks: 0,
                next_retry_tick: self.tick,
                retry_ticks,
                request: None,
                duplicates: Vec::new(),
            };
            self.pipeline.insert(op, in_flight);
        }
        self.last_heard_tick.fill(self.tick);
        self.lag.start_view(self.tick);
        self.next_commit_tick = self.tick;
        self.commit_up_to(self.commit_max);
        let message = self.build_start_view(0);
        for to in self.peers() {
            self.send(to, message.clone());
        }
        self.primary_commit();
    }

    fn build_start_view(&self, nonce: u64) -> Message {
        let (headers, _) = self.headers_for_view();
        Message::StartView {
            view: self.view,
            op: self.op,
            commit: self.commit,
            nonce,
            headers,
            membership: self.config.members,
        }
    }

    fn on_start_view(
        &mut self,
        from: u8,
        view: u32,
        op: u64,
        commit: u64,
        nonce: u64,
        headers: BTreeMap<u64, (Header, u8)>,
    ) {
        // A newer epoch's opening may come from any of its members (`answer_older_epoch`).
        if from != self.config.primary_of(view) && !self.is_epoch_opening(view, op, commit) {
            return;
        }
        // A view at or above this replica's; or, out of normal status, one below it that is
        // newer than its log and not below any view it sent a DoViewChange for.
        let lower_allowed =
            self.status != Status::Normal && view > self.log_view && view >= self.view_floor;
        if view < self.view && !lower_allowed {
            return;
        }
        if self.status == Status::Normal && view == self.view {
            return;
        }
        // A view's log holds every committed op: one that ends below this replica's commit
        // point, or whose headers do not end at its op, is not a StartView to trust.
        if !self.start_view_sound(op, commit, nonce, &headers) {
            return;
        }
        let canonical: BTreeMap<u64, Header> =
            headers.into_iter().map(|(op, (h, _))| (op, h)).collect();
        self.drop_hand_over();
        self.fail_pipeline();
        self.counters.start_views_installed += 1;
        self.status = Status::Normal;
        self.enter_view_log(view, op);
        self.persist_views();
        self.faulty_clear_op = Some(op);
        self.adopt_log(&canonical, op);
        self.commit_max = self.commit_max.max(commit);
        self.arm_heartbeat();
        self.commit_up_to(self.commit_max);
        if self.is_primary() {
            // A newer epoch's opening, handed on by another member, names this replica its
            // first primary, which never started it: a view change moves the epoch on.
            self.start_view_change(self.view + 1);
            return;
        }
        self.acknowledge_head();
        self.repair_target = self.config.primary_of(view);
        self.repair_round = None;
        self.repair_asked_tick = None;
        self.repair();
    }

    fn on_request_start_view(&mut self, from: u8, view: u32, nonce: u64) {
        if !self.is_primary() {
            return;
        }
        if view > self.view && self.config.is_voter(from) {
            // The asker is bound to a later view (it sent a DoViewChange for it, or restarted
            // there) and so can never serve in this one: move the group to that view, or it
            // stays out of every quorum for good. It heard this primary or probed it, so a
            // backup merely cut off from the primary cannot cause this; the other members join
            // on their own heartbeat timeouts, as for any view change.
            self.counters.views_yielded += 1;
            self.start_view_change(view);
            return;
        }
        let message = self.build_start_view(nonce);
        self.send(from, message);
    }

    /// Asks the primary `to` of an earlier view to move the group to this replica's view.
    fn request_view_at_least(&mut self, to: u8) {
        if self.tick < self.next_request_start_view_tick {
            return;
        }
        self.next_request_start_view_tick = self.tick + self.config.repair_interval_ticks;
        let (view, nonce) = (self.view, self.boot_nonce);
        self.send(to, Message::RequestStartView { view, nonce });
    }

    fn request_start_view(&mut self, view: u32) {
        if self.tick < self.next_request_start_view_tick {
            return;
        }
        self.next_request_start_view_tick = self.tick + self.config.repair_interval_ticks;
        let nonce = self.boot_nonce;
        self.send(self.config.primary_of(view), Message::RequestStartView { view, nonce });
    }

    // --- Helpers ---------------------------------------------------------------------------

    /// The one send chokepoint: a message leaves now only when everything it reveals is
    /// durable; otherwise it waits in `persisted_messages` for the writes issued so far.
    fn send(&mut self, to: u8, message: Message) {
        debug_assert_ne!(to, self.config.replica);
        let reveals_durable = match &message {
            Message::PrepareOk { op, .. } => *op <= self.op_durable && self.views_durable(),
            Message::StartViewChange { .. }
            | Message::DoViewChange { .. }
            | Message::StartView { .. }
            | Message::Commit { .. } => self.views_durable(),
            // A prepare of this view reveals the view; a relayed older one reveals nothing new.
            Message::Prepare { header, .. } => header.view != self.view || self.views_durable(),
            // A state is as of a commit point: a quorum holds it durably.
            Message::RequestStartView { .. }
            | Message::RequestPrepare { .. }
            | Message::RangeEvicted { .. }
            | Message::RequestState { .. }
            | Message::StateChunk { .. } => true,
        };
        #[cfg(feature = "canary-send-before-persist")]
        let reveals_durable = reveals_durable || matches!(message, Message::PrepareOk { .. });
        let envelope = Envelope { from: self.config.replica, to, message };
        if reveals_durable {
            self.ready.messages.push(envelope);
        } else {
            self.ready.persisted_messages.push(envelope);
        }
    }

    /// Takes `view` as both view and log view, its log beginning with head `op`, and forgets the
    /// view change that led here.
    fn enter_view_log(&mut self, view: u32, op: u64) {
        self.view = view;
        self.log_view = view;
        self.log_view_head_op = Some(op);
        self.merge = None;
        self.needs_start_view = false;
        self.do_view_change_sent = false;
        self.do_view_changes.clear();
        self.votes.clear();
    }

    fn views_durable(&self) -> bool {
        self.view_durable >= self.view && self.log_view_durable >= self.log_view
    }

    fn persist_views(&mut self) {
        self.view_promised = self.view_promised.max(self.view);
        self.ready.writes.push(Write::Views {
            view: self.view_promised,
            log_view: self.log_view,
            log_view_head_op: self.log_view_head_op,
        });
    }

    fn enter_normal_as_is(&mut self) {
        self.status = Status::Normal;
        self.arm_heartbeat();
        self.last_heard_tick.fill(self.tick);
        self.lag.start_view(self.tick);
    }

    fn arm_heartbeat(&mut self) {
        let spread = self.rng.below(self.config.heartbeat_timeout_ticks / 2 + 1);
        self.heartbeat_deadline_tick = self.tick + self.config.heartbeat_timeout_ticks + spread;
    }

    /// A primary leaving its view with a hand-over still waiting for its target gives it up.
    fn drop_hand_over(&mut self) {
        if self.hand_over.take().is_some() {
            self.counters.hand_overs_abandoned += 1;
        }
    }

    /// Answers every request of the pipeline that may still commit with "outcome unknown" (a
    /// view change; or the driver stopping or replacing this replica, which would take no more
    /// input to answer them: collected by [`Replica::take_ready`]).
    pub fn fail_pipeline(&mut self) {
        for (_, in_flight) in std::mem::take(&mut self.pipeline) {
            for (client, request) in in_flight.request.into_iter().chain(in_flight.duplicates) {
                let result = ReplyResult::TransientNotCommitted;
                self.ready.replies.push(Reply { client, request, result });
            }
        }
    }

    /// The producer rules for `batch` against the committed table with the uncommitted log
    /// laid over it: a retry of a batch still in the pipeline is a duplicate too, and the next
    /// sequence follows the newest batch whether committed or not. Ops the table already holds
    /// (a snapshot taken past the recovered commit point) are not laid over twice.
    fn check_producer(&self, batch: &ProducerBatch, now_ms: i64) -> Check {
        // Canary (DESIGN.md §7): every idempotent batch counts as new, so a retry is applied
        // again.
        #[cfg(feature = "canary-no-dedup")]
        if batch.producer_id >= 0 {
            return Check::New;
        }
        let mut state = self.producers.state(batch.producer_id, now_ms);
        let from = self.commit.max(self.producers.op()) + 1;
        for (&op, entry) in self.log.range(from..) {
            let Some(b) = entry.producer.filter(|b| b.producer_id == batch.producer_id) else {
                continue;
            };
            let fields = prepare(&entry.header);
            state.get_or_insert_with(|| producers::ProducerState::new(b.epoch, now_ms)).record(
                &b,
                op,
                fields.base_offset,
                fields.append_time_ms,
            );
        }
        producers::check(state.as_ref(), batch)
    }

    /// Answers a retried batch: at once when its op is committed, when that op commits while it
    /// is in the pipeline.
    fn answer_duplicate(&mut self, client: u64, request: u64, op: u64, base_offset: u64) {
        if op <= self.commit {
            let result = ReplyResult::Committed { op, base_offset };
            self.ready.replies.push(Reply { client, request, result });
            return;
        }
        match self.pipeline.get_mut(&op) {
            Some(in_flight) if in_flight.duplicates.len() < DUPLICATES_WAITING_MAX => {
                in_flight.duplicates.push((client, request));
            }
            _ => {
                let result = ReplyResult::TransientNotAccepted;
                self.ready.replies.push(Reply { client, request, result });
            }
        }
    }

    /// The first of the next ticks (1: the next) at which [`Replica::quorum_in_touch`] fails,
    /// were no peer heard from in between; `u64::MAX` when it never would.
    fn quorum_lost_in_ticks(&self) -> u64 {
        let needed = self.config.quorum().saturating_sub(1);
        if needed == 0 {
            return u64::MAX;
        }
        // The last of the next ticks at which each voter peer still counts as in touch.
        let mut fresh_until: Vec<u64> = self
            .voter_peers()
            .map(|r| self.in_touch_through_tick(r).saturating_sub(self.tick))
            .collect();
        if fresh_until.len() < needed {
            return 1;
        }
        fresh_until.sort_unstable_by(|a, b| b.cmp(a));
        fresh_until[needed - 1] + 1
    }

    fn quorum_in_touch(&self) -> bool {
        let fresh =
            self.voter_peers().filter(|&r| self.in_touch_through_tick(r) >= self.tick).count();
        fresh + 1 >= self.config.quorum()
    }

    /// The last tick at which peer `r` counts as in touch: a heartbeat timeout after it was
    /// last heard from. [`Replica::quorum_in_touch`] and [`Replica::quorum_lost_in_ticks`] both
    /// read it, so they cannot disagree on what "in touch" means.
    fn in_touch_through_tick(&self, r: u8) -> u64 {
        self.last_heard_tick[usize::from(r)].saturating_add(self.config.heartbeat_timeout_ticks)
    }

    /// Hands the driver every body that now continues the appended chain.
    fn append_ready_bodies(&mut self) {
        loop {
            let next = self.op_appended + 1;
            let (header, body) = match self.log.get(&next) {
                Some(Entry { header, body: Some(body), .. }) => (*header, body.clone()),
                Some(Entry { body: None, .. }) => break,
                None => {
                    let Some((header, body)) = self.repaired.remove(&next) else { break };
                    if !self.links_to_appended(&header) {
                        // Not the committed op after ours: a peer's divergent answer.
                        continue;
                    }
                    self.log.insert(next, Entry::with_body(header, body.clone()));
                    self.op = self.op.max(next);
                    (header, body)
                }
            };
            if !self.links_to_appended(&header) {
                // Headers a peer sent that do not continue what this replica holds: forget
                // them (network input never panics); a StartView or repair brings the log again.
                self.counters.chain_mismatches += 1;
                self.log.retain(|&op, _| op < next);
                self.op = self.op_appended;
                break;
            }
            self.op_appended = next;
            self.recent_prepare_size_bytes = u64::from(header.size);
            self.ready.writes.push(Write::Append { header, body });
        }
        let appended = self.op_appended;
        self.repaired.retain(|&op, _| op > appended);
        if self.status == Status::Normal
            && self.faulty_clear_op.is_some_and(|op| self.op_appended >= op)
        {
            self.faulty_from = None;
            self.faulty_clear_op = None;
        }
    }

    fn links_to_appended(&self, header: &Header) -> bool {
        self.links_after(self.op_appended, header)
    }

    /// Whether `header` continues the log's head.
    fn log_links(&self, header: &Header) -> bool {
        self.links_after(self.op, header)
    }

    /// Whether `header` is the op after `op` in this log: it names `op`'s checksum as its
    /// parent and starts at the offset after `op`'s batch.
    fn links_after(&self, op: u64, header: &Header) -> bool {
        let fields = prepare(header);
        match self.log.get(&op) {
            Some(prev) => {
                let p = prepare(&prev.header);
                fields.parent == prev.header.checksum_header && fields.base_offset == p.end_offset()
            }
            None => op == 0 && fields.parent == 0 && fields.base_offset == 0,
        }
    }

    /// The parent checksum and base offset of the next op.
    fn next_link(&self) -> (u32, u64) {
        match self.log.get(&self.op) {
            Some(prev) => {
                let p = prepare(&prev.header);
                (prev.header.checksum_header, p.end_offset())
            }
            None => {
                assert_eq!(self.op, 0, "the head header is always held");
                (0, 0)
            }
        }
    }

    fn checksum_at(&self, op: u64) -> u32 {
        if op == 0 {
            return 0;
        }
        self.log.get(&op).map_or(0, |entry| entry.header.checksum_header)
    }

    /// Drops headers far below the head; keeps everything above the commit point.
    fn prune(&mut self) {
        let floor =
            self.commit.min((self.op + 1).saturating_sub(2 * self.config.view_headers_max as u64));
        while let Some((&op, _)) = self.log.first_key_value() {
            if op >= floor {
                break;
            }
            self.log.pop_first();
        }
    }

    fn window_ops(&self) -> u64 {
        2 * self.config.view_headers_max as u64
    }

    fn is_learner(&self) -> bool {
        !self.config.is_voter(self.config.replica)
    }

    /// Asks every voter for the view it is in (a learner's way back into the group's view, and
    /// a restarted replica's); only a primary answers. A replica that does not know its
    /// epoch's members asks every slot.
    fn probe_voters(&mut self) {
        let (view, nonce) = (self.view, self.boot_nonce);
        let own = self.config.replica;
        let targets: Vec<u8> = if self.members_known {
            self.voter_peers().collect()
        } else {
            (0..self.config.replica_count).filter(|&r| r != own).collect()
        };
        for to in targets {
            self.send(to, Message::RequestStartView { view, nonce });
        }
    }

    /// The other voters.
    fn voter_peers(&self) -> impl Iterator<Item = u8> + use<> {
        let own = self.config.replica;
        self.config.members.voter_indices().filter(move |&r| r != own)
    }

    /// The other members, voters and learners.
    fn peers(&self) -> impl Iterator<Item = u8> + use<> {
        let own = self.config.replica;
        self.config.members.member_indices().filter(move |&r| r != own)
    }

    fn peer_bits(&self) -> u32 {
        self.peers().fold(0, |bits, r| bits | (1 << r))
    }

    /// Validates received headers: prepares of this cluster and group, ascending, contiguous,
    /// chained; flags with known bits only.
    fn checked_headers(
        &self,
        headers: &[Header],
        flags: Option<&[u8]>,
    ) -> Option<BTreeMap<u64, (Header, u8)>> {
        let mut map = BTreeMap::new();
        let mut previous: Option<&Header> = None;
        for (index, header) in headers.iter().enumerate() {
            let fields = header.as_prepare()?;
            if header.cluster != self.config.cluster || fields.group != self.config.group {
                return None;
            }
            if let Some(prev) = previous
                && (prepare(prev).op + 1 != fields.op || fields.parent != prev.checksum_header)
            {
                return None;
            }
            let flag = flags.map_or(0, |f| f[index]);
            if flag & !(FLAG_PRESENT | FLAG_NACK) != 0 {
                return None;
            }
            map.insert(fields.op, (*header, flag));
            previous = Some(header);
        }
        Some(map)
    }
}

fn prepare(header: &Header) -> &Prepare {
    header.as_prepare().expect("log entries are prepares")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Skipping ticks leaves a one-replica primary as ticking it each time would: its tick and
    /// its commit timer, from any phase of that timer, for any stretch, one tick included.
    #[test]
    fn skipped_ticks_leave_the_replica_as_ticking_would() {
        for interval in [1, 3, 10] {
            let config = ReplicaConfig {
                commit_interval_ticks: interval,
                idle_heartbeat_interval_ticks: interval,
                ..ReplicaConfig::new(1, 0, 1, 0)
            };
            for before in 0..12 {
                for skipped in 0..25 {
                    let mut ticking = Replica::new(config, 7);
                    for _ in 0..before {
                        ticking.on_tick();
                    }
                    let mut skipping = Replica::new(config, 7);
                    for _ in 0..before {
                        skipping.on_tick();
                    }
                    assert_eq!(ticking.ticks_only_counting(), u64::MAX);
                    for _ in 0..skipped {
                        ticking.on_tick();
                    }
                    skipping.skip_ticks(skipped);
                    let case = format!("interval {interval}, {before} then {skipped}");
                    assert_eq!(skipping.tick, ticking.tick, "{case}");
                    assert_eq!(skipping.next_commit_tick, ticking.next_commit_tick, "{case}");
                }
            }
        }
    }

    /// Only a one-replica primary's ticks count until an input; a replica with peers has
    /// timers (heartbeats sent or awaited) that end its counting ticks.
    #[test]
    fn only_a_one_replica_primary_counts_ticks_until_an_input() {
        assert_eq!(Replica::new(ReplicaConfig::new(1, 0, 1, 0), 7).ticks_only_counting(), u64::MAX);
        assert!(Replica::new(ReplicaConfig::new(1, 0, 3, 0), 7).ticks_only_counting() < u64::MAX);
        assert!(Replica::new(ReplicaConfig::new(1, 1, 3, 0), 7).ticks_only_counting() < u64::MAX);
    }
}
