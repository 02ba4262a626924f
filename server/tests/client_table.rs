//! The metadata group's client table and metadata snapshots on the real binary (DESIGN.md §4,
//! "Sessions and exactly-once produce"): an admin request retried with the same session and
//! request number — byte for byte the same frame, on the same or another connection, before and
//! after a `kill -9` — gets its original answer and executes once; a new request number executes
//! again; an unknown session is told to register again. With a small snapshot interval, a
//! restart restores the newest metadata snapshot and replays only the log past it (the
//! `shoal_metadata_*` gauges say how much), and a damaged snapshot is set aside for a full replay
//! of the metadata log, which still holds every op.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Answer, Raw, ShoalProcess, restart, start, start_command};
use shoal_engine::shard::{group_dir, shard_dir};
use shoal_proto::Durability;
use shoal_proto::protocol::{
    CreateTopic, ErrorCode, Operation, decode_session, decode_streams, encode_stream_name,
};
use shoal_proto::wire::{ClientRequest, Header};

/// One request frame with exactly these header fields.
fn frame(client: u64, session: u64, request: u64, operation: Operation, body: &[u8]) -> Vec<u8> {
    let fields = ClientRequest { client, session, request, operation: operation as u32 };
    let mut bytes = Header::request(1, fields, body).encode().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// Sends `frame` as is on `raw` and reads its answer.
fn send(raw: &mut Raw, frame: &[u8]) -> Answer {
    raw.stream.write_all(frame).expect("sends");
    raw.receive()
}

fn register(raw: &mut Raw) -> u64 {
    decode_session(raw.call(Operation::Register, &[]).ok()).expect("a session")
}

fn create_topic_body(stream: &str, topic: &str) -> Vec<u8> {
    let create = CreateTopic {
        stream: stream.into(),
        topic: topic.into(),
        partitions: 2,
        durability: Some(Durability::Persisted),
        ..CreateTopic::default()
    };
    create.encode()
}

fn stream_names(raw: &mut Raw) -> Vec<String> {
    let body = raw.call(Operation::ListStreams, &[]).ok().to_vec();
    decode_streams(&body).expect("streams").into_iter().map(|s| s.name).collect()
}

#[test]
fn a_retried_create_topic_gets_its_original_answer_even_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 2);
    let mut raw = Raw::connect(server.native(), 11);
    let session = register(&mut raw);
    let stream = frame(11, session, 100, Operation::CreateStream, &encode_stream_name("s"));
    send(&mut raw, &stream).ok();
    let create = frame(11, session, 101, Operation::CreateTopic, &create_topic_body("s", "t"));
    assert_eq!(send(&mut raw, &create).ok(), b"");

    // The very same frame again: the original answer (success), not TopicExists.
    assert_eq!(send(&mut raw, &create).ok(), b"");
    // From another connection and client id of the same session, as after a reconnect.
    let mut other = Raw::connect(server.native(), 12);
    let create_elsewhere =
        frame(12, session, 101, Operation::CreateTopic, &create_topic_body("s", "t"));
    assert_eq!(send(&mut other, &create_elsewhere).ok(), b"");
    // A new request number executes again and finds the topic.
    let again = frame(11, session, 102, Operation::CreateTopic, &create_topic_body("s", "t"));
    assert_eq!(send(&mut raw, &again).error(), ErrorCode::TopicExists);
    // That refusal never entered the log, so request 101 is still the session's newest.
    assert_eq!(send(&mut raw, &create).ok(), b"");
    // A session nobody registered must register.
    let stranger = frame(11, session + 1000, 1, Operation::CreateStream, &encode_stream_name("x"));
    let expired = send(&mut raw, &stranger);
    assert_eq!(expired.error(), ErrorCode::SessionExpired);
    // The topic exists once, with its partitions placed once.
    let topics = raw.call(Operation::ListTopics, &encode_stream_name("s")).ok().to_vec();
    assert_eq!(shoal_proto::protocol::decode_topics(&topics).unwrap().len(), 1);

    // A retry of the newest request survives kill -9: the table comes back with the log.
    let newest = frame(11, session, 103, Operation::CreateStream, &encode_stream_name("s2"));
    send(&mut raw, &newest).ok();
    // Request 101's answer is gone now (only the newest is kept): an older number is stale.
    assert_eq!(send(&mut raw, &create).error(), ErrorCode::InvalidRequest);
    server.kill_9();
    restart(&mut server);
    let mut raw = Raw::connect(server.native(), 13);
    assert_eq!(send(&mut raw, &newest).ok(), b"", "the original answer after a restart");
    let newer = frame(13, session, 104, Operation::CreateStream, &encode_stream_name("s2"));
    assert_eq!(send(&mut raw, &newer).error(), ErrorCode::StreamExists);
    assert_eq!(stream_names(&mut raw), ["s", "s2"]);
}

#[test]
fn a_retry_sent_while_the_original_is_in_flight_gets_the_same_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut raw = Raw::connect(server.native(), 31);
    let session = register(&mut raw);
    raw.call(Operation::CreateStream, &encode_stream_name("s")).ok();
    // Both copies leave in one write: the second reaches shard 0 while the first is (most
    // likely) still in the metadata group's pipeline, and joins it; if the first committed
    // already, the client table answers. Either way: the original answer, twice.
    for (round, topic) in ["t", "u", "v"].into_iter().enumerate() {
        let request = 100 + round as u64;
        let create =
            frame(31, session, request, Operation::CreateTopic, &create_topic_body("s", topic));
        let mut both = create.clone();
        both.extend_from_slice(&create);
        raw.stream.write_all(&both).unwrap();
        for copy in 0..2 {
            let answer = raw.receive();
            assert_eq!(answer.reply.request, request);
            assert_eq!(answer.reply.error, 0, "copy {copy} of {topic}: {:?}", answer.body);
        }
    }
    let topics = raw.call(Operation::ListTopics, &encode_stream_name("s")).ok().to_vec();
    assert_eq!(shoal_proto::protocol::decode_topics(&topics).unwrap().len(), 3);
}

/// `shard="0"`'s value of `name` on the metrics page.
fn gauge(server: &ShoalProcess, name: &str) -> u64 {
    let address = server.metrics().expect("a metrics address");
    let page = common::metrics_page(address).expect("the metrics page");
    let prefix = format!("{name}{{shard=\"0\"}} ");
    let line = page.lines().find(|line| line.starts_with(&prefix));
    let line = line.unwrap_or_else(|| panic!("no {prefix} on the page"));
    line[prefix.len()..].trim().parse().expect("a number")
}

/// Waits (bounded) until `name` reaches `at_least`.
fn wait_for(server: &ShoalProcess, name: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let value = gauge(server, name);
        if value >= at_least {
            return value;
        }
        assert!(Instant::now() < deadline, "{name} stays at {value}, below {at_least}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const INTERVAL_OPS: u64 = 4;

fn start_with_interval(dir: &Path) -> ShoalProcess {
    let mut command = common::command(dir, 1);
    command.env("SHOAL_METADATA_SNAPSHOT_INTERVAL_OPS", INTERVAL_OPS.to_string());
    start_command(command)
}

#[test]
fn metadata_snapshots_shorten_the_replay_and_a_damaged_one_means_a_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_with_interval(dir.path());
    let mut raw = Raw::connect(server.native(), 21);
    // Op 1, 2: two sessions; op 3: the early session's one request, which only a snapshot
    // will hold once the log's replay starts past it.
    let early = register(&mut raw);
    let session = register(&mut raw);
    let early_request = frame(21, early, 50, Operation::CreateStream, &encode_stream_name("e"));
    send(&mut raw, &early_request).ok();
    // Ops 4 to 13.
    let names: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let create =
            frame(21, session, 100 + i as u64, Operation::CreateStream, &encode_stream_name(name));
        send(&mut raw, &create).ok();
    }
    let ops = 13;
    // Snapshots follow every INTERVAL_OPS ops (saved in the background): wait for the one
    // that covers op 12.
    let saved = wait_for(&server, "shoal_metadata_snapshot_op", 12);
    assert!(saved <= ops);
    let expected_streams = {
        let mut all = names.clone();
        all.push("e".into());
        all.sort();
        all
    };
    server.kill_9();

    restart(&mut server);
    let restored = gauge(&server, "shoal_metadata_snapshot_op");
    let replayed = gauge(&server, "shoal_metadata_replayed_ops");
    assert!(restored >= 12, "restored the snapshot at op {restored}");
    // Start-up replays up to the commit point the replica recovered with; the newest op may
    // commit again only once the group is back (the normal path applies it), so the sum may
    // fall one short.
    assert!(restored + replayed >= ops - 1 && restored + replayed <= ops, "{restored}+{replayed}");
    assert!(replayed < INTERVAL_OPS, "only the log past the snapshot was replayed");
    let mut raw = Raw::connect(server.native(), 22);
    assert_eq!(stream_names(&mut raw), expected_streams);
    // The early session's table entry came from the snapshot alone.
    assert_eq!(send(&mut raw, &early_request).ok(), b"");
    let redo = frame(22, early, 51, Operation::CreateStream, &encode_stream_name("e"));
    assert_eq!(send(&mut raw, &redo).error(), ErrorCode::StreamExists);
    server.kill_9();

    // Damage the snapshot: the start-up sets it aside and replays the whole metadata log.
    let path = group_dir(&shard_dir(dir.path(), 0), 0).join(shoal_engine::state::STATE_FILE);
    let mut bytes = std::fs::read(&path).expect("the metadata snapshot");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    restart(&mut server);
    // The full replay shows the damaged one was not used; the gauge is 0 until the fresh save
    // below lands, which may already have happened.
    assert!(gauge(&server, "shoal_metadata_replayed_ops") >= ops - 1, "every op (see above)");
    let restored = gauge(&server, "shoal_metadata_snapshot_op");
    assert!(restored == 0 || restored == ops, "the damaged one is not used: {restored}");
    let mut raw = Raw::connect(server.native(), 23);
    assert_eq!(stream_names(&mut raw), expected_streams);
    // The refused redo never entered the log, so request 50 is still the newest of its session.
    assert_eq!(send(&mut raw, &early_request).ok(), b"");
    // A fresh snapshot replaces the damaged one without waiting for the interval, and the next
    // start restores it.
    wait_for(&server, "shoal_metadata_snapshots_total", 1);
    assert_eq!(gauge(&server, "shoal_metadata_snapshot_op"), ops);
    server.kill_9();
    restart(&mut server);
    assert_eq!(gauge(&server, "shoal_metadata_snapshot_op"), ops);
    assert_eq!(gauge(&server, "shoal_metadata_replayed_ops"), 0);
    let mut raw = Raw::connect(server.native(), 24);
    assert_eq!(stream_names(&mut raw), expected_streams);
}
