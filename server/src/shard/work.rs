//! What a shard's inbox carries and what it answers: the [`Work`] items connections and other
//! shards send, the reply slot each answers through, the [`Outcome`] it gets, and how a
//! replica's reply or the node's refusal becomes one.
//!
//! It holds no state and never touches a node or a log: the shard's jobs do the work.

use std::sync::Arc;

use bytes::Bytes;

use shoal_proto::protocol::consumer::{ConsumerId, GroupMember, JoinGroup, OffsetCommitRecord};
use shoal_proto::protocol::{ErrorCode, FetchFrom, ProduceReply};
use shoal_proto::wire::ClientRequest;
use shoal_replication::{ReplyResult, Request, RequestRefused};

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
}

impl Outcome {
    /// A success with this body.
    pub fn ok(body: Vec<u8>) -> Outcome {
        Outcome { error: 0, body: Body::Encoded(body) }
    }

    /// A produce success.
    pub fn produced(reply: ProduceReply) -> Outcome {
        Outcome { error: 0, body: Body::Produce(reply) }
    }

    /// An error with its text.
    pub fn error(code: ErrorCode, text: impl Into<String>) -> Outcome {
        Outcome { error: code as u32, body: Body::Encoded(text.into().into_bytes()) }
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
    /// Byte limit.
    pub bytes_max: u32,
    /// Record limit.
    pub count_max: u32,
    /// Long-poll: how long to wait for data when nothing committed is at the start yet.
    pub wait_ms_max: u32,
}

/// A partition's figures, for describe and status.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupStats {
    /// First offset held.
    pub first_offset: u64,
    /// Log end offset.
    pub next_offset: u64,
    /// Bytes on disk.
    pub size_bytes: u64,
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

/// A shard's own figures, for status.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct ShardReport {
    /// The shard.
    pub shard: u32,
    /// Groups it holds (the metadata group included).
    pub groups: usize,
    /// Heap allocations its thread has made since it started.
    pub allocations: u64,
    /// I/O rounds its node layer has run.
    pub io_rounds: u64,
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
        ReplyResult::NotPrimary { view, primary } => {
            Outcome::error(ErrorCode::NotPrimary, format!("replica {primary} leads view {view}"))
        }
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

/// Answers work that arrives while the shard stops.
pub(super) fn refuse(work: Work) {
    let outcome = || Outcome::error(ErrorCode::ShuttingDown, "shutting down");
    match work {
        Work::Produce { reply, .. }
        | Work::Fetch { reply, .. }
        | Work::Metadata { reply, .. }
        | Work::StoreOffset { reply, .. }
        | Work::GetOffset { reply, .. }
        | Work::Group { reply, .. }
        | Work::Poll { reply, .. } => {
            let _ = reply.send(outcome());
        }
        Work::Stats { reply, .. } => {
            let _ = reply.send(Vec::new());
        }
        // Dropping the reply slot tells the scrape this shard has nothing to show.
        Work::Report { .. } | Work::Metrics { .. } => {}
        Work::Catalog(_) | Work::Packet { .. } | Work::Wake => {}
    }
}
