//! The cluster tests' shared harness: three real `shoal` processes on 127.0.0.1
//! (`shoal_testkit::ShoalCluster`, the small profile, one shard each) and a raw client that
//! sends each request to the nodes in turn until one accepts it, treating an outcome it cannot
//! know (`TransientNotCommitted`, a dropped connection) as "maybe written" — a value that may
//! appear at most once — so the checks hold without idempotent retries. [`Ledger`] records
//! every write and checks them all back; [`converge`] waits until every node agrees;
//! [`check_logs_agree`] compares the stopped nodes' logs offline.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use shoal_engine::inspect::inspect;
use shoal_engine::storage::std_fs::{StdStorage, block_on};
use shoal_proto::Durability;
use shoal_proto::protocol::{
    CreateTopic, ErrorCode, Fetch, FetchFrom, Hello, Operation, PROTOCOL_VERSION, Partitioning,
    Produce, ProduceReply,
};
use shoal_testkit::{ClusterPlan, ShoalCluster};

use super::{DEADLINE, Raw, batch, decode_fetch, metrics_page};

pub const STREAM: &str = "s";
pub const PARTITIONS: u32 = 3;

/// A cluster of three in a temporary directory.
pub fn cluster(dir: &Path) -> ShoalCluster {
    cluster_with_args(dir, &[])
}

/// A cluster of three in a temporary directory, every node given `args` too.
pub fn cluster_with_args(dir: &Path, args: &[&str]) -> ShoalCluster {
    cluster_with_plan(dir, |plan| plan.args.extend(args.iter().map(|arg| arg.to_string())))
}

/// A cluster of three in a temporary directory, its plan changed by `change` first.
pub fn cluster_with_plan(dir: &Path, change: impl FnOnce(&mut ClusterPlan)) -> ShoalCluster {
    let mut plan = ClusterPlan::small(env!("CARGO_BIN_EXE_shoal").into(), dir, 3, DEADLINE);
    plan.args.extend(["--log-level", "info,shoal_replication=debug"].map(String::from));
    change(&mut plan);
    ShoalCluster::start(plan).unwrap_or_else(|error| panic!("{error}"))
}

/// A cluster in `dir` with stream `s` and its `persisted` topic `p`, and an empty ledger.
pub fn cluster_with_topic(dir: &Path) -> (ShoalCluster, Ledger) {
    let cluster = cluster(dir);
    create_stream_and_topic(&cluster);
    (cluster, Ledger::default())
}

/// Creates stream `s` and its `persisted` topic `p`.
pub fn create_stream_and_topic(cluster: &ShoalCluster) {
    let stream = shoal_proto::protocol::encode_stream_name(STREAM);
    assert_eq!(call_anywhere(cluster, 0, Operation::CreateStream, &stream).unwrap().0, 0);
    create_topic(cluster, "p", Durability::Persisted);
}

/// What one write came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Acknowledged at this offset; `also_maybe`: an earlier attempt's answer was lost, so one
    /// more copy may be in the log too (the raw client has no idempotence).
    At { offset: u64, also_maybe: bool },
    /// Unknown: it may or may not be in the log (at most once).
    Maybe,
}

/// Connects and says hello, or `None` when the node is down or does not answer.
pub fn connect(address: &str) -> Option<Raw> {
    let stream = TcpStream::connect(address).ok()?;
    // A paused node's kernel still accepts connections: its silence is told by this timeout,
    // which a live node's hello (answered without touching a disk) never comes near.
    stream.set_read_timeout(Some(HELLO_TIME_MAX)).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut raw = Raw { stream, client: rand_client(), next_request: 1 };
    let hello = Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client_name: "cluster-test".into(),
    };
    raw.try_send(Operation::Hello, &hello.encode()).ok()?;
    let answer = raw.try_receive()?;
    raw.stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    (answer.reply.error == 0).then_some(raw)
}

/// How long a node may take to answer a hello before it counts as down for that attempt.
pub const HELLO_TIME_MAX: Duration = Duration::from_secs(1);

pub fn rand_client() -> u64 {
    std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 1u8) | 1
}

/// The errors after which another node (or the same one later) may take the request. A node
/// learns a new topic when its metadata replica hears of the commit (the next heartbeat), so a
/// missing stream or topic is retried too, as Kafka clients retry an unknown topic.
pub fn try_elsewhere(code: u32) -> bool {
    [
        ErrorCode::NotPrimary,
        ErrorCode::TransientNotAccepted,
        ErrorCode::ShuttingDown,
        ErrorCode::StreamNotFound,
        ErrorCode::TopicNotFound,
    ]
    .iter()
    .any(|&c| c as u32 == code)
}

/// Sends one request to the nodes in turn (from `first`) until one answers it with anything but
/// "try elsewhere"; gives up at the deadline. `None`: the outcome is unknown (the request was
/// sent but its answer lost, or it was not committed).
pub fn call_anywhere(
    cluster: &ShoalCluster,
    first: usize,
    operation: Operation,
    body: &[u8],
) -> Option<(u32, Vec<u8>)> {
    call_anywhere_saying_retried(cluster, first, operation, body).0
}

/// [`call_anywhere`], and whether an attempt before the answer was sent and its answer lost (so
/// it may have been executed as well).
pub fn call_anywhere_saying_retried(
    cluster: &ShoalCluster,
    first: usize,
    operation: Operation,
    body: &[u8],
) -> (Option<(u32, Vec<u8>)>, bool) {
    let deadline = Instant::now() + DEADLINE;
    let mut attempt = first;
    let mut maybe_sent = false;
    while Instant::now() < deadline {
        if attempt > first && (attempt - first).is_multiple_of(cluster.clients.len()) {
            // A whole round without an answer: nodes down, or every one saying "elsewhere" (a
            // view change is under way). Without the wait, a round whose last node is down
            // never paused, and the retries opened thousands of connections a second, enough
            // to run the machine out of ephemeral ports for the tests beside it.
            std::thread::sleep(Duration::from_millis(50));
        }
        let node = attempt % cluster.clients.len();
        attempt += 1;
        let Some(mut raw) = connect(&cluster.clients[node]) else { continue };
        // A send cut short may still have reached the node: as unknown as a lost answer.
        let sent = raw.try_send(operation, body);
        let Some(answer) = sent.ok().and_then(|()| raw.try_receive()) else {
            maybe_sent = true;
            continue;
        };
        let code = answer.reply.error;
        if code == ErrorCode::TransientNotCommitted as u32 {
            return (None, maybe_sent);
        }
        if !try_elsewhere(code) {
            return ((!maybe_sent || code == 0).then_some((code, answer.body)), maybe_sent);
        }
    }
    panic!("no node took {operation:?} within {DEADLINE:?}\n{}", cluster.log_tails(40));
}

pub fn create_topic(cluster: &ShoalCluster, topic: &str, durability: Durability) {
    create_topic_as(cluster, CreateTopic { durability: Some(durability), ..topic_of(topic) });
}

/// A `CreateTopic` of `topic` in stream `s` with `PARTITIONS` partitions, the rest defaults.
pub fn topic_of(topic: &str) -> CreateTopic {
    CreateTopic {
        stream: STREAM.into(),
        topic: topic.into(),
        partitions: PARTITIONS,
        ..CreateTopic::default()
    }
}

/// Creates a topic as `create` says (any node that takes it), and checks it was.
pub fn create_topic_as(cluster: &ShoalCluster, create: CreateTopic) {
    let (code, body) = call_anywhere(cluster, 0, Operation::CreateTopic, &create.encode())
        .expect("a topic creation is answered");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&body));
}

/// One value written and what the write came to.
pub type Sent = (Vec<u8>, Written);

/// Where a group's log ends on one node: its last op and that op's checksum.
pub type LogEnd = (Option<u64>, Option<u32>);

/// The values written, by (topic, partition), with what each write came to.
#[derive(Default)]
pub struct Ledger {
    writes: BTreeMap<(String, u32), Vec<Sent>>,
    next: u64,
}

impl Ledger {
    /// Writes `count` single-record batches round-robin over the topic's partitions.
    pub fn produce(&mut self, cluster: &ShoalCluster, topic: &str, count: u32) {
        for i in 0..count {
            self.produce_one(cluster, topic, i % PARTITIONS, i as usize);
        }
    }

    /// Writes `count` single-record batches to one partition.
    pub fn produce_to(&mut self, cluster: &ShoalCluster, topic: &str, partition: u32, count: u32) {
        for i in 0..count {
            self.produce_one(cluster, topic, partition, i as usize);
        }
    }

    /// Writes one single-record batch, asking node `first` first.
    fn produce_one(&mut self, cluster: &ShoalCluster, topic: &str, partition: u32, first: usize) {
        self.next += 1;
        let value = format!("{topic}-{partition}-{}", self.next).into_bytes();
        let produce = Produce {
            stream: STREAM.into(),
            topic: topic.into(),
            partitioning: Partitioning::Explicit(partition),
        };
        let body = produce.encode(&batch(&[&value]));
        let (answer, retried) =
            call_anywhere_saying_retried(cluster, first, Operation::Produce, &body);
        let written = match answer {
            Some((0, reply)) => Written::At {
                offset: ProduceReply::decode(&reply).expect("a produce reply").base_offset,
                also_maybe: retried,
            },
            Some((code, text)) => {
                panic!("produce refused ({code}): {}", String::from_utf8_lossy(&text))
            }
            None => Written::Maybe,
        };
        self.writes.entry((topic.to_string(), partition)).or_default().push((value, written));
    }

    /// Reads every partition back from its primary and checks: offsets dense from 0, every
    /// acknowledged value at its offset (and at most once more when an earlier attempt's answer
    /// was lost), every unknown one at most once, nothing else.
    pub fn check(&self, cluster: &ShoalCluster) {
        self.check_offsets(cluster, true);
    }

    /// [`Ledger::check`] where control records (a move's configuration changes) take offsets
    /// between the values: offsets ascend, with gaps.
    pub fn check_with_control_records(&self, cluster: &ShoalCluster) {
        self.check_offsets(cluster, false);
    }

    fn check_offsets(&self, cluster: &ShoalCluster, dense: bool) {
        for ((topic, partition), writes) in &self.writes {
            let (records, first_reply) = read_all_noting_first(cluster, topic, *partition);
            for (expected, (offset, _)) in records.iter().enumerate() {
                if dense {
                    assert_eq!(*offset, expected as u64, "{topic}/{partition}: offsets are dense");
                }
            }
            for pair in records.windows(2) {
                assert!(pair[0].0 < pair[1].0, "{topic}/{partition}: offsets ascend: {pair:?}");
            }
            let mut copies: BTreeMap<&[u8], Vec<u64>> = BTreeMap::new();
            for (offset, value) in &records {
                copies.entry(value).or_default().push(*offset);
            }
            for (value, offsets) in &copies {
                let known = writes.iter().find(|(v, _)| v == value);
                match known {
                    Some((_, Written::At { offset: at, also_maybe })) => {
                        assert!(
                            offsets.contains(at),
                            "{topic}/{partition}: {at} is not {offsets:?}"
                        );
                        let allowed = if *also_maybe { 2 } else { 1 };
                        assert!(offsets.len() <= allowed, "{topic}/{partition}: {offsets:?}");
                    }
                    Some((_, Written::Maybe)) => {
                        assert_eq!(offsets.len(), 1, "{topic}/{partition}: duplicates {offsets:?}")
                    }
                    None => panic!("{topic}/{partition}: {offsets:?} hold a value never sent"),
                }
            }
            for (value, written) in writes {
                if let Written::At { offset: at, .. } = written
                    && !copies.contains_key(value.as_slice())
                {
                    // What each node reports of its groups now, to tell a lost write from a read
                    // that was answered short.
                    let pages = figures_by_node(cluster);
                    panic!(
                        "{topic}/{partition}: acknowledged offset {at} is missing ({} records \
                         read, the first reply's (first offset, committed end, batches): \
                         {first_reply:?}; read again: {}); each node's answer to a fetch from \
                         offset 0: {:?}; groups (commit op, status, committed offset, next \
                         offset) by node: {pages:?}\n{}",
                        records.len(),
                        read_all(cluster, topic, *partition).len(),
                        first_fetch_by_node(cluster, topic, *partition),
                        cluster.log_tails(20)
                    );
                }
            }
        }
    }
}

/// Each node's own answer to a fetch of `topic`/`partition` from offset 0 (no redirect
/// followed): error code, committed end and batch count, or why there was none. Tells which
/// node answers a read short, and with what end, when a check finds data missing.
fn first_fetch_by_node(cluster: &ShoalCluster, topic: &str, partition: u32) -> Vec<String> {
    let fetch = Fetch {
        stream: STREAM.into(),
        topic: topic.into(),
        partition,
        from: FetchFrom::Offset(0),
        bytes_max: 1 << 20,
        count_max: 1_000,
        wait_ms_max: 0,
    };
    cluster
        .clients
        .iter()
        .enumerate()
        .map(|(node, address)| {
            let Some(mut raw) = connect(address) else { return format!("node {node}: down") };
            if raw.try_send(Operation::Fetch, &fetch.encode()).is_err() {
                return format!("node {node}: send failed");
            }
            match raw.try_receive() {
                Some(answer) if answer.reply.error == 0 => {
                    let (reply, _) = decode_fetch(&answer.body);
                    format!(
                        "node {node}: next offset {}, {} batches",
                        reply.next_offset, reply.batch_count
                    )
                }
                Some(answer) => format!("node {node}: error {}", answer.reply.error),
                None => format!("node {node}: no answer"),
            }
        })
        .collect()
}

/// The offset after the last batch of a fetch reply's body.
fn batches_end(body: &[u8]) -> u64 {
    let (reply, at) = shoal_proto::protocol::FetchReply::decode(body).expect("a fetch reply");
    let mut rest = &body[at..];
    let mut end = 0;
    for _ in 0..reply.batch_count {
        let header = shoal_proto::batch::BatchHeader::parse(rest).expect("a batch");
        end = header.base_offset() as u64 + header.last_offset_delta() as u64 + 1;
        rest = &rest[header.total_size()..];
    }
    end
}

/// Every record of a partition, read from whichever node serves it.
pub fn read_all(cluster: &ShoalCluster, topic: &str, partition: u32) -> Vec<(u64, Vec<u8>)> {
    read_all_noting_first(cluster, topic, partition).0
}

/// A fetch reply's first offset, committed end and batch count.
type ReplyFigures = (u64, u64, u32);

/// [`read_all`], and the first reply's figures.
fn read_all_noting_first(
    cluster: &ShoalCluster,
    topic: &str,
    partition: u32,
) -> (Vec<(u64, Vec<u8>)>, Option<ReplyFigures>) {
    let mut first_reply = None;
    let mut records = Vec::new();
    // The offset after the last batch read, control batches (skipped) included.
    let mut next = 0;
    for _ in 0..10_000 {
        let fetch = Fetch {
            stream: STREAM.into(),
            topic: topic.into(),
            partition,
            from: FetchFrom::Offset(next),
            bytes_max: 1 << 20,
            count_max: 1_000,
            wait_ms_max: 0,
        };
        let (code, body) = call_anywhere(cluster, 0, Operation::Fetch, &fetch.encode())
            .expect("a fetch is answered");
        assert_eq!(code, 0, "fetch: {}", String::from_utf8_lossy(&body));
        let (reply, batch) = decode_fetch(&body);
        first_reply.get_or_insert((reply.first_offset, reply.next_offset, reply.batch_count));
        if reply.batch_count == 0 {
            return (records, first_reply);
        }
        next = batches_end(&body);
        records.extend(batch);
    }
    panic!("{topic}/{partition} never ended");
}

/// Each group's (commit op, status, committed offset, next offset) on a node, from its metrics
/// page.
pub fn group_figures(page: &str) -> BTreeMap<String, [u64; 4]> {
    let mut figures: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    let names = [
        "shoal_partition_commit_op{",
        "shoal_partition_status{",
        "shoal_partition_committed_offset{",
        "shoal_partition_next_offset{",
    ];
    for line in page.lines() {
        let Some(slot) = names.iter().position(|name| line.starts_with(name)) else { continue };
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let Some(group) = labels.split("group=\"").nth(1).and_then(|g| g.split('"').next()) else {
            continue;
        };
        if let Ok(value) = value.parse() {
            figures.entry(group.to_string()).or_default()[slot] = value;
        }
    }
    figures
}

/// The sum of a counter's samples on a metrics page.
pub fn counter(page: &str, name: &str) -> u64 {
    samples_sum(page, name, "")
}

/// The sum of a metric's samples on a metrics page whose labels contain `with` ("" for all).
pub fn samples_sum(page: &str, name: &str, with: &str) -> u64 {
    page.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with('{'))
        .filter(|line| line.contains(with))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

/// Each node's [`group_figures`], or None for a node whose metrics page did not answer.
fn figures_by_node(cluster: &ShoalCluster) -> Vec<Option<BTreeMap<String, [u64; 4]>>> {
    cluster
        .nodes
        .iter()
        .map(|node| node.metrics().and_then(metrics_page).map(|page| group_figures(&page)))
        .collect()
}

/// Waits (bounded) until the cluster is quiet: on every node every group is normal with all it
/// holds committed, and every node reports the same commit op for every group.
pub fn converge(cluster: &ShoalCluster) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let pages = figures_by_node(cluster);
        let quiet = pages.iter().all(|page| {
            page.as_ref().is_some_and(|groups| {
                groups
                    .values()
                    .all(|[_, status, committed, next]| *status == 0 && committed == next)
            })
        });
        let commits = |page: &Option<BTreeMap<String, [u64; 4]>>| {
            page.as_ref().map(|groups| groups.iter().map(|(g, f)| (g.clone(), f[0])).collect())
        };
        let first: Option<Vec<(String, u64)>> = commits(&pages[0]);
        if quiet && pages.iter().all(|page| commits(page) == first) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes never agreed: {pages:?}\n{}",
            cluster.log_tails(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops every node and checks offline that each data directory is clean and that every group's
/// log ends at the same op with the same checksum on every node.
pub fn check_logs_agree(cluster: &mut ShoalCluster) {
    for node in &mut cluster.nodes {
        node.terminate().expect("a graceful stop");
    }
    let mut ends: Vec<BTreeMap<u64, LogEnd>> = Vec::new();
    for node in 0..cluster.nodes.len() as u8 {
        let report = block_on(inspect(&StdStorage, &cluster.data_dir(node)));
        assert!(report.is_clean(), "node {node}: {:?}", report.first_corruption());
        let groups = report.shards.iter().flat_map(|shard| &shard.groups);
        ends.push(groups.map(|g| (g.group, (g.last_op, g.last_checksum))).collect());
    }
    assert!(ends.iter().all(|end| end == &ends[0]), "the logs differ: {ends:?}");
}

pub fn restart(cluster: &mut ShoalCluster, node: usize) {
    if let Err(error) = cluster.nodes[node].restart() {
        // A node that exits before its readiness line says why on stderr, in its log.
        panic!("node {node}: {error}\n{}", cluster.log_tails(20));
    }
}

/// One group a node's replica leads: its id and, for a partition's, the topic and partition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Led {
    pub group: u64,
    pub topic: String,
    pub partition: Option<u32>,
}

/// The groups node `node`'s replicas lead, from its metrics page (`None`: no page).
pub fn led_by(cluster: &ShoalCluster, node: usize) -> Option<BTreeSet<Led>> {
    let groups = groups_on(cluster, node)?;
    Some(groups.into_iter().filter(|&(_, leads)| leads).map(|(group, _)| group).collect())
}

/// Every group node `node` holds (the metadata group, 0, among them) and whether its replica
/// leads it, from its metrics page (`None`: no page).
pub fn groups_on(cluster: &ShoalCluster, node: usize) -> Option<Vec<(Led, bool)>> {
    let page = metrics_page(cluster.nodes[node].metrics()?)?;
    let label = |line: &str, name: &str| -> Option<String> {
        Some(line.split(&format!("{name}=\"")).nth(1)?.split('"').next()?.to_string())
    };
    let groups = page
        .lines()
        .filter(|line| line.starts_with("shoal_partition_primary{"))
        .filter_map(|line| {
            let group = Led {
                group: label(line, "group")?.parse().ok()?,
                topic: label(line, "topic").unwrap_or_default(),
                partition: label(line, "partition").and_then(|p| p.parse().ok()),
            };
            Some((group, line.ends_with(" 1")))
        })
        .collect();
    Some(groups)
}

/// A partition of `topic` that node `node` leads (waits, bounded, for one).
pub fn partition_led_by(cluster: &ShoalCluster, node: usize, topic: &str) -> LedPartition {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let led = led_by(cluster, node).unwrap_or_default();
        let found = led
            .iter()
            .find(|l| l.topic == topic)
            .and_then(|l| Some(LedPartition { group: l.group, partition: l.partition? }));
        if let Some(found) = found {
            return found;
        }
        assert!(Instant::now() < deadline, "node {node} leads no partition of {topic}: {led:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A partition and its group.
#[derive(Clone, Copy, Debug)]
pub struct LedPartition {
    pub group: u64,
    pub partition: u32,
}

/// The sum of a metric's samples on node `node`'s page whose labels contain `with`.
pub fn gauge_sum(cluster: &ShoalCluster, node: usize, name: &str, with: &str) -> Option<u64> {
    let page = metrics_page(cluster.nodes[node].metrics()?)?;
    Some(samples_sum(&page, name, with))
}

/// Waits (bounded) until `done` holds; says how long that took.
pub fn wait_until(cluster: &ShoalCluster, what: &str, done: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < DEADLINE, "{what} never happened\n{}", cluster.log_tails(30));
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// The status document of node `node`, `None` while it does not answer.
pub fn status(cluster: &ShoalCluster, node: usize) -> Option<serde_json::Value> {
    let mut raw = connect(cluster.clients.get(node)?)?;
    raw.try_send(Operation::Status, &[]).ok()?;
    let answer = raw.try_receive()?;
    serde_json::from_slice(&answer.body).ok()
}

/// The metadata group's primary, as the first node whose replica of it is normal names it.
pub fn metadata_primary(cluster: &ShoalCluster) -> usize {
    (0..cluster.clients.len())
        .find_map(|node| {
            let status = status(cluster, node)?;
            let reports = status["shard_reports"].as_array()?.clone();
            let metadata = reports
                .iter()
                .flat_map(|shard| shard["replication"].as_array().cloned().unwrap_or_default())
                .find(|report| report["group"] == 0 && report["status"] == "normal")?;
            metadata["primary"].as_u64()
        })
        .expect("some node names the metadata primary") as usize
}
