//! The async client: connect, admin calls, produce, fetch and status over the native protocol.
//!
//! [`Client`] owns the client's identity (a random client id, the registered session), the seed
//! list, its connections and what it believes about the cluster (`routes`). Against a cluster
//! (protocol version 3) it keeps one connection per node it talks to and sends each request to
//! the node that leads what the request is about: admin, session and consumer group requests to
//! the metadata group's primary, a partition's requests to that partition's primary (learned from
//! `DescribeTopic` and from every `NotPrimary` answer). Against one node (or an older server) it
//! keeps one connection, as before: to the seeds in turn (the one that worked last first), after
//! the shard address [`Client::connect_to_shard`] chose, if any.
//!
//! Every call is bounded by `request_timeout_ms`. A call answered `NotPrimary` goes at once to
//! the node the answer names, and one answered `TransientNotAccepted` (nothing was done) is sent
//! again after a growing backoff, within the same time bound; a read (listing, describing,
//! status, a fetch, a stored offset, a heartbeat) whose connection broke is sent again too,
//! since repeating it is harmless. A write whose outcome became unknown (a broken connection, a
//! timeout, `TransientNotCommitted`) is never repeated by the client: it fails with a retryable
//! error ([`ClientError::is_retryable`]) and the caller decides — the [`crate::Producer`] does,
//! with the same producer sequence. A connection that failed or timed out is dropped; the next
//! call reconnects, to the node believed to lead, then to any node (the seeds, then every node
//! a `Hello` named).
//!
//! It runs on the calling thread's monoio runtime, which must have its timer enabled
//! ([`runtime`] builds one). It never spawns tasks or threads, and is `!Send`, like every
//! per-core object in Shoal.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_proto::protocol::consumer::{
    self, Assignment, GroupMember, JoinGroup, OffsetKey, PartitionRef, Poll, StoreOffset,
};
use shoal_proto::protocol::{
    AddNode, CreateTopic, Fetch, FetchFrom, FetchReply, HelloReply, MovePartition, Operation,
    PartitionInfo, Partitioning, Produce, ProduceReply, RemoveNode, StreamInfo, TopicDescription,
    TopicInfo, Writer, decode_session, decode_streams, decode_topics, encode_stream_name,
    encode_topic_name,
};

use crate::connection::ConnectionConfig;
use crate::error::{ClientError, Result};
use crate::fetch::Fetched;
use crate::routes::{Route, Routes, resolve};
use crate::transport::Transport;

mod links;

pub(crate) use links::is_catalog_lag;

/// How to reach the server and the limits every call keeps.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Server addresses (`HOST:PORT`), tried in turn on (re)connect.
    pub seeds: Vec<String>,
    /// The cluster id requests carry (a single node's is 1).
    pub cluster: u64,
    /// Free text naming the client in the server's logs.
    pub client_name: String,
    /// Register a session (the producer id) when first connecting.
    pub register: bool,
    /// Longest wait for one call's reply (or one pipelined reply), in milliseconds.
    pub request_timeout_ms: u64,
    /// Longest wait for a TCP connection to one seed, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Requests one connection may have outstanding (keep it at or below the server's
    /// `requests_in_flight_max`).
    pub in_flight_max: usize,
    /// Largest request frame (header plus body) the client sends.
    pub frame_size_bytes_max: usize,
    /// Largest reply frame the client accepts; a fetch's `bytes_max` should leave room below it.
    pub reply_size_bytes_max: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            seeds: vec!["127.0.0.1:7070".to_string()],
            cluster: 1,
            client_name: format!("shoal-client/{}", env!("CARGO_PKG_VERSION")),
            register: false,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            in_flight_max: 32,
            // The server's default frame limit (1 MiB of batch plus room for the arguments).
            frame_size_bytes_max: (1 << 20) + (64 << 10),
            // A fetch returns at least one whole batch even when it exceeds `bytes_max`.
            reply_size_bytes_max: (16 << 20) + (64 << 10),
        }
    }
}

impl ClientConfig {
    /// The defaults with these seed addresses.
    pub fn with_seeds<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig { seeds: seeds.into_iter().map(Into::into).collect(), ..Default::default() }
    }

    fn connection(&self, client: u64) -> ConnectionConfig {
        ConnectionConfig {
            cluster: self.cluster,
            client,
            in_flight_max: self.in_flight_max.max(1),
            frame_size_bytes_max: self.frame_size_bytes_max,
            reply_size_bytes_max: self.reply_size_bytes_max,
        }
    }
}

/// Builds a single-threaded monoio runtime on the io_uring driver with its timer enabled, as the
/// client needs. Fails (rather than falling back to epoll) where io_uring is unavailable.
pub fn runtime() -> std::io::Result<monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>>>
{
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer().with_entries(256).build()
}

/// A connection-managing client. See the module documentation.
#[derive(Debug)]
pub struct Client {
    config: ClientConfig,
    client_id: u64,
    session: u64,
    /// The number the next request carries, on whichever connection: numbers keep increasing
    /// across connections, because the server deduplicates admin requests by (session, request).
    next_request: u64,
    /// The open connections, at most one per address.
    links: Vec<Link>,
    /// The link untargeted calls use ([`Client::submit`], [`Client::status`], ...).
    current: Option<u64>,
    /// The id the next link gets (ids are never reused, so a request sent on a link that broke
    /// is never matched with a later link to the same address).
    next_link: u64,
    /// What the current link's server said in its `Hello` (or the last one's).
    server: Option<HelloReply>,
    /// The seed to try first on the next connect: the one that worked last.
    seed_first: usize,
    /// The shard listener [`Client::connect_to_shard`] chose, tried before the seeds.
    preferred: Option<String>,
    /// The address of the current link (or of the last one).
    address: Option<String>,
    /// Where requests go in a cluster.
    routes: Routes,
}

/// One open connection.
#[derive(Debug)]
struct Link {
    id: u64,
    address: String,
    /// The node its `Hello` (version 3) named.
    node: Option<u8>,
    transport: Transport,
}

impl Client {
    /// Connects to the first seed that answers, negotiates the version and, if configured,
    /// registers a session (with the metadata group's primary, wherever the seed was).
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        let mut client = Client {
            config,
            client_id: random_client_id(),
            session: 0,
            next_request: 1,
            links: Vec::new(),
            current: None,
            next_link: 1,
            server: None,
            seed_first: 0,
            preferred: None,
            address: None,
            routes: Routes::default(),
        };
        client.reconnect(None).await?;
        if client.config.register {
            client.register().await?;
        }
        Ok(client)
    }

    /// The random id this client carries in every request.
    pub fn id(&self) -> u64 {
        self.client_id
    }

    /// The registered session (`0` if none).
    pub fn session(&self) -> u64 {
        self.session
    }

    /// What the server said in its last `Hello` reply (version, shards, name, cluster).
    pub fn server(&self) -> Option<&HelloReply> {
        self.server.as_ref()
    }

    /// The address of the live connection (or of the last one): a seed, or the shard address
    /// [`Client::connect_to_shard`] moved to.
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// The client address of every node a version 3 `Hello` named, in node order (empty before
    /// one did: an older server). Nodes without an address are left out, so a position here
    /// is not a node index: [`Client::node_addresses`] pairs each with its index.
    pub fn nodes(&self) -> Vec<String> {
        self.routes.addresses().map(str::to_string).collect()
    }

    /// Every node's index and client address, as a version 3 `Hello` named them.
    pub fn node_addresses(&self) -> Vec<(u8, String)> {
        self.routes.indexed_addresses().map(|(node, address)| (node, address.to_string())).collect()
    }

    /// The node the client believes leads what `route` is about (`None`: no belief, or a
    /// one-node cluster, whose requests all go over the current connection).
    pub fn believed_primary(&self, route: &Route<'_>) -> Option<u8> {
        self.routes.primary(route)
    }

    /// Where shard `shard`'s own listener is, as the server's `Hello` result named it (`None`:
    /// the server speaks protocol version 1 or has no per-shard listeners). An unspecified IP
    /// (the server listens on every interface) is replaced by the host this connection reached.
    pub fn shard_address(&self, shard: u32) -> Option<String> {
        let advertised = self.server.as_ref()?.shard_addresses.get(shard as usize)?;
        let parsed: std::net::SocketAddr = advertised.parse().ok()?;
        if !parsed.ip().is_unspecified() {
            return Some(advertised.clone());
        }
        Some(resolve(advertised, self.address.as_deref()?))
    }

    /// Moves the client to shard `shard`'s own listener, so that requests for the partitions it
    /// owns are served there without being forwarded between shards. Returns whether the
    /// connection is now served by that shard. Without a shard address (`Client::shard_address`)
    /// the client stays where it is; if the shard's address cannot be reached the client falls
    /// back to its seeds and forgets the address. Requests outstanding on the current connection
    /// are lost: call it with none.
    pub async fn connect_to_shard(&mut self, shard: u32) -> Result<bool> {
        if self.is_connected() && self.server.as_ref().is_some_and(|hello| hello.version >= 2) {
            let here = self.server.as_ref().map(|hello| hello.shard);
            if here == Some(shard) {
                return Ok(true);
            }
        }
        let Some(address) = self.shard_address(shard) else { return Ok(false) };
        self.preferred = Some(address);
        self.reconnect(Some(Instant::now() + self.request_timeout())).await?;
        Ok(self.server.as_ref().is_some_and(|hello| hello.version >= 2 && hello.shard == shard))
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Whether a connection is open (it may still turn out broken on the next call).
    pub fn is_connected(&self) -> bool {
        self.current.is_some_and(|id| self.link_alive(id))
    }

    /// Closes every connection; the next call reconnects.
    pub fn disconnect(&mut self) {
        self.links.clear();
        self.current = None;
    }

    // -- Admin ---------------------------------------------------------------------------------

    /// Creates a stream.
    pub async fn create_stream(&mut self, name: &str) -> Result<()> {
        self.call(Operation::CreateStream, &[&encode_stream_name(name)]).await.map(drop)
    }

    /// Deletes a stream and its topics.
    pub async fn delete_stream(&mut self, name: &str) -> Result<()> {
        self.call(Operation::DeleteStream, &[&encode_stream_name(name)]).await.map(drop)
    }

    /// Lists the streams.
    pub async fn list_streams(&mut self) -> Result<Vec<StreamInfo>> {
        let body = self.call(Operation::ListStreams, &[]).await?;
        decode_streams(&body).map_err(|e| ClientError::Protocol(format!("ListStreams reply: {e}")))
    }

    /// Creates a topic.
    pub async fn create_topic(&mut self, topic: &CreateTopic) -> Result<()> {
        self.call(Operation::CreateTopic, &[&topic.encode()]).await.map(drop)
    }

    /// Starts, cancels or reports the end of a partition's move (`MovePartition`).
    pub async fn move_partition(&mut self, request: &MovePartition) -> Result<()> {
        self.call(Operation::MovePartition, &[&request.encode()]).await.map(drop)
    }

    /// Adds a node to the cluster (`AddNode`); returns the index it was given.
    pub async fn add_node(&mut self, request: &AddNode) -> Result<u8> {
        let body = self.call(Operation::AddNode, &[&request.encode()]).await?;
        match body.as_ref() {
            [node] => Ok(*node),
            other => Err(ClientError::Protocol(format!("AddNode reply of {} bytes", other.len()))),
        }
    }

    /// Starts removing a node, its partitions going to `replacement` or spread over the others
    /// (`RemoveNode`).
    pub async fn remove_node(&mut self, request: &RemoveNode) -> Result<()> {
        self.call(Operation::RemoveNode, &[&request.encode()]).await.map(drop)
    }

    /// Deletes a topic.
    pub async fn delete_topic(&mut self, stream: &str, topic: &str) -> Result<()> {
        self.call(Operation::DeleteTopic, &[&encode_topic_name(stream, topic)]).await.map(drop)
    }

    /// Lists a stream's topics.
    pub async fn list_topics(&mut self, stream: &str) -> Result<Vec<TopicInfo>> {
        let body = self.call(Operation::ListTopics, &[&encode_stream_name(stream)]).await?;
        decode_topics(&body).map_err(|e| ClientError::Protocol(format!("ListTopics reply: {e}")))
    }

    /// One topic with its partitions (shard, group, first and next offsets, size).
    pub async fn describe_topic(
        &mut self,
        stream: &str,
        topic: &str,
    ) -> Result<(TopicInfo, Vec<PartitionInfo>)> {
        let description = self.describe(stream, topic).await?;
        Ok((description.topic, description.partitions))
    }

    /// One topic with its partitions and, from a version 3 server, each partition's primary as
    /// the answering node believes it (which the client takes as its own belief too).
    pub async fn describe(&mut self, stream: &str, topic: &str) -> Result<TopicDescription> {
        let body =
            self.call(Operation::DescribeTopic, &[&encode_topic_name(stream, topic)]).await?;
        let description = TopicDescription::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("DescribeTopic reply: {e}")))?;
        let partitions = description.partitions.iter().map(|p| p.partition);
        self.routes.learn_topic(stream, topic, partitions, &description.primaries);
        Ok(description)
    }

    /// The status document (JSON text) of the node the client is connected to: cluster, shards
    /// and their groups, config, partitions and their offsets.
    pub async fn status(&mut self) -> Result<String> {
        let body = self.call(Operation::Status, &[]).await?;
        status_text(&body)
    }

    /// The status document of node `node` (see [`Client::nodes`]).
    pub async fn status_of(&mut self, node: u8) -> Result<String> {
        let link = self.link_to(Some(node), Instant::now() + self.request_timeout()).await?;
        let body = self.call_on(link, Duration::ZERO, Operation::Status, &[]).await?;
        status_text(&body)
    }

    // -- Data ----------------------------------------------------------------------------------

    /// Appends one record batch (Kafka RecordBatch v2, e.g. from `BatchBuilder`) and waits for
    /// its acknowledgement; an explicit partition's batch goes to its primary. For many records,
    /// `Producer` batches, pipelines and retries.
    pub async fn produce(
        &mut self,
        stream: &str,
        topic: &str,
        partitioning: Partitioning,
        batch: &[u8],
    ) -> Result<ProduceReply> {
        let route = match partitioning {
            Partitioning::Explicit(partition) => Route::Partition { stream, topic, partition },
            Partitioning::Key(_) | Partitioning::Balanced => Route::Any,
        };
        let mut prefix = Writer::new();
        Produce { stream: stream.to_string(), topic: topic.to_string(), partitioning }
            .encode_prefix(&mut prefix);
        let parts: &[&[u8]] = &[&prefix.bytes, batch];
        let body = self.call_routed(&route, Duration::ZERO, Operation::Produce, parts).await?;
        ProduceReply::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("Produce reply: {e}")))
    }

    /// Reads batches from a partition (at its primary). The result's `records` skips records
    /// before the requested position. With `wait_ms_max`, the server holds the request until
    /// data is committed at the position or the wait runs out; the request timeout runs on top
    /// of it.
    pub async fn fetch(&mut self, fetch: &Fetch) -> Result<Fetched> {
        let wait = Duration::from_millis(u64::from(fetch.wait_ms_max));
        let route = partition_route(&fetch.stream, &fetch.topic, fetch.partition);
        let body = self.call_routed(&route, wait, Operation::Fetch, &[&fetch.encode()]).await?;
        let (reply, at) = FetchReply::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("Fetch reply: {e}")))?;
        if reply.partition != fetch.partition {
            return Err(ClientError::Protocol(format!(
                "asked partition {} for records, the reply is for partition {}",
                fetch.partition, reply.partition
            )));
        }
        Fetched::new(reply, body.slice(at..), fetch.from)
    }

    // -- Consumers -----------------------------------------------------------------------------

    /// Stores `consumer`'s offset (of the next message to process) in a partition. A group's
    /// member names its membership (member id and generation); a standalone consumer passes
    /// `Membership::default()`.
    pub async fn store_offset(&mut self, store: &StoreOffset) -> Result<()> {
        let route = partition_ref_route(&store.partition);
        let body = store.encode();
        self.call_routed(&route, Duration::ZERO, Operation::StoreOffset, &[&body]).await.map(drop)
    }

    /// `consumer`'s stored offset in a partition, if any.
    pub async fn get_offset(&mut self, key: &OffsetKey) -> Result<Option<u64>> {
        let route = partition_ref_route(&key.partition);
        let body = self
            .call_routed(&route, Duration::ZERO, Operation::GetOffset, &[&key.encode()])
            .await?;
        consumer::decode_stored_offset(&body)
            .map_err(|e| ClientError::Protocol(format!("GetOffset reply: {e}")))
    }

    /// Deletes `consumer`'s stored offset in a partition (a group's only while it has no
    /// members).
    pub async fn delete_offset(&mut self, key: &OffsetKey) -> Result<()> {
        let route = partition_ref_route(&key.partition);
        let body = key.encode();
        self.call_routed(&route, Duration::ZERO, Operation::DeleteOffset, &[&body]).await.map(drop)
    }

    /// Joins a topic's consumer group (an empty `member` joins as a new member). Answered once
    /// an assignment including the member is in force, so the wait is bounded by a rebalance,
    /// not the request timeout alone.
    pub async fn join_group(&mut self, join: &JoinGroup) -> Result<Assignment> {
        let rebalance = Duration::from_millis(u64::from(join.session_timeout_ms));
        let body = join.encode();
        let body =
            self.call_routed(&Route::Metadata, rebalance, Operation::JoinGroup, &[&body]).await?;
        Assignment::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("JoinGroup reply: {e}")))
    }

    /// Keeps a member alive; returns its part of the assignment in force (a new generation
    /// means a rebalance happened: commit under the new one from now on).
    pub async fn heartbeat(&mut self, member: &GroupMember) -> Result<Assignment> {
        let body = self.call(Operation::Heartbeat, &[&member.encode()]).await?;
        Assignment::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("Heartbeat reply: {e}")))
    }

    /// Leaves a consumer group; its partitions go to the other members.
    pub async fn leave_group(&mut self, member: &GroupMember) -> Result<()> {
        self.call(Operation::LeaveGroup, &[&member.encode()]).await.map(drop)
    }

    /// Fetches from the consumer's stored offset (from the first message when it has none),
    /// waiting up to `wait_ms_max` for data; with `auto_commit` the server stores the offset
    /// after what it returns before answering (at-most-once delivery of what it returned).
    pub async fn poll(&mut self, poll: &Poll) -> Result<Fetched> {
        let wait = Duration::from_millis(u64::from(poll.wait_ms_max));
        let route = partition_ref_route(&poll.partition);
        let body = self.call_routed(&route, wait, Operation::Poll, &[&poll.encode()]).await?;
        let start = body
            .first_chunk::<8>()
            .map(|bytes| u64::from_le_bytes(*bytes))
            .ok_or_else(|| ClientError::Protocol("Poll reply: shorter than its start".into()))?;
        let body = body.slice(8..);
        let (reply, at) = FetchReply::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("Poll reply: {e}")))?;
        if reply.partition != poll.partition.partition {
            return Err(ClientError::Protocol(format!(
                "polled partition {}, the reply is for partition {}",
                poll.partition.partition, reply.partition
            )));
        }
        Fetched::new(reply, body.slice(at..), FetchFrom::Offset(start))
    }

    // -- Requests ------------------------------------------------------------------------------

    /// Sends one request and waits for its reply body, within the request timeout: an admin,
    /// session or consumer group request to the metadata group's primary, anything else over
    /// the current connection (a request naming a partition follows the `NotPrimary` answer of
    /// a node that does not lead it).
    pub async fn call(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<Bytes> {
        let route = if goes_to_metadata_primary(operation) { Route::Metadata } else { Route::Any };
        self.call_routed(&route, Duration::ZERO, operation, body_parts).await
    }

    /// Registers a session with the metadata group's primary; every connection carries it from
    /// now on.
    async fn register(&mut self) -> Result<()> {
        let body = self.call(Operation::Register, &[]).await?;
        self.session = decode_session(&body)
            .map_err(|e| ClientError::Protocol(format!("Register reply: {e}")))?;
        for link in &mut self.links {
            link.transport.connection.set_session(self.session);
        }
        Ok(())
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms.max(1))
    }
}

/// Whether `operation` is served by the metadata group's primary: metadata changes and sessions,
/// the catalog reads (so a client reads its own changes) and consumer group coordination.
fn goes_to_metadata_primary(operation: Operation) -> bool {
    operation.is_metadata_write()
        || matches!(
            operation,
            Operation::ListStreams
                | Operation::ListTopics
                | Operation::DescribeTopic
                | Operation::JoinGroup
                | Operation::Heartbeat
                | Operation::LeaveGroup
        )
}

fn partition_route<'a>(stream: &'a str, topic: &'a str, partition: u32) -> Route<'a> {
    Route::Partition { stream, topic, partition }
}

fn partition_ref_route(partition: &PartitionRef) -> Route<'_> {
    partition_route(&partition.stream, &partition.topic, partition.partition)
}

fn status_text(body: &[u8]) -> Result<String> {
    String::from_utf8(body.to_vec())
        .map_err(|_| ClientError::Protocol("the Status reply is not UTF-8".into()))
}

/// A random, non-zero client id without a `rand` dependency: `RandomState` is seeded from the
/// operating system's randomness, and time, process id and a stack address are mixed in so two
/// clients in one process, or two processes started together, differ.
fn random_client_id() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(now);
    hasher.write_u32(std::process::id());
    let marker = 0u8;
    hasher.write_usize(std::ptr::addr_of!(marker) as usize);
    hasher.finish().max(1)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::testing::{
        Faults, MemoryServer, batch_of, spawn_cluster, spawn_cluster_with_silent, spawn_tcp,
    };
    use shoal_proto::protocol::{ErrorCode, FetchFrom};

    fn config(address: std::net::SocketAddr) -> ClientConfig {
        ClientConfig {
            request_timeout_ms: 2_000,
            connect_timeout_ms: 2_000,
            ..ClientConfig::with_seeds([address.to_string()])
        }
    }

    #[test]
    fn client_ids_are_random_and_non_zero() {
        let ids: std::collections::BTreeSet<u64> = (0..64).map(|_| random_client_id()).collect();
        assert_eq!(ids.len(), 64);
        assert!(!ids.contains(&0));
    }

    #[test]
    fn client_calls_over_tcp_and_maps_server_errors() {
        let server = Arc::new(Mutex::new(MemoryServer::new(2)));
        let address = spawn_tcp(server.clone(), Faults::default());
        runtime().unwrap().block_on(async move {
            let mut client = Client::connect(ClientConfig {
                register: true,
                // An unreachable seed first: connect moves on to the next.
                seeds: vec!["127.0.0.1:1".into(), address.to_string()],
                ..config(address)
            })
            .await
            .unwrap();
            assert_eq!(client.server().map(|h| h.version), Some(1));
            assert_eq!(client.session(), 7);
            client.create_stream("s").await.unwrap();
            let error = client.create_stream("missing").await.unwrap_err();
            assert_eq!(error.code(), Some(ErrorCode::StreamNotFound));
            assert_eq!(error.to_string(), "StreamNotFound: stream \"missing\" not found");
            assert_eq!(client.list_streams().await.unwrap()[0].name, "s");
            let (topic, partitions) = client.describe_topic("s", "t").await.unwrap();
            assert_eq!((topic.partitions, partitions.len()), (2, 2));
            assert!(client.status().await.unwrap().contains("shards"));

            let batch = batch_of(0, 1_000, &["x", "y", "z"]);
            let reply = client.produce("s", "t", Partitioning::Explicit(1), &batch).await.unwrap();
            assert_eq!((reply.partition, reply.base_offset, reply.record_count), (1, 0, 3));
            let fetch = Fetch {
                stream: "s".into(),
                topic: "t".into(),
                partition: 1,
                from: FetchFrom::Offset(1),
                bytes_max: 1 << 20,
                count_max: 100,
                wait_ms_max: 0,
            };
            let fetched = client.fetch(&fetch).await.unwrap();
            let values: Vec<(u64, Vec<u8>)> = fetched
                .records()
                .map(|r| r.map(|r| (r.offset, r.value.unwrap().to_vec())).unwrap())
                .collect();
            assert_eq!(values, [(1, b"y".to_vec()), (2, b"z".to_vec())]);
        });
    }

    #[test]
    fn client_reconnects_on_the_next_call_after_the_connection_breaks() {
        let server = Arc::new(Mutex::new(MemoryServer::new(1)));
        // The first connection answers Hello, then closes instead of answering.
        let address = spawn_tcp(server, Faults { close_first_after: Some(1), ..Faults::default() });
        runtime().unwrap().block_on(async move {
            let mut client = Client::connect(config(address)).await.unwrap();
            let id = client.id();
            // A write whose outcome is unknown is not sent again by the client.
            let error = client.create_stream("s").await.unwrap_err();
            assert!(matches!(error, ClientError::Closed | ClientError::Io(_)), "{error:?}");
            assert!(error.is_retryable());
            assert!(!client.is_connected());
            // The next call reconnects (Hello again) and succeeds, with the same identity.
            assert_eq!(client.list_streams().await.unwrap().len(), 1);
            assert_eq!(client.id(), id);
            // Request numbers went on across the connections (Hello 1, the lost call 2, Hello
            // 3, the call 4): a number never names two requests of one session.
            assert_eq!(client.next_request, 5);
        });
    }

    #[test]
    fn client_sends_a_read_again_when_its_connection_breaks() {
        let server = Arc::new(Mutex::new(MemoryServer::new(1)));
        let address = spawn_tcp(server, Faults { close_first_after: Some(1), ..Faults::default() });
        runtime().unwrap().block_on(async move {
            let mut client = Client::connect(config(address)).await.unwrap();
            // Listing is harmless to repeat: the lost one is sent again on a new connection.
            assert_eq!(client.list_streams().await.unwrap().len(), 1);
            assert_eq!(client.next_request, 5);
        });
    }

    /// Three nodes; the client is given node 0 only. Node 2 leads the metadata group, node 1
    /// partition 0 and node 2 partition 1.
    fn cluster_of_three() -> (Arc<Mutex<MemoryServer>>, Vec<std::net::SocketAddr>) {
        let server = Arc::new(Mutex::new(MemoryServer::new(2)));
        let nodes = spawn_cluster(&server, 3);
        let mut state = server.lock().unwrap();
        state.metadata_primary = 2;
        state.primaries = vec![1, 2];
        drop(state);
        (server, nodes)
    }

    #[test]
    fn client_follows_not_primary_to_the_metadata_and_partition_primaries() {
        let (server, nodes) = cluster_of_three();
        let seed = nodes[0];
        let shared = Arc::clone(&server);
        runtime().unwrap().block_on(async move {
            // Registering at node 0 is redirected to node 2, the metadata primary.
            let mut client =
                Client::connect(ClientConfig { register: true, ..config(seed) }).await.unwrap();
            assert_eq!(client.session(), 7);
            let all: Vec<String> = nodes.iter().map(ToString::to_string).collect();
            assert_eq!(client.nodes(), all);
            assert_eq!(client.believed_primary(&Route::Metadata), Some(2));
            // Admin requests now go straight there.
            client.create_stream("s").await.unwrap();
            // Describing teaches every partition's primary.
            let description = client.describe("s", "t").await.unwrap();
            assert_eq!(description.primaries.iter().map(|p| p.primary).collect::<Vec<_>>(), [1, 2]);
            let partition = |partition| Route::Partition { stream: "s", topic: "t", partition };
            assert_eq!(client.believed_primary(&partition(0)), Some(1));
            let batch = batch_of(0, 1_000, &["x"]);
            for p in 0..2 {
                let reply = client.produce("s", "t", Partitioning::Explicit(p), &batch).await;
                assert_eq!(reply.unwrap().partition, p);
            }
            // Partition 0 moves to node 0: the client's belief (node 1) is refused once and
            // followed at once.
            shared.lock().unwrap().primaries[0] = 0;
            client.produce("s", "t", Partitioning::Explicit(0), &batch).await.unwrap();
            assert_eq!(client.believed_primary(&partition(0)), Some(0));
            let fetch = Fetch {
                stream: "s".into(),
                topic: "t".into(),
                partition: 0,
                from: FetchFrom::First,
                bytes_max: 1 << 20,
                count_max: 100,
                wait_ms_max: 0,
            };
            assert_eq!(client.fetch(&fetch).await.unwrap().records().count(), 2);
        });
        let server = server.lock().unwrap();
        // One redirect for the registration (node 0), one for the moved partition (node 1);
        // nothing else went to the wrong node.
        assert_eq!(server.redirects_by_node, [1, 1, 0]);
    }

    #[test]
    fn client_goes_to_any_node_when_the_believed_primary_is_down() {
        let (server, nodes) = cluster_of_three();
        runtime().unwrap().block_on(async move {
            let mut client = Client::connect(config(nodes[0])).await.unwrap();
            client.describe("s", "t").await.unwrap();
            let partition = Route::Partition { stream: "s", topic: "t", partition: 0 };
            assert_eq!(client.believed_primary(&partition), Some(1));
            // Node 1 dies and node 2 takes partition 0 over: the believed primary cannot be
            // reached, so the client asks any node, is redirected, and goes there.
            {
                let mut state = server.lock().unwrap();
                state.down[1] = true;
                state.primaries[0] = 2;
            }
            let batch = batch_of(0, 1_000, &["x"]);
            let reply = client.produce("s", "t", Partitioning::Explicit(0), &batch).await.unwrap();
            assert_eq!((reply.partition, reply.base_offset), (0, 0));
            assert_eq!(client.believed_primary(&partition), Some(2));
        });
    }

    #[test]
    fn client_gives_up_following_within_the_request_timeout() {
        let (server, nodes) = cluster_of_three();
        // Every node names another as the metadata primary: a redirect loop.
        server.lock().unwrap().metadata_primary = 1;
        runtime().unwrap().block_on(async move {
            let mut client =
                Client::connect(ClientConfig { request_timeout_ms: 500, ..config(nodes[0]) })
                    .await
                    .unwrap();
            server.lock().unwrap().down[1] = true;
            let started = std::time::Instant::now();
            let error = client.create_stream("s").await.unwrap_err();
            assert!(error.is_retryable(), "{error:?}");
            assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        });
    }

    /// Reconnecting counts towards a call's request timeout: a call whose node went down does
    /// not try hung nodes a `Hello` named one request timeout each.
    #[test]
    fn a_reconnect_past_hung_nodes_stays_within_the_request_timeout() {
        let server = Arc::new(Mutex::new(MemoryServer::new(2)));
        let nodes = spawn_cluster_with_silent(&server, 9, 8);
        runtime().unwrap().block_on(async move {
            let config = ClientConfig { request_timeout_ms: 400, ..config(nodes[0]) };
            let mut client = Client::connect(config).await.unwrap();
            assert_eq!(client.nodes().len(), 9);
            server.lock().unwrap().down[0] = true;
            // The call that finds the connection closed fails at once; the next reconnects.
            client.create_stream("s").await.unwrap_err();
            let started = std::time::Instant::now();
            let error = client.create_stream("s").await.unwrap_err();
            assert!(matches!(error, ClientError::Timeout), "{error:?}");
            // One timeout per hung node would be 3.2 s.
            let took = started.elapsed();
            assert!(took < Duration::from_millis(2_000), "the call took {took:?}");
        });
    }

    #[test]
    fn client_call_is_bounded_by_the_request_timeout() {
        let server = Arc::new(Mutex::new(MemoryServer::new(1)));
        let address = spawn_tcp(server, Faults { silent: true, ..Faults::default() });
        runtime().unwrap().block_on(async move {
            let config = ClientConfig { request_timeout_ms: 200, ..config(address) };
            // Even the handshake is bounded.
            let error = Client::connect(config).await.unwrap_err();
            assert!(matches!(error, ClientError::Timeout), "{error:?}");
        });
    }

    #[test]
    fn client_connect_names_the_address_that_refused() {
        runtime().unwrap().block_on(async move {
            let config = ClientConfig::with_seeds(["127.0.0.1:1"]);
            let error = Client::connect(config).await.unwrap_err();
            assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
            assert!(error.is_retryable());
        });
    }
}
