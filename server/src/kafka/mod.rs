//! The Kafka listener: accepting Kafka clients on every shard (beside the native listener, within
//! the same connection bound), reading their size-prefixed frames, answering each request in
//! order, and closing a connection that sends what cannot be trusted.
//!
//! A frame is bounded by `[network] frame_size_bytes_max` before anything is read into memory;
//! its header and body are decoded by `shoal_kafka` (every count bounded before allocation). A
//! malformed frame, an unknown API key or a version Shoal does not serve closes that connection
//! only, as Kafka does; an ApiVersions request of a version Shoal does not know is answered at
//! v0 with UNSUPPORTED_VERSION and the served table (KIP-511), so a newer client can downgrade.
//! This module never touches storage or replicas: what a request needs from a partition it asks
//! the owning shard through its inbox, as native connections do.

mod admin;
mod delete_records;
mod errors;
mod fetch;
mod forward;

pub(crate) use forward::call_each;
mod groups;
mod list_offsets;
mod metadata;
mod offsets;
mod produce;
mod producer_id;

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, CreatePartitionsResponse, CreateTopicsResponse,
    DeleteRecordsResponse, DeleteTopicsResponse, DescribeClusterResponse, DescribeConfigsResponse,
    DescribeGroupsResponse, FindCoordinatorResponse, HeartbeatResponse, InitProducerIdResponse,
    JoinGroupResponse, LeaveGroupResponse, ListGroupsResponse, ListOffsetsResponse,
    MetadataResponse, OffsetCommitResponse, OffsetFetchResponse, OffsetForLeaderEpochResponse,
    ProduceResponse, SyncGroupResponse,
};
use shoal_kafka::request::Request;
use shoal_kafka::{
    DecodeError, EncodeError, FetchAnswer, Reader, RequestHeader, encode_frame, serves, topic_id,
};

use shoal_proto::protocol::Operation;
use shoal_proto::wire::ClientRequest;

use crate::connection::{Acceptor, ConnectionGuard};
use crate::metadata::{Catalog, PartitionPlace, Topic};
use crate::shard::Work;
use crate::vectored::Parts;

/// A response frame: one buffer, or (Fetch) several written as one.
type Frame = Vec<Bytes>;

/// Accepts Kafka clients on `listener` until it fails; each connection is served by its own
/// task. Kafka connections count against `[network] connections_max` with native ones.
pub async fn accept(context: Rc<Acceptor>, listener: TcpListener) {
    let served = Rc::clone(&context);
    context
        .accept(listener, |stream, guard| {
            // Over the bound: Kafka has no "too many connections" answer; the socket closes.
            if let Some(guard) = guard {
                monoio::spawn(serve(stream, Rc::clone(&served), guard));
            }
        })
        .await;
}

/// Why a connection is closed.
enum Close {
    /// The client went away, or the socket failed.
    Gone,
    /// The client sent something Shoal will not answer; logged with the reason.
    Refused(String),
}

impl From<DecodeError> for Close {
    fn from(error: DecodeError) -> Self {
        Close::Refused(error.to_string())
    }
}

/// The client ids of Kafka connections' writes: a tag in the top bits (native clients pick
/// their own ids, and the owning shard keys a write by client and request number), the node
/// (a forwarded InitProducerId proposes on another node under this id), then a count of
/// connections since the process started.
const KAFKA_CLIENT_TAG: u64 = 0x4b46 << 48;
static NEXT_CLIENT: AtomicU64 = AtomicU64::new(0);

/// One connection's state across its requests.
struct Connection {
    context: Rc<Acceptor>,
    /// The client id its writes carry, unique among the node's connections.
    client: u64,
    /// Writes sent so far: the request number of each.
    requests: u64,
    /// The address this client reached: what a one-node cluster advertises as its broker.
    reached: Option<SocketAddr>,
    catalog: Arc<Catalog>,
}

async fn serve(mut stream: TcpStream, context: Rc<Acceptor>, _guard: ConnectionGuard) {
    let _open = context.metrics.connection_opened();
    let peer = stream.peer_addr().ok();
    let mut connection = Connection {
        reached: stream.local_addr().ok(),
        client: KAFKA_CLIENT_TAG
            | u64::from(context.config.cluster.node) << 40
            | (NEXT_CLIENT.fetch_add(1, Ordering::Relaxed) & ((1 << 40) - 1)),
        requests: 0,
        // Empty until the first request refreshes it (the placeholder the native side uses).
        catalog: Arc::new(Catalog::new(1, 0)),
        context,
    };
    let mut size_buf = vec![0u8; 4];
    let idle_ms = connection.context.config.network.idle_timeout_ms;
    loop {
        // One request at a time: between them the connection owes nothing, so a client that
        // stays silent past the idle timeout is closed (Kafka's connections.max.idle.ms).
        let read = stream.read_exact(size_buf);
        let (read, buf) = if idle_ms == 0 {
            read.await
        } else {
            match monoio::time::timeout(Duration::from_millis(u64::from(idle_ms)), read).await {
                Ok(read) => read,
                Err(_) => {
                    connection.context.metrics.idle_connection_closed();
                    crate::connection::shut_down(stream.as_raw_fd());
                    return;
                }
            }
        };
        size_buf = buf;
        if read.is_err() {
            return;
        }
        let size = i32::from_be_bytes([size_buf[0], size_buf[1], size_buf[2], size_buf[3]]);
        let limit = connection.context.config.network.frame_size_bytes_max;
        let outcome = match usize::try_from(size) {
            Ok(size) if size <= limit => match read_frame(&mut stream, size).await {
                Some(frame) => {
                    connection.context.metrics.received(4 + size);
                    connection.answer(frame).await
                }
                None => Err(Close::Gone),
            },
            _ => Err(Close::Refused(format!(
                "a frame of {size} bytes (the bound is {limit}, [network] frame_size_bytes_max)"
            ))),
        };
        match outcome {
            Ok(Some(mut reply)) => {
                // One buffer, or a Fetch response's parts (its batches uncopied).
                let written = if reply.len() == 1 {
                    stream.write_all(reply.pop().expect("one part")).await.0
                } else {
                    Parts::new(reply).write_all(&mut stream).await.0
                };
                match written {
                    Ok(bytes) => connection.context.metrics.sent(bytes),
                    Err(_) => return,
                }
            }
            Ok(None) => {}
            Err(Close::Gone) => return,
            Err(Close::Refused(reason)) => {
                connection.context.metrics.kafka_connection_refused();
                // At debug: a client sending garbage in a loop must not flood the log; the
                // counter shows it.
                tracing::debug!(?peer, "closing a Kafka connection: {reason}");
                return;
            }
        }
    }
}

impl Connection {
    /// The Kafka topics: those of the `[kafka] stream` (none while it does not exist).
    fn kafka_topics(&self) -> impl Iterator<Item = (&String, &Topic)> {
        let stream = self.catalog.streams.get(&self.context.config.kafka.stream);
        stream.into_iter().flat_map(|stream| stream.topics.iter())
    }

    /// A topic's Kafka topic id (see `shoal_kafka::topic_id`).
    fn topic_id(&self, topic: &Topic) -> [u8; 16] {
        let cluster = self.context.config.cluster.id;
        topic.partitions.first().map_or([0; 16], |place| topic_id(cluster, place.group))
    }

    /// The Kafka topic a request names: by `name`, or (v13+ requests, a null name) by `id`.
    /// Unknown: UNKNOWN_TOPIC_OR_PARTITION by name, UNKNOWN_TOPIC_ID by id.
    fn find_topic(
        &self,
        name: Option<&str>,
        id: &[u8; 16],
    ) -> Result<(String, &Topic), ResponseError> {
        match name {
            Some(name) => self
                .kafka_topics()
                .find(|(topic_name, _)| topic_name.as_str() == name)
                .map(|(name, topic)| (name.clone(), topic))
                .ok_or(ResponseError::UnknownTopicOrPartition),
            None => self
                .kafka_topics()
                .find(|(_, topic)| self.topic_id(topic) == *id)
                .map(|(name, topic)| (name.clone(), topic))
                .ok_or(ResponseError::UnknownTopicId),
        }
    }

    /// Partition `index` of the Kafka topic `topic`: the topic, where the partition lives and
    /// its index as Shoal counts it.
    fn find_partition(
        &self,
        topic: &str,
        index: i32,
    ) -> Result<(&Topic, PartitionPlace, u32), ResponseError> {
        let partition = u32::try_from(index).map_err(|_| ResponseError::UnknownTopicOrPartition)?;
        let (topic, place) = self
            .catalog
            .partition(&self.context.config.kafka.stream, topic, partition)
            .map_err(|_| ResponseError::UnknownTopicOrPartition)?;
        Ok((topic, place, partition))
    }

    /// The cluster id as Kafka clients see it.
    fn cluster_id(&self) -> String {
        format!("shoal-{}", self.context.config.cluster.id)
    }

    /// Each node's Kafka address and rack: its `kafka` address in `[cluster] nodes`, or, for a
    /// one-node cluster (or this node without one), the address this client reached. A node
    /// with neither is left out.
    fn broker_addresses(&self) -> Vec<(u8, SocketAddr, Option<String>)> {
        let cluster = &self.context.config.cluster;
        let book = &self.catalog.nodes;
        let known = book.known_by(cluster);
        (0..32u8)
            .filter(|&node| known & (1 << node) != 0)
            .filter_map(|node| {
                let address = match book.kafka_address(cluster, node) {
                    Some(address) => Some(address),
                    None if node == cluster.node => self.reached,
                    None => None,
                }?;
                let rack = book.entry(cluster, node).and_then(|n| n.rack.clone());
                Some((node, address, rack))
            })
            .collect()
    }

    /// The header fields of this connection's next write (produce, offset commit, metadata
    /// proposal): its client id and the next request number, no session.
    fn next_request(&mut self, operation: Operation) -> ClientRequest {
        self.requests += 1;
        ClientRequest {
            client: self.client,
            session: 0,
            request: self.requests,
            operation: operation as u32,
        }
    }

    /// Hands `work` to `shard`'s inbox; a stopped shard is NOT_LEADER_OR_FOLLOWER (the client
    /// refreshes its metadata and retries).
    async fn send(&self, shard: u32, work: Work) -> Result<(), ResponseError> {
        self.context.mesh[shard as usize]
            .send_async(work)
            .await
            .map_err(|_| ResponseError::NotLeaderOrFollower)
    }
}

/// Reads one frame body of `size` bytes (already bounded); `None` when the socket fails.
async fn read_frame(stream: &mut TcpStream, size: usize) -> Option<Bytes> {
    let (read, body) = stream.read_exact(vec![0u8; size]).await;
    read.ok().map(|_| Bytes::from(body))
}

impl Connection {
    /// The response frame to one request (`None`: the request wants none), counted by API:
    /// requests, errors and the time to answer.
    async fn answer(&mut self, frame: Bytes) -> Result<Option<Frame>, Close> {
        let mut reader = Reader::new(frame);
        let header = RequestHeader::decode(&mut reader)?;
        let started = Instant::now();
        let metrics = Rc::clone(&self.context.metrics);
        metrics.kafka_request(header.api_key);
        let answered = self.respond(&header, &mut reader).await;
        let (error, elapsed) = match &answered {
            Ok((_, error)) => (*error, Some(started.elapsed())),
            Err(_) => (true, None),
        };
        metrics.kafka_answered(header.api_key, error, elapsed);
        answered.map(|(frame, _)| frame)
    }

    /// The response frame to the request after `header`, and whether it carries an error.
    async fn respond(
        &mut self,
        header: &RequestHeader,
        reader: &mut Reader,
    ) -> Result<(Option<Frame>, bool), Close> {
        let version = header.api_version;
        if header.key() == Some(ApiKey::ApiVersions) && !serves(ApiKey::ApiVersions, version) {
            let body = shoal_kafka::api_versions(Some(ResponseError::UnsupportedVersion));
            return encoded(encode_frame(header, &body, 0), true);
        }
        let Some(request) = Request::decode(header, reader) else {
            let api = header.key().map_or_else(|| header.api_key.to_string(), |k| format!("{k:?}"));
            return Err(Close::Refused(format!(
                "{api} version {version} is not served (ApiVersions lists what is)"
            )));
        };
        // Requests that read the catalog see the newest one published.
        if !matches!(request, Ok(Request::ApiVersions(_) | Request::InitProducerId(_))) {
            self.context.published.refresh(&mut self.catalog);
        }
        let frame = |body: &dyn Answer| body.frame(header, version);
        match request? {
            Request::ApiVersions(request) => {
                tracing::debug!(
                    client = request.client_software_name.as_deref().unwrap_or("?"),
                    version = request.client_software_version.as_deref().unwrap_or("?"),
                    "Kafka client"
                );
                frame(&shoal_kafka::api_versions(None))
            }
            Request::Produce(request) => match produce::answer(self, request).await {
                Some(body) => frame(&body),
                None => Ok((None, false)),
            },
            Request::Fetch(request) => frame(&fetch::answer(self, request).await),
            Request::InitProducerId(request) => frame(&producer_id::answer(self, request).await),
            Request::ListOffsets(request) => frame(&list_offsets::answer(self, request).await),
            Request::Metadata(request) => {
                admin::auto_create(self, &request).await;
                frame(&metadata::answer(self, &request).await)
            }
            Request::FindCoordinator(request) => {
                frame(&groups::find_coordinator(self, request, version).await)
            }
            Request::JoinGroup(request) => {
                let client_id = header.client_id.as_deref();
                frame(&groups::join(self, request, version, client_id).await)
            }
            Request::SyncGroup(request) => frame(&groups::sync(self, request).await),
            Request::Heartbeat(request) => frame(&groups::heartbeat(self, request).await),
            Request::LeaveGroup(request) => frame(&groups::leave(self, request, version).await),
            Request::OffsetCommit(request) => frame(&offsets::commit(self, request).await),
            Request::OffsetFetch(request) => frame(&offsets::fetch(self, request, version).await),
            Request::OffsetForLeaderEpoch(request) => {
                frame(&offsets::for_leader_epoch(self, request).await)
            }
            Request::CreateTopics(request) => frame(&admin::create_topics(self, request).await),
            Request::CreatePartitions(request) => {
                frame(&admin::create_partitions(self, request).await)
            }
            Request::DeleteTopics(request) => frame(&admin::delete_topics(self, request).await),
            Request::DescribeConfigs(request) => frame(&admin::describe_configs(self, request)),
            Request::DescribeGroups(request) => frame(&admin::describe_groups(self, request).await),
            Request::ListGroups(request) => frame(&admin::list_groups(self, request).await),
            Request::DescribeCluster(_) => frame(&admin::describe_cluster(self).await),
            Request::DeleteRecords(request) => frame(&delete_records::answer(self, request).await),
        }
    }
}

/// A response frame to send with whether it carries an error, or (a bug: Shoal built a body
/// its version cannot carry) a close.
fn encoded(frame: Result<Bytes, EncodeError>, error: bool) -> Result<(Option<Frame>, bool), Close> {
    frame.map(|frame| (Some(vec![frame]), error)).map_err(|error| {
        tracing::error!("{error}");
        Close::Refused(error.to_string())
    })
}

/// A response body: its frame, and whether it carries an error anywhere (for the per-API
/// error counter).
trait Answer {
    fn frame(&self, header: &RequestHeader, version: i16) -> Result<(Option<Frame>, bool), Close>;
}

/// `Answer` for a body type whose error codes `$errors` lists (any iterable of `i16`).
macro_rules! answer {
    ($body:ty, |$b:ident| $errors:expr) => {
        impl Answer for $body {
            fn frame(
                &self,
                header: &RequestHeader,
                version: i16,
            ) -> Result<(Option<Frame>, bool), Close> {
                let $b = self;
                let error = $errors.into_iter().any(|code: i16| code != 0);
                encoded(encode_frame(header, self, version), error)
            }
        }
    };
}

answer!(ApiVersionsResponse, |b| [b.error_code]);
answer!(ProduceResponse, |b| b
    .responses
    .iter()
    .flat_map(|t| &t.partition_responses)
    .map(|p| p.error_code));
impl Answer for FetchAnswer {
    fn frame(&self, header: &RequestHeader, version: i16) -> Result<(Option<Frame>, bool), Close> {
        let error = self.error_codes().any(|code| code != 0);
        let frame = self.encode_frame(header, version).map_err(|error| {
            tracing::error!("{error}");
            Close::Refused(error.to_string())
        })?;
        Ok((Some(frame), error))
    }
}
answer!(InitProducerIdResponse, |b| [b.error_code]);
answer!(ListOffsetsResponse, |b| b.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code));
answer!(MetadataResponse, |b| b.topics.iter().flat_map(|t| {
    std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code))
}));
answer!(FindCoordinatorResponse, |b| std::iter::once(b.error_code)
    .chain(b.coordinators.iter().map(|c| c.error_code)));
answer!(JoinGroupResponse, |b| [b.error_code]);
answer!(SyncGroupResponse, |b| [b.error_code]);
answer!(HeartbeatResponse, |b| [b.error_code]);
answer!(LeaveGroupResponse, |b| std::iter::once(b.error_code)
    .chain(b.members.iter().map(|m| m.error_code)));
answer!(OffsetCommitResponse, |b| b
    .topics
    .iter()
    .flat_map(|t| &t.partitions)
    .map(|p| p.error_code));
answer!(OffsetFetchResponse, |b| std::iter::once(b.error_code)
    .chain(b.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code))
    .chain(b.groups.iter().flat_map(|g| {
        std::iter::once(g.error_code)
            .chain(g.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code))
    })));
answer!(CreateTopicsResponse, |b| b.topics.iter().map(|t| t.error_code));
answer!(CreatePartitionsResponse, |b| b.results.iter().map(|t| t.error_code));
answer!(DeleteTopicsResponse, |b| b.responses.iter().map(|t| t.error_code));
answer!(DeleteRecordsResponse, |b| b
    .topics
    .iter()
    .flat_map(|t| &t.partitions)
    .map(|p| p.error_code));
answer!(DescribeConfigsResponse, |b| b.results.iter().map(|r| r.error_code));
answer!(DescribeGroupsResponse, |b| b.groups.iter().map(|g| g.error_code));
answer!(ListGroupsResponse, |b| [b.error_code]);
answer!(DescribeClusterResponse, |b| [b.error_code]);
answer!(OffsetForLeaderEpochResponse, |b| b
    .topics
    .iter()
    .flat_map(|t| &t.partitions)
    .map(|p| p.error_code));
