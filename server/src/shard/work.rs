//! What a shard's inbox carries and what it answers: the [`Work`] items connections and other
//! shards send, the reply slot each answers through, the [`Outcome`] it gets, and how a
//! replica's reply or the node's refusal becomes one.
//!
//! It holds no state and never touches a node or a log: the shard's jobs do the work.

use std::sync::Arc;

use bytes::Bytes;

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_proto::protocol::consumer::{ConsumerId, GroupMember, JoinGroup, OffsetCommitRecord};
use shoal_proto::protocol::{ErrorCode, FetchFrom, NODE_UNKNOWN, ProduceReply};
use shoal_proto::wire::ClientRequest;
use shoal_replication::{
    GroupStatus, LogStats, Replica, ReplicaState, ReplyResult, Request, RequestRefused, Status,
    TICK_MS,
};

use crate::kafka_groups::{GroupAnswer, GroupDescription, GroupState, Join, Sync};
use crate::metadata::{Catalog, MetaCommand};
use crate::metrics::ShardSnapshot;

/// The answer to one request: an error code (`0`: success) and the reply body.
#[derive(Debug)]
pub struct Outcome {
    /// `0` or an [`ErrorCode`].
    pub error: u32,
    /// The result, or the error's text.
    pub body: Body,
}

/// A reply body. A produce result travels unencoded, so the hot path allocates no buffer for
/// it: the connection's writer encodes it into its reused frame buffer.
#[derive(Debug)]
pub enum Body {
    /// Bytes already encoded.
    Encoded(Vec<u8>),
    /// A produce result.
    Produce(ProduceReply),
    /// A body sent as these parts in order, each written from where it lies (a fetch reply:
    /// its prefix, then the stored batches as views of the ring or the read buffer).
    Parts(Vec<Bytes>),
    /// A `NotPrimary` error: the connection's writer encodes it for the version the connection
    /// speaks (the structured body from version 3 on, with the primary's client address from
    /// the node's config; the text alone before).
    NotPrimary {
        /// The view of the refusing replica.
        view: u32,
        /// The primary of that view.
        primary: u8,
    },
}

impl Outcome {
    /// A success with this body.
    pub fn ok(body: Vec<u8>) -> Outcome {
        Outcome { error: 0, body: Body::Encoded(body) }
    }

    /// A success whose body is `parts`, one after the other.
    pub fn parts(parts: Vec<Bytes>) -> Outcome {
        Outcome { error: 0, body: Body::Parts(parts) }
    }

    /// A produce success.
    pub fn produced(reply: ProduceReply) -> Outcome {
        Outcome { error: 0, body: Body::Produce(reply) }
    }

    /// An error with its text.
    pub fn error(code: ErrorCode, text: impl Into<String>) -> Outcome {
        Outcome { error: code as u32, body: Body::Encoded(text.into().into_bytes()) }
    }

    /// A `NotPrimary` error naming the primary of `view`.
    pub fn not_primary(view: u32, primary: u8) -> Outcome {
        Outcome { error: ErrorCode::NotPrimary as u32, body: Body::NotPrimary { view, primary } }
    }

    /// An error's text (empty for a success's body).
    pub fn text(&self) -> String {
        match &self.body {
            Body::Encoded(bytes) if self.error != 0 => String::from_utf8_lossy(bytes).into_owned(),
            Body::NotPrimary { view, primary } => Body::not_primary_text(*view, *primary),
            _ => String::new(),
        }
    }
}

impl Body {
    /// The text of a `NotPrimary` error, the whole body before version 3.
    pub fn not_primary_text(view: u32, primary: u8) -> String {
        format!("replica {primary} leads view {view}")
    }
}

/// Where a request's answer goes: the waiting connection.
pub type ReplySender = flume::Sender<Outcome>;

/// Where a fetch starts, resolved on the owning shard.
#[derive(Clone, Copy, Debug)]
pub struct FetchArgs {
    /// Partition index (for the reply).
    pub partition: u32,
    /// Start.
    pub from: FetchFrom,
    /// Byte limit; the first batch always comes whatever it says, except at 0: the offsets only
    /// (the Kafka path's partitions past a response's budget; native clients ask for 1 at least).
    pub bytes_max: u32,
    /// Record limit.
    pub count_max: u32,
    /// Long-poll: how long to wait for data when nothing committed is at the start yet.
    pub wait_ms_max: u32,
}

/// A partition's figures, for describe and status.
#[derive(Clone, Copy, Debug)]
pub struct GroupStats {
    /// First offset held.
    pub first_offset: u64,
    /// Log end offset.
    pub next_offset: u64,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// The view this node's replica of the group is in.
    pub view: u32,
    /// The node this replica believes leads the group ([`NODE_UNKNOWN`] while it is in a view
    /// change or recovering).
    pub primary: u8,
}

impl Default for GroupStats {
    fn default() -> Self {
        GroupStats {
            first_offset: 0,
            next_offset: 0,
            size_bytes: 0,
            view: 0,
            primary: NODE_UNKNOWN,
        }
    }
}

impl GroupStats {
    /// The figures of a group from its log's and its replica's, where the shard holds them.
    pub fn of(log: Option<LogStats>, replica: Option<&Replica>) -> GroupStats {
        let mut stats = GroupStats::default();
        if let Some(log) = log {
            stats.first_offset = log.first_offset;
            stats.next_offset = log.next_offset;
            stats.size_bytes = log.size_bytes;
        }
        if let Some(replica) = replica {
            stats.view = replica.view();
            if replica.status() == Status::Normal {
                stats.primary = replica.config().primary_of(replica.view());
            }
        }
        stats
    }
}

/// One group as this node's replica of it sees it, for status: its view and status, the
/// primary, and (on the primary only) every replica's progress.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupReport {
    /// The group (0: the metadata group).
    pub group: u64,
    /// The replica's view.
    pub view: u32,
    /// `normal`, `view_change` or `recovering`.
    pub status: &'static str,
    /// The node leading the view, when the replica is normal.
    pub primary: Option<u8>,
    /// The highest op the replica applied.
    pub commit_op: u64,
    /// Its head op.
    pub head_op: u64,
    /// Every replica's state, when this one is the group's serving primary; empty otherwise.
    pub replicas: Vec<ReplicaReport>,
    /// The voters of the replica's configuration, as it knows them.
    pub voters: Vec<u8>,
    /// Its learners.
    pub learners: Vec<u8>,
}

/// One replica of a group as its primary sees it.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct ReplicaReport {
    /// The replica (its node).
    pub node: u8,
    /// `primary`, `in_sync`, `lagging` or `dead`.
    pub state: &'static str,
    /// The highest op it acknowledged in this view.
    pub acknowledged_op: u64,
    /// Ops its acknowledgements trail the primary's head.
    pub lag_ops: u64,
    /// Milliseconds since it was last caught up.
    pub lag_ms: u64,
    /// Milliseconds since the primary last heard from it.
    pub silent_ms: u64,
}

impl GroupReport {
    /// What `replica` reports of its group (replica states only on the serving primary), with
    /// `status` as the node reads it (`Node::group_status`).
    pub fn of(replica: &Replica, status: GroupStatus) -> GroupReport {
        let replicas = status
            .replicas
            .iter()
            .map(|progress| ReplicaReport {
                node: progress.replica,
                state: match progress.state {
                    ReplicaState::Primary => "primary",
                    ReplicaState::InSync => "in_sync",
                    ReplicaState::Lagging => "lagging",
                    ReplicaState::Dead => "dead",
                },
                acknowledged_op: progress.acknowledged_op,
                lag_ops: status.head.saturating_sub(progress.acknowledged_op),
                lag_ms: progress.lag_ticks * TICK_MS,
                silent_ms: progress.silent_ticks * TICK_MS,
            })
            .collect();
        GroupReport {
            group: status.group,
            view: status.view,
            status: match status.status {
                Status::Normal => "normal",
                Status::ViewChange => "view_change",
                Status::Recovering => "recovering",
                Status::Removed => "removed",
            },
            primary: (status.status == Status::Normal)
                .then(|| replica.config().primary_of(status.view)),
            commit_op: status.commit,
            head_op: status.head,
            replicas,
            voters: replica.config().members.voter_indices().collect(),
            learners: replica.config().members.learner_indices().collect(),
        }
    }
}

/// Something for a shard's loop to do.
pub enum Work {
    /// Append a validated batch to a partition group owned here.
    Produce {
        /// The group.
        group: u64,
        /// The partition (for the reply).
        partition: u32,
        /// The write.
        request: Request,
        /// The answer.
        reply: ReplySender,
    },
    /// Read from a partition group owned here.
    Fetch {
        /// The group.
        group: u64,
        /// What to read.
        args: FetchArgs,
        /// The answer.
        reply: ReplySender,
    },
    /// A metadata change (shard 0 only).
    Metadata {
        /// The request's header fields (client and request number go into the log).
        client: ClientRequest,
        /// The change.
        command: MetaCommand,
        /// The answer.
        reply: ReplySender,
    },
    /// A new catalog: create the partition groups it places here.
    Catalog(Arc<Catalog>),
    /// Report these groups' figures.
    Stats {
        /// The groups.
        groups: Vec<u64>,
        /// The answer.
        reply: flume::Sender<Vec<(u64, GroupStats)>>,
    },
    /// Store or delete a consumer's offset in a partition group owned here (a control record
    /// in the group's log).
    StoreOffset {
        /// The group.
        group: u64,
        /// The request's header fields (the commit is a write of this client's).
        client: ClientRequest,
        /// The commit.
        record: OffsetCommitRecord,
        /// The answer.
        reply: ReplySender,
    },
    /// Move a partition group's log start up (Kafka's DeleteRecords; a control record in the
    /// group's log): answered with the log start (u64 LE) once committed.
    DeleteRecords {
        /// The group.
        group: u64,
        /// The request's header fields (a write of this client's).
        client: ClientRequest,
        /// The new log start; `None`: the committed end (Kafka's −1).
        offset: Option<u64>,
        /// The answer.
        reply: ReplySender,
    },
    /// Read a consumer's stored offset in a partition group owned here.
    GetOffset {
        /// The group.
        group: u64,
        /// Whose.
        consumer: ConsumerId,
        /// The answer.
        reply: ReplySender,
    },
    /// A consumer group request (shard 0 only: the coordinator).
    Group {
        /// What is asked.
        request: GroupRequest,
        /// The answer.
        reply: ReplySender,
    },
    /// A Kafka consumer group request (shard 0 only: the coordinator of Kafka groups).
    KafkaGroup {
        /// What is asked.
        request: KafkaGroupRequest,
        /// The answer.
        reply: KafkaGroupReplySender,
    },
    /// Fetch from a consumer's stored offset in a partition group owned here.
    Poll {
        /// The group.
        group: u64,
        /// Limits and wait (`from` is resolved here, from the stored offset).
        args: FetchArgs,
        /// Whose offset.
        consumer: ConsumerId,
        /// Commit past what is returned before answering.
        auto_commit: bool,
        /// The request's header fields (an auto-commit is a write of this client's).
        client: ClientRequest,
        /// The answer.
        reply: ReplySender,
    },
    /// Report the shard's own figures.
    Report {
        /// The answer.
        reply: flume::Sender<ShardReport>,
    },
    /// Report the shard's metrics (a scrape of the metrics endpoint).
    Metrics {
        /// The answer.
        reply: flume::Sender<ShardSnapshot>,
    },
    /// A replica packet from peer node `from`, read off the bus (framing checked, nothing else).
    Packet {
        /// The sending node.
        from: u8,
        /// The frame: header and body.
        packet: Bytes,
    },
    /// Nothing: wakes the loop to look at its local completions.
    Wake,
}

/// A consumer group request for the coordinator.
pub enum GroupRequest {
    /// Join (or rejoin) a group.
    Join(JoinGroup),
    /// Keep a member alive; answered with its assignment.
    Heartbeat(GroupMember),
    /// Leave a group.
    Leave(GroupMember),
}

/// A Kafka consumer group request for the coordinator (`crate::kafka_groups`).
pub enum KafkaGroupRequest {
    /// JoinGroup: answered once the rebalance it takes part in completes.
    Join(Join),
    /// SyncGroup: answered once the leader's assignment is in.
    Sync(Sync),
    /// Heartbeat.
    Heartbeat { group: String, member: String, generation: i32 },
    /// LeaveGroup: these members leave.
    Leave { group: String, members: Vec<String> },
    /// May this member of this generation commit offsets (OffsetCommit)?
    CheckCommit { group: String, member: String, generation: i32 },
    /// DescribeGroups: these groups' states and members.
    Describe { groups: Vec<String> },
    /// ListGroups: every group kept.
    List,
}

/// The coordinator's answer to a [`KafkaGroupRequest`].
#[derive(Debug)]
pub enum KafkaGroupReply {
    /// To a JoinGroup or a SyncGroup.
    Answer(GroupAnswer),
    /// To a Heartbeat or a commit check (`None`: go ahead).
    Checked(Option<ResponseError>),
    /// To a LeaveGroup: each member's result, in the request's order.
    Left(Vec<Option<ResponseError>>),
    /// To a Describe: each group's description (`None`: not kept), in the request's order.
    Described(Vec<Option<GroupDescription>>),
    /// To a List: (group, protocol type, state) of every group kept.
    Listed(Vec<(String, String, GroupState)>),
    /// This node does not coordinate Kafka groups (now): the client finds the coordinator
    /// again.
    NotCoordinator,
}

/// Where a Kafka group request is answered.
pub type KafkaGroupReplySender = flume::Sender<KafkaGroupReply>;

/// A shard's own figures, for status.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShardReport {
    /// The shard.
    pub shard: u32,
    /// Groups it holds (the metadata group included).
    pub groups: usize,
    /// Heap allocations its thread has made since it started.
    pub allocations: u64,
    /// I/O rounds its node layer has run.
    pub io_rounds: u64,
    /// Move steps its primaries proposed (configuration changes) and held back because a
    /// learner to be promoted was not in sync yet.
    pub move_changes_proposed: u64,
    /// See `move_changes_proposed`.
    pub move_steps_waited: u64,
    /// Moves the partition balancer started here (shard 0 of the metadata primary).
    pub balancer_moves: u64,
    /// Preferred-primary changes the leader balancer proposed here (as `balancer_moves`).
    pub balancer_primaries: u64,
    /// Partition groups deleted here since the shard started: removed replicas of finished
    /// moves, and deleted topics'.
    pub groups_deleted: u64,
    /// Each group's view, primary and (where this node leads it) replica states.
    pub replication: Vec<GroupReport>,
}

/// Every shard's inbox.
pub type Mesh = Arc<Vec<flume::Sender<Work>>>;

/// Creates the inboxes of `shards` shards.
pub fn mesh(shards: u32, inbox_max: usize) -> (Mesh, Vec<flume::Receiver<Work>>) {
    let (senders, receivers) = (0..shards).map(|_| flume::bounded(inbox_max)).unzip();
    (Arc::new(senders), receivers)
}

/// Sending an answer whose receiver may be gone (the connection closed).
pub(super) trait SendOutcome {
    fn send_outcome(self, outcome: Outcome);
}

impl SendOutcome for ReplySender {
    fn send_outcome(self, outcome: Outcome) {
        let _ = self.send(outcome);
    }
}

/// The answer to a write its group did not commit (a `Committed` result is a plain success).
pub(super) fn result_error(result: &ReplyResult) -> Outcome {
    match result {
        ReplyResult::Committed { .. } => Outcome::ok(Vec::new()),
        ReplyResult::NotPrimary { view, primary } => Outcome::not_primary(*view, *primary),
        ReplyResult::TransientNotAccepted => {
            Outcome::error(ErrorCode::TransientNotAccepted, "not accepted: retry")
        }
        ReplyResult::TransientNotCommitted => Outcome::error(
            ErrorCode::TransientNotCommitted,
            "outcome unknown: retry with the same request number",
        ),
        ReplyResult::OutOfOrderSequence => Outcome::error(
            ErrorCode::OutOfOrderSequence,
            "the batch's sequence does not follow the producer's last batch in this partition",
        ),
        ReplyResult::UnknownProducer => Outcome::error(
            ErrorCode::UnknownProducer,
            "this partition does not know the producer (expired or evicted): restart at sequence 0",
        ),
        ReplyResult::ProducerFenced => {
            Outcome::error(ErrorCode::ProducerFenced, "a newer epoch of this producer appended")
        }
        ReplyResult::ReconfigurationRefused { reason } => {
            Outcome::error(ErrorCode::InvalidRequest, format!("reconfiguration refused: {reason}"))
        }
    }
}

/// The answer to a request the node refused before it reached the replica.
pub(super) fn refusal(refused: &RequestRefused) -> Outcome {
    let code = match refused {
        // Retryable: the client may send it again once disk space is freed.
        RequestRefused::StorageFull { .. } => ErrorCode::StorageFull,
        RequestRefused::UnknownGroup { .. } | RequestRefused::GroupFailed { .. } => {
            ErrorCode::PartitionFailed
        }
    };
    Outcome::error(code, refused.to_string())
}

/// Why this node's `replica` must not serve a request for its group, if it must not: a backup
/// (or a replica voting for another's view) names the primary (`NotPrimary`); a replica that
/// recovers, or assembles a view it is to lead, has no primary to name yet
/// (`TransientNotAccepted`: retry shortly). `None`: it is the serving primary.
pub(super) fn redirect(replica: &Replica) -> Option<Outcome> {
    let view = replica.view();
    let primary = replica.config().primary_of(view);
    match replica.status() {
        Status::Normal if replica.is_primary() => None,
        Status::Normal => Some(Outcome::not_primary(view, primary)),
        Status::ViewChange if primary != replica.config().replica => {
            Some(Outcome::not_primary(view, primary))
        }
        Status::ViewChange => Some(Outcome::error(
            ErrorCode::TransientNotAccepted,
            format!("view {view} is being assembled here: retry"),
        )),
        Status::Recovering => Some(Outcome::error(
            ErrorCode::TransientNotAccepted,
            "this replica is recovering: retry, or ask another node",
        )),
        // Its configuration names the members it was removed by, and their primary.
        Status::Removed => Some(Outcome::not_primary(view, primary)),
    }
}

/// Answers work that arrives while the shard stops.
pub(super) fn refuse(work: Work) {
    let outcome = || Outcome::error(ErrorCode::ShuttingDown, "shutting down");
    match work {
        Work::Produce { reply, .. }
        | Work::Fetch { reply, .. }
        | Work::Metadata { reply, .. }
        | Work::StoreOffset { reply, .. }
        | Work::DeleteRecords { reply, .. }
        | Work::GetOffset { reply, .. }
        | Work::Group { reply, .. }
        | Work::Poll { reply, .. } => {
            let _ = reply.send(outcome());
        }
        Work::KafkaGroup { reply, .. } => {
            let _ = reply.send(KafkaGroupReply::NotCoordinator);
        }
        Work::Stats { reply, .. } => {
            let _ = reply.send(Vec::new());
        }
        // Dropping the reply slot tells the scrape this shard has nothing to show.
        Work::Report { .. } | Work::Metrics { .. } => {}
        Work::Catalog(_) | Work::Packet { .. } | Work::Wake => {}
    }
}
