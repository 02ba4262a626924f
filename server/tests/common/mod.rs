//! Shared harness of the server's end-to-end tests: the real `shoal` binary's command line on a
//! temp directory with ephemeral ports (native and metrics) and the small profile, started,
//! stopped and restarted through `shoal_testkit::ShoalProcess` under [`DEADLINE`], and a
//! raw-frame client built on `engine::wire` and `engine::protocol` (raw on purpose: the
//! bad-input tests must send what no client library would).

#![allow(dead_code)]

pub mod cluster;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use shoal_proto::Durability;
use shoal_proto::batch::BatchBuilder;
use shoal_proto::protocol::{
    CreateTopic, ErrorCode, Fetch, FetchFrom, FetchReply, Hello, Operation, PROTOCOL_VERSION,
    Partitioning, Produce, ProduceReply,
};
use shoal_proto::wire::{ClientReply, ClientRequest, HEADER_SIZE, Header};

pub use shoal_testkit::{ShoalProcess, metrics_page};

/// `shoal` on `dir` with `shards` shards, the small profile, port 0 (native and metrics) and no
/// pinning.
pub fn command(dir: &Path, shards: u32) -> Command {
    let mut command = ShoalProcess::command(Path::new(env!("CARGO_BIN_EXE_shoal")), dir);
    command.args(["--shards", &shards.to_string(), "--profile", "small", "--cpus", "none"]);
    command
}

/// How long any child may take; a hung server fails the test instead of stalling it.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// `Command::output` bounded by [`DEADLINE`].
pub trait OutputWithin {
    fn output_within(&mut self) -> Output;
}

impl OutputWithin for Command {
    fn output_within(&mut self) -> Output {
        let child = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("runs");
        shoal_testkit::output_within(child, DEADLINE, "shoal")
    }
}

pub fn start(dir: &Path, shards: u32) -> ShoalProcess {
    start_command(command(dir, shards))
}

/// Starts `command` and waits (at most [`DEADLINE`]) for its readiness line.
pub fn start_command(command: Command) -> ShoalProcess {
    ShoalProcess::start(command, DEADLINE).unwrap_or_else(|error| panic!("{error}"))
}

/// Starts `server` again on its data directory (killing it first if it still runs).
pub fn restart(server: &mut ShoalProcess) {
    server.restart().unwrap_or_else(|error| panic!("{error}"));
}

/// SIGTERM, then the exit code (within [`DEADLINE`]).
pub fn terminate(server: &mut ShoalProcess) -> i32 {
    exit_code(server.terminate())
}

/// The exit code of a server that was told to stop (within [`DEADLINE`]).
pub fn wait_exit(server: &mut ShoalProcess) -> i32 {
    exit_code(server.wait_exit())
}

fn exit_code(exit: Result<ExitStatus, shoal_testkit::ProcessError>) -> i32 {
    let status = exit.unwrap_or_else(|error| panic!("{error}"));
    status.code().expect("exited, not killed")
}

/// A blocking client speaking raw frames. Every read is bounded by a 30 s timeout.
pub struct Raw {
    pub stream: TcpStream,
    pub client: u64,
    pub next_request: u64,
}

/// A reply: its error code (0 = ok) and body.
pub struct Answer {
    pub reply: ClientReply,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn ok(&self) -> &[u8] {
        assert_eq!(self.reply.error, 0, "error reply: {}", String::from_utf8_lossy(&self.body));
        &self.body
    }

    pub fn error(&self) -> ErrorCode {
        ErrorCode::from_u32(self.reply.error)
            .unwrap_or_else(|| panic!("not an error reply: {}", self.reply.error))
    }
}

impl Raw {
    /// Connects without saying hello.
    pub fn connect_only(address: &str, client: u64) -> Raw {
        let stream = TcpStream::connect(address).expect("connects");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        Raw { stream, client, next_request: 1 }
    }

    /// Connects and negotiates the version.
    pub fn connect(address: &str, client: u64) -> Raw {
        let mut raw = Raw::connect_only(address, client);
        let hello = Hello {
            version_min: PROTOCOL_VERSION,
            version_max: PROTOCOL_VERSION,
            client_name: "test".into(),
        };
        raw.call(Operation::Hello, &hello.encode()).ok();
        raw
    }

    pub fn frame(&mut self, operation: u32, body: &[u8]) -> Vec<u8> {
        let fields = ClientRequest {
            client: self.client,
            session: 0,
            request: self.next_request,
            operation,
        };
        self.next_request += 1;
        let header = Header::request(1, fields, body);
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(body);
        bytes
    }

    pub fn send(&mut self, operation: Operation, body: &[u8]) {
        self.try_send(operation, body).expect("sends");
    }

    /// Sends one request; an error once the peer reset or closed the connection (a node that
    /// is exiting can accept a connection and then drop it).
    pub fn try_send(&mut self, operation: Operation, body: &[u8]) -> std::io::Result<()> {
        let bytes = self.frame(operation as u32, body);
        self.stream.write_all(&bytes)
    }

    /// Reads one reply; `None` once the server closed the connection.
    pub fn try_receive(&mut self) -> Option<Answer> {
        let mut header = [0u8; HEADER_SIZE];
        self.stream.read_exact(&mut header).ok()?;
        let header = Header::decode(&header).expect("a valid reply header");
        let reply = *header.as_reply().expect("a reply");
        let mut body = vec![0u8; header.body_size()];
        self.stream.read_exact(&mut body).expect("the reply body");
        header.verify_body(&body).expect("the body checksum");
        Some(Answer { reply, body })
    }

    pub fn receive(&mut self) -> Answer {
        self.try_receive().expect("a reply before the connection closed")
    }

    pub fn call(&mut self, operation: Operation, body: &[u8]) -> Answer {
        self.send(operation, body);
        let answer = self.receive();
        assert_eq!(answer.reply.request, self.next_request - 1, "replies come in order");
        answer
    }

    /// Whether the server closed the connection (EOF within the read timeout).
    pub fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }

    pub fn create_stream(&mut self, name: &str) -> Answer {
        self.call(Operation::CreateStream, &shoal_proto::protocol::encode_stream_name(name))
    }

    pub fn create_topic(
        &mut self,
        stream: &str,
        topic: &str,
        partitions: u32,
        durability: Durability,
    ) -> Answer {
        let create = topic_args(stream, topic, partitions, durability);
        self.call(Operation::CreateTopic, &create.encode())
    }

    /// A topic whose partitions roll 1 MiB segments (the smallest) and keep 1 MiB: retention
    /// deletes a segment as soon as a second one is full.
    pub fn create_retained_topic(
        &mut self,
        stream: &str,
        topic: &str,
        partitions: u32,
        durability: Durability,
    ) -> Answer {
        let create = CreateTopic {
            retention_bytes: Some(1 << 20),
            segment_size_bytes: Some(1 << 20),
            ..topic_args(stream, topic, partitions, durability)
        };
        self.call(Operation::CreateTopic, &create.encode())
    }

    pub fn produce_body(stream: &str, topic: &str, partition: u32, values: &[&[u8]]) -> Vec<u8> {
        let produce = Produce {
            stream: stream.into(),
            topic: topic.into(),
            partitioning: Partitioning::Explicit(partition),
        };
        produce.encode(&batch(values))
    }

    pub fn produce(
        &mut self,
        stream: &str,
        topic: &str,
        partition: u32,
        values: &[&[u8]],
    ) -> ProduceReply {
        let body = Raw::produce_body(stream, topic, partition, values);
        ProduceReply::decode(self.call(Operation::Produce, &body).ok()).expect("a produce reply")
    }

    /// Every record value from `from` on (up to `count_max` records), with its offset.
    pub fn fetch(
        &mut self,
        stream: &str,
        topic: &str,
        partition: u32,
        from: FetchFrom,
        count_max: u32,
    ) -> (FetchReply, Vec<(u64, Vec<u8>)>) {
        let fetch = Fetch {
            stream: stream.into(),
            topic: topic.into(),
            partition,
            from,
            bytes_max: 1 << 20,
            count_max,
            wait_ms_max: 0,
        };
        let answer = self.call(Operation::Fetch, &fetch.encode());
        decode_fetch(answer.ok())
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as i64)
}

/// A batch of one record per value.
pub fn batch(values: &[&[u8]]) -> Vec<u8> {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    for value in values {
        builder.push(1_700_000_000_000, None, Some(value), &[]);
    }
    builder.build().to_vec()
}

/// The records of a fetch reply, with their offsets.
pub fn decode_fetch(body: &[u8]) -> (FetchReply, Vec<(u64, Vec<u8>)>) {
    let (reply, at) = FetchReply::decode(body).expect("a fetch reply");
    let mut records = Vec::new();
    let mut rest = &body[at..];
    for _ in 0..reply.batch_count {
        let header = shoal_proto::batch::BatchHeader::parse(rest).expect("a batch");
        let size = header.total_size();
        let base = header.base_offset() as u64;
        if header.is_control() {
            // Offset commits live in the partition's log; consumers skip them, as Kafka's do.
            rest = &rest[size..];
            continue;
        }
        for record in shoal_proto::batch::records(&rest[..size]).expect("records") {
            let record = record.expect("a record");
            let value = record.value.unwrap_or_default().to_vec();
            records.push((base + record.offset_delta as u64, value));
        }
        rest = &rest[size..];
    }
    assert!(rest.is_empty(), "bytes after the last batch");
    (reply, records)
}

/// `CreateTopic` arguments with the server's defaults for everything but these.
fn topic_args(stream: &str, topic: &str, partitions: u32, durability: Durability) -> CreateTopic {
    CreateTopic {
        stream: stream.into(),
        topic: topic.into(),
        partitions,
        durability: Some(durability),
        ..CreateTopic::default()
    }
}
