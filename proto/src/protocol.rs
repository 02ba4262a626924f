//! The native client protocol's bodies: operation and error codes, and the byte layout of each
//! operation's arguments and result. The header around them is [`crate::wire`]'s `Request` and
//! `Reply`.
//!
//! It lives in `proto` because both sides need it: the server and the client library (which
//! depends on nothing else of Shoal's). It owns the encoding and
//! the hostile-input decoding of these bodies, the name rule for streams and topics, and Kafka's
//! key partitioner (so native and Kafka clients place keys alike). It must never decide what a
//! request does (that is the server's), never allocate more than the input's own length
//! justifies, and never panic on any bytes. `docs/protocol.md` documents every layout here; change
//! them together.
//!
//! Encoding: little-endian integers; a string is a `u16` length and UTF-8 bytes; an optional
//! `u64` is a presence byte (0 or 1) and the value; a list is a `u32` count and its items. A
//! record batch, where present, is the body's tail, so it can be sliced out without copying.

pub mod consumer;

use std::fmt;

use crate::durability::Durability;

/// The protocol version this build speaks. Version 2 added the shard map to the `Hello` result
/// ([`HelloReply::shard`], [`HelloReply::shard_addresses`]). Version 3 added the cluster to it
/// ([`HelloReply::cluster`], [`HelloReply::node`], [`HelloReply::nodes`]), each partition's
/// primary to the `DescribeTopic` result ([`PartitionPrimary`]) and a structured `NotPrimary`
/// error body ([`NotPrimary`]).
pub const PROTOCOL_VERSION: u16 = 3;
/// The oldest protocol version this build still speaks.
pub const PROTOCOL_VERSION_MIN: u16 = 1;

/// Longest stream or topic name, in bytes (Kafka's limit, so a Kafka listener can map names).
pub const NAME_LEN_MAX: usize = 249;
/// Longest free-text string (client name, error text) a body may carry.
pub const TEXT_LEN_MAX: usize = 4096;

/// What a request asks for. Values never change meaning; new ones get new numbers.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Version negotiation; the first request on a connection.
    Hello = 1,
    /// Registers a session for the client (the producer id).
    Register = 2,
    /// Creates a stream.
    CreateStream = 3,
    /// Deletes a stream and its topics.
    DeleteStream = 4,
    /// Lists streams.
    ListStreams = 5,
    /// Creates a topic in a stream.
    CreateTopic = 6,
    /// Deletes a topic.
    DeleteTopic = 7,
    /// Lists a stream's topics.
    ListTopics = 8,
    /// One topic with its partitions, their shards and offsets.
    DescribeTopic = 9,
    /// Appends one record batch to a partition.
    Produce = 10,
    /// Reads record batches from a partition.
    Fetch = 11,
    /// The server's effective config, shards, partition map and per-partition offsets (JSON).
    Status = 12,
    /// Stores a consumer's (or a consumer group's) offset in a partition.
    StoreOffset = 13,
    /// Reads a stored offset.
    GetOffset = 14,
    /// Deletes a stored offset.
    DeleteOffset = 15,
    /// Joins a topic's consumer group.
    JoinGroup = 16,
    /// Keeps a group member alive and reports its assignment.
    Heartbeat = 17,
    /// Leaves a consumer group.
    LeaveGroup = 18,
    /// Fetches from the consumer's stored offset (consume next).
    Poll = 19,
    /// Starts, cancels or records the end of a partition's move to other nodes
    /// ([`MovePartition`]).
    MovePartition = 20,
    /// Adds a node to the cluster's address book ([`AddNode`]); answered with its index (`u8`).
    AddNode = 21,
    /// Removes a node: its partitions move to the other nodes ([`RemoveNode`]).
    RemoveNode = 22,
}

impl Operation {
    /// The operation a code denotes, if any.
    pub fn from_u32(code: u32) -> Option<Operation> {
        Some(match code {
            1 => Operation::Hello,
            2 => Operation::Register,
            3 => Operation::CreateStream,
            4 => Operation::DeleteStream,
            5 => Operation::ListStreams,
            6 => Operation::CreateTopic,
            7 => Operation::DeleteTopic,
            8 => Operation::ListTopics,
            9 => Operation::DescribeTopic,
            10 => Operation::Produce,
            11 => Operation::Fetch,
            12 => Operation::Status,
            13 => Operation::StoreOffset,
            14 => Operation::GetOffset,
            15 => Operation::DeleteOffset,
            16 => Operation::JoinGroup,
            17 => Operation::Heartbeat,
            18 => Operation::LeaveGroup,
            19 => Operation::Poll,
            20 => Operation::MovePartition,
            21 => Operation::AddNode,
            22 => Operation::RemoveNode,
            _ => return None,
        })
    }

    /// Whether the operation changes metadata (and so goes through the metadata group).
    pub fn is_metadata_write(self) -> bool {
        matches!(
            self,
            Operation::Register
                | Operation::CreateStream
                | Operation::DeleteStream
                | Operation::CreateTopic
                | Operation::DeleteTopic
                | Operation::MovePartition
                | Operation::AddNode
                | Operation::RemoveNode
        )
    }
}

/// A reply's error code. `0` is success and is not a variant. Values never change meaning.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The frame was not a valid request (checksum, size, command); the connection is closed.
    InvalidFrame = 1,
    /// No protocol version in common; the connection is closed.
    UnsupportedVersion = 2,
    /// The operation code is unknown.
    UnknownOperation = 3,
    /// The body does not decode as the operation's arguments.
    InvalidRequest = 4,
    /// A stream or topic name breaks the rule `[a-zA-Z0-9._-]{1,249}`.
    InvalidName = 5,
    /// No such stream.
    StreamNotFound = 6,
    /// A stream with that name exists.
    StreamExists = 7,
    /// No such topic.
    TopicNotFound = 8,
    /// A topic with that name exists in the stream.
    TopicExists = 9,
    /// No such partition in the topic.
    PartitionNotFound = 10,
    /// The batch is larger than the topic's `message_size_bytes_max`, or the frame than the
    /// server's frame limit.
    TooLarge = 11,
    /// The batch is not a valid RecordBatch v2 (CRC, format, unsupported compression, control).
    InvalidBatch = 12,
    /// A configured bound was reached (connections, topics, partitions, sessions).
    LimitReached = 13,
    /// A queue is full: retry later.
    Busy = 14,
    /// The disk is full: retry once space is freed.
    StorageFull = 15,
    /// This node does not lead the group the request is for (a partition's, or the metadata
    /// group's for admin and consumer group requests): go to its primary. From version 3 on the
    /// body is a [`NotPrimary`] (view, primary node, its client address, then the text); before,
    /// the text alone names the view and primary.
    NotPrimary = 16,
    /// The request never entered the log: safe to retry anywhere.
    TransientNotAccepted = 17,
    /// The request entered the log with an unknown outcome: retry with the same request number.
    TransientNotCommitted = 18,
    /// The partition stopped serving (storage damage or an I/O error); the text says why.
    PartitionFailed = 19,
    /// The request needs a registered session.
    SessionRequired = 20,
    /// The server is shutting down.
    ShuttingDown = 21,
    /// An invalid argument other than a name (a zero partition count, bad retention, …).
    InvalidArgument = 22,
    /// A group member acted under a generation that is no longer in force: it must take its
    /// new assignment (`Heartbeat`) before committing or polling again.
    StaleGeneration = 23,
    /// The group has no such member (it left, or was declared dead): join again.
    UnknownMember = 24,
    /// The partition is not assigned to this member in the current generation.
    NotAssigned = 25,
    /// An idempotent batch's base sequence does not follow its producer's newest batch in the
    /// partition (a gap), nor repeats one of its last five: it was not appended. Not
    /// retryable as is: the producer lost a batch and must resend from the gap.
    OutOfOrderSequence = 26,
    /// An idempotent batch with a non-zero sequence from a producer the partition does not
    /// know (never seen, expired after a day without appends, or evicted): not appended. The
    /// producer starts again at sequence 0 (or a new epoch).
    UnknownProducer = 27,
    /// An idempotent batch from an older producer epoch than the partition's newest: not
    /// appended; this producer instance is fenced.
    ProducerFenced = 28,
    /// An admin request from a session the metadata group's client table does not hold: it was
    /// never registered, or it was evicted (the least recently used beyond the node's
    /// `metadata.sessions_max`). Not executed; register again (a new session) and resend.
    SessionExpired = 29,
}

impl ErrorCode {
    /// The error a code denotes, if any (`0` is success, not an error).
    pub fn from_u32(code: u32) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match code {
            1 => InvalidFrame,
            2 => UnsupportedVersion,
            3 => UnknownOperation,
            4 => InvalidRequest,
            5 => InvalidName,
            6 => StreamNotFound,
            7 => StreamExists,
            8 => TopicNotFound,
            9 => TopicExists,
            10 => PartitionNotFound,
            11 => TooLarge,
            12 => InvalidBatch,
            13 => LimitReached,
            14 => Busy,
            15 => StorageFull,
            16 => NotPrimary,
            17 => TransientNotAccepted,
            18 => TransientNotCommitted,
            19 => PartitionFailed,
            20 => SessionRequired,
            21 => ShuttingDown,
            22 => InvalidArgument,
            23 => StaleGeneration,
            24 => UnknownMember,
            25 => NotAssigned,
            26 => OutOfOrderSequence,
            27 => UnknownProducer,
            28 => ProducerFenced,
            29 => SessionExpired,
            _ => return None,
        })
    }

    /// Whether the same request may succeed if retried later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Busy
                | ErrorCode::StorageFull
                | ErrorCode::NotPrimary
                | ErrorCode::TransientNotAccepted
                | ErrorCode::TransientNotCommitted
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why a body did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The body ended inside a field.
    Truncated {
        /// What was being read.
        field: &'static str,
    },
    /// A field's value is out of its range.
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// Bytes were left over after the last field.
    TrailingBytes {
        /// How many.
        len: usize,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Truncated { field } => write!(f, "body ends inside {field}"),
            ProtocolError::Invalid { field, reason } => write!(f, "{field}: {reason}"),
            ProtocolError::TrailingBytes { len } => write!(f, "{len} bytes after the last field"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// What decoding a body returns.
pub type Result<T> = std::result::Result<T, ProtocolError>;

/// Checks a stream or topic name against `[a-zA-Z0-9._-]{1,249}`.
pub fn validate_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("a name must not be empty".into());
    }
    if name.len() > NAME_LEN_MAX {
        return Err(format!("a name is at most {NAME_LEN_MAX} bytes, not {}", name.len()));
    }
    if let Some(bad) =
        name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("{bad:?} is not allowed: use a-z, A-Z, 0-9, '.', '_' and '-'"));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is reserved"));
    }
    Ok(())
}

/// Kafka's murmur2 hash (the Java client's `Utils.murmur2`), seed `0x9747b28c`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() == 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner picks for `key` among `partitions` (> 0).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

// ---------------------------------------------------------------------------------------------
// Primitive encoding
// ---------------------------------------------------------------------------------------------

/// Appends fields to a body.
#[derive(Debug, Default)]
pub struct Writer {
    /// The bytes written so far.
    pub bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// Appends a byte.
    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }

    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, value: u16) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends a little-endian `i64`.
    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends an optional `u64` (presence byte, then the value).
    pub fn opt_u64(&mut self, value: Option<u64>) -> &mut Self {
        match value {
            Some(value) => self.u8(1).u64(value),
            None => self.u8(0).u64(0),
        }
    }

    /// Appends a string, truncated to `u16::MAX` bytes at a character boundary.
    pub fn str(&mut self, value: &str) -> &mut Self {
        let mut end = value.len().min(usize::from(u16::MAX));
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.bytes.extend_from_slice(&value.as_bytes()[..end]);
        self
    }

    /// Appends length-prefixed bytes (`u32` length).
    ///
    /// # Panics
    /// If `value` is longer than `u32::MAX` bytes.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u32(u32::try_from(value.len()).expect("bytes field over 4 GiB"));
        self.bytes.extend_from_slice(value);
        self
    }

    /// Appends raw bytes (a tail field).
    pub fn raw(&mut self, value: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(value);
        self
    }

    /// The body.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }
}

/// Reads fields from a body, refusing to read past its end.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, position: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8]> {
        if self.remaining() < len {
            return Err(ProtocolError::Truncated { field });
        }
        let slice = &self.bytes[self.position..self.position + len];
        self.position += len;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N]> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N, field)?);
        Ok(array)
    }

    /// Reads a byte.
    pub fn u8(&mut self, field: &'static str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self, field: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self, field: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self, field: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// Reads a little-endian `i64`.
    pub fn i64(&mut self, field: &'static str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    /// Reads an optional `u64`.
    pub fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>> {
        let present = self.u8(field)?;
        let value = self.u64(field)?;
        match present {
            0 => Ok(None),
            1 => Ok(Some(value)),
            other => Err(invalid(field, format!("presence byte {other}, not 0 or 1"))),
        }
    }

    /// Reads a string of at most `len_max` bytes.
    pub fn str(&mut self, field: &'static str, len_max: usize) -> Result<String> {
        let len = usize::from(self.u16(field)?);
        if len > len_max {
            return Err(invalid(field, format!("{len} bytes, more than {len_max}")));
        }
        let bytes = self.take(len, field)?;
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text.to_string()),
            Err(_) => Err(invalid(field, "not UTF-8".into())),
        }
    }

    /// Reads a stream or topic name (checked against the name rule by the caller, which owns the
    /// error code).
    pub fn name(&mut self, field: &'static str) -> Result<String> {
        self.str(field, NAME_LEN_MAX)
    }

    /// Reads length-prefixed bytes of at most `len_max`.
    pub fn bytes(&mut self, field: &'static str, len_max: usize) -> Result<&'a [u8]> {
        let len = self.u32(field)? as usize;
        if len > len_max {
            return Err(invalid(field, format!("{len} bytes, more than {len_max}")));
        }
        self.take(len, field)
    }

    /// Reads a list count, bounded by what the rest of the body could hold at `item_size_min`
    /// bytes per item, so a hostile count cannot make the caller allocate.
    pub fn count(&mut self, field: &'static str, item_size_min: usize) -> Result<usize> {
        let count = self.u32(field)? as usize;
        if count.saturating_mul(item_size_min.max(1)) > self.remaining() {
            return Err(ProtocolError::Truncated { field });
        }
        Ok(count)
    }

    /// The unread rest of the body (a tail field).
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.position..];
        self.position = self.bytes.len();
        rest
    }

    /// Checks that nothing is left.
    pub fn end(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            len => Err(ProtocolError::TrailingBytes { len }),
        }
    }
}

fn invalid(field: &'static str, reason: String) -> ProtocolError {
    ProtocolError::Invalid { field, reason }
}

fn durability_byte(durability: Option<Durability>) -> u8 {
    durability.map_or(0, Durability::to_byte)
}

fn durability_from(byte: u8, field: &'static str) -> Result<Option<Durability>> {
    match byte {
        0 => Ok(None),
        byte => Durability::from_byte(byte)
            .map(Some)
            .ok_or_else(|| invalid(field, format!("durability {byte}: use 1 or 2 (0: default)"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Operation bodies
// ---------------------------------------------------------------------------------------------

/// `Hello` arguments: the versions the client speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Oldest version the client speaks.
    pub version_min: u16,
    /// Newest version the client speaks.
    pub version_max: u16,
    /// Free text naming the client (logged).
    pub client_name: String,
}

impl Hello {
    /// Encodes the arguments.
    pub fn encode(&self) -> Vec<u8> {
        Writer::new().u16(self.version_min).u16(self.version_max).str(&self.client_name).finish()
    }

    /// Decodes the arguments.
    pub fn decode(body: &[u8]) -> Result<Hello> {
        let mut r = Reader::new(body);
        let hello = Hello {
            version_min: r.u16("version_min")?,
            version_max: r.u16("version_max")?,
            client_name: r.str("client_name", TEXT_LEN_MAX)?,
        };
        r.end()?;
        Ok(hello)
    }

    /// The newest version both sides speak, if any.
    pub fn negotiate(&self) -> Option<u16> {
        let high = self.version_max.min(PROTOCOL_VERSION);
        (high >= self.version_min.max(PROTOCOL_VERSION_MIN)).then_some(high)
    }
}

/// Shards a `Hello` result may list addresses for (the server runs at most 256).
pub const HELLO_SHARD_ADDRESSES_MAX: usize = 256;
/// Longest shard or node address (`[IPv6%scope]:PORT` fits with room).
pub const ADDRESS_LEN_MAX: usize = 64;
/// Nodes a cluster has at most, and so a `Hello` result lists at most.
pub const CLUSTER_NODES_MAX: usize = 32;
/// The node index that names no node: a partition whose primary the answering node does not
/// know (its replica is in a view change or recovering).
pub const NODE_UNKNOWN: u8 = u8::MAX;

/// One node of the cluster as a `Hello` result (version 3) names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    /// Its index (its replica index in every group).
    pub node: u8,
    /// Where clients reach it, as `IP:PORT`; an unspecified IP means "the host you reached this
    /// connection on".
    pub address: String,
}

/// `Hello` result. The shard fields exist from version 2 on; a version 1 result carries neither
/// (decoded as shard 0 and no addresses). The cluster fields exist from version 3 on; an older
/// result is decoded as cluster 0, node 0 and no nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloReply {
    /// The version the connection speaks from now on.
    pub version: u16,
    /// Shards on the node.
    pub shards: u32,
    /// The server's name and build.
    pub server: String,
    /// The shard serving this connection (v2).
    pub shard: u32,
    /// Each shard's own listener, indexed by shard, as `IP:PORT` (v2): connecting there lands
    /// on that shard, so requests for its partitions are served without forwarding. Empty when
    /// the server has no per-shard listeners. An unspecified IP (`0.0.0.0`, `::`) means "the
    /// host you reached this connection on".
    pub shard_addresses: Vec<String>,
    /// The cluster's id (v3).
    pub cluster: u64,
    /// The index of the node serving this connection (v3).
    pub node: u8,
    /// Every node of the cluster with its client address, by index (v3); a one-node cluster
    /// lists itself.
    pub nodes: Vec<NodeAddress>,
}

impl HelloReply {
    /// Encodes the result for the negotiated `version` (the shard fields only from 2 on, the
    /// cluster fields only from 3 on).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u16(self.version).u32(self.shards).str(&self.server);
        if self.version >= 2 {
            w.u32(self.shard).u32(self.shard_addresses.len() as u32);
            for address in &self.shard_addresses {
                w.str(address);
            }
        }
        if self.version >= 3 {
            w.u64(self.cluster).u8(self.node).u32(self.nodes.len() as u32);
            for node in &self.nodes {
                w.u8(node.node).str(&node.address);
            }
        }
        w.finish()
    }

    /// Decodes the result; its own `version` says whether the shard fields follow.
    pub fn decode(body: &[u8]) -> Result<HelloReply> {
        let mut r = Reader::new(body);
        let mut reply = HelloReply {
            version: r.u16("version")?,
            shards: r.u32("shards")?,
            server: r.str("server", TEXT_LEN_MAX)?,
            shard: 0,
            shard_addresses: Vec::new(),
            cluster: 0,
            node: 0,
            nodes: Vec::new(),
        };
        if reply.version >= 2 {
            reply.shard = r.u32("shard")?;
            let count = r.count("shard_addresses", 2)?;
            if count > HELLO_SHARD_ADDRESSES_MAX {
                return Err(invalid(
                    "shard_addresses",
                    format!("{count} addresses, more than {HELLO_SHARD_ADDRESSES_MAX}"),
                ));
            }
            for _ in 0..count {
                reply.shard_addresses.push(r.str("shard_address", ADDRESS_LEN_MAX)?);
            }
        }
        if reply.version >= 3 {
            reply.cluster = r.u64("cluster")?;
            reply.node = r.u8("node")?;
            let count = r.count("nodes", 1 + 2)?;
            if count > CLUSTER_NODES_MAX {
                return Err(invalid(
                    "nodes",
                    format!("{count} nodes, more than {CLUSTER_NODES_MAX}"),
                ));
            }
            for _ in 0..count {
                let node = r.u8("node")?;
                let address = r.str("node_address", ADDRESS_LEN_MAX)?;
                reply.nodes.push(NodeAddress { node, address });
            }
        }
        r.end()?;
        Ok(reply)
    }
}

/// `Register` result: the session (producer id).
pub fn encode_session(session: u64) -> Vec<u8> {
    Writer::new().u64(session).finish()
}

/// Decodes a `Register` result.
pub fn decode_session(body: &[u8]) -> Result<u64> {
    let mut r = Reader::new(body);
    let session = r.u64("session")?;
    r.end()?;
    Ok(session)
}

/// Arguments naming a stream (`CreateStream`, `DeleteStream`, `ListTopics`).
pub fn encode_stream_name(stream: &str) -> Vec<u8> {
    Writer::new().str(stream).finish()
}

/// Decodes arguments naming a stream.
pub fn decode_stream_name(body: &[u8]) -> Result<String> {
    let mut r = Reader::new(body);
    let stream = r.name("stream")?;
    r.end()?;
    Ok(stream)
}

/// Arguments naming a topic (`DeleteTopic`, `DescribeTopic`).
pub fn encode_topic_name(stream: &str, topic: &str) -> Vec<u8> {
    Writer::new().str(stream).str(topic).finish()
}

/// Decodes arguments naming a topic.
pub fn decode_topic_name(body: &[u8]) -> Result<(String, String)> {
    let mut r = Reader::new(body);
    let names = (r.name("stream")?, r.name("topic")?);
    r.end()?;
    Ok(names)
}

/// One stream in a `ListStreams` result.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StreamInfo {
    /// The stream's name.
    pub name: String,
    /// Topics in it.
    pub topic_count: u32,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: i64,
}

/// Encodes a `ListStreams` result.
pub fn encode_streams(streams: &[StreamInfo]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(streams.len() as u32);
    for stream in streams {
        w.str(&stream.name).u32(stream.topic_count).i64(stream.created_ms);
    }
    w.finish()
}

/// Decodes a `ListStreams` result.
pub fn decode_streams(body: &[u8]) -> Result<Vec<StreamInfo>> {
    let mut r = Reader::new(body);
    let count = r.count("streams", 2 + 4 + 8)?;
    let mut streams = Vec::with_capacity(count);
    for _ in 0..count {
        streams.push(StreamInfo {
            name: r.name("stream")?,
            topic_count: r.u32("topic_count")?,
            created_ms: r.i64("created_ms")?,
        });
    }
    r.end()?;
    Ok(streams)
}

/// What a [`MovePartition`] asks of a partition's move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveAction {
    /// Move the partition's replicas to these nodes (a bit per node index), as many as it
    /// has now.
    Start {
        /// The nodes to hold the partition when the move is done.
        voters: u32,
    },
    /// Undo the move in progress: back to the nodes that held the partition before it.
    Cancel,
    /// The group's configuration reached `voters` (sent by the partition's primary node).
    Done {
        /// The voters the group runs with now.
        voters: u32,
    },
}

/// `MovePartition` arguments: a partition and what to do with its move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovePartition {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Start, cancel or done.
    pub action: MoveAction,
}

impl MovePartition {
    /// Encodes the arguments: names, partition, then `action u8` (1 start, 2 cancel, 3 done)
    /// and `voters u32` (0 for a cancel).
    pub fn encode(&self) -> Vec<u8> {
        let (action, voters) = match self.action {
            MoveAction::Start { voters } => (1, voters),
            MoveAction::Cancel => (2, 0),
            MoveAction::Done { voters } => (3, voters),
        };
        let mut w = Writer::new();
        w.str(&self.stream).str(&self.topic).u32(self.partition).u8(action).u32(voters);
        w.finish()
    }

    /// Decodes the arguments; a start or done naming no node is refused.
    pub fn decode(body: &[u8]) -> Result<MovePartition> {
        let mut r = Reader::new(body);
        let stream = r.name("stream")?;
        let topic = r.name("topic")?;
        let partition = r.u32("partition")?;
        let action = r.u8("action")?;
        let voters = r.u32("voters")?;
        r.end()?;
        let action = match (action, voters) {
            (1, voters) if voters != 0 => MoveAction::Start { voters },
            (2, 0) => MoveAction::Cancel,
            (3, voters) if voters != 0 => MoveAction::Done { voters },
            (action, voters) => {
                return Err(invalid("action", format!("action {action} with voters {voters:#x}")));
            }
        };
        Ok(MovePartition { stream, topic, partition, action })
    }
}

/// Longest address text an [`AddNode`] carries (an IPv6 address with its port fits).
pub const NODE_ADDRESS_BYTES_MAX: usize = 64;

/// `AddNode` arguments: a node for the cluster's address book, where its peers (`bus`, the base
/// port of its shards' bus ports) and its clients (`client`, `kafka`) reach it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AddNode {
    /// Its index; `None`: the lowest free one.
    pub node: Option<u8>,
    /// `IP:PORT` of its bus base port.
    pub bus: String,
    /// `IP:PORT` of its native listener.
    pub client: String,
    /// `IP:PORT` it advertises to Kafka clients; empty: none.
    pub kafka: String,
    /// Its rack; empty: none.
    pub rack: String,
}

impl AddNode {
    /// Encodes the arguments: `node u8` (255: the lowest free), then the four texts.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(self.node.unwrap_or(u8::MAX));
        w.str(&self.bus).str(&self.client).str(&self.kafka).str(&self.rack);
        w.finish()
    }

    /// Decodes the arguments; texts longer than [`NODE_ADDRESS_BYTES_MAX`] are refused (what
    /// they say is checked by the server).
    pub fn decode(body: &[u8]) -> Result<AddNode> {
        let mut r = Reader::new(body);
        let node = r.u8("node")?;
        let bus = r.str("bus", NODE_ADDRESS_BYTES_MAX)?;
        let client = r.str("client", NODE_ADDRESS_BYTES_MAX)?;
        let kafka = r.str("kafka", NODE_ADDRESS_BYTES_MAX)?;
        let rack = r.str("rack", NODE_ADDRESS_BYTES_MAX)?;
        r.end()?;
        let node = (node != u8::MAX).then_some(node);
        Ok(AddNode { node, bus, client, kafka, rack })
    }
}

/// `RemoveNode` arguments: the node to drain and remove, and optionally the node its partitions
/// go to (`replace-node`; otherwise each goes to the node holding the fewest replicas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoveNode {
    /// The node leaving.
    pub node: u8,
    /// The node taking its place; `None`: spread over the others.
    pub replacement: Option<u8>,
}

impl RemoveNode {
    /// Encodes the arguments: `node u8`, `replacement u8` (255: none).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(self.node).u8(self.replacement.unwrap_or(u8::MAX));
        w.finish()
    }

    /// Decodes the arguments.
    pub fn decode(body: &[u8]) -> Result<RemoveNode> {
        let mut r = Reader::new(body);
        let node = r.u8("node")?;
        let replacement = r.u8("replacement")?;
        r.end()?;
        Ok(RemoveNode { node, replacement: (replacement != u8::MAX).then_some(replacement) })
    }
}

/// `CreateTopic` arguments. `None` (or a zero partition count) takes the server's default.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CreateTopic {
    /// The stream.
    pub stream: String,
    /// The new topic's name.
    pub topic: String,
    /// Partitions (0: the server's default).
    pub partitions: u32,
    /// Durability mode.
    pub durability: Option<Durability>,
    /// Size-based retention in bytes per partition (0: unbounded).
    pub retention_bytes: Option<u64>,
    /// Age-based retention (0: unbounded).
    pub retention_ms: Option<u64>,
    /// Segment roll size.
    pub segment_size_bytes: Option<u64>,
    /// Largest batch accepted.
    pub message_size_bytes_max: Option<u64>,
    /// The topic's own lag bound for its replicas (`[replication] replica_lag_time_max_ms`
    /// otherwise), as Kafka's per-topic override of `replica.lag.time.max.ms`. Sent only when
    /// set (a trailing field: a server that predates it reads the rest as before).
    pub replica_lag_time_max_ms: Option<u64>,
    /// How many nodes hold each partition (Kafka's replication factor; the server's default
    /// otherwise). Sent only when set, after the lag bound (written, absent or not, before it).
    pub replication_factor: Option<u8>,
}

impl CreateTopic {
    /// Encodes the arguments.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.str(&self.stream)
            .str(&self.topic)
            .u32(self.partitions)
            .u8(durability_byte(self.durability))
            .opt_u64(self.retention_bytes)
            .opt_u64(self.retention_ms)
            .opt_u64(self.segment_size_bytes)
            .opt_u64(self.message_size_bytes_max);
        if self.replica_lag_time_max_ms.is_some() || self.replication_factor.is_some() {
            w.opt_u64(self.replica_lag_time_max_ms);
        }
        if let Some(factor) = self.replication_factor {
            w.u8(factor);
        }
        w.finish()
    }

    /// Decodes the arguments.
    pub fn decode(body: &[u8]) -> Result<CreateTopic> {
        let mut r = Reader::new(body);
        let create = CreateTopic {
            stream: r.name("stream")?,
            topic: r.name("topic")?,
            partitions: r.u32("partitions")?,
            durability: durability_from(r.u8("durability")?, "durability")?,
            retention_bytes: r.opt_u64("retention_bytes")?,
            retention_ms: r.opt_u64("retention_ms")?,
            segment_size_bytes: r.opt_u64("segment_size_bytes")?,
            message_size_bytes_max: r.opt_u64("message_size_bytes_max")?,
            replica_lag_time_max_ms: None,
            replication_factor: None,
        };
        let replica_lag_time_max_ms =
            if r.remaining() > 0 { r.opt_u64("replica_lag_time_max_ms")? } else { None };
        let replication_factor =
            if r.remaining() > 0 { Some(r.u8("replication_factor")?) } else { None };
        r.end()?;
        Ok(CreateTopic { replica_lag_time_max_ms, replication_factor, ..create })
    }
}

/// A topic as `ListTopics` and `DescribeTopic` report it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TopicInfo {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub name: String,
    /// Partitions.
    pub partitions: u32,
    /// Durability mode.
    pub durability: Durability,
    /// Size-based retention per partition (0: unbounded).
    pub retention_bytes: u64,
    /// Age-based retention (0: unbounded).
    pub retention_ms: u64,
    /// Segment roll size.
    pub segment_size_bytes: u64,
    /// Largest batch accepted.
    pub message_size_bytes_max: u64,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: i64,
}

impl TopicInfo {
    fn write(&self, w: &mut Writer) {
        w.str(&self.stream)
            .str(&self.name)
            .u32(self.partitions)
            .u8(durability_byte(Some(self.durability)))
            .u64(self.retention_bytes)
            .u64(self.retention_ms)
            .u64(self.segment_size_bytes)
            .u64(self.message_size_bytes_max)
            .i64(self.created_ms);
    }

    fn read(r: &mut Reader<'_>) -> Result<TopicInfo> {
        Ok(TopicInfo {
            stream: r.name("stream")?,
            name: r.name("topic")?,
            partitions: read_partition_count(r)?,
            durability: durability_from(r.u8("durability")?, "durability")?
                .ok_or_else(|| invalid("durability", "missing".into()))?,
            retention_bytes: r.u64("retention_bytes")?,
            retention_ms: r.u64("retention_ms")?,
            segment_size_bytes: r.u64("segment_size_bytes")?,
            message_size_bytes_max: r.u64("message_size_bytes_max")?,
            created_ms: r.i64("created_ms")?,
        })
    }
}

/// The most partitions a topic may have on any server (the highest `topic_partitions_max` a
/// server accepts): what a client sizes its per-partition tables by is bounded by it.
pub const TOPIC_PARTITIONS_MAX: u32 = 1 << 20;

/// A topic's partition count, refused past [`TOPIC_PARTITIONS_MAX`].
fn read_partition_count(r: &mut Reader<'_>) -> Result<u32> {
    let partitions = r.u32("partitions")?;
    if partitions > TOPIC_PARTITIONS_MAX {
        return Err(invalid(
            "partitions",
            format!("{partitions} is past the bound of {TOPIC_PARTITIONS_MAX}"),
        ));
    }
    Ok(partitions)
}

/// Encodes a `ListTopics` result.
pub fn encode_topics(topics: &[TopicInfo]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(topics.len() as u32);
    for topic in topics {
        topic.write(&mut w);
    }
    w.finish()
}

/// Decodes a `ListTopics` result.
pub fn decode_topics(body: &[u8]) -> Result<Vec<TopicInfo>> {
    let mut r = Reader::new(body);
    let count = r.count("topics", 2 + 2 + 4 + 1 + 8 * 5)?;
    let mut topics = Vec::with_capacity(count);
    for _ in 0..count {
        topics.push(TopicInfo::read(&mut r)?);
    }
    r.end()?;
    Ok(topics)
}

/// One partition in a `DescribeTopic` result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PartitionInfo {
    /// The partition's index in its topic.
    pub partition: u32,
    /// The shard that owns it.
    pub shard: u32,
    /// Its VSR group.
    pub group: u64,
    /// The first offset still held (retention moves it).
    pub first_offset: u64,
    /// The offset the next message gets (the log end offset).
    pub next_offset: u64,
    /// Bytes on disk.
    pub size_bytes: u64,
}

const PARTITION_INFO_SIZE: usize = 4 + 4 + 8 * 4;

/// A partition's primary as the node answering `DescribeTopic` believes it (version 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PartitionPrimary {
    /// The node leading the partition's group in `view` ([`NODE_UNKNOWN`] while the answering
    /// node's replica is in a view change or recovering).
    pub primary: u8,
    /// The view the answering node's replica of the group is in.
    pub view: u32,
}

const PARTITION_PRIMARY_SIZE: usize = 1 + 4;

/// A `DescribeTopic` result: the topic, its partitions and (from version 3 on) each partition's
/// primary, in the same order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    /// The topic's settings.
    pub topic: TopicInfo,
    /// Its partitions with their figures.
    pub partitions: Vec<PartitionInfo>,
    /// Each partition's primary, by position in `partitions`; empty in a result older than
    /// version 3.
    pub primaries: Vec<PartitionPrimary>,
}

impl TopicDescription {
    /// Encodes the result for the negotiated `version`: the primaries section follows the
    /// partitions from version 3 on.
    ///
    /// # Panics
    /// From version 3 on, if `primaries` does not hold one entry per partition.
    pub fn encode(&self, version: u16) -> Vec<u8> {
        let mut w = Writer::new();
        self.topic.write(&mut w);
        w.u32(self.partitions.len() as u32);
        for p in &self.partitions {
            w.u32(p.partition).u32(p.shard).u64(p.group).u64(p.first_offset);
            w.u64(p.next_offset).u64(p.size_bytes);
        }
        if version >= 3 {
            assert_eq!(self.primaries.len(), self.partitions.len(), "one primary per partition");
            w.u32(self.primaries.len() as u32);
            for p in &self.primaries {
                w.u8(p.primary).u32(p.view);
            }
        }
        w.finish()
    }

    /// Decodes a result of any version: the primaries section is there when bytes follow the
    /// partitions, and then must list exactly one primary per partition.
    pub fn decode(body: &[u8]) -> Result<TopicDescription> {
        let mut r = Reader::new(body);
        let topic = TopicInfo::read(&mut r)?;
        let count = r.count("partitions", PARTITION_INFO_SIZE)?;
        let mut partitions = Vec::with_capacity(count);
        for _ in 0..count {
            partitions.push(PartitionInfo {
                partition: r.u32("partition")?,
                shard: r.u32("shard")?,
                group: r.u64("group")?,
                first_offset: r.u64("first_offset")?,
                next_offset: r.u64("next_offset")?,
                size_bytes: r.u64("size_bytes")?,
            });
        }
        // Every partition once, in order: clients index their tables by partition.
        if count != topic.partitions as usize
            || partitions.iter().enumerate().any(|(index, p)| p.partition as usize != index)
        {
            return Err(invalid(
                "partitions",
                format!("not partitions 0..{} in order ({count} listed)", topic.partitions),
            ));
        }
        let mut primaries = Vec::new();
        if r.remaining() > 0 {
            let listed = r.count("primaries", PARTITION_PRIMARY_SIZE)?;
            if listed != count {
                return Err(invalid(
                    "primaries",
                    format!("{listed} primaries for {count} partitions"),
                ));
            }
            primaries.reserve(listed);
            for _ in 0..listed {
                primaries
                    .push(PartitionPrimary { primary: r.u8("primary")?, view: r.u32("view")? });
            }
        }
        r.end()?;
        Ok(TopicDescription { topic, partitions, primaries })
    }
}

/// Encodes a version 1 or 2 `DescribeTopic` result (no primaries).
pub fn encode_describe(topic: &TopicInfo, partitions: &[PartitionInfo]) -> Vec<u8> {
    let description = TopicDescription {
        topic: topic.clone(),
        partitions: partitions.to_vec(),
        primaries: Vec::new(),
    };
    description.encode(2)
}

/// Decodes a `DescribeTopic` result of any version, without its primaries (see
/// [`TopicDescription::decode`] for them).
pub fn decode_describe(body: &[u8]) -> Result<(TopicInfo, Vec<PartitionInfo>)> {
    let description = TopicDescription::decode(body)?;
    Ok((description.topic, description.partitions))
}

/// A `NotPrimary` error's body from version 3 on: where the client should go instead. Before
/// version 3 the body is `text` alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotPrimary {
    /// The view the answering node's replica of the group is in.
    pub view: u32,
    /// The node that leads the group in that view ([`NODE_UNKNOWN`] if none is known).
    pub primary: u8,
    /// That node's client address (`IP:PORT`; empty when the answering node has none for it).
    pub address: String,
    /// What happened, for people.
    pub text: String,
}

impl NotPrimary {
    /// Encodes the version 3 body.
    pub fn encode(&self) -> Vec<u8> {
        Writer::new().u32(self.view).u8(self.primary).str(&self.address).str(&self.text).finish()
    }

    /// Decodes a version 3 body.
    pub fn decode(body: &[u8]) -> Result<NotPrimary> {
        let mut r = Reader::new(body);
        let not_primary = NotPrimary {
            view: r.u32("view")?,
            primary: r.u8("primary")?,
            address: r.str("address", ADDRESS_LEN_MAX)?,
            text: r.str("text", TEXT_LEN_MAX)?,
        };
        r.end()?;
        Ok(not_primary)
    }
}

/// How a produce request picks its partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Partitioning {
    /// This partition.
    Explicit(u32),
    /// Kafka's murmur2 partitioner over this key ([`partition_for_key`]).
    Key(Vec<u8>),
    /// The server spreads batches over the partitions.
    Balanced,
}

/// Longest key a produce request may carry for partitioning.
pub const PARTITION_KEY_LEN_MAX: usize = 4096;

/// `Produce` arguments before the batch. The record batch is the rest of the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Produce {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub topic: String,
    /// How to choose the partition.
    pub partitioning: Partitioning,
}

impl Produce {
    /// Encodes the arguments followed by `batch`.
    pub fn encode(&self, batch: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        self.encode_prefix(&mut w);
        w.raw(batch);
        w.finish()
    }

    /// Encodes the arguments only; the batch is appended by the caller.
    pub fn encode_prefix(&self, w: &mut Writer) {
        w.str(&self.stream).str(&self.topic);
        match &self.partitioning {
            Partitioning::Explicit(partition) => w.u8(0).u32(*partition),
            Partitioning::Key(key) => w.u8(1).bytes(key),
            Partitioning::Balanced => w.u8(2),
        };
    }

    /// Decodes the arguments; returns them and the offset in `body` where the batch starts.
    pub fn decode(body: &[u8]) -> Result<(Produce, usize)> {
        let mut r = Reader::new(body);
        let stream = r.name("stream")?;
        let topic = r.name("topic")?;
        let partitioning = match r.u8("partitioning")? {
            0 => Partitioning::Explicit(r.u32("partition")?),
            1 => Partitioning::Key(r.bytes("key", PARTITION_KEY_LEN_MAX)?.to_vec()),
            2 => Partitioning::Balanced,
            other => return Err(invalid("partitioning", format!("{other}: use 0, 1 or 2"))),
        };
        Ok((Produce { stream, topic, partitioning }, r.position()))
    }
}

/// `Produce` result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProduceReply {
    /// The partition the batch went to.
    pub partition: u32,
    /// The offset assigned to the batch's first record.
    pub base_offset: u64,
    /// Records in the batch.
    pub record_count: u32,
}

/// Size of an encoded [`ProduceReply`].
pub const PRODUCE_REPLY_SIZE: usize = 4 + 8 + 4;

impl ProduceReply {
    /// Encodes the result.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_array().to_vec()
    }

    /// Encodes the result without allocating.
    pub fn encode_array(&self) -> [u8; PRODUCE_REPLY_SIZE] {
        let mut bytes = [0u8; PRODUCE_REPLY_SIZE];
        bytes[0..4].copy_from_slice(&self.partition.to_le_bytes());
        bytes[4..12].copy_from_slice(&self.base_offset.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.record_count.to_le_bytes());
        bytes
    }

    /// Decodes the result.
    pub fn decode(body: &[u8]) -> Result<ProduceReply> {
        let mut r = Reader::new(body);
        let reply = ProduceReply {
            partition: r.u32("partition")?,
            base_offset: r.u64("base_offset")?,
            record_count: r.u32("record_count")?,
        };
        r.end()?;
        Ok(reply)
    }
}

/// Where a fetch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchFrom {
    /// At this offset (the batch containing it).
    Offset(u64),
    /// At the first message appended at or after this time (ms since the Unix epoch).
    Timestamp(i64),
    /// At the first offset still held.
    First,
    /// At the last message (the log end offset − 1); with nothing stored, at the end.
    Last,
}

/// `Fetch` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetch {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Where to start.
    pub from: FetchFrom,
    /// Bytes of batches to return at most (at least one whole batch when one exists).
    pub bytes_max: u32,
    /// Records to return at most, counted in whole batches (the last batch may overshoot; the
    /// client trims).
    pub count_max: u32,
    /// Long-poll: when nothing committed is at or after the start yet, how long the server may
    /// hold the request waiting for it (0: answer at once).
    pub wait_ms_max: u32,
}

impl Fetch {
    /// Encodes the arguments.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.str(&self.stream).str(&self.topic).u32(self.partition);
        match self.from {
            FetchFrom::Offset(offset) => w.u8(0).u64(offset),
            FetchFrom::Timestamp(time_ms) => w.u8(1).i64(time_ms),
            FetchFrom::First => w.u8(2).u64(0),
            FetchFrom::Last => w.u8(3).u64(0),
        };
        w.u32(self.bytes_max).u32(self.count_max).u32(self.wait_ms_max).finish()
    }

    /// Decodes the arguments.
    pub fn decode(body: &[u8]) -> Result<Fetch> {
        let mut r = Reader::new(body);
        let stream = r.name("stream")?;
        let topic = r.name("topic")?;
        let partition = r.u32("partition")?;
        let kind = r.u8("from")?;
        let value = r.u64("from")?;
        let from = match kind {
            0 => FetchFrom::Offset(value),
            1 => FetchFrom::Timestamp(value as i64),
            2 => FetchFrom::First,
            3 => FetchFrom::Last,
            other => return Err(invalid("from", format!("{other}: use 0..=3"))),
        };
        let fetch = Fetch {
            stream,
            topic,
            partition,
            from,
            bytes_max: r.u32("bytes_max")?,
            count_max: r.u32("count_max")?,
            wait_ms_max: r.u32("wait_ms_max")?,
        };
        r.end()?;
        Ok(fetch)
    }
}

/// `Fetch` result before the batches; the batches, concatenated, are the rest of the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchReply {
    /// The partition.
    pub partition: u32,
    /// The first offset still held.
    pub first_offset: u64,
    /// The end of the committed log: the offset after the last committed message (what a
    /// consumer may read up to; Kafka's high watermark).
    pub next_offset: u64,
    /// Batches that follow.
    pub batch_count: u32,
}

/// Size of the fixed part of a `Fetch` result.
pub const FETCH_REPLY_PREFIX_SIZE: usize = 4 + 8 + 8 + 4;

impl FetchReply {
    /// Encodes the fixed part.
    pub fn encode_prefix(&self) -> [u8; FETCH_REPLY_PREFIX_SIZE] {
        let mut bytes = [0u8; FETCH_REPLY_PREFIX_SIZE];
        bytes[0..4].copy_from_slice(&self.partition.to_le_bytes());
        bytes[4..12].copy_from_slice(&self.first_offset.to_le_bytes());
        bytes[12..20].copy_from_slice(&self.next_offset.to_le_bytes());
        bytes[20..24].copy_from_slice(&self.batch_count.to_le_bytes());
        bytes
    }

    /// Decodes the fixed part; returns it and the offset in `body` where the batches start.
    pub fn decode(body: &[u8]) -> Result<(FetchReply, usize)> {
        let mut r = Reader::new(body);
        let reply = FetchReply {
            partition: r.u32("partition")?,
            first_offset: r.u64("first_offset")?,
            next_offset: r.u64("next_offset")?,
            batch_count: r.u32("batch_count")?,
        };
        Ok((reply, r.position()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_murmur2_matches_kafka() {
        // Values from Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key), expected, "{:?}", std::str::from_utf8(key));
        }
        assert!(partition_for_key(b"foobar", 7) < 7);
    }

    #[test]
    fn protocol_names_follow_kafka_rule() {
        for good in ["a", "orders", "A.b_c-9", &"x".repeat(NAME_LEN_MAX)] {
            assert_eq!(validate_name(good), Ok(()), "{good}");
        }
        for bad in ["", "has space", "slash/", "ü", ".", "..", &"x".repeat(NAME_LEN_MAX + 1)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn protocol_bodies_round_trip() {
        let hello = Hello { version_min: 1, version_max: 3, client_name: "t".into() };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello.clone()));
        assert_eq!(hello.negotiate(), Some(PROTOCOL_VERSION));
        let future = Hello { version_min: 4, version_max: 9, client_name: String::new() };
        assert_eq!(future.negotiate(), None);
        let old = Hello { version_min: 1, version_max: 1, client_name: String::new() };
        assert_eq!(old.negotiate(), Some(1), "version 1 clients are still served");
        let v2 = Hello { version_min: 1, version_max: 2, client_name: String::new() };
        assert_eq!(v2.negotiate(), Some(2), "version 2 clients are still served");

        // The shard map exists from version 2 on; a version 1 result has neither field.
        let v2 = HelloReply {
            version: 2,
            shards: 2,
            server: "shoal".into(),
            shard: 1,
            shard_addresses: vec!["127.0.0.1:7100".into(), "127.0.0.1:7101".into()],
            cluster: 0,
            node: 0,
            nodes: Vec::new(),
        };
        assert_eq!(HelloReply::decode(&v2.encode()), Ok(v2.clone()));
        let v1 = HelloReply { version: 1, ..v2.clone() };
        let plain = HelloReply { shard: 0, shard_addresses: Vec::new(), ..v1.clone() };
        assert_eq!(HelloReply::decode(&v1.encode()), Ok(plain));
        assert_eq!(v1.encode().len() + 4 + 4 + 2 * (2 + 14), v2.encode().len());
        let mut too_many = Writer::new();
        too_many.u16(2).u32(1).str("s").u32(0).u32(HELLO_SHARD_ADDRESSES_MAX as u32 + 1);
        for _ in 0..=HELLO_SHARD_ADDRESSES_MAX {
            too_many.str("a");
        }
        assert!(HelloReply::decode(&too_many.finish()).is_err(), "the address count is bounded");

        let create = CreateTopic {
            stream: "s".into(),
            topic: "t".into(),
            partitions: 3,
            durability: Some(Durability::Persisted),
            retention_bytes: Some(0),
            retention_ms: None,
            segment_size_bytes: Some(1 << 20),
            message_size_bytes_max: None,
            replica_lag_time_max_ms: None,
            replication_factor: None,
        };
        assert_eq!(CreateTopic::decode(&create.encode()), Ok(create.clone()));
        // The lag override is a trailing field, sent only when set: without it the body is
        // what a server that predates it reads.
        let with_lag = CreateTopic { replica_lag_time_max_ms: Some(5_000), ..create.clone() };
        assert_eq!(CreateTopic::decode(&with_lag.encode()), Ok(with_lag.clone()));
        assert_eq!(with_lag.encode().len(), create.encode().len() + 1 + 8);
        // The factor follows the lag bound, written (absent or not) before it.
        let with_factor = CreateTopic { replication_factor: Some(3), ..create.clone() };
        assert_eq!(CreateTopic::decode(&with_factor.encode()), Ok(with_factor.clone()));
        assert_eq!(with_factor.encode().len(), create.encode().len() + 1 + 8 + 1);
        let both = CreateTopic { replication_factor: Some(5), ..with_lag.clone() };
        assert_eq!(CreateTopic::decode(&both.encode()), Ok(both.clone()));
        let mut trailing = both.encode();
        trailing.push(0);
        assert!(CreateTopic::decode(&trailing).is_err(), "bytes past the last field");

        for action in [
            MoveAction::Start { voters: 0b110 },
            MoveAction::Cancel,
            MoveAction::Done { voters: 0b011 },
        ] {
            let moved =
                MovePartition { stream: "s".into(), topic: "t".into(), partition: 2, action };
            assert_eq!(MovePartition::decode(&moved.encode()), Ok(moved.clone()));
        }
        let nobody = MovePartition {
            stream: "s".into(),
            topic: "t".into(),
            partition: 0,
            action: MoveAction::Start { voters: 0 },
        };
        assert!(MovePartition::decode(&nobody.encode()).is_err(), "a move to no node");

        let add = AddNode {
            node: Some(3),
            bus: "10.0.0.4:7000".into(),
            client: "10.0.0.4:8000".into(),
            kafka: String::new(),
            rack: "r1".into(),
        };
        assert_eq!(AddNode::decode(&add.encode()), Ok(add.clone()));
        let lowest_free = AddNode { node: None, ..add.clone() };
        assert_eq!(AddNode::decode(&lowest_free.encode()), Ok(lowest_free));
        let long = AddNode { bus: "9".repeat(NODE_ADDRESS_BYTES_MAX + 1), ..add };
        assert!(AddNode::decode(&long.encode()).is_err(), "an address past the bound");
        for replacement in [None, Some(4)] {
            let remove = RemoveNode { node: 0, replacement };
            assert_eq!(RemoveNode::decode(&remove.encode()), Ok(remove));
        }

        let produce = Produce {
            stream: "s".into(),
            topic: "t".into(),
            partitioning: Partitioning::Key(vec![1, 2]),
        };
        let body = produce.encode(b"BATCH");
        let (decoded, at) = Produce::decode(&body).unwrap();
        assert_eq!(decoded, produce);
        assert_eq!(&body[at..], b"BATCH");

        let fetch = Fetch {
            stream: "s".into(),
            topic: "t".into(),
            partition: 2,
            from: FetchFrom::Timestamp(-5),
            bytes_max: 10,
            count_max: 1,
            wait_ms_max: 500,
        };
        assert_eq!(Fetch::decode(&fetch.encode()), Ok(fetch));

        let topic = TopicInfo {
            stream: "s".into(),
            name: "t".into(),
            partitions: 1,
            durability: Durability::Replicated,
            retention_bytes: 1,
            retention_ms: 2,
            segment_size_bytes: 3,
            message_size_bytes_max: 4,
            created_ms: 5,
        };
        let partition = PartitionInfo {
            partition: 0,
            shard: 1,
            group: 2,
            first_offset: 3,
            next_offset: 4,
            size_bytes: 5,
        };
        let body = encode_describe(&topic, &[partition]);
        assert_eq!(decode_describe(&body), Ok((topic.clone(), vec![partition])));
        assert_eq!(TopicDescription::decode(&body).map(|d| d.primaries), Ok(Vec::new()));
        assert_eq!(decode_topics(&encode_topics(std::slice::from_ref(&topic))), Ok(vec![topic]));
        let streams = vec![StreamInfo { name: "s".into(), topic_count: 2, created_ms: 3 }];
        assert_eq!(decode_streams(&encode_streams(&streams)), Ok(streams));
    }

    fn topic_info() -> TopicInfo {
        TopicInfo {
            stream: "s".into(),
            name: "t".into(),
            partitions: 2,
            durability: Durability::Persisted,
            retention_bytes: 0,
            retention_ms: 0,
            segment_size_bytes: 1 << 20,
            message_size_bytes_max: 1 << 20,
            created_ms: 7,
        }
    }

    fn v3_hello() -> HelloReply {
        HelloReply {
            version: 3,
            shards: 1,
            server: "shoal".into(),
            shard: 0,
            shard_addresses: Vec::new(),
            cluster: 9,
            node: 2,
            nodes: (0..3)
                .map(|node| NodeAddress { node, address: format!("127.0.0.1:710{node}") })
                .collect(),
        }
    }

    #[test]
    fn protocol_hello_v3_names_the_cluster_and_older_versions_do_not() {
        let v3 = v3_hello();
        assert_eq!(HelloReply::decode(&v3.encode()), Ok(v3.clone()));
        // A version 2 result of the same reply has no cluster fields: 8 + 1 + 4 + 3 nodes of
        // 1 + 2 + 14 bytes fewer, and decodes as cluster 0, node 0, no nodes.
        let v2 = HelloReply { version: 2, ..v3.clone() };
        assert_eq!(v2.encode().len() + 8 + 1 + 4 + 3 * (1 + 2 + 14), v3.encode().len());
        let decoded = HelloReply::decode(&v2.encode()).unwrap();
        assert_eq!((decoded.cluster, decoded.node, decoded.nodes.len()), (0, 0, 0));
        // Every prefix is refused, and so is one byte more.
        let body = v3.encode();
        for len in 0..body.len() {
            assert!(HelloReply::decode(&body[..len]).is_err(), "prefix {len}");
        }
        let mut trailing = body.clone();
        trailing.push(0);
        assert!(HelloReply::decode(&trailing).is_err());
    }

    #[test]
    fn protocol_hello_v3_bounds_its_nodes_and_their_addresses() {
        let at_limit = HelloReply {
            nodes: (0..CLUSTER_NODES_MAX as u8)
                .map(|node| NodeAddress { node, address: "a".repeat(ADDRESS_LEN_MAX) })
                .collect(),
            ..v3_hello()
        };
        assert_eq!(HelloReply::decode(&at_limit.encode()), Ok(at_limit.clone()));
        let mut too_many = at_limit.clone();
        too_many.nodes.push(NodeAddress { node: 32, address: "a".into() });
        assert!(matches!(
            HelloReply::decode(&too_many.encode()),
            Err(ProtocolError::Invalid { field: "nodes", .. })
        ));
        let mut too_long = at_limit;
        too_long.nodes[0].address.push('a');
        assert!(matches!(
            HelloReply::decode(&too_long.encode()),
            Err(ProtocolError::Invalid { field: "node_address", .. })
        ));
    }

    #[test]
    fn protocol_describe_v3_adds_one_primary_per_partition() {
        let partitions: Vec<PartitionInfo> = (0..2)
            .map(|partition| PartitionInfo {
                partition,
                shard: 0,
                group: u64::from(partition) + 1,
                first_offset: 0,
                next_offset: 10,
                size_bytes: 100,
            })
            .collect();
        let primaries = vec![
            PartitionPrimary { primary: 1, view: 4 },
            PartitionPrimary { primary: NODE_UNKNOWN, view: 5 },
        ];
        let description = TopicDescription { topic: topic_info(), partitions, primaries };
        let v3 = description.encode(3);
        assert_eq!(TopicDescription::decode(&v3), Ok(description.clone()));
        // The version 2 body is the version 3 body without the section (count + 5 bytes each)
        // and decodes with no primaries; decode_describe takes either.
        let v2 = description.encode(2);
        assert_eq!(v2.len() + 4 + 2 * 5, v3.len());
        assert_eq!(&v3[..v2.len()], &v2[..]);
        assert_eq!(TopicDescription::decode(&v2).map(|d| d.primaries), Ok(Vec::new()));
        let expected = (description.topic.clone(), description.partitions.clone());
        assert_eq!(decode_describe(&v3), Ok(expected.clone()));
        assert_eq!(decode_describe(&v2), Ok(expected));
        // A section that does not list one primary per partition is refused, as is every
        // truncation inside it.
        let mut short = v2.clone();
        short.extend_from_slice(&1u32.to_le_bytes());
        short.extend_from_slice(&[1, 4, 0, 0, 0]);
        assert!(matches!(
            TopicDescription::decode(&short),
            Err(ProtocolError::Invalid { field: "primaries", .. })
        ));
        for len in v2.len() + 1..v3.len() {
            assert!(TopicDescription::decode(&v3[..len]).is_err(), "prefix {len}");
        }
        let mut hostile = v2;
        hostile.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(TopicDescription::decode(&hostile).is_err(), "a huge count allocates nothing");
    }

    /// Clients size and index their per-partition tables by what a description says, so it
    /// must list partitions 0..count in order, and no topic may claim more than any server
    /// allows.
    #[test]
    fn protocol_describe_refuses_partitions_a_client_cannot_index() {
        let info = |partition| PartitionInfo {
            partition,
            shard: 0,
            group: 1,
            first_offset: 0,
            next_offset: 0,
            size_bytes: 0,
        };
        let describe = |partitions: u32, listed: Vec<u32>| {
            let description = TopicDescription {
                topic: TopicInfo { partitions, ..topic_info() },
                partitions: listed.into_iter().map(info).collect(),
                primaries: Vec::new(),
            };
            TopicDescription::decode(&description.encode(2))
        };
        assert!(describe(2, vec![0, 1]).is_ok());
        for (partitions, listed) in [
            (u32::MAX, vec![]),
            (2, vec![0]),
            (1, vec![0, 1]),
            (2, vec![1, 0]),
            (2, vec![0, u32::MAX]),
        ] {
            let refused = describe(partitions, listed.clone());
            assert!(
                matches!(refused, Err(ProtocolError::Invalid { field: "partitions", .. })),
                "{partitions} {listed:?}: {refused:?}"
            );
        }
        let most = TopicInfo { partitions: TOPIC_PARTITIONS_MAX, ..topic_info() };
        assert_eq!(decode_topics(&encode_topics(std::slice::from_ref(&most))), Ok(vec![most]));
        let more = TopicInfo { partitions: TOPIC_PARTITIONS_MAX + 1, ..topic_info() };
        assert!(decode_topics(&encode_topics(&[more])).is_err());
    }

    #[test]
    fn protocol_not_primary_round_trips_and_is_bounded() {
        let redirect = NotPrimary {
            view: 7,
            primary: 1,
            address: "127.0.0.1:7101".into(),
            text: "replica 1 leads view 7".into(),
        };
        let body = redirect.encode();
        assert_eq!(NotPrimary::decode(&body), Ok(redirect.clone()));
        assert_eq!(body.len(), 4 + 1 + 2 + 14 + 2 + 22);
        for len in 0..body.len() {
            assert!(NotPrimary::decode(&body[..len]).is_err(), "prefix {len}");
        }
        // A version 2 body (the text alone) is not a version 3 one.
        assert!(NotPrimary::decode(redirect.text.as_bytes()).is_err());
        let long = NotPrimary { address: "a".repeat(ADDRESS_LEN_MAX + 1), ..redirect.clone() };
        assert!(matches!(
            NotPrimary::decode(&long.encode()),
            Err(ProtocolError::Invalid { field: "address", .. })
        ));
        let unknown = NotPrimary { primary: NODE_UNKNOWN, address: String::new(), ..redirect };
        assert_eq!(NotPrimary::decode(&unknown.encode()), Ok(unknown));
    }

    #[test]
    fn protocol_hostile_bodies_rejected_without_panic() {
        // A huge list count with no items behind it must not allocate or panic.
        let mut body = Writer::new().u32(u32::MAX).finish();
        assert!(decode_streams(&body).is_err());
        assert!(decode_topics(&body).is_err());
        body.extend_from_slice(&[0xff; 64]);
        assert!(decode_streams(&body).is_err());
        // Every prefix of a valid body is rejected, never a panic.
        let create = CreateTopic { stream: "s".into(), topic: "t".into(), ..Default::default() };
        let encoded = create.encode();
        for len in 0..encoded.len() {
            assert!(CreateTopic::decode(&encoded[..len]).is_err(), "prefix {len}");
        }
        // A byte past the fixed fields begins the optional lag bound, and is refused as cut.
        let mut trailing = encoded.clone();
        trailing.push(0);
        let cut = ProtocolError::Truncated { field: "replica_lag_time_max_ms" };
        assert_eq!(CreateTopic::decode(&trailing), Err(cut));
        // Over-long names and invalid UTF-8.
        let long = Writer::new().u16(NAME_LEN_MAX as u16 + 1).finish();
        assert!(matches!(decode_stream_name(&long), Err(ProtocolError::Invalid { .. })));
        let not_utf8 = Writer::new().u16(1).u8(0xff).finish();
        assert!(matches!(decode_stream_name(&not_utf8), Err(ProtocolError::Invalid { .. })));
    }
}
