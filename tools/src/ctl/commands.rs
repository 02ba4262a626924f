//! What each `shoalctl` command does against the server, and how its result is printed.
//!
//! It owns the command flows (admin calls, the stdin-to-producer pipe, the consume loop, the
//! status summary, the shell completion script) and their text and JSON output. It talks to the
//! server only through `shoal_client`, and never decides exit codes beyond returning an error
//! (`main` maps it).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use clap::CommandFactory;
use clap_complete::Shell;
use serde_json::{Value, json};
use shoal_client::{
    AddNode, Assignment, Client, ClientConfig, ClientError, ConsumerId, CreateTopic, ErrorCode,
    Fetch, FetchFrom, FetchedRecord, GroupMember, GroupRef, JoinGroup, Membership, MoveAction,
    MovePartition, PartitionInfo, PartitionRef, Poll, Producer, ProducerConfig, RemoveNode,
    StoreOffset, TopicInfo,
};

use super::args::{Cli, Cluster, Command, Consume, Format, Stream, Topic};

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// The client or server refused.
    Client(ClientError),
    /// Whoever read stdout went away (`shoalctl consume ... | head`).
    StdoutClosed,
    /// Local I/O (stdin, stdout) or unexpected server output.
    Other(String),
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        Failure::Client(error)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Client(error) => write!(f, "{error}"),
            Failure::StdoutClosed => f.write_str("stdout was closed"),
            Failure::Other(reason) => f.write_str(reason),
        }
    }
}

type Outcome = Result<(), Failure>;

/// Bytes one fetch asks for.
const FETCH_BYTES_MAX: u32 = 1 << 20;
/// Records one fetch asks for when no `--count` bounds it.
const FETCH_COUNT_MAX: u32 = 10_000;
/// Wait between polls of `consume --follow` when nothing new arrived.
/// How long one `--follow` fetch waits at the end of the partition for new data (long-poll).
const FOLLOW_WAIT_MS: u32 = 5_000;
/// How long `produce` waits for more stdin lines to join a batch.
const PRODUCE_LINGER: Duration = Duration::from_millis(1);
/// Lines the stdin reader may run ahead of the producer.
const STDIN_LINES_AHEAD_MAX: usize = 4096;

/// Runs a parsed command other than `completions` on the current thread's runtime.
pub async fn run(cli: Cli) -> Outcome {
    let config = ClientConfig {
        request_timeout_ms: cli.timeout_ms,
        client_name: format!("shoalctl/{}", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::with_seeds(cli.servers.iter().cloned())
    };
    let json = cli.json;
    let connect = || Client::connect(config);
    match cli.command {
        Command::Stream(command) => stream(&mut connect().await?, command, json).await,
        Command::Topic(command) => topic(&mut connect().await?, command, json).await,
        Command::Produce { stream, topic, partition, key } => {
            produce(connect().await?, &stream, &topic, partition, key, json).await
        }
        Command::Consume(consume) => consume.run(&mut connect().await?).await,
        Command::Status => status(&mut connect().await?, json).await,
        Command::Cluster(command) => cluster(&mut connect().await?, command, json).await,
        Command::Completions { .. } => unreachable!("main prints completions without a runtime"),
    }
}

/// Prints the completion script for `shell`; needs neither the server nor a runtime.
pub fn completions(shell: Shell) -> Outcome {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "shoalctl", &mut script);
    write_stdout(&script)
}

async fn stream(client: &mut Client, command: Stream, json: bool) -> Outcome {
    match command {
        Stream::Create { name } => {
            client.create_stream(&name).await?;
            print(json, json!({ "created": { "stream": name } }), format!("created stream {name}"))
        }
        Stream::Delete { name } => {
            client.delete_stream(&name).await?;
            print(json, json!({ "deleted": { "stream": name } }), format!("deleted stream {name}"))
        }
        Stream::List => {
            let streams = client.list_streams().await?;
            let value = to_json(&streams);
            let rows = streams
                .iter()
                .map(|s| vec![s.name.clone(), s.topic_count.to_string(), utc(s.created_ms)])
                .collect();
            print(json, value, table(&["NAME", "TOPICS", "CREATED"], rows))
        }
    }
}

async fn topic(client: &mut Client, command: Topic, json: bool) -> Outcome {
    match command {
        Topic::Create {
            stream,
            topic,
            partitions,
            durability,
            retention_bytes,
            retention_ms,
            segment_size_bytes,
            message_size_bytes_max,
            replica_lag_time_max_ms,
            replication_factor,
        } => {
            let create = CreateTopic {
                stream: stream.clone(),
                topic: topic.clone(),
                partitions,
                durability: Some(durability),
                retention_bytes,
                retention_ms,
                segment_size_bytes,
                message_size_bytes_max,
                replica_lag_time_max_ms,
                replication_factor,
            };
            client.create_topic(&create).await?;
            print(
                json,
                json!({ "created": { "stream": stream, "topic": topic, "partitions": partitions } }),
                format!("created topic {stream}/{topic} with {partitions} partitions"),
            )
        }
        Topic::List { stream } => {
            let topics = client.list_topics(&stream).await?;
            let value = to_json(&topics);
            let rows = topics
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        t.partitions.to_string(),
                        t.durability.as_str().to_string(),
                        t.retention_bytes.to_string(),
                        t.retention_ms.to_string(),
                        t.segment_size_bytes.to_string(),
                        t.message_size_bytes_max.to_string(),
                        utc(t.created_ms),
                    ]
                })
                .collect();
            let headers = [
                "TOPIC",
                "PARTITIONS",
                "DURABILITY",
                "RETENTION_BYTES",
                "RETENTION_MS",
                "SEGMENT_BYTES",
                "MESSAGE_BYTES_MAX",
                "CREATED",
            ];
            print(json, value, table(&headers, rows))
        }
        Topic::Describe { stream, topic } => {
            let (info, partitions) = client.describe_topic(&stream, &topic).await?;
            // The partitions' list takes the place of their count.
            let mut value = to_json(&info);
            value["partitions"] = to_json(&partitions);
            print(json, value, describe_text(&info, &partitions))
        }
        Topic::Delete { stream, topic } => {
            client.delete_topic(&stream, &topic).await?;
            print(
                json,
                json!({ "deleted": { "stream": stream, "topic": topic } }),
                format!("deleted topic {stream}/{topic}"),
            )
        }
    }
}

async fn cluster(client: &mut Client, command: Cluster, json: bool) -> Outcome {
    let (stream, topic, partition, action) = match command {
        Cluster::Status => return cluster_status(client, json).await,
        Cluster::AddNode { bus, client: address, kafka, rack, node } => {
            let request = AddNode {
                node,
                bus,
                client: address,
                kafka: kafka.unwrap_or_default(),
                rack: rack.unwrap_or_default(),
            };
            let node = client.add_node(&request).await?;
            return print(
                json,
                json!({ "node": node, "bus": request.bus, "client": request.client }),
                format!(
                    "added node {node}: start it with --cluster-node {node} \
                     --cluster-added-node bus={},client={}",
                    request.bus, request.client
                ),
            );
        }
        Cluster::RemoveNode { node } => {
            client.remove_node(&RemoveNode { node, replacement: None }).await?;
            return print(
                json,
                json!({ "removing": node }),
                format!("removing node {node}: its partitions are moving (cluster status)"),
            );
        }
        Cluster::ReplaceNode { old, new } => {
            client.remove_node(&RemoveNode { node: old, replacement: Some(new) }).await?;
            return print(
                json,
                json!({ "removing": old, "replacement": new }),
                format!("replacing node {old} with node {new}: its partitions are moving"),
            );
        }
        Cluster::MovePartition { stream, topic, partition, to } => {
            let voters = to.iter().fold(0u32, |voters, &node| voters | 1 << node);
            (stream, topic, partition, MoveAction::Start { voters })
        }
        Cluster::CancelMove { stream, topic, partition } => {
            (stream, topic, partition, MoveAction::Cancel)
        }
    };
    let request = MovePartition { stream: stream.clone(), topic: topic.clone(), partition, action };
    client.move_partition(&request).await?;
    let (verb, to) = match action {
        MoveAction::Start { voters } => ("moving", voters),
        _ => ("cancelled the move of", 0),
    };
    let nodes: Vec<u32> = (0..32).filter(|node| to & (1 << node) != 0).collect();
    print(
        json,
        json!({ "stream": stream, "topic": topic, "partition": partition, "moving_to": nodes }),
        format!(
            "{verb} {stream}/{topic}/{partition}{}",
            if nodes.is_empty() { String::new() } else { format!(" to nodes {nodes:?}") }
        ),
    )
}

/// Every node's status document (`Err`: why it could not be had).
async fn node_statuses(client: &mut Client) -> Vec<NodeStatus> {
    let mut nodes = Vec::new();
    for (node, address) in client.node_addresses() {
        let document = match client.status_of(node).await {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}")),
            Err(error) => Err(error.to_string()),
        };
        nodes.push(NodeStatus { node, address, document });
    }
    nodes
}

async fn cluster_status(client: &mut Client, json: bool) -> Outcome {
    let mut nodes = node_statuses(client).await;
    if nodes.is_empty() {
        let text = client.status().await?;
        let document = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"));
        let address = client.address().unwrap_or("?").to_string();
        nodes.push(NodeStatus { node: 0, address, document });
    }
    let moves = moves_of(&nodes);
    let book = book_of(&nodes);
    if json {
        return print(true, json!({ "nodes": book, "moves": moves }), String::new());
    }
    let mut text = book_text(&book);
    text.push('\n');
    text.push_str(&groups_text(&nodes));
    text.push('\n');
    text.push_str(&moves_text(&moves));
    write_stdout(text.as_bytes())
}

async fn status(client: &mut Client, json: bool) -> Outcome {
    let text = client.status().await?;
    let status: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Other(format!("the server's status is not JSON: {e}")))?;
    if json {
        return write_stdout(format!("{text}\n").as_bytes());
    }
    // In a cluster every node reports its own replicas (the replica states of a group only on
    // its primary): the groups table is put together from every node's document.
    let mut nodes = Vec::new();
    if client.nodes().len() > 1 {
        nodes = node_statuses(client).await;
    } else {
        let node = status.get("node").and_then(Value::as_u64).unwrap_or(0) as u8;
        let address = client.address().unwrap_or("?").to_string();
        nodes.push(NodeStatus { node, address, document: Ok(status.clone()) });
    }
    let mut out = status_text(&status);
    out.push('\n');
    out.push_str(&groups_text(&nodes));
    write_stdout(out.as_bytes())
}

// -- produce ----------------------------------------------------------------------------------

enum Input {
    Line(Vec<u8>),
    End,
    Failed(String),
}

/// Reads stdin lines on a plain thread (stdin has no io_uring-friendly form here), so the
/// runtime thread can keep batching and collecting acknowledgements.
fn spawn_stdin_reader() -> mpsc::Receiver<Input> {
    let (sender, receiver) = mpsc::sync_channel(STDIN_LINES_AHEAD_MAX);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut stdin = stdin.lock();
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) => {
                    let _ = sender.send(Input::End);
                    return;
                }
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                    }
                    if sender.send(Input::Line(line)).is_err() {
                        return;
                    }
                }
                Err(error) => {
                    let _ = sender.send(Input::Failed(format!("reading stdin: {error}")));
                    return;
                }
            }
        }
    });
    receiver
}

async fn produce(
    client: Client,
    stream: &str,
    topic: &str,
    partition: Option<u32>,
    key: Option<String>,
    json: bool,
) -> Outcome {
    let config = ProducerConfig { partition, ..ProducerConfig::default() };
    let mut producer = Producer::new(client, stream, topic, config).await?;
    let key = key.map(String::into_bytes);
    let key = key.as_deref();
    let input = spawn_stdin_reader();
    let mut ended = false;
    loop {
        // Everything already piped or typed joins the open batches.
        while !ended {
            match input.try_recv() {
                Ok(Input::Line(line)) => {
                    producer.send(key, &line).await?;
                }
                Ok(Input::End) | Err(mpsc::TryRecvError::Disconnected) => ended = true,
                Ok(Input::Failed(reason)) => return fail_after_acks(&mut producer, json, reason),
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        print_acks(&mut producer, json)?;
        if ended {
            // Report what was acknowledged even if the flush fails part-way.
            let flushed = producer.flush().await;
            print_acks(&mut producer, json)?;
            return flushed.map_err(Failure::from);
        }
        if producer.buffered_records() > 0 {
            // A moment's linger lets a burst of lines share a batch.
            match input.recv_timeout(PRODUCE_LINGER) {
                Ok(Input::Line(line)) => {
                    producer.send(key, &line).await?;
                    continue;
                }
                Ok(Input::End) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    ended = true;
                    continue;
                }
                Ok(Input::Failed(reason)) => return fail_after_acks(&mut producer, json, reason),
                Err(mpsc::RecvTimeoutError::Timeout) => producer.send_buffered().await?,
            }
        }
        if producer.in_flight() > 0 {
            producer.await_ack().await?;
            continue;
        }
        // Nothing buffered, nothing in flight: wait for the next line.
        match input.recv() {
            Ok(Input::Line(line)) => {
                producer.send(key, &line).await?;
            }
            Ok(Input::End) | Err(mpsc::RecvError) => ended = true,
            Ok(Input::Failed(reason)) => return fail_after_acks(&mut producer, json, reason),
        }
    }
}

fn fail_after_acks(producer: &mut Producer, json: bool, reason: String) -> Outcome {
    print_acks(producer, json)?;
    Err(Failure::Other(reason))
}

/// Prints every acknowledgement received so far and flushes stdout, so a reader sees exactly
/// what is acknowledged.
fn print_acks(producer: &mut Producer, json: bool) -> Outcome {
    let mut text = String::new();
    for ack in producer.poll_acks() {
        if json {
            text.push_str(&json!({ "partition": ack.partition, "offset": ack.offset }).to_string());
            text.push('\n');
        } else {
            text.push_str(&format!("{} {}\n", ack.partition, ack.offset));
        }
    }
    if text.is_empty() {
        return Ok(());
    }
    write_stdout(text.as_bytes())
}

// -- consume ----------------------------------------------------------------------------------

/// A group member's session timeout: a killed `shoalctl` gives its partitions up this soon.
const GROUP_SESSION_TIMEOUT_MS: u32 = 10_000;
/// Heartbeats per session timeout.
const HEARTBEATS_PER_SESSION: u32 = 4;
/// How long one poll of a member with nothing to read waits for new data.
const GROUP_POLL_WAIT_MS: u32 = 500;

impl Consume {
    async fn run(self, client: &mut Client) -> Outcome {
        match (self.group.clone(), self.partition.zip(self.from)) {
            (Some(group), _) => self.run_in_group(client, group).await,
            (None, Some((partition, from))) => self.run_partition(client, partition, from).await,
            (None, None) => unreachable!("clap requires --partition and --from without --group"),
        }
    }

    /// Consumes as a member of `group`: joins, then polls each assigned partition from the
    /// group's stored offset and stores the offset after what it printed (at-least-once: a
    /// crash between printing and storing prints those messages again to the next member).
    /// Heartbeats keep the membership; a new generation brings a new share.
    async fn run_in_group(self, client: &mut Client, group: String) -> Outcome {
        let group_ref = GroupRef { stream: self.stream.clone(), topic: self.topic.clone(), group };
        let consumer = ConsumerId::group(group_ref.group.clone());
        let join = JoinGroup {
            group: group_ref.clone(),
            member: String::new(),
            session_timeout_ms: GROUP_SESSION_TIMEOUT_MS,
        };
        let mut assignment = client.join_group(&join).await?;
        let member = GroupMember { group: group_ref.clone(), member: assignment.member.clone() };
        let heartbeat_every =
            Duration::from_millis(u64::from(GROUP_SESSION_TIMEOUT_MS / HEARTBEATS_PER_SESSION));
        let mut last_heartbeat = std::time::Instant::now();
        // Without --follow, a member given no partition (more members than partitions) waits
        // one session for a rebalance to give it some, then stops as a caught-up one does.
        let mut idle_since: Option<std::time::Instant> = None;
        let session = Duration::from_millis(u64::from(GROUP_SESSION_TIMEOUT_MS));
        let mut remaining = self.count;
        let mut out = Vec::new();
        let result: Outcome = async {
            loop {
                if remaining == Some(0) {
                    return Ok(());
                }
                if last_heartbeat.elapsed() >= heartbeat_every {
                    assignment = client.heartbeat(&member).await?;
                    last_heartbeat = std::time::Instant::now();
                }
                let mut printed_any = false;
                let idle = assignment.partitions.is_empty();
                for &partition in &assignment.partitions.clone() {
                    let count_max = remaining
                        .map_or(FETCH_COUNT_MAX, |r| r.min(u64::from(FETCH_COUNT_MAX)) as u32);
                    let poll = self.group_poll(
                        &assignment,
                        &consumer,
                        partition,
                        (FETCH_BYTES_MAX, count_max),
                        0,
                    );
                    let fetched = match client.poll(&poll).await {
                        Ok(fetched) => fetched,
                        Err(error) if needs_new_assignment(&error) => {
                            assignment = client.heartbeat(&member).await?;
                            last_heartbeat = std::time::Instant::now();
                            break;
                        }
                        Err(error) => return Err(error.into()),
                    };
                    out.clear();
                    let mut next = None;
                    for record in fetched.records() {
                        let record = record?;
                        self.format_group_record(partition, &record, &mut out);
                        next = Some(record.offset + 1);
                        if let Some(left) = remaining.as_mut() {
                            *left -= 1;
                            if *left == 0 {
                                break;
                            }
                        }
                    }
                    let Some(next) = next else { continue };
                    match write_stdout(&out) {
                        Ok(()) => {}
                        Err(Failure::StdoutClosed) => return Ok(()),
                        Err(error) => return Err(error),
                    }
                    printed_any = true;
                    let store = StoreOffset {
                        partition: poll.partition,
                        consumer: consumer.clone(),
                        membership: poll.membership,
                        offset: next,
                    };
                    match client.store_offset(&store).await {
                        Ok(()) => {}
                        // The share moved on: the next owner starts from the last stored offset.
                        Err(error) if needs_new_assignment(&error) => {
                            assignment = client.heartbeat(&member).await?;
                            last_heartbeat = std::time::Instant::now();
                            break;
                        }
                        Err(error) => return Err(error.into()),
                    }
                    if remaining == Some(0) {
                        return Ok(());
                    }
                }
                idle_since = if idle {
                    idle_since.or_else(|| Some(std::time::Instant::now()))
                } else {
                    None
                };
                let idle_done = idle_since.is_some_and(|since| since.elapsed() >= session);
                if !printed_any {
                    if !self.follow && (!idle || idle_done) {
                        return Ok(());
                    }
                    // Nothing new anywhere: wait on the first partition (or, with none
                    // assigned yet, just until the next heartbeat) instead of spinning.
                    self.wait_for_data(client, &assignment, &consumer, heartbeat_every).await?;
                }
            }
        }
        .await;
        // Leaving hands the partitions over at once instead of after the session timeout.
        let left = client.leave_group(&member).await;
        result?;
        left.map_err(Failure::from)
    }

    /// Blocks until the first assigned partition has data (a long poll whose result is
    /// discarded: the next round polls again from the stored offset) or `at_most` passes.
    async fn wait_for_data(
        &self,
        client: &mut Client,
        assignment: &Assignment,
        consumer: &ConsumerId,
        at_most: Duration,
    ) -> Outcome {
        let Some(&partition) = assignment.partitions.first() else {
            monoio::time::sleep(at_most).await;
            return Ok(());
        };
        let wait_ms_max = GROUP_POLL_WAIT_MS.min(at_most.as_millis() as u32);
        let poll = self.group_poll(assignment, consumer, partition, (1, 1), wait_ms_max);
        match client.poll(&poll).await {
            Ok(_) => Ok(()),
            Err(error) if needs_new_assignment(&error) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// A poll of `partition` for the group under `assignment`, committing nothing.
    fn group_poll(
        &self,
        assignment: &Assignment,
        consumer: &ConsumerId,
        partition: u32,
        (bytes_max, count_max): (u32, u32),
        wait_ms_max: u32,
    ) -> Poll {
        Poll {
            partition: PartitionRef {
                stream: self.stream.clone(),
                topic: self.topic.clone(),
                partition,
            },
            consumer: consumer.clone(),
            membership: Membership {
                member: assignment.member.clone(),
                generation: assignment.generation,
            },
            bytes_max,
            count_max,
            wait_ms_max,
            auto_commit: false,
        }
    }

    fn format_group_record(&self, partition: u32, record: &FetchedRecord<'_>, out: &mut Vec<u8>) {
        if self.format() == Format::Offset {
            out.extend_from_slice(format!("{partition}\t").as_bytes());
        }
        if self.format() == Format::Json {
            let value = record.value.map(|v| String::from_utf8_lossy(v).into_owned());
            let key = record.key.map(|k| String::from_utf8_lossy(k).into_owned());
            let line = json!({
                "partition": partition,
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "key": key,
                "value": value,
            });
            out.extend_from_slice(line.to_string().as_bytes());
            out.push(b'\n');
            return;
        }
        self.format_record(record, out);
    }

    async fn run_partition(self, client: &mut Client, partition: u32, from: FetchFrom) -> Outcome {
        let mut position = from;
        let mut remaining = self.count;
        let mut out = Vec::new();
        loop {
            if remaining == Some(0) {
                return Ok(());
            }
            let count_max =
                remaining.map_or(FETCH_COUNT_MAX, |r| r.min(u64::from(u32::MAX)) as u32);
            let fetch = Fetch {
                stream: self.stream.clone(),
                topic: self.topic.clone(),
                partition,
                from: position,
                bytes_max: FETCH_BYTES_MAX,
                count_max,
                wait_ms_max: if self.follow { FOLLOW_WAIT_MS } else { 0 },
            };
            let fetched = client.fetch(&fetch).await?;
            let mut after_last = None;
            out.clear();
            for record in fetched.records() {
                let record = record?;
                self.format_record(&record, &mut out);
                after_last = Some(record.offset + 1);
                if let Some(left) = remaining.as_mut() {
                    *left -= 1;
                    if *left == 0 {
                        break;
                    }
                }
            }
            if !out.is_empty() {
                match write_stdout(&out) {
                    Ok(()) => {}
                    // A reader that went away (`| head`) ends the command quietly.
                    Err(Failure::StdoutClosed) => return Ok(()),
                    Err(error) => return Err(error),
                }
            }
            let previous = match position {
                FetchFrom::Offset(offset) => Some(offset),
                _ => None,
            };
            // Resume after the last record printed, else after the batches returned (all of
            // whose records were before the start); a fetch that did not move forward is
            // treated as "nothing new".
            let resume = after_last
                .or(fetched.end_offset())
                .filter(|next| previous.is_none_or(|p| *next > p));
            match resume {
                Some(next) => {
                    position = FetchFrom::Offset(next);
                    if !self.follow && next >= fetched.reply.next_offset {
                        return Ok(());
                    }
                }
                None => {
                    if !self.follow {
                        return Ok(());
                    }
                    if !matches!(position, FetchFrom::Offset(_)) {
                        // Nothing at first/last/time yet: wait at the end for what comes next.
                        position = FetchFrom::Offset(fetched.reply.next_offset);
                    }
                }
            }
        }
    }

    fn format_record(&self, record: &FetchedRecord<'_>, out: &mut Vec<u8>) {
        let value = record.value.unwrap_or_default();
        match self.format() {
            Format::Value => {
                out.extend_from_slice(value);
                out.push(b'\n');
            }
            Format::Offset => {
                out.extend_from_slice(record.offset.to_string().as_bytes());
                out.push(b'\t');
                out.extend_from_slice(value);
                out.push(b'\n');
            }
            Format::Json => {
                let text = |bytes: Option<&[u8]>| {
                    bytes.map_or(Value::Null, |b| {
                        Value::String(String::from_utf8_lossy(b).into_owned())
                    })
                };
                let line = json!({
                    "offset": record.offset,
                    "timestamp_ms": record.timestamp_ms,
                    "key": text(record.key),
                    "value": text(record.value),
                });
                out.extend_from_slice(line.to_string().as_bytes());
                out.push(b'\n');
            }
        }
    }
}

/// Whether a group member's request failed because its share changed: it must take the
/// assignment in force (a heartbeat answers with it) before going on.
fn needs_new_assignment(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Server { code: ErrorCode::StaleGeneration | ErrorCode::NotAssigned, .. }
    )
}

// -- output -----------------------------------------------------------------------------------

/// Writes and flushes stdout.
fn write_stdout(bytes: &[u8]) -> Outcome {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::StdoutClosed),
        Err(error) => Err(Failure::Other(format!("writing stdout: {error}"))),
    }
}

fn print(json: bool, value: Value, text: String) -> Outcome {
    let mut line = if json { value.to_string() } else { text };
    if !line.ends_with('\n') {
        line.push('\n');
    }
    write_stdout(line.as_bytes())
}

/// An admin result as JSON (plain structs of strings and numbers always serialize).
fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("admin results serialize")
}

fn describe_text(info: &TopicInfo, partitions: &[PartitionInfo]) -> String {
    let mut text = format!(
        "topic {}/{}\n  partitions: {}\n  durability: {}\n  retention_bytes: {}\n  retention_ms: \
         {}\n  segment_size_bytes: {}\n  message_size_bytes_max: {}\n  created: {}\n\n",
        info.stream,
        info.name,
        info.partitions,
        info.durability.as_str(),
        info.retention_bytes,
        info.retention_ms,
        info.segment_size_bytes,
        info.message_size_bytes_max,
        utc(info.created_ms),
    );
    let rows = partitions
        .iter()
        .map(|p| {
            vec![
                p.partition.to_string(),
                p.shard.to_string(),
                p.group.to_string(),
                p.first_offset.to_string(),
                p.next_offset.to_string(),
                p.size_bytes.to_string(),
            ]
        })
        .collect();
    text.push_str(&table(
        &["PARTITION", "SHARD", "GROUP", "FIRST_OFFSET", "NEXT_OFFSET", "SIZE_BYTES"],
        rows,
    ));
    text
}

/// Shards a status summary lists whether or not they hold partitions (a server has far fewer).
const SHARDS_LISTED_MAX: u64 = 4096;

/// The human summary of the server's status document (extra keys are ignored, missing ones
/// shown as `?`).
pub fn status_text(status: &Value) -> String {
    let shards = status.get("shards").and_then(Value::as_u64);
    let partitions: &[Value] =
        status.get("partitions").and_then(Value::as_array).map_or(&[], Vec::as_slice);
    let number = |p: &Value, key: &str| p.get(key).and_then(Value::as_u64);
    let shown = |value: Option<u64>| value.map_or_else(|| "?".to_string(), |v| v.to_string());

    let mut text = format!("shards: {}\n", shown(shards));
    // Shards without partitions are listed too, up to a bound: the count is the server's word.
    let mut per_shard: BTreeMap<u64, (u64, u64)> =
        (0..shards.unwrap_or(0).min(SHARDS_LISTED_MAX)).map(|shard| (shard, (0, 0))).collect();
    let mut total_bytes = 0u64;
    for p in partitions {
        let size = number(p, "size_bytes").unwrap_or(0);
        total_bytes = total_bytes.saturating_add(size);
        if let Some(shard) = number(p, "shard") {
            let entry = per_shard.entry(shard).or_default();
            entry.0 += 1;
            entry.1 = entry.1.saturating_add(size);
        }
    }
    text.push_str(&format!(
        "partitions: {}\ndisk usage: {total_bytes} bytes\n\n",
        partitions.len()
    ));
    let rows = per_shard
        .iter()
        .map(|(shard, (count, bytes))| {
            vec![shard.to_string(), count.to_string(), bytes.to_string()]
        })
        .collect();
    text.push_str(&table(&["SHARD", "PARTITIONS", "SIZE_BYTES"], rows));
    if !partitions.is_empty() {
        text.push('\n');
        let string =
            |p: &Value, key: &str| p.get(key).and_then(Value::as_str).unwrap_or("?").to_string();
        // The nodes holding the partition (servers before replication factors name none).
        let replicas = |p: &Value| match p.get("replicas").and_then(Value::as_array) {
            Some(nodes) => nodes.iter().map(|n| shown(n.as_u64())).collect::<Vec<_>>().join(","),
            None => "?".to_string(),
        };
        let rows = partitions
            .iter()
            .map(|p| {
                vec![
                    string(p, "stream"),
                    string(p, "topic"),
                    shown(number(p, "partition")),
                    shown(number(p, "shard")),
                    shown(number(p, "group")),
                    replicas(p),
                    shown(number(p, "first_offset")),
                    shown(number(p, "next_offset")),
                    shown(number(p, "size_bytes")),
                ]
            })
            .collect();
        text.push_str(&table(
            &[
                "STREAM",
                "TOPIC",
                "PARTITION",
                "SHARD",
                "GROUP",
                "REPLICAS",
                "FIRST_OFFSET",
                "NEXT_OFFSET",
                "SIZE_BYTES",
            ],
            rows,
        ));
    }
    text
}

/// One node's status document, or why it could not be had.
pub struct NodeStatus {
    /// The node's index.
    pub node: u8,
    /// Its client address.
    pub address: String,
    /// Its `Status` document.
    pub document: Result<Value, String>,
}

/// The cluster's nodes, then every replicated group as the nodes report it: its name, shard,
/// view, primary, each node's status of it, and its replicas' states as its primary sees them
/// (lag when lagging). Missing keys are shown as `?`.
pub fn groups_text(nodes: &[NodeStatus]) -> String {
    let rows = nodes
        .iter()
        .map(|n| {
            let state = match &n.document {
                Ok(_) => "up".to_string(),
                Err(why) => format!("unreachable: {why}"),
            };
            vec![n.node.to_string(), n.address.clone(), state]
        })
        .collect();
    let mut text = table(&["NODE", "ADDRESS", "STATE"], rows);
    // Group → (shard, per node its report); and group → its partition's name.
    let mut groups: BTreeMap<u64, GroupReports<'_>> = BTreeMap::new();
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    for n in nodes {
        let Ok(document) = &n.document else { continue };
        let shards = document.get("shard_reports").and_then(Value::as_array);
        for shard in shards.map_or(&[][..], Vec::as_slice) {
            let index = shard.get("shard").and_then(Value::as_u64).unwrap_or(0);
            let reports = shard.get("replication").and_then(Value::as_array);
            for report in reports.map_or(&[][..], Vec::as_slice) {
                let Some(group) = report.get("group").and_then(Value::as_u64) else { continue };
                groups.entry(group).or_insert((index, Vec::new())).1.push((n.node, report));
            }
        }
        let partitions = document.get("partitions").and_then(Value::as_array);
        for p in partitions.map_or(&[][..], Vec::as_slice) {
            if let Some(group) = p.get("group").and_then(Value::as_u64) {
                let field = |key: &str| p.get(key).map_or("?".into(), |v| v.to_string());
                let name = format!(
                    "{}/{}/{}",
                    p.get("stream").and_then(Value::as_str).unwrap_or("?"),
                    p.get("topic").and_then(Value::as_str).unwrap_or("?"),
                    field("partition")
                );
                names.insert(group, name);
            }
        }
    }
    if groups.is_empty() {
        return text;
    }
    let rows = groups
        .iter()
        .map(|(group, (shard, reports))| {
            let name = if *group == 0 {
                "metadata".to_string()
            } else {
                names.get(group).cloned().unwrap_or("?".into())
            };
            group_row(*group, name, *shard, reports)
        })
        .collect();
    text.push('\n');
    text.push_str(&table(
        &["GROUP", "NAME", "SHARD", "VIEW", "PRIMARY", "STATUS", "REPLICAS"],
        rows,
    ));
    text
}

/// The moves in progress as the nodes report them: per moving partition its replicas, the
/// nodes it moves to, the bytes it holds where it is largest (its primary's copy, or a current
/// replica's), and the bytes each node it moves to holds so far.
pub fn moves_of(nodes: &[NodeStatus]) -> Vec<Value> {
    // (stream, topic, partition) → (replicas, moving_to, per node its size where it holds it).
    type Seen = (Value, Value, BTreeMap<u8, u64>);
    let mut seen: BTreeMap<(String, String, u64), Seen> = BTreeMap::new();
    for n in nodes {
        let Ok(document) = &n.document else { continue };
        let partitions = document.get("partitions").and_then(Value::as_array);
        for p in partitions.map_or(&[][..], Vec::as_slice) {
            let moving =
                p.get("moving_to").and_then(Value::as_array).is_some_and(|m| !m.is_empty());
            if !moving {
                continue;
            }
            let key = (
                p.get("stream").and_then(Value::as_str).unwrap_or("?").to_string(),
                p.get("topic").and_then(Value::as_str).unwrap_or("?").to_string(),
                p.get("partition").and_then(Value::as_u64).unwrap_or(0),
            );
            let entry = seen.entry(key).or_insert_with(|| {
                (p["replicas"].clone(), p["moving_to"].clone(), BTreeMap::new())
            });
            if p.get("held").and_then(Value::as_bool) == Some(true) {
                entry.2.insert(n.node, p.get("size_bytes").and_then(Value::as_u64).unwrap_or(0));
            }
        }
    }
    seen.into_iter()
        .map(|((stream, topic, partition), (replicas, moving_to, sizes))| {
            let members = |list: &Value| -> Vec<u8> {
                list.as_array()
                    .map_or(&[][..], Vec::as_slice)
                    .iter()
                    .filter_map(|n| n.as_u64().map(|n| n as u8))
                    .collect()
            };
            let (from, to) = (members(&replicas), members(&moving_to));
            let size = from.iter().filter_map(|n| sizes.get(n)).max().copied().unwrap_or(0);
            let copied: BTreeMap<String, u64> = to
                .iter()
                .filter(|n| !from.contains(n))
                .map(|n| (n.to_string(), sizes.get(n).copied().unwrap_or(0)))
                .collect();
            json!({
                "stream": stream,
                "topic": topic,
                "partition": partition,
                "replicas": from,
                "moving_to": to,
                "size_bytes": size,
                "copied_bytes": copied,
            })
        })
        .collect()
}

/// The cluster's address book as the first answering node knows it: each node with its state
/// (founding or added; leaving, or removed once it holds no replica and no metadata seat),
/// whether it answered, its place in the metadata group and how many partitions the catalog
/// places on it (replicas and move targets).
pub fn book_of(nodes: &[NodeStatus]) -> Vec<Value> {
    let Some(seen) = nodes.iter().find_map(|n| {
        let document = n.document.as_ref().ok()?;
        document.get("cluster_nodes")?.as_array().filter(|b| !b.is_empty())?;
        Some(document)
    }) else {
        return Vec::new();
    };
    let metadata = seen["shard_reports"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|shard| shard["replication"].as_array().into_iter().flatten())
        .find(|report| report["group"] == 0);
    let partitions = seen["partitions"].as_array().map_or(&[][..], Vec::as_slice);
    let names = |list: &Value, index: u64| {
        list.as_array().is_some_and(|list| list.iter().any(|n| n.as_u64() == Some(index)))
    };
    seen["cluster_nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| {
            let index = entry["node"].as_u64().unwrap_or(u64::MAX);
            let answered = nodes.iter().any(|n| u64::from(n.node) == index && n.document.is_ok());
            let role = metadata.map(|report| {
                if names(&report["voters"], index) {
                    "voter"
                } else if names(&report["learners"], index) {
                    "learner"
                } else {
                    "none"
                }
            });
            let placed = partitions
                .iter()
                .filter(|p| names(&p["replicas"], index) || names(&p["moving_to"], index))
                .count();
            let state = match (entry["founding"] == true, entry["leaving"] == true) {
                (_, true) if placed == 0 && role == Some("none") => "removed",
                (_, true) => "leaving",
                (true, false) => "founding",
                (false, false) => "added",
            };
            json!({
                "node": index,
                "client": entry["client"],
                "bus": entry["bus"],
                "state": state,
                "answered": answered,
                "metadata": role,
                "partitions": placed,
            })
        })
        .collect()
}

/// The nodes table of `cluster status`.
fn book_text(book: &[Value]) -> String {
    let rows = book
        .iter()
        .map(|n| {
            vec![
                n["node"].to_string(),
                n["client"].as_str().unwrap_or("?").to_string(),
                n["state"].as_str().unwrap_or("?").to_string(),
                if n["answered"] == true { "up" } else { "no answer" }.to_string(),
                n["metadata"].as_str().unwrap_or("?").to_string(),
                n["partitions"].to_string(),
            ]
        })
        .collect();
    table(&["NODE", "CLIENT", "STATE", "ANSWERS", "METADATA", "PARTITIONS"], rows)
}

/// The moves table: each partition moving, from where to where, and each new node's bytes.
fn moves_text(moves: &[Value]) -> String {
    if moves.is_empty() {
        return "no move in progress\n".to_string();
    }
    let list = |value: &Value| {
        value.as_array().map_or(String::new(), |nodes| {
            nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
        })
    };
    let rows = moves
        .iter()
        .map(|m| {
            let size = m["size_bytes"].as_u64().unwrap_or(0);
            let copied = m["copied_bytes"].as_object().map_or(String::new(), |copied| {
                copied
                    .iter()
                    .map(|(node, bytes)| format!("{node}:{}/{size}", bytes.as_u64().unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            vec![
                format!(
                    "{}/{}/{}",
                    m["stream"].as_str().unwrap_or("?"),
                    m["topic"].as_str().unwrap_or("?"),
                    m["partition"]
                ),
                list(&m["replicas"]),
                list(&m["moving_to"]),
                copied,
            ]
        })
        .collect();
    table(&["PARTITION", "REPLICAS", "MOVING_TO", "NEW_NODES_BYTES"], rows)
}

/// A group's shard and each node's report of it.
type GroupReports<'a> = (u64, Vec<(u8, &'a Value)>);

/// One group's row from each node's report of it.
fn group_row(group: u64, name: String, shard: u64, reports: &[(u8, &Value)]) -> Vec<String> {
    let number = |report: &Value, key: &str| report.get(key).and_then(Value::as_u64);
    let view = reports.iter().filter_map(|(_, r)| number(r, "view")).max();
    // The node that reports replica states is the group's serving primary; else the primary
    // the newest view's reporters name.
    let leader = reports
        .iter()
        .find(|(_, r)| r.get("replicas").and_then(Value::as_array).is_some_and(|a| !a.is_empty()));
    let primary = leader.map(|(node, _)| u64::from(*node)).or_else(|| {
        reports
            .iter()
            .filter(|(_, r)| number(r, "view") == view)
            .find_map(|(_, r)| number(r, "primary"))
    });
    let statuses = reports
        .iter()
        .map(|(node, r)| {
            format!("{node}:{}", r.get("status").and_then(Value::as_str).unwrap_or("?"))
        })
        .collect::<Vec<_>>()
        .join(" ");
    let replicas = leader.map_or("?".to_string(), |(_, r)| {
        let list = r.get("replicas").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        list.iter()
            .map(|replica| {
                let state = replica.get("state").and_then(Value::as_str).unwrap_or("?");
                let node = number(replica, "node").map_or("?".into(), |n| n.to_string());
                match (state, number(replica, "lag_ms"), number(replica, "lag_ops")) {
                    ("lagging", Some(ms), Some(ops)) => format!("{node}:lagging({ms}ms,{ops}ops)"),
                    ("lagging", Some(ms), None) => format!("{node}:lagging({ms}ms)"),
                    _ => format!("{node}:{state}"),
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    });
    let shown = |value: Option<u64>| value.map_or_else(|| "?".to_string(), |v| v.to_string());
    vec![
        group.to_string(),
        name,
        shard.to_string(),
        shown(view),
        shown(primary),
        statuses,
        replicas,
    ]
}

/// Left-aligned columns separated by two spaces.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(&format!("{cell:<width$}", width = widths[i]));
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    text
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn utc(time_ms: i64) -> String {
    let seconds = time_ms.div_euclid(1000);
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14T22:13:20Z");
        assert_eq!(utc(-1_000), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn commands_status_summary_tolerates_extra_and_missing_keys() {
        let status = json!({
            "shards": 2,
            "config": {"anything": true},
            "extra": [1, 2],
            "partitions": [
                {"stream": "s", "topic": "t", "partition": 0, "shard": 0, "group": 1,
                 "first_offset": 0, "next_offset": 100, "size_bytes": 4096},
                {"stream": "s", "topic": "t", "partition": 1, "shard": 1, "group": 2,
                 "first_offset": 0, "next_offset": 7, "size_bytes": 1000, "new_key": 1},
                {"stream": "s"}
            ]
        });
        let text = status_text(&status);
        assert!(text.contains("shards: 2"), "{text}");
        assert!(text.contains("disk usage: 5096 bytes"), "{text}");
        assert!(
            text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["0", "1", "4096"]),
            "{text}"
        );
        assert!(text.contains("100"), "{text}");
        assert!(text.contains('?'), "{text}");
        let empty = status_text(&json!({}));
        assert!(empty.contains("shards: ?"), "{empty}");
        // The server's shard count lists at most SHARDS_LISTED_MAX empty shards.
        let huge = status_text(&json!({"shards": u64::MAX, "partitions": []}));
        assert_eq!(huge.lines().count(), empty.lines().count() + SHARDS_LISTED_MAX as usize);
    }

    #[test]
    fn commands_groups_table_merges_every_nodes_report() {
        let report = |node: u64, status: &str, replicas: Value| {
            json!({
                "node": node,
                "shard_reports": [{"shard": 0, "replication": [
                    {"group": 0, "view": 1, "status": status, "primary": 1, "replicas": replicas},
                ]}],
                "partitions": [],
            })
        };
        let leading = json!([
            {"node": 0, "state": "dead", "lag_ms": 9000},
            {"node": 1, "state": "primary", "lag_ms": 0},
            {"node": 2, "state": "lagging", "lag_ms": 12000, "lag_ops": 340},
        ]);
        let nodes = vec![
            NodeStatus { node: 0, address: "a:1".into(), document: Err("refused".into()) },
            NodeStatus {
                node: 1,
                address: "a:2".into(),
                document: Ok(report(1, "normal", leading)),
            },
            NodeStatus {
                node: 2,
                address: "a:3".into(),
                document: Ok(report(2, "normal", json!([]))),
            },
        ];
        let text = groups_text(&nodes);
        assert!(text.contains("unreachable: refused"), "{text}");
        let row = text.lines().find(|l| l.contains("metadata")).expect("the metadata group's row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[..5], ["0", "metadata", "0", "1", "1"], "{text}");
        assert!(row.contains("1:normal 2:normal"), "{text}");
        assert!(row.contains("0:dead 1:primary 2:lagging(12000ms,340ops)"), "{text}");
    }

    /// `cluster status` puts each moving partition together from every node's document: its
    /// replicas, where it moves, its size on a current replica and what each new node holds.
    #[test]
    fn cluster_status_shows_each_move_with_the_bytes_its_new_nodes_hold() {
        let partition = |held: bool, size: u64, moving: bool| {
            json!({
                "stream": "s", "topic": "t", "partition": 2, "group": 7, "size_bytes": size,
                "replicas": [0], "held": held, "moving_to": if moving { json!([1]) } else { json!([]) },
            })
        };
        let node = |node: u8, p: Value| NodeStatus {
            node,
            address: format!("n{node}:1"),
            document: Ok(json!({ "partitions": [p, partition(true, 5, false)] })),
        };
        let nodes = [
            node(0, partition(true, 4_000, true)),
            node(1, partition(true, 1_500, true)),
            node(2, partition(false, 0, true)),
            NodeStatus { node: 3, address: "n3:1".into(), document: Err("refused".into()) },
        ];
        let moves = moves_of(&nodes);
        assert_eq!(moves.len(), 1, "{moves:?}");
        let only = &moves[0];
        assert_eq!((only["replicas"].clone(), only["moving_to"].clone()), (json!([0]), json!([1])));
        assert_eq!(only["size_bytes"], 4_000);
        assert_eq!(only["copied_bytes"], json!({ "1": 1_500 }));
        let text = moves_text(&moves);
        assert!(text.contains("s/t/2") && text.contains("1:1500/4000"), "{text}");
        assert_eq!(moves_text(&[]), "no move in progress\n");
    }

    #[test]
    fn cluster_status_lists_every_node_of_the_book_with_its_state() {
        let document = json!({
            "cluster_nodes": [
                { "node": 0, "client": "n0:1", "bus": "n0:2", "founding": true, "leaving": true },
                { "node": 1, "client": "n1:1", "bus": "n1:2", "founding": true, "leaving": true },
                { "node": 3, "client": "n3:1", "bus": "n3:2", "founding": false, "leaving": false },
            ],
            "shard_reports": [{ "replication": [{ "group": 0, "voters": [3], "learners": [1] }] }],
            "partitions": [
                { "replicas": [3], "moving_to": [] },
                { "replicas": [1], "moving_to": [3] },
            ],
        });
        let nodes = [
            NodeStatus { node: 0, address: "n0:1".into(), document: Err("down".into()) },
            NodeStatus { node: 3, address: "n3:1".into(), document: Ok(document) },
        ];
        let book = book_of(&nodes);
        let row = |i: usize| {
            let n = &book[i];
            (
                n["state"].clone(),
                n["answered"].clone(),
                n["metadata"].clone(),
                n["partitions"].clone(),
            )
        };
        assert_eq!(row(0), (json!("removed"), json!(false), json!("none"), json!(0)));
        assert_eq!(row(1), (json!("leaving"), json!(false), json!("learner"), json!(1)));
        assert_eq!(row(2), (json!("added"), json!(true), json!("voter"), json!(2)));
        let text = book_text(&book);
        assert!(text.contains("removed") && text.contains("no answer"), "{text}");
        let gone = [NodeStatus { node: 3, address: "n3:1".into(), document: Err("down".into()) }];
        assert!(book_of(&gone).is_empty());
    }

    #[test]
    fn commands_table_aligns_columns() {
        let text = table(&["A", "BB"], vec![vec!["xyz".into(), "1".into()]]);
        assert_eq!(text, "A    BB\nxyz  1\n");
    }
}
