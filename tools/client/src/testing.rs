//! Test harness (tests only): reply frames, request decoding and an in-memory responder built
//! from the same `proto::wire`/`proto::protocol` codecs the server uses.
//!
//! It is a harness for the client's unit tests, not a model of the server: it answers the
//! operations the tests exercise, assigns dense offsets per partition, and can be scripted to
//! answer produce requests with errors, drop a connection or stay silent. It never stands in for
//! the real server in end-to-end tests.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use shoal_proto::Durability;
use shoal_proto::batch::{self, BatchBuilder, BatchHeader, BatchLimits};
use shoal_proto::protocol::{
    ErrorCode, Fetch, FetchFrom, FetchReply, HelloReply, NodeAddress, NotPrimary, Operation,
    PartitionInfo, PartitionPrimary, Partitioning, Produce, ProduceReply, StreamInfo,
    TopicDescription, TopicInfo, decode_stream_name, encode_describe, encode_session,
    encode_streams, partition_for_key,
};
use shoal_proto::wire::{ClientReply, HEADER_SIZE, Header};

/// A sealed reply frame for `operation`.
pub fn reply_frame(
    cluster: u64,
    client: u64,
    request: u64,
    operation: Operation,
    error: u32,
    body: &[u8],
) -> Vec<u8> {
    reply_frame_with(cluster, client, request, operation as u32, error, body)
}

/// A sealed reply frame with a raw operation code.
pub fn reply_frame_with(
    cluster: u64,
    client: u64,
    request: u64,
    operation: u32,
    error: u32,
    body: &[u8],
) -> Vec<u8> {
    let header = Header::reply(cluster, ClientReply { client, request, operation, error }, body);
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// A `Hello` result speaking `version`, from shard 0 of a server without per-shard listeners
/// (node 0 of a one-node cluster at `127.0.0.1:7070` from version 3 on).
pub fn hello_reply_body(version: u16) -> Vec<u8> {
    HelloReply {
        version,
        shards: 1,
        server: "memory".into(),
        shard: 0,
        shard_addresses: Vec::new(),
        cluster: 1,
        node: 0,
        nodes: vec![NodeAddress { node: 0, address: "127.0.0.1:7070".into() }],
    }
    .encode()
}

/// An uncompressed batch of `values` (no keys) stamped with `base_offset`, record `i` stamped
/// `base_timestamp_ms + i`.
pub fn batch_of(base_offset: u64, base_timestamp_ms: i64, values: &[&str]) -> Vec<u8> {
    let mut builder = BatchBuilder::new(base_timestamp_ms);
    for (i, value) in values.iter().enumerate() {
        builder.push(base_timestamp_ms + i as i64, None, Some(value.as_bytes()), &[]);
    }
    let mut bytes = builder.build().to_vec();
    batch::stamp(&mut bytes, base_offset, 0);
    bytes
}

/// A decoded request frame.
#[derive(Clone, Debug)]
pub struct Request {
    pub client: u64,
    pub session: u64,
    pub request: u64,
    pub operation: Operation,
    pub body: Vec<u8>,
}

/// Splits a byte stream into request frames (panics on anything invalid: the client under test
/// must never send it).
#[derive(Debug)]
pub struct Responder {
    cluster: u64,
    buffer: Vec<u8>,
}

impl Responder {
    pub fn new(cluster: u64) -> Responder {
        Responder { cluster, buffer: Vec::new() }
    }

    /// Every complete request frame in what has been fed so far.
    pub fn requests(&mut self, bytes: &[u8]) -> Vec<Request> {
        self.buffer.extend_from_slice(bytes);
        let mut requests = Vec::new();
        while self.buffer.len() >= HEADER_SIZE {
            let header =
                Header::decode_prefix(&self.buffer).expect("the client sends valid headers");
            assert_eq!(header.cluster, self.cluster);
            let size = header.size as usize;
            if self.buffer.len() < size {
                break;
            }
            let frame: Vec<u8> = self.buffer.drain(..size).collect();
            let body = frame[HEADER_SIZE..].to_vec();
            header.verify_body(&body).expect("the client seals its bodies");
            let fields = *header.as_request().expect("a request header");
            requests.push(Request {
                client: fields.client,
                session: fields.session,
                request: fields.request,
                operation: Operation::from_u32(fields.operation).expect("a known operation"),
                body,
            });
        }
        requests
    }
}

/// An in-memory responder: one stream `s` with topic `t` of `partitions` partitions.
#[derive(Debug)]
pub struct MemoryServer {
    pub partitions: u32,
    /// Per partition: (base offset, stamped batch).
    pub logs: Vec<Vec<(u64, Vec<u8>)>>,
    pub next_offsets: Vec<u64>,
    balanced_next: u32,
    /// Errors to answer the next produce requests with, in order (`None`: answer normally).
    pub produce_script: VecDeque<Option<ErrorCode>>,
    /// Produce requests seen (including refused ones).
    pub produce_requests: usize,
    /// Every produce request's partitioning and record count, in arrival order.
    pub produce_log: Vec<(Partitioning, u32)>,
    /// `Hello` requests answered (one per connection).
    pub hellos: usize,
    /// Per-shard listener addresses to name in `Hello` (version 2 when any); partition `p` is
    /// then on shard `p % len`. Empty: a version 1 server of one shard.
    pub shard_addresses: Vec<String>,
    /// A cluster's nodes' addresses, by index (version 3 when any: then each listener answers
    /// as its node, and a request for a group it does not lead gets `NotPrimary`).
    pub nodes: Vec<String>,
    /// In a cluster: the node leading the metadata group.
    pub metadata_primary: u8,
    /// In a cluster: the node leading each partition.
    pub primaries: Vec<u8>,
    /// In a cluster: nodes that are down (their listeners close every connection unanswered).
    pub down: Vec<bool>,
    /// In a cluster: requests each node received, and `NotPrimary` answers it gave.
    pub requests_by_node: Vec<usize>,
    pub redirects_by_node: Vec<usize>,
}

impl MemoryServer {
    pub fn new(partitions: u32) -> MemoryServer {
        MemoryServer {
            partitions,
            logs: vec![Vec::new(); partitions as usize],
            next_offsets: vec![0; partitions as usize],
            balanced_next: 0,
            produce_script: VecDeque::new(),
            produce_requests: 0,
            produce_log: Vec::new(),
            hellos: 0,
            shard_addresses: Vec::new(),
            nodes: Vec::new(),
            metadata_primary: 0,
            primaries: Vec::new(),
            down: Vec::new(),
            requests_by_node: Vec::new(),
            redirects_by_node: Vec::new(),
        }
    }

    /// Makes this server a cluster of the nodes at `addresses` (each served by
    /// [`spawn_tcp_as_node`]), every group led by node 0.
    pub fn cluster(&mut self, addresses: Vec<String>) {
        let nodes = addresses.len();
        self.nodes = addresses;
        self.primaries = vec![0; self.partitions as usize];
        self.down = vec![false; nodes];
        self.requests_by_node = vec![0; nodes];
        self.redirects_by_node = vec![0; nodes];
    }

    /// The reply (error code, body) node `node` of a cluster gives to one request: a request
    /// for a group it does not lead gets a version 3 `NotPrimary`.
    pub fn answer_as(&mut self, node: u8, request: &Request) -> (u32, Vec<u8>) {
        self.requests_by_node[usize::from(node)] += 1;
        let body = &request.body[..];
        let leader = match request.operation {
            Operation::Register
            | Operation::CreateStream
            | Operation::DeleteStream
            | Operation::ListStreams
            | Operation::DescribeTopic => Some(self.metadata_primary),
            Operation::Produce => match Produce::decode(body) {
                Ok((Produce { partitioning: Partitioning::Explicit(p), .. }, _)) => {
                    self.primaries.get(p as usize).copied()
                }
                _ => None,
            },
            Operation::Fetch => Fetch::decode(body)
                .ok()
                .and_then(|f| self.primaries.get(f.partition as usize))
                .copied(),
            _ => None,
        };
        if let Some(primary) = leader.filter(|&primary| primary != node) {
            self.redirects_by_node[usize::from(node)] += 1;
            let redirect = NotPrimary {
                view: 1,
                primary,
                address: self.nodes[usize::from(primary)].clone(),
                text: format!("replica {primary} leads view 1"),
            };
            return (ErrorCode::NotPrimary as u32, redirect.encode());
        }
        match request.operation {
            Operation::Hello => {
                self.hellos += 1;
                let nodes = self
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(index, address)| NodeAddress {
                        node: index as u8,
                        address: address.clone(),
                    })
                    .collect();
                let hello = HelloReply {
                    version: 3,
                    shards: 1,
                    server: "memory".into(),
                    shard: 0,
                    shard_addresses: Vec::new(),
                    cluster: 1,
                    node,
                    nodes,
                };
                (0, hello.encode())
            }
            Operation::DescribeTopic => {
                let primaries = self
                    .primaries
                    .iter()
                    .map(|&primary| PartitionPrimary { primary, view: 1 })
                    .collect();
                let description = TopicDescription {
                    topic: self.topic(),
                    partitions: self.partition_infos(),
                    primaries,
                };
                (0, description.encode(3))
            }
            _ => self.answer(request),
        }
    }

    /// Answers every complete request in `bytes` (fed through `responder`), returning the reply
    /// frames.
    pub fn respond(&mut self, responder: &mut Responder, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for request in responder.requests(bytes) {
            let (error, body) = self.answer(&request);
            out.extend(reply_frame(
                1,
                request.client,
                request.request,
                request.operation,
                error,
                &body,
            ));
        }
        out
    }

    /// The reply (error code, body) to one request.
    pub fn answer(&mut self, request: &Request) -> (u32, Vec<u8>) {
        match self.handle(request) {
            Ok(body) => (0, body),
            Err((code, text)) => (code as u32, text.into_bytes()),
        }
    }

    fn handle(&mut self, request: &Request) -> Result<Vec<u8>, (ErrorCode, String)> {
        let body = &request.body[..];
        match request.operation {
            Operation::Hello => {
                self.hellos += 1;
                if self.shard_addresses.is_empty() {
                    return Ok(hello_reply_body(1));
                }
                Ok(HelloReply {
                    version: 2,
                    shards: self.shard_addresses.len() as u32,
                    server: "memory".into(),
                    shard: 0,
                    shard_addresses: self.shard_addresses.clone(),
                    cluster: 0,
                    node: 0,
                    nodes: Vec::new(),
                }
                .encode())
            }
            Operation::Register => Ok(encode_session(7)),
            Operation::CreateStream | Operation::DeleteStream => {
                let name = decode_stream_name(body).map_err(|e| bad(e.to_string()))?;
                if name == "missing" {
                    return Err((ErrorCode::StreamNotFound, format!("stream {name:?} not found")));
                }
                Ok(Vec::new())
            }
            Operation::ListStreams => Ok(encode_streams(&[StreamInfo {
                name: "s".into(),
                topic_count: 1,
                created_ms: 5,
            }])),
            Operation::DescribeTopic => Ok(encode_describe(&self.topic(), &self.partition_infos())),
            Operation::Status => Ok(b"{\"shards\":1,\"partitions\":[]}".to_vec()),
            Operation::Produce => self.produce(body),
            Operation::Fetch => self.fetch(body),
            other => Err((ErrorCode::UnknownOperation, format!("{other:?}"))),
        }
    }

    fn topic(&self) -> TopicInfo {
        TopicInfo {
            stream: "s".into(),
            name: "t".into(),
            partitions: self.partitions,
            durability: Durability::Persisted,
            retention_bytes: 0,
            retention_ms: 0,
            segment_size_bytes: 1 << 20,
            message_size_bytes_max: 1 << 20,
            created_ms: 5,
        }
    }

    fn partition_infos(&self) -> Vec<PartitionInfo> {
        (0..self.partitions)
            .map(|p| PartitionInfo {
                partition: p,
                shard: p % (self.shard_addresses.len().max(1) as u32),
                group: u64::from(p) + 1,
                first_offset: 0,
                next_offset: self.next_offsets[p as usize],
                size_bytes: 0,
            })
            .collect()
    }

    fn produce(&mut self, body: &[u8]) -> Result<Vec<u8>, (ErrorCode, String)> {
        self.produce_requests += 1;
        let (produce, at) = Produce::decode(body).map_err(|e| bad(e.to_string()))?;
        let bytes = &body[at..];
        let header = batch::validate(bytes, &BatchLimits::default())
            .map_err(|e| (ErrorCode::InvalidBatch, e.to_string()))?;
        self.produce_log.push((produce.partitioning.clone(), header.record_count()));
        if let Some(Some(code)) = self.produce_script.pop_front() {
            return Err((code, "scripted".into()));
        }
        let partition = match produce.partitioning {
            Partitioning::Explicit(p) if p < self.partitions => p,
            Partitioning::Explicit(p) => {
                return Err((ErrorCode::PartitionNotFound, format!("partition {p}")));
            }
            Partitioning::Key(key) => partition_for_key(&key, self.partitions),
            Partitioning::Balanced => {
                let p = self.balanced_next % self.partitions;
                self.balanced_next += 1;
                p
            }
        };
        let base_offset = self.next_offsets[partition as usize];
        let mut stored = bytes.to_vec();
        batch::stamp(&mut stored, base_offset, 0);
        self.logs[partition as usize].push((base_offset, stored));
        self.next_offsets[partition as usize] += u64::from(header.record_count());
        Ok(ProduceReply { partition, base_offset, record_count: header.record_count() }.encode())
    }

    fn fetch(&mut self, body: &[u8]) -> Result<Vec<u8>, (ErrorCode, String)> {
        let fetch = Fetch::decode(body).map_err(|e| bad(e.to_string()))?;
        let Some(log) = self.logs.get(fetch.partition as usize) else {
            return Err((ErrorCode::PartitionNotFound, format!("partition {}", fetch.partition)));
        };
        let next_offset = self.next_offsets[fetch.partition as usize];
        let start = match fetch.from {
            FetchFrom::Offset(offset) => log.iter().position(|(base, bytes)| {
                base + u64::from(BatchHeader::parse(bytes).unwrap().record_count()) > offset
            }),
            FetchFrom::First => (!log.is_empty()).then_some(0),
            FetchFrom::Last => log.len().checked_sub(1),
            FetchFrom::Timestamp(time_ms) => log.iter().position(|(_, bytes)| {
                BatchHeader::parse(bytes).unwrap().max_timestamp() >= time_ms
            }),
        };
        let mut batches = Vec::new();
        let mut count = 0u32;
        let mut records = 0u32;
        for (_, bytes) in log.iter().skip(start.unwrap_or(log.len())) {
            if count > 0
                && (batches.len() + bytes.len() > fetch.bytes_max as usize
                    || records >= fetch.count_max)
            {
                break;
            }
            batches.extend_from_slice(bytes);
            count += 1;
            records += BatchHeader::parse(bytes).unwrap().record_count();
        }
        let reply = FetchReply {
            partition: fetch.partition,
            first_offset: 0,
            next_offset,
            batch_count: count,
        };
        let mut out = reply.encode_prefix().to_vec();
        out.extend(batches);
        Ok(out)
    }
}

fn bad(text: String) -> (ErrorCode, String) {
    (ErrorCode::InvalidRequest, text)
}

/// How a TCP responder misbehaves.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Close the first connection after answering this many requests.
    pub close_first_after: Option<usize>,
    /// Never answer anything (the client's timeout must fire).
    pub silent: bool,
}

/// Serves `server` on a loopback TCP port from a plain thread, one connection at a time, for
/// transport tests. Returns the address; the thread lives until the test process ends.
pub fn spawn_tcp(server: Arc<Mutex<MemoryServer>>, faults: Faults) -> SocketAddr {
    spawn_tcp_as_shard(server, faults, 0)
}

/// [`spawn_tcp`] for a listener of shard `shard`: its version 2 `Hello` results name that shard
/// (several listeners may share one `MemoryServer`, as a real server's shards share a catalog).
pub fn spawn_tcp_as_shard(
    server: Arc<Mutex<MemoryServer>>,
    faults: Faults,
    shard: u32,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let address = listener.local_addr().expect("local address");
    serve_tcp(listener, server, faults, Listener::Shard(shard));
    address
}

/// Binds one loopback listener per node of a cluster, makes `server` that cluster
/// ([`MemoryServer::cluster`]) and serves each listener as its node. Returns the addresses.
pub fn spawn_cluster(server: &Arc<Mutex<MemoryServer>>, nodes: u8) -> Vec<SocketAddr> {
    spawn_cluster_with_silent(server, nodes, 0)
}

/// [`spawn_cluster`] whose last `silent` nodes accept connections and never answer anything
/// (hung nodes).
pub fn spawn_cluster_with_silent(
    server: &Arc<Mutex<MemoryServer>>,
    nodes: u8,
    silent: u8,
) -> Vec<SocketAddr> {
    let listeners: Vec<TcpListener> =
        (0..nodes).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind loopback")).collect();
    let addresses: Vec<SocketAddr> =
        listeners.iter().map(|l| l.local_addr().expect("local address")).collect();
    server.lock().unwrap().cluster(addresses.iter().map(ToString::to_string).collect());
    for (node, listener) in listeners.into_iter().enumerate() {
        let faults = Faults { silent: node >= usize::from(nodes - silent), ..Faults::default() };
        serve_tcp(listener, Arc::clone(server), faults, Listener::Node(node as u8));
    }
    addresses
}

/// What a listener answers as.
#[derive(Clone, Copy, Debug)]
enum Listener {
    Shard(u32),
    Node(u8),
}

/// Serves `listener` from a plain thread, one connection at a time.
fn serve_tcp(
    listener: TcpListener,
    server: Arc<Mutex<MemoryServer>>,
    faults: Faults,
    role: Listener,
) {
    std::thread::spawn(move || {
        let mut first = true;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let close_after = if first { faults.close_first_after } else { None };
            first = false;
            let mut responder = Responder::new(1);
            let mut answered = 0usize;
            let mut buffer = vec![0u8; 64 << 10];
            'connection: loop {
                let n = match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if faults.silent {
                    continue;
                }
                for request in responder.requests(&buffer[..n]) {
                    if close_after == Some(answered) {
                        break 'connection;
                    }
                    let (error, body) = match role {
                        Listener::Node(node) => {
                            let mut server = server.lock().unwrap();
                            if server.down[usize::from(node)] {
                                break 'connection;
                            }
                            server.answer_as(node, &request)
                        }
                        Listener::Shard(shard) => {
                            let (error, mut body) = server.lock().unwrap().answer(&request);
                            if request.operation == Operation::Hello
                                && let Ok(mut hello) = HelloReply::decode(&body)
                                && hello.version >= 2
                            {
                                hello.shard = shard;
                                body = hello.encode();
                            }
                            (error, body)
                        }
                    };
                    let frame = reply_frame(
                        1,
                        request.client,
                        request.request,
                        request.operation,
                        error,
                        &body,
                    );
                    if stream.write_all(&frame).is_err() {
                        break 'connection;
                    }
                    answered += 1;
                }
            }
        }
    });
}
