//! Native protocol connections: accepting them (within the node's connection bound), reading and
//! checking request frames, routing each request to the shard that owns what it names, and
//! writing the replies back in request order.
//!
//! A connection is two tasks on the accepting shard: the reader decodes a frame, routes it and
//! queues the reply slot; the writer awaits the slots in order and writes each reply, so a
//! connection's replies never overtake each other whichever shards answered them. The queue is
//! bounded by `requests_in_flight_max`: when it is full the reader stops reading (backpressure).
//! A frame that cannot be trusted (bad checksum, wrong command, over the size limit, bad body
//! checksum) gets an `InvalidFrame` or `TooLarge` reply and the connection is closed; nothing it
//! sent reaches a shard. This module never touches storage or replicas: shards do that, through
//! their inboxes.
//!
//! Every shard accepts on the node's shared port (`SO_REUSEPORT`: the kernel spreads connections
//! over the shards) and, when `[network] shard_listen` is set, on a port of its own; both are
//! served alike. The `Hello` result (version 2) names the serving shard and every shard's own
//! address, so a client can connect to the shard that owns its partition, whose requests then
//! need no forwarding (`shoal_requests_forwarded_total` counts the ones that did). From version 3
//! it names the cluster's nodes too, `DescribeTopic` each partition's primary, and a `NotPrimary`
//! error (which shards answer with the view and primary alone) is written here with the
//! primary's client address from `[cluster]`: the connection knows the version it speaks, the
//! shard does not.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use monoio::io::{AsyncReadRent, AsyncReadRentExt, AsyncWriteRent, AsyncWriteRentExt, Splitable};
use monoio::net::{TcpListener, TcpStream};
use shoal_proto::batch::{self, BatchLimits};
use shoal_proto::checksum;
use shoal_proto::protocol::consumer::{
    ConsumerId, ConsumerKind, GroupMember, JoinGroup, Membership, OffsetCommitRecord, OffsetKey,
    PartitionRef, Poll, StoreOffset,
};
use shoal_proto::protocol::{
    self, AddNode, CreateTopic, ErrorCode, Fetch, FetchFrom, Hello, HelloReply, MovePartition,
    NODE_UNKNOWN, NodeAddress, NotPrimary, Operation, PartitionInfo, PartitionPrimary,
    Partitioning, Produce, RemoveNode, TopicDescription,
};
use shoal_proto::wire::{ClientReply, ClientRequest, HEADER_SIZE, Header};
use shoal_replication::Request;

use crate::config::{ClusterNode, Config, NODES_MAX};
use crate::metadata::{Catalog, METADATA_GROUP, MetaCommand, Published, TopicSettings};
use crate::metrics::ShardMetrics;
use crate::node_book;
use crate::shard::{
    Body, FetchArgs, GroupRequest, GroupStats, Mesh, Outcome, ShardReport, Work, now_ms,
};
use crate::vectored::Parts;

/// Accepts connections on one shard's listeners.
pub struct Acceptor {
    /// The shard accepting.
    pub shard: u32,
    /// Every shard's own listener address, by shard (empty: per-shard listeners are off).
    pub shard_addresses: Arc<Vec<String>>,
    /// Replies this shard's connections owe their clients (read, not yet written).
    pub replies_owed: Rc<Cell<usize>>,
    pub config: Arc<Config>,
    pub mesh: Mesh,
    pub published: Arc<Published>,
    pub connections: Arc<AtomicUsize>,
    pub stop: Arc<AtomicBool>,
    /// This shard's counters.
    pub metrics: Rc<ShardMetrics>,
}

impl Acceptor {
    /// Accepts native clients on `listener` until it fails; each connection is served by its
    /// own tasks. A shard runs one of these per listener, sharing `context` (and its connection
    /// bound).
    pub async fn run(context: Rc<Acceptor>, listener: TcpListener) {
        let cluster = context.config.cluster.id;
        let limit = context.config.network.connections_max;
        let served = Rc::clone(&context);
        context
            .accept(listener, |stream, guard| match guard {
                Some(guard) => {
                    monoio::spawn(serve(stream, Rc::clone(&served), guard));
                }
                None => {
                    monoio::spawn(refuse(stream, cluster, limit));
                }
            })
            .await;
    }

    /// Accepts on `listener` until it fails or the shard stops, counting each connection
    /// against the node's bound: `admit` gets each one with its slot, or with `None` when the
    /// bound is reached (counted as refused; it holds no slot while it is told why).
    pub(crate) async fn accept(
        &self,
        listener: TcpListener,
        mut admit: impl FnMut(TcpStream, Option<ConnectionGuard>),
    ) {
        while let Ok((stream, _)) = listener.accept().await {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let _ = stream.set_nodelay(true);
            let open = self.connections.fetch_add(1, Ordering::SeqCst);
            let guard = ConnectionGuard(Arc::clone(&self.connections));
            if open >= self.config.network.connections_max {
                drop(guard);
                self.metrics.connection_refused();
                admit(stream, None);
            } else {
                admit(stream, Some(guard));
            }
        }
    }
}

/// Counts a connection as open until dropped.
pub(crate) struct ConnectionGuard(Arc<AtomicUsize>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers a connection over the bound with one `LimitReached` reply and closes it.
async fn refuse(stream: TcpStream, cluster: u64, limit: usize) {
    let text = format!("the server holds at most {limit} connections");
    let reply = ClientReply { error: ErrorCode::LimitReached as u32, ..ClientReply::default() };
    let socket = stream.as_raw_fd();
    let (mut reader, mut writer) = stream.into_split();
    let mut bytes = Vec::new();
    write_frame(&mut bytes, cluster, reply, text.as_bytes());
    let (result, _) = writer.write_all(bytes).await;
    if result.is_ok() {
        let _ = writer.shutdown().await;
        drain(&mut reader, vec![0u8; HEADER_SIZE], socket).await;
    }
}

/// Appends a reply frame (header and body) to `out`.
fn write_frame(out: &mut Vec<u8>, cluster: u64, reply: ClientReply, body: &[u8]) {
    let header = Header::reply(cluster, reply, body);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
}

/// A reply the writer will send, once its outcome is known.
struct Pending {
    reply: ClientReply,
    outcome: Waiting,
    /// Close the connection after this reply.
    close: bool,
    /// When the request was decoded (its latency runs from here to its reply being written).
    received: std::time::Instant,
    _owed: Owed,
}

/// One reply owed to a client, counted until written or abandoned, so shutdown can wait for
/// the replies of requests it finished.
struct Owed(Rc<Cell<usize>>);

impl Owed {
    fn new(count: &Rc<Cell<usize>>) -> Owed {
        count.set(count.get() + 1);
        Owed(Rc::clone(count))
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// The `Status` JSON: the cluster and this node's place in it, the shards and their own
/// figures (each group's view, primary and, where this node leads it, replica states), the
/// connections, the effective config and every partition.
#[derive(serde::Serialize)]
struct Status<'a> {
    cluster: u64,
    node: u8,
    /// Every node's client address, by index (an unknown index: empty).
    nodes: Vec<String>,
    /// Every node of the cluster's address book: the founding ones, then those added.
    cluster_nodes: Vec<StatusNode>,
    shards: u32,
    shard_reports: Vec<ShardReport>,
    connections: usize,
    config: serde_json::Value,
    partitions: Vec<StatusPartition<'a>>,
}

/// One node of the cluster's address book in the `Status` JSON.
#[derive(serde::Serialize)]
struct StatusNode {
    node: u8,
    client: String,
    bus: String,
    /// One of the founding nodes (`[cluster] nodes`), not added later.
    founding: bool,
    /// Being removed: its partitions move away, and nothing new is placed there.
    leaving: bool,
}

/// One partition in the `Status` JSON: its names, then the figures `DescribeTopic` gives.
#[derive(serde::Serialize)]
struct StatusPartition<'a> {
    stream: &'a str,
    topic: &'a str,
    #[serde(flatten)]
    info: &'a PartitionInfo,
    /// The node this node believes leads the partition (`null`: its replica is in a view change
    /// or recovering).
    primary: Option<u8>,
    /// The view this node's replica of the partition is in.
    view: u32,
    /// The nodes holding the partition (its replicas' members when it was created).
    replicas: Vec<u8>,
    /// Whether this node holds it (if not, `primary` is its preferred primary, a guess).
    held: bool,
    /// The nodes a move in progress takes it to (empty: no move).
    moving_to: Vec<u8>,
    /// Where its primary belongs: its home, or the voter the leader balancer preferred.
    preferred_primary: Option<u8>,
}

enum Waiting {
    Ready(Outcome),
    Answer(flume::Receiver<Outcome>),
}

async fn serve(stream: TcpStream, context: Rc<Acceptor>, _guard: ConnectionGuard) {
    let _open = context.metrics.connection_opened();
    // What a one-node cluster's `Hello` names as its address: the one this client reached.
    let reached = stream.local_addr().map(|address| address.to_string()).unwrap_or_default();
    let socket = stream.as_raw_fd();
    let (mut reader, mut writer) = stream.into_split();
    let (queue, replies) = flume::bounded::<Pending>(context.config.network.requests_in_flight_max);
    let metrics = Rc::clone(&context.metrics);
    let cluster = context.config.cluster.id;
    // The version `Hello` negotiated (0 before): how a `NotPrimary` body is written.
    let version = Rc::new(Cell::new(0u16));
    let writer_version = Rc::clone(&version);
    let config = Arc::clone(&context.config);
    let published = Arc::clone(&context.published);
    // Requests read and not yet answered: while any is, the client may rightly be silent (a
    // long-poll), so the idle timeout does not close the connection.
    let unanswered = Rc::new(Cell::new(0usize));
    let writer_unanswered = Rc::clone(&unanswered);
    let writing = monoio::spawn(async move {
        // One frame buffer for the connection's life: replies are written one at a time.
        let mut out = Vec::with_capacity(HEADER_SIZE + 64);
        while let Ok(pending) = replies.recv_async().await {
            let outcome = match pending.outcome {
                Waiting::Ready(outcome) => outcome,
                Waiting::Answer(answer) => answer.recv_async().await.unwrap_or_else(|_| {
                    Outcome::error(ErrorCode::ShuttingDown, "the shard stopped before answering")
                }),
            };
            let reply = ClientReply { error: outcome.error, ..pending.reply };
            metrics.replied(reply.operation, reply.error, pending.received);
            let written = if let Body::Parts(parts) = outcome.body {
                // The batches go out from where they lie: one writev of header and parts.
                let header = Header::reply_parts(cluster, reply, &parts);
                let mut frame = Vec::with_capacity(parts.len() + 1);
                frame.push(Bytes::copy_from_slice(&header.encode()));
                frame.extend(parts);
                Parts::new(frame).write_all(&mut writer).await.0
            } else {
                out.clear();
                match &outcome.body {
                    Body::Encoded(body) => write_frame(&mut out, cluster, reply, body),
                    Body::Produce(produced) => {
                        write_frame(&mut out, cluster, reply, &produced.encode_array())
                    }
                    &Body::NotPrimary { view, primary } => {
                        let version = writer_version.get();
                        let body = not_primary_body(&config, &published, version, view, primary);
                        write_frame(&mut out, cluster, reply, &body)
                    }
                    Body::Parts(_) => unreachable!("written above"),
                }
                let (result, buffer) = writer.write_all(out).await;
                out = buffer;
                result
            };
            writer_unanswered.set(writer_unanswered.get() - 1);
            let Ok(written) = written else { break };
            metrics.sent(written);
            if pending.close {
                // FIN after the last reply, so the client reads it and then sees the end.
                let _ = writer.shutdown().await;
                break;
            }
        }
    });
    let mut session = Session {
        context,
        catalog: Arc::new(Catalog::new(1, 0)),
        version,
        reached,
        balanced: Cell::new(0),
    };
    let mut header_buffer = vec![0u8; HEADER_SIZE];
    let mut refused = false;
    let idle = Duration::from_millis(u64::from(session.context.config.network.idle_timeout_ms));
    loop {
        let (result, buffer) = if idle.is_zero() {
            reader.read_exact(header_buffer).await
        } else {
            match read_unless_idle(&mut reader, header_buffer, idle, &unanswered).await {
                Some(read) => read,
                None => {
                    session.context.metrics.idle_connection_closed();
                    shut_down(socket);
                    header_buffer = Vec::new();
                    break;
                }
            }
        };
        header_buffer = buffer;
        if result.is_err() {
            break;
        }
        session.context.metrics.received(HEADER_SIZE);
        let pending = match session.read_request(&header_buffer, &mut reader).await {
            Ok(pending) => pending,
            Err(None) => break,
            Err(Some(pending)) => pending,
        };
        refused = pending.close;
        unanswered.set(unanswered.get() + 1);
        if queue.send_async(pending).await.is_err() || refused {
            break;
        }
    }
    drop(queue);
    let _ = writing.await;
    if refused {
        drain(&mut reader, header_buffer, socket).await;
    }
}

/// Ends a connection the server gives up on while a receive on it may still be in flight (a
/// timed-out read): monoio does not cancel a dropped operation, and the socket closes only once
/// none is in flight, so without this the receive waited for a client that sends nothing and
/// the client never saw the connection end.
pub(crate) fn shut_down(socket: RawFd) {
    // SAFETY: `socket` is the connection's descriptor, open while the caller holds its stream.
    unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
}

/// Shuts its socket down when dropped ([`shut_down`]): for a task whose every way out must end
/// the connection at once, even with a timed-out read still in flight. Made after the stream,
/// so that it drops first, while the descriptor is still the stream's.
pub(crate) struct ShutDownOnDrop(pub(crate) RawFd);

impl Drop for ShutDownOnDrop {
    fn drop(&mut self) {
        shut_down(self.0);
    }
}

/// The next header, read while the client keeps talking or is owed a reply; `None` once it
/// has sent nothing for `idle` with nothing owed (`[network] idle_timeout_ms`). A timeout while
/// a reply is owed waits on with the same read: a new one beside it would leave the first in
/// flight (monoio does not cancel a dropped operation), and it would take the client's next
/// bytes.
async fn read_unless_idle(
    reader: &mut Reader,
    buffer: Vec<u8>,
    idle: Duration,
    unanswered: &Cell<usize>,
) -> Option<(std::io::Result<usize>, Vec<u8>)> {
    let mut read = std::pin::pin!(reader.read_exact(buffer));
    loop {
        match monoio::time::timeout(idle, &mut read).await {
            Ok(read) => return Some(read),
            Err(_) if unanswered.get() == 0 => return None,
            Err(_) => {}
        }
    }
}

/// Bytes a refused connection's unread input is drained for at most, and for how long.
const DRAIN_BYTES_MAX: usize = 4 << 20;
const DRAIN_TIME_MAX: Duration = Duration::from_secs(2);

/// Reads and discards what a refused client still sends (bounded in bytes and time), so that
/// closing does not reset the connection before the client has read the error reply: a close
/// with unread input sends a reset, which discards data the client has not read yet.
async fn drain(reader: &mut Reader, mut buffer: Vec<u8>, socket: RawFd) {
    let deadline = std::time::Instant::now() + DRAIN_TIME_MAX;
    let mut drained = 0;
    while drained < DRAIN_BYTES_MAX {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((result, back)) = monoio::time::timeout(left, reader.read(buffer)).await else {
            shut_down(socket);
            return;
        };
        buffer = back;
        match result {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

/// The body of a `NotPrimary` error for a connection speaking `version`: the structured body
/// with the primary's client address from version 3 on, the text alone before.
fn not_primary_body(
    config: &Config,
    published: &Published,
    version: u16,
    view: u32,
    primary: u8,
) -> Vec<u8> {
    let text = Body::not_primary_text(view, primary);
    if version < 3 {
        return text.into_bytes();
    }
    let catalog = published.latest();
    let address = catalog.nodes.client_address(&config.cluster, primary).map(|a| a.to_string());
    NotPrimary { view, primary, address: address.unwrap_or_default(), text }.encode()
}

/// One connection's reading side.
struct Session {
    context: Rc<Acceptor>,
    catalog: Arc<Catalog>,
    /// The version `Hello` negotiated; 0 until then.
    version: Rc<Cell<u16>>,
    /// The local address this connection reached (a one-node cluster's address in `Hello`).
    reached: String,
    balanced: Cell<u32>,
}

type Reader = monoio::io::OwnedReadHalf<TcpStream>;

impl Session {
    /// Reads one request's body and routes it. `Err(None)`: the connection broke;
    /// `Err(Some(reply))`: answer this and close.
    async fn read_request(
        &mut self,
        header_bytes: &[u8],
        reader: &mut Reader,
    ) -> Result<Pending, Option<Pending>> {
        let closing = |reply: ClientReply, code: ErrorCode, text: String| {
            Some(Pending {
                reply,
                outcome: Waiting::Ready(Outcome::error(code, text)),
                close: true,
                received: std::time::Instant::now(),
                _owed: Owed::new(&self.context.replies_owed),
            })
        };
        let header = match Header::decode_prefix(header_bytes) {
            Ok(header) => header,
            Err(error) => {
                let code = match error {
                    shoal_proto::wire::HeaderError::UnsupportedVersion(_) => {
                        ErrorCode::UnsupportedVersion
                    }
                    _ => ErrorCode::InvalidFrame,
                };
                return Err(closing(ClientReply::default(), code, format!("bad header: {error}")));
            }
        };
        let Some(fields) = header.as_request().copied() else {
            let text = format!("command {:?} is not a client request", header.command);
            return Err(closing(ClientReply::default(), ErrorCode::InvalidFrame, text));
        };
        let reply = ClientReply {
            client: fields.client,
            request: fields.request,
            operation: fields.operation,
            error: 0,
        };
        self.context.metrics.request(fields.operation);
        let cluster = self.context.config.cluster.id;
        if header.cluster != cluster {
            let text = format!("cluster {} is not this server's {cluster}", header.cluster);
            return Err(closing(reply, ErrorCode::InvalidFrame, text));
        }
        let frame_max = self.context.config.network.frame_size_bytes_max;
        if header.size as usize > frame_max {
            let text = format!("frame of {} bytes exceeds the limit of {frame_max}", header.size);
            return Err(closing(reply, ErrorCode::TooLarge, text));
        }
        let body_size = header.body_size();
        let mut body = BytesMut::with_capacity(body_size);
        if body_size > 0 {
            use monoio::buf::IoBufMut;
            let (result, slice) = reader.read_exact(body.slice_mut(0..body_size)).await;
            body = slice.into_inner();
            if result.is_err() {
                return Err(None);
            }
            self.context.metrics.received(body_size);
        }
        if let Err(error) = header.verify_body(&body) {
            return Err(closing(reply, ErrorCode::InvalidFrame, format!("bad body: {error}")));
        }
        let received = std::time::Instant::now();
        let owed = &self.context.replies_owed;
        let ready = |outcome| Pending {
            reply,
            outcome: Waiting::Ready(outcome),
            close: false,
            received,
            _owed: Owed::new(owed),
        };
        let Some(operation) = Operation::from_u32(fields.operation) else {
            let text = format!("unknown operation {}", fields.operation);
            return Ok(ready(Outcome::error(ErrorCode::UnknownOperation, text)));
        };
        if self.version.get() == 0 {
            if operation != Operation::Hello {
                let text = "the first request on a connection must be Hello".to_string();
                return Err(closing(reply, ErrorCode::InvalidRequest, text));
            }
            return match Hello::decode(&body) {
                Err(error) => Err(closing(reply, ErrorCode::InvalidRequest, error.to_string())),
                Ok(hello) => match hello.negotiate() {
                    Some(version) => {
                        self.version.set(version);
                        // The nodes it names include those the newest catalog added.
                        self.context.published.refresh(&mut self.catalog);
                        Ok(ready(Outcome::ok(self.hello_reply(version).encode())))
                    }
                    None => {
                        let text = format!(
                            "client speaks versions {}..={}, this server {}..={}",
                            hello.version_min,
                            hello.version_max,
                            protocol::PROTOCOL_VERSION_MIN,
                            protocol::PROTOCOL_VERSION
                        );
                        Err(closing(reply, ErrorCode::UnsupportedVersion, text))
                    }
                },
            };
        }
        if self.context.stop.load(Ordering::SeqCst) {
            let text = "the server is shutting down".to_string();
            return Err(closing(reply, ErrorCode::ShuttingDown, text));
        }
        self.context.published.refresh(&mut self.catalog);
        let owed = Owed::new(&self.context.replies_owed);
        // The body is verified: its checksum now vouches for any part of it (see `checksum`).
        let outcome = match self.route(fields, operation, body, header.checksum_body).await {
            Ok(outcome) => outcome,
            Err((code, text)) => Waiting::Ready(Outcome::error(code, text)),
        };
        Ok(Pending { reply, outcome, close: false, received, _owed: owed })
    }

    /// The `Hello` result for `version`: the shards and, from version 3, the cluster's nodes
    /// (a one-node cluster names itself by the address this client reached).
    fn hello_reply(&self, version: u16) -> HelloReply {
        let cluster = &self.context.config.cluster;
        let nodes = if cluster.nodes.is_empty() {
            vec![NodeAddress { node: cluster.node, address: self.reached.clone() }]
        } else {
            let book = &self.catalog.nodes;
            let known = book.known_by(cluster);
            (0..NODES_MAX as u8)
                .filter(|&node| known & (1 << node) != 0)
                .filter_map(|node| {
                    let address = book.client_address(cluster, node)?.to_string();
                    Some(NodeAddress { node, address })
                })
                .collect()
        };
        HelloReply {
            version,
            shards: self.context.config.shards,
            server: format!("shoal {}", env!("CARGO_PKG_VERSION")),
            shard: self.context.shard,
            shard_addresses: self.context.shard_addresses.to_vec(),
            cluster: cluster.id,
            node: cluster.node,
            nodes,
        }
    }

    /// Sends the request where it belongs, or answers it here.
    async fn route(
        &self,
        fields: ClientRequest,
        operation: Operation,
        body: BytesMut,
        body_checksum: u32,
    ) -> Result<Waiting, (ErrorCode, String)> {
        let catalog = &self.catalog;
        match operation {
            Operation::Hello => Ok(Waiting::Ready(Outcome::error(
                ErrorCode::InvalidRequest,
                "Hello was already sent on this connection",
            ))),
            Operation::Register => self.metadata(fields, MetaCommand::RegisterSession).await,
            Operation::CreateStream => {
                let name = protocol::decode_stream_name(&body).map_err(invalid_request)?;
                self.metadata(fields, MetaCommand::CreateStream { name }).await
            }
            Operation::DeleteStream => {
                let name = protocol::decode_stream_name(&body).map_err(invalid_request)?;
                self.metadata(fields, MetaCommand::DeleteStream { name, frees_groups: true }).await
            }
            Operation::CreateTopic => self.create_topic(fields, &body).await,
            Operation::MovePartition => {
                let asked = MovePartition::decode(&body).map_err(invalid_request)?;
                let MovePartition { stream, topic, partition, action } = asked;
                let nodes = self.context.config.cluster.founders();
                let command = MetaCommand::Move { stream, topic, partition, action, nodes };
                self.metadata(fields, command).await
            }
            Operation::AddNode => {
                let asked = AddNode::decode(&body).map_err(invalid_request)?;
                let command = self.add_node_command(asked)?;
                self.metadata(fields, command).await
            }
            Operation::RemoveNode => {
                let RemoveNode { node, replacement } =
                    RemoveNode::decode(&body).map_err(invalid_request)?;
                let founders = self.context.config.cluster.founders();
                self.metadata(fields, MetaCommand::RemoveNode { node, replacement, founders }).await
            }
            Operation::DeleteTopic => {
                let (stream, topic) =
                    protocol::decode_topic_name(&body).map_err(invalid_request)?;
                let command = MetaCommand::DeleteTopic { stream, topic, frees_groups: true };
                self.metadata(fields, command).await
            }
            Operation::ListStreams | Operation::ListTopics | Operation::DescribeTopic
                if let Some(redirect) = self.metadata_redirect().await =>
            {
                Ok(Waiting::Ready(redirect))
            }
            Operation::ListStreams => {
                protocol::Reader::new(&body).end().map_err(invalid_request)?;
                let body = protocol::encode_streams(&catalog.stream_infos());
                Ok(Waiting::Ready(Outcome::ok(body)))
            }
            Operation::ListTopics => {
                let name = protocol::decode_stream_name(&body).map_err(invalid_request)?;
                let stream = catalog.stream(&name)?;
                let topics: Vec<_> = stream
                    .topics
                    .iter()
                    .map(|(topic, entry)| Catalog::topic_info(&name, topic, entry))
                    .collect();
                Ok(Waiting::Ready(Outcome::ok(protocol::encode_topics(&topics))))
            }
            Operation::DescribeTopic => self.describe_topic(&body).await,
            Operation::Status => {
                protocol::Reader::new(&body).end().map_err(invalid_request)?;
                Ok(Waiting::Ready(Outcome::ok(self.status().await.into_bytes())))
            }
            Operation::Produce => self.produce(fields, body, body_checksum).await,
            Operation::Fetch => {
                let fetch = Fetch::decode(&body).map_err(invalid_request)?;
                let (_, place) = catalog.partition(&fetch.stream, &fetch.topic, fetch.partition)?;
                self.check_wait(fetch.wait_ms_max)?;
                let args = FetchArgs {
                    partition: fetch.partition,
                    from: fetch.from,
                    // At least one batch, whatever the client asks (0 is the Kafka path's offsets only).
                    bytes_max: fetch.bytes_max.clamp(1, self.reply_bytes_max()),
                    count_max: fetch.count_max,
                    wait_ms_max: fetch.wait_ms_max,
                };
                let (slot, answer) = flume::bounded(1);
                self.send(place.shard, Work::Fetch { group: place.group, args, reply: slot })
                    .await?;
                Ok(Waiting::Answer(answer))
            }
            Operation::StoreOffset => {
                let store = StoreOffset::decode(&body).map_err(invalid_request)?;
                let target = &store.partition;
                let (topic, place) =
                    catalog.partition(&target.stream, &target.topic, target.partition)?;
                // A group with no members takes a commit from outside group management, as
                // Kafka's does under generation -1: how a Kafka group's coordinator, which
                // checked the commit itself, stores it on the partition's primary.
                let outside = store.consumer.kind == ConsumerKind::Group
                    && store.membership == Membership::default()
                    && !topic.group_has_members(&store.consumer.name);
                if outside {
                    check_consumer_name(&store.consumer)?;
                } else {
                    self.check_consumer(&store.partition, &store.consumer, &store.membership)?;
                }
                let work = |reply| Work::StoreOffset {
                    group: place.group,
                    client: fields,
                    record: OffsetCommitRecord {
                        consumer: store.consumer,
                        offset: Some(store.offset),
                    },
                    reply,
                };
                self.send_work(place.shard, work).await
            }
            Operation::DeleteOffset => self.delete_offset(fields, &body).await,
            Operation::GetOffset => {
                let key = OffsetKey::decode(&body).map_err(invalid_request)?;
                let target = &key.partition;
                let (_, place) =
                    catalog.partition(&target.stream, &target.topic, target.partition)?;
                check_consumer_name(&key.consumer)?;
                let work =
                    |reply| Work::GetOffset { group: place.group, consumer: key.consumer, reply };
                self.send_work(place.shard, work).await
            }
            Operation::JoinGroup => {
                let join = JoinGroup::decode(&body).map_err(invalid_request)?;
                catalog.topic(&join.group.stream, &join.group.topic)?;
                check_consumer_name(&ConsumerId::group(join.group.group.clone()))?;
                self.send_work(0, |reply| Work::Group { request: GroupRequest::Join(join), reply })
                    .await
            }
            Operation::Heartbeat | Operation::LeaveGroup => {
                let member = GroupMember::decode(&body).map_err(invalid_request)?;
                catalog.topic(&member.group.stream, &member.group.topic)?;
                let request = if operation == Operation::Heartbeat {
                    GroupRequest::Heartbeat(member)
                } else {
                    GroupRequest::Leave(member)
                };
                self.send_work(0, |reply| Work::Group { request, reply }).await
            }
            Operation::Poll => self.poll(fields, &body).await,
        }
    }

    /// Decodes a topic creation, resolves its settings against the defaults and the smallest record
    /// bound of any shard, and hands it to the metadata group.
    async fn create_topic(
        &self,
        fields: ClientRequest,
        body: &[u8],
    ) -> Result<Waiting, (ErrorCode, String)> {
        let request = CreateTopic::decode(body).map_err(invalid_request)?;
        let config = &self.context.config;
        let record_max = config.shard.iter().map(|s| s.storage.record_size_bytes_max).min();
        let settings = TopicSettings::resolve(
            &request,
            &config.topic_defaults,
            record_max.unwrap_or(0),
            config.metadata.topic_partitions_max,
            self.catalog.active_node_count(&config.cluster),
        )?;
        let command = MetaCommand::CreateTopic {
            stream: request.stream,
            topic: request.topic,
            settings,
            nodes: config.cluster.founders(),
        };
        self.metadata(fields, command).await
    }

    /// A topic's settings and its partitions with their current figures.
    async fn describe_topic(&self, body: &[u8]) -> Result<Waiting, (ErrorCode, String)> {
        let catalog = &self.catalog;
        let (stream, topic) = protocol::decode_topic_name(body).map_err(invalid_request)?;
        let entry = catalog.topic(&stream, &topic)?;
        let info = Catalog::topic_info(&stream, &topic, entry);
        let mut partitions: Vec<PartitionInfo> = catalog
            .partition_infos()
            .into_iter()
            .filter(|(s, t, _)| *s == stream && *t == topic)
            .map(|(_, _, p)| p)
            .collect();
        let primaries = self.fill_stats(&mut partitions).await;
        let description = TopicDescription { topic: info, partitions, primaries };
        Ok(Waiting::Ready(Outcome::ok(description.encode(self.version.get()))))
    }

    /// Places a batch on its partition (explicit, by key, or balanced), checks it against the
    /// topic's bound and its checksum, and sends it to the owning shard.
    async fn produce(
        &self,
        fields: ClientRequest,
        mut body: BytesMut,
        body_checksum: u32,
    ) -> Result<Waiting, (ErrorCode, String)> {
        let catalog = &self.catalog;
        let (produce, at) = Produce::decode(&body).map_err(invalid_request)?;
        let topic = catalog.topic(&produce.stream, &produce.topic)?;
        let partitions = topic.partitions.len() as u32;
        let partition = match &produce.partitioning {
            Partitioning::Explicit(partition) => *partition,
            Partitioning::Key(key) => protocol::partition_for_key(key, partitions),
            Partitioning::Balanced => {
                let next = self.balanced.get();
                self.balanced.set(next.wrapping_add(1));
                next % partitions
            }
        };
        let (topic, place) = catalog.partition(&produce.stream, &produce.topic, partition)?;
        let batch_bytes = body.split_off(at);
        // One pass over the batch (the frame check) serves every checksum after it.
        let batch_checksum = checksum::suffix(body_checksum, &body, batch_bytes.len());
        let size_max = topic.settings.message_size_bytes_max;
        if batch_bytes.len() as u64 > size_max {
            return Err((
                ErrorCode::TooLarge,
                format!("batch of {} bytes exceeds the topic's {size_max}", batch_bytes.len()),
            ));
        }
        let limits = BatchLimits {
            batch_size_bytes_max: size_max.min(u64::from(u32::MAX)) as u32,
            ..BatchLimits::default()
        };
        let checked = batch::validate_checksummed(&batch_bytes, &limits, batch_checksum)
            .map_err(|error| (ErrorCode::InvalidBatch, error.to_string()))?;
        // Canary (DESIGN.md §7): one allocation per message; the allocation test must
        // catch it.
        #[cfg(feature = "canary-alloc-per-message")]
        let _copies: Vec<Vec<u8>> = batch::records(&batch_bytes)
            .into_iter()
            .flatten()
            .flatten()
            .map(|record| record.value.unwrap_or_default().to_vec())
            .collect();
        let request = Request {
            client: fields.client,
            session: fields.session,
            request: fields.request,
            body: batch_bytes,
            body_checksum: batch_checksum,
            record_count: checked.record_count(),
            first_timestamp_ms: checked.base_timestamp(),
            max_timestamp_ms: checked.max_timestamp(),
            append_time_ms: now_ms(),
        };
        let (slot, answer) = flume::bounded(1);
        let work = Work::Produce { group: place.group, partition, request, reply: slot };
        self.send(place.shard, work).await?;
        Ok(Waiting::Answer(answer))
    }

    /// Deletes a consumer's stored offset, refused for a group that still has members.
    async fn delete_offset(
        &self,
        fields: ClientRequest,
        body: &[u8],
    ) -> Result<Waiting, (ErrorCode, String)> {
        let catalog = &self.catalog;
        let key = OffsetKey::decode(body).map_err(invalid_request)?;
        let target = &key.partition;
        let (topic, place) = catalog.partition(&target.stream, &target.topic, target.partition)?;
        if key.consumer.kind == ConsumerKind::Group && topic.group_has_members(&key.consumer.name) {
            return Err((
                ErrorCode::InvalidRequest,
                format!("group {} has members: its offsets are theirs", key.consumer.name),
            ));
        }
        check_consumer_name(&key.consumer)?;
        let work = |reply| Work::StoreOffset {
            group: place.group,
            client: fields,
            record: OffsetCommitRecord { consumer: key.consumer, offset: None },
            reply,
        };
        self.send_work(place.shard, work).await
    }

    /// Fetches for a consumer from its stored offset, after checking its membership.
    async fn poll(
        &self,
        fields: ClientRequest,
        body: &[u8],
    ) -> Result<Waiting, (ErrorCode, String)> {
        let catalog = &self.catalog;
        let poll = Poll::decode(body).map_err(invalid_request)?;
        let target = &poll.partition;
        let (_, place) = catalog.partition(&target.stream, &target.topic, target.partition)?;
        self.check_consumer(&poll.partition, &poll.consumer, &poll.membership)?;
        self.check_wait(poll.wait_ms_max)?;
        let args = FetchArgs {
            partition: target.partition,
            from: FetchFrom::First,
            bytes_max: poll.bytes_max.clamp(1, self.reply_bytes_max()),
            count_max: poll.count_max,
            wait_ms_max: poll.wait_ms_max,
        };
        let work = |reply| Work::Poll {
            group: place.group,
            args,
            consumer: poll.consumer,
            auto_commit: poll.auto_commit,
            client: fields,
            reply,
        };
        self.send_work(place.shard, work).await
    }

    /// Sends the work `make` builds around a fresh reply slot to `shard`.
    async fn send_work(
        &self,
        shard: u32,
        make: impl FnOnce(crate::shard::ReplySender) -> Work,
    ) -> Result<Waiting, (ErrorCode, String)> {
        let (slot, answer) = flume::bounded(1);
        self.send(shard, make(slot)).await?;
        Ok(Waiting::Answer(answer))
    }

    /// A group member must act under the group's generation in force, for a partition assigned
    /// to it; a standalone consumer names no member.
    fn check_consumer(
        &self,
        partition: &PartitionRef,
        consumer: &ConsumerId,
        membership: &Membership,
    ) -> Result<(), (ErrorCode, String)> {
        check_consumer_name(consumer)?;
        match consumer.kind {
            ConsumerKind::Group => self.catalog.check_member(
                &partition.stream,
                &partition.topic,
                &consumer.name,
                membership,
                partition.partition,
            ),
            ConsumerKind::Consumer if *membership != Membership::default() => Err((
                ErrorCode::InvalidArgument,
                "a standalone consumer names no member or generation".into(),
            )),
            ConsumerKind::Consumer => Ok(()),
        }
    }

    fn check_wait(&self, wait_ms_max: u32) -> Result<(), (ErrorCode, String)> {
        let bound = self.context.config.network.fetch_wait_ms_max;
        if wait_ms_max > bound {
            return Err((
                ErrorCode::InvalidArgument,
                format!("wait_ms_max {wait_ms_max} is above this server's {bound}"),
            ));
        }
        Ok(())
    }

    /// The largest reply body a fetch may produce: the frame limit, less the fixed part.
    fn reply_bytes_max(&self) -> u32 {
        let frame_max = self.context.config.network.frame_size_bytes_max;
        frame_max.saturating_sub(HEADER_SIZE + protocol::FETCH_REPLY_PREFIX_SIZE) as u32
    }

    /// The command adding the node `asked` names, at the lowest free index when it names none;
    /// a one-node cluster (no `[cluster] nodes`) cannot grow.
    fn add_node_command(&self, asked: AddNode) -> Result<MetaCommand, (ErrorCode, String)> {
        let cluster = &self.context.config.cluster;
        if cluster.nodes.is_empty() {
            return Err((
                ErrorCode::InvalidArgument,
                "a one-node cluster without [cluster] nodes cannot add nodes".into(),
            ));
        }
        let founders = cluster.founders();
        let known = self.catalog.nodes.known(founders);
        let node = match asked.node {
            Some(node) => node,
            None => (founders..NODES_MAX as u8).find(|&n| known & (1 << n) == 0).ok_or((
                ErrorCode::LimitReached,
                format!("the cluster has {NODES_MAX} nodes already"),
            ))?,
        };
        let address =
            |field, text: &str| node_book::parse_address(field, text).map_err(invalid_request);
        let kafka =
            (!asked.kafka.is_empty()).then(|| address("kafka", &asked.kafka)).transpose()?;
        let entry = ClusterNode {
            bus: address("bus", &asked.bus)?,
            client: address("client", &asked.client)?,
            kafka,
            rack: (!asked.rack.is_empty()).then_some(asked.rack),
        };
        let clash = cluster
            .nodes
            .iter()
            .position(|founder| founder.bus == entry.bus || founder.client == entry.client);
        if let Some(founder) = clash {
            return Err((
                ErrorCode::InvalidArgument,
                format!("founding node {founder} has that bus or client address"),
            ));
        }
        Ok(MetaCommand::AddNode { node, address: entry, founders })
    }

    async fn metadata(
        &self,
        fields: ClientRequest,
        command: MetaCommand,
    ) -> Result<Waiting, (ErrorCode, String)> {
        let (slot, answer) = flume::bounded(1);
        self.send(0, Work::Metadata { client: fields, command, reply: slot }).await?;
        Ok(Waiting::Answer(answer))
    }

    /// Where a catalog read (listing, describing) must go instead, if this node is not the
    /// metadata group's serving primary: the catalog is applied on every node, but a backup's
    /// may lag the commits a client was already told of, and a client reads its own changes only
    /// where they were made. A one-node cluster answers everything here.
    async fn metadata_redirect(&self) -> Option<Outcome> {
        let cluster = &self.context.config.cluster;
        if cluster.nodes.is_empty() {
            return None;
        }
        let (view, primary) = metadata_primary(&self.context.mesh).await?;
        if primary == cluster.node {
            return None;
        }
        Some(if primary == NODE_UNKNOWN {
            let text = format!("the metadata group is changing views (view {view}): retry");
            Outcome::error(ErrorCode::TransientNotAccepted, text)
        } else {
            Outcome::not_primary(view, primary)
        })
    }

    /// Routes a request's work to `shard` (counted as forwarded when that is not this one).
    async fn send(&self, shard: u32, work: Work) -> Result<(), (ErrorCode, String)> {
        if shard != self.context.shard {
            self.context.metrics.forwarded();
        }
        self.send_internal(shard, work).await
    }

    /// Sends `work` to `shard`: a request's own work through [`Session::send`], or a fan-out
    /// that asks every shard for its figures (`DescribeTopic`, `Status`), which is no forwarding.
    async fn send_internal(&self, shard: u32, work: Work) -> Result<(), (ErrorCode, String)> {
        match self.context.mesh[shard as usize].send_async(work).await {
            Ok(()) => Ok(()),
            Err(_) => Err((ErrorCode::ShuttingDown, format!("shard {shard} stopped"))),
        }
    }

    /// Each partition's figures and primary, from the owning shards.
    async fn fill_stats(&self, partitions: &mut [PartitionInfo]) -> Vec<PartitionPrimary> {
        partition_stats(&self.context.mesh, partitions).await
    }

    /// The `Status` JSON: config, shards and every partition with its figures.
    async fn status(&self) -> String {
        let all = self.catalog.partition_infos();
        let mut infos: Vec<PartitionInfo> = all.iter().map(|(_, _, p)| *p).collect();
        let primaries = self.fill_stats(&mut infos).await;
        let config = &self.context.config;
        let (node, nodes) = (config.cluster.node, config.cluster.founders());
        let partitions: Vec<StatusPartition> = all
            .iter()
            .zip(&infos)
            .zip(&primaries)
            .map(|(((stream, topic, _), info), primary)| {
                let place =
                    self.catalog.partition(stream, topic, info.partition).ok().map(|(_, p)| p);
                let replicas = place.map_or_else(|| (0..nodes).collect(), |p| p.replicas(nodes));
                let moving_to = place.map_or(Vec::new(), |p| p.target.member_indices().collect());
                StatusPartition {
                    stream,
                    topic,
                    info,
                    primary: (primary.primary != NODE_UNKNOWN).then_some(primary.primary),
                    view: primary.view,
                    held: replicas.contains(&node) || moving_to.contains(&node),
                    replicas,
                    moving_to,
                    preferred_primary: place.map(|p| p.preferred_primary(nodes)),
                }
            })
            .collect();
        let mut reports = Vec::new();
        for shard in 0..config.shards {
            let (slot, answer) = flume::bounded(1);
            if self.send_internal(shard, Work::Report { reply: slot }).await.is_ok()
                && let Ok(report) = answer.recv_async().await
            {
                reports.push(report);
            }
        }
        let cluster = &config.cluster;
        let book = &self.catalog.nodes;
        let known = match cluster.nodes.is_empty() {
            true => 0,
            false => book.known_by(cluster),
        };
        let status = Status {
            cluster: cluster.id,
            node: cluster.node,
            nodes: (0..32 - known.leading_zeros() as u8)
                .map(|node| book.client_address(cluster, node).map(|a| a.to_string()))
                .map(Option::unwrap_or_default)
                .collect(),
            cluster_nodes: (0..32u8)
                .filter(|&node| known & (1 << node) != 0)
                .filter_map(|node| {
                    let entry = book.entry(cluster, node)?;
                    Some(StatusNode {
                        node,
                        client: entry.client.to_string(),
                        bus: entry.bus.to_string(),
                        founding: node < cluster.founders(),
                        leaving: book.leaving & (1 << node) != 0,
                    })
                })
                .collect(),
            shards: config.shards,
            shard_reports: reports,
            connections: self.context.connections.load(Ordering::SeqCst),
            config: config.to_json(),
            partitions,
        };
        serde_json::to_string(&status).expect("the status serializes")
    }
}

/// A body that does not decode: the request is invalid, and the decoder's reason says why.
fn invalid_request(error: protocol::ProtocolError) -> (ErrorCode, String) {
    (ErrorCode::InvalidRequest, error.to_string())
}

/// Consumer and group names follow the stream and topic name rule.
fn check_consumer_name(consumer: &ConsumerId) -> Result<(), (ErrorCode, String)> {
    protocol::validate_name(&consumer.name)
        .map_err(|reason| (ErrorCode::InvalidName, format!("{:?}: {reason}", consumer.name)))
}

/// The metadata group's view and primary as this node's replica sees them (the primary
/// [`NODE_UNKNOWN`] during a view change); `None` when shard 0 has stopped.
pub(crate) async fn metadata_primary(mesh: &Mesh) -> Option<(u32, u8)> {
    let (slot, answer) = flume::bounded(1);
    let work = Work::Stats { groups: vec![METADATA_GROUP], reply: slot };
    mesh[0].send_async(work).await.ok()?;
    let stats = answer.recv_async().await.ok()?;
    let &(_, GroupStats { view, primary, .. }) = stats.first()?;
    Some((view, primary))
}

/// Asks each owning shard for its partitions' figures; returns each partition's primary as
/// this node's replica sees it, in the same order (unknown where a shard did not answer).
pub(crate) async fn partition_stats(
    mesh: &Mesh,
    partitions: &mut [PartitionInfo],
) -> Vec<PartitionPrimary> {
    let unknown = PartitionPrimary { primary: NODE_UNKNOWN, view: 0 };
    let mut primaries = vec![unknown; partitions.len()];
    // Where each group sits in `partitions` (a lookup per answer, not a scan: a topic of
    // 10,000 partitions made that 50 million comparisons on the shard's thread).
    let mut at: HashMap<u64, Vec<usize>> = HashMap::new();
    for (index, partition) in partitions.iter().enumerate() {
        at.entry(partition.group).or_default().push(index);
    }
    for (shard, inbox) in (0u32..).zip(mesh.iter()) {
        let mut groups: Vec<u64> =
            partitions.iter().filter(|p| p.shard == shard).map(|p| p.group).collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.is_empty() {
            continue;
        }
        let (slot, answer) = flume::bounded(1);
        if inbox.send_async(Work::Stats { groups, reply: slot }).await.is_err() {
            continue;
        }
        let Ok(stats) = answer.recv_async().await else { continue };
        for (group, stats) in stats {
            let GroupStats { first_offset, next_offset, size_bytes, view, primary } = stats;
            for &index in at.get(&group).map_or(&[][..], Vec::as_slice) {
                let p = &mut partitions[index];
                p.first_offset = first_offset;
                p.next_offset = next_offset;
                p.size_bytes = size_bytes;
                primaries[index] = PartitionPrimary { primary, view };
            }
        }
    }
    primaries
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::wire::Command;

    #[test]
    fn connection_frames_decode_as_replies() {
        let reply = ClientReply { client: 7, request: 9, operation: 10, error: 0 };
        let mut bytes = Vec::new();
        write_frame(&mut bytes, 1, reply, b"body");
        let header = Header::decode_prefix(&bytes).unwrap();
        assert_eq!(header.command, Command::Reply);
        assert_eq!(header.as_reply(), Some(&reply));
        header.verify_body(&bytes[HEADER_SIZE..]).unwrap();
    }
}
