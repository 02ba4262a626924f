//! The async client: connect, admin calls, produce, fetch and status over the native protocol.
//!
//! [`Client`] owns the client's identity (a random client id, the registered session), the seed
//! list and at most one live [`Transport`]. Every call is bounded by `request_timeout_ms`; a
//! connection that failed or timed out is dropped, and the next call reconnects, trying the seeds
//! in turn (the one that worked last first) — after the shard address
//! [`Client::connect_to_shard`] chose, if any: a server with per-shard listeners names them in
//! its `Hello` result, and a connection there is served by that shard without forwarding. Requests outstanding on a dropped connection fail
//! with a retryable error ([`ClientError::is_retryable`]); the client never retries a call by
//! itself, because only the caller knows whether a repeat is harmless.
//!
//! It runs on the calling thread's monoio runtime, which must have its timer enabled
//! ([`runtime`] builds one). It never spawns tasks or threads, and is `!Send`, like every
//! per-core object in Shoal.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use bytes::Bytes;
use shoal_proto::protocol::consumer::{
    self, Assignment, GroupMember, JoinGroup, OffsetKey, Poll, StoreOffset,
};
use shoal_proto::protocol::{
    CreateTopic, Fetch, FetchFrom, FetchReply, HelloReply, Operation, PartitionInfo, Partitioning,
    Produce, ProduceReply, StreamInfo, TopicInfo, Writer, decode_describe, decode_streams,
    decode_topics, encode_stream_name, encode_topic_name,
};

use crate::connection::{ConnectionConfig, HelloState, Reply};
use crate::error::{ClientError, Result};
use crate::fetch::Fetched;
use crate::split::{ReplyReceiver, RequestSender};
use crate::transport::Transport;

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
    /// across reconnects, because the server deduplicates admin requests by (session, request).
    next_request: u64,
    transport: Option<Transport>,
    server: Option<HelloReply>,
    /// The seed to try first on the next connect: the one that worked last.
    seed_first: usize,
    /// The shard listener [`Client::connect_to_shard`] chose, tried before the seeds.
    preferred: Option<String>,
    /// The address of the live connection (or of the last one).
    address: Option<String>,
}

impl Client {
    /// Connects to the first seed that answers, negotiates the version and, if configured,
    /// registers a session.
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        let mut client = Client {
            config,
            client_id: random_client_id(),
            session: 0,
            next_request: 1,
            transport: None,
            server: None,
            seed_first: 0,
            preferred: None,
            address: None,
        };
        client.reconnect().await?;
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

    /// What the server said in its last `Hello` reply (version, shards, name).
    pub fn server(&self) -> Option<&HelloReply> {
        self.server.as_ref()
    }

    /// The address of the live connection (or of the last one): a seed, or the shard address
    /// [`Client::connect_to_shard`] moved to.
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
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
        let reached = self.address.as_deref()?;
        let host = reached.rsplit_once(':').map_or(reached, |(host, _)| host);
        Some(format!("{host}:{}", parsed.port()))
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
        self.reconnect().await?;
        Ok(self.server.as_ref().is_some_and(|hello| hello.version >= 2 && hello.shard == shard))
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Whether a connection is open (it may still turn out broken on the next call).
    pub fn is_connected(&self) -> bool {
        self.transport.as_ref().is_some_and(|t| !t.connection.is_failed())
    }

    /// Closes the connection; the next call reconnects.
    pub fn disconnect(&mut self) {
        self.transport = None;
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
        let body =
            self.call(Operation::DescribeTopic, &[&encode_topic_name(stream, topic)]).await?;
        decode_describe(&body)
            .map_err(|e| ClientError::Protocol(format!("DescribeTopic reply: {e}")))
    }

    /// The server's status document (JSON text): shards, config, partitions and their offsets.
    pub async fn status(&mut self) -> Result<String> {
        let body = self.call(Operation::Status, &[]).await?;
        String::from_utf8(body.to_vec())
            .map_err(|_| ClientError::Protocol("the Status reply is not UTF-8".into()))
    }

    // -- Data ----------------------------------------------------------------------------------

    /// Appends one record batch (Kafka RecordBatch v2, e.g. from `BatchBuilder`) and waits for
    /// its acknowledgement. For many records, `Producer` batches and pipelines.
    pub async fn produce(
        &mut self,
        stream: &str,
        topic: &str,
        partitioning: Partitioning,
        batch: &[u8],
    ) -> Result<ProduceReply> {
        let mut prefix = Writer::new();
        Produce { stream: stream.to_string(), topic: topic.to_string(), partitioning }
            .encode_prefix(&mut prefix);
        let body = self.call(Operation::Produce, &[&prefix.bytes, batch]).await?;
        ProduceReply::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("Produce reply: {e}")))
    }

    /// Reads batches from a partition. The result's `records` skips records before the
    /// requested position. With `wait_ms_max`, the server holds the request until data is
    /// committed at the position or the wait runs out; the request timeout runs on top of it.
    pub async fn fetch(&mut self, fetch: &Fetch) -> Result<Fetched> {
        let wait = Duration::from_millis(u64::from(fetch.wait_ms_max));
        let body = self.call_within(wait, Operation::Fetch, &[&fetch.encode()]).await?;
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
        self.call(Operation::StoreOffset, &[&store.encode()]).await.map(drop)
    }

    /// `consumer`'s stored offset in a partition, if any.
    pub async fn get_offset(&mut self, key: &OffsetKey) -> Result<Option<u64>> {
        let body = self.call(Operation::GetOffset, &[&key.encode()]).await?;
        consumer::decode_stored_offset(&body)
            .map_err(|e| ClientError::Protocol(format!("GetOffset reply: {e}")))
    }

    /// Deletes `consumer`'s stored offset in a partition (a group's only while it has no
    /// members).
    pub async fn delete_offset(&mut self, key: &OffsetKey) -> Result<()> {
        self.call(Operation::DeleteOffset, &[&key.encode()]).await.map(drop)
    }

    /// Joins a topic's consumer group (an empty `member` joins as a new member). Answered once
    /// an assignment including the member is in force, so the wait is bounded by a rebalance,
    /// not the request timeout alone.
    pub async fn join_group(&mut self, join: &JoinGroup) -> Result<Assignment> {
        let rebalance = Duration::from_millis(u64::from(join.session_timeout_ms));
        let body = self.call_within(rebalance, Operation::JoinGroup, &[&join.encode()]).await?;
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
        let body = self.call_within(wait, Operation::Poll, &[&poll.encode()]).await?;
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

    /// Sends one request and waits for its reply body, within the request timeout.
    pub async fn call(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<Bytes> {
        self.call_within(Duration::ZERO, operation, body_parts).await
    }

    /// [`Client::call`] for a request the server may hold for up to `held` (a long-poll).
    async fn call_within(
        &mut self,
        held: Duration,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<Bytes> {
        let timeout = self.request_timeout() + held;
        match monoio::time::timeout(timeout, self.call_unbounded(operation, body_parts)).await {
            Ok(result) => result,
            Err(_) => {
                // The reply may still come; the connection's state is unknown from here on.
                self.transport = None;
                Err(ClientError::Timeout)
            }
        }
    }

    async fn call_unbounded(
        &mut self,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<Bytes> {
        // Requests left outstanding by a caller that gave up are answered first, in order;
        // their replies are drained here.
        while self.transport.as_ref().is_some_and(|t| !t.connection.has_room()) {
            self.receive_unbounded().await?;
        }
        let request = self.submit_unbounded(operation, body_parts).await?;
        loop {
            let reply = self.receive_unbounded().await?;
            if reply.request == request {
                return reply.result;
            }
        }
    }

    /// Queues and writes one request without waiting for its reply; returns its request number.
    /// Reconnects first if there is no live connection. The caller must collect the reply with
    /// [`Client::receive`] (replies come in request order) and keep at most `in_flight_max`
    /// requests outstanding ([`Client::has_room`]); pipelining tools (the load tool) use this pair.
    pub async fn submit(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<u64> {
        let timeout = self.request_timeout();
        match monoio::time::timeout(timeout, self.submit_unbounded(operation, body_parts)).await {
            Ok(result) => result,
            Err(_) => {
                self.transport = None;
                Err(ClientError::Timeout)
            }
        }
    }

    async fn submit_unbounded(
        &mut self,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<u64> {
        if !self.is_connected() {
            self.reconnect().await?;
        }
        let Some(transport) = self.transport.as_mut() else { return Err(ClientError::Closed) };
        let request = transport.connection.request(operation, body_parts)?;
        self.next_request = transport.connection.next_request();
        if let Err(error) = transport.write_pending().await {
            self.transport = None;
            return Err(error);
        }
        Ok(request)
    }

    /// The next reply on the connection, within the request timeout. A failure drops the
    /// connection: every request still outstanding on it is lost.
    pub async fn receive(&mut self) -> Result<Reply> {
        let timeout = self.request_timeout();
        match monoio::time::timeout(timeout, self.receive_unbounded()).await {
            Ok(result) => result,
            Err(_) => {
                self.transport = None;
                Err(ClientError::Timeout)
            }
        }
    }

    async fn receive_unbounded(&mut self) -> Result<Reply> {
        let Some(transport) = self.transport.as_mut() else { return Err(ClientError::Closed) };
        match transport.read_reply().await {
            Ok(reply) => {
                if transport.connection.is_failed() {
                    // The server closes the connection after this reply (InvalidFrame,
                    // UnsupportedVersion): reconnect next time rather than write into it.
                    self.transport = None;
                }
                Ok(reply)
            }
            Err(error) => {
                self.transport = None;
                Err(error)
            }
        }
    }

    /// Splits the live connection into its writing and reading halves (see [`RequestSender`]),
    /// connecting first if there is none. The halves keep this client's request timeout but
    /// never reconnect: after a failure, connect a new client.
    pub async fn into_split(mut self) -> Result<(RequestSender, ReplyReceiver)> {
        if !self.is_connected() {
            self.reconnect().await?;
        }
        let timeout = self.request_timeout();
        let transport = self.transport.take().ok_or(ClientError::Closed)?;
        let (stream, connection) = transport.into_parts();
        Ok(crate::split::split(stream, connection, timeout))
    }

    /// Requests outstanding on the live connection.
    pub fn in_flight(&self) -> usize {
        self.transport.as_ref().map_or(0, |t| t.connection.in_flight())
    }

    /// Whether the live connection may take another request now (`true` without one: the next
    /// submit reconnects).
    pub fn has_room(&self) -> bool {
        self.transport.as_ref().is_none_or(|t| t.connection.has_room())
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms.max(1))
    }

    // -- Connecting ----------------------------------------------------------------------------

    /// Drops any connection and connects to the chosen shard address, else to the first seed
    /// that completes the handshake, starting with the one that worked last.
    async fn reconnect(&mut self) -> Result<()> {
        self.transport = None;
        if let Some(address) = self.preferred.clone() {
            match self.open(&address).await {
                Ok(transport) => {
                    self.transport = Some(transport);
                    self.address = Some(address);
                    return Ok(());
                }
                // Stale or unreachable (a restarted server may listen elsewhere): the seeds
                // are the way back, and the next connect_to_shard learns the address anew.
                Err(_) => self.preferred = None,
            }
        }
        let seeds = self.config.seeds.len();
        if seeds == 0 {
            return Err(ClientError::Invalid("no server address to connect to".into()));
        }
        let mut last_error = None;
        for attempt in 0..seeds {
            let index = (self.seed_first + attempt) % seeds;
            let address = self.config.seeds[index].clone();
            match self.open(&address).await {
                Ok(transport) => {
                    self.transport = Some(transport);
                    self.seed_first = index;
                    self.address = Some(address);
                    return Ok(());
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(ClientError::Closed))
    }

    /// One seed: TCP connect, `Hello`, and `Register` if configured and not yet done.
    async fn open(&mut self, address: &str) -> Result<Transport> {
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms.max(1));
        let config = self.config.connection(self.client_id);
        let mut transport =
            match monoio::time::timeout(connect_timeout, Transport::connect(address, config)).await
            {
                Ok(result) => result?,
                Err(_) => {
                    return Err(ClientError::io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connect to {address}: no answer within {connect_timeout:?}"),
                    )));
                }
            };
        transport.connection.set_session(self.session);
        transport.connection.continue_numbering(self.next_request);
        let handshake = self.handshake(&mut transport).await;
        self.next_request = transport.connection.next_request();
        handshake?;
        Ok(transport)
    }

    /// `Hello`, and `Register` if configured and not yet done.
    async fn handshake(&mut self, transport: &mut Transport) -> Result<()> {
        transport.connection.hello(&self.config.client_name)?;
        self.handshake_step(transport).await?;
        if let HelloState::Done(hello) = transport.connection.hello_state() {
            self.server = Some(hello.clone());
        }
        if self.config.register && self.session == 0 {
            transport.connection.request(Operation::Register, &[])?;
            self.handshake_step(transport).await?;
            self.session = transport.connection.session();
        }
        Ok(())
    }

    async fn handshake_step(&self, transport: &mut Transport) -> Result<()> {
        match monoio::time::timeout(self.request_timeout(), transport.round_trip()).await {
            Ok(reply) => reply?.result.map(drop),
            Err(_) => Err(ClientError::Timeout),
        }
    }
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
    use crate::testing::{Faults, MemoryServer, batch_of, spawn_tcp};
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
            let error = client.list_streams().await.unwrap_err();
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
