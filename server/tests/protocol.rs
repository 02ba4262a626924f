//! The native protocol end to end, on the real binary: metadata that survives restart, produce and
//! fetch with the offsets they promise, and every kind of bad input answered with its error while
//! other clients keep being served.

mod common;

use std::io::Write;

use common::{Raw, restart, start, terminate};
use shoal_proto::Durability;
use shoal_proto::protocol::{
    self, ErrorCode, FetchFrom, Hello, Operation, decode_describe, decode_streams, decode_topics,
};

#[test]
fn metadata_produce_and_fetch_round_trip_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("orders").ok();
    assert_eq!(client.create_stream("orders").error(), ErrorCode::StreamExists);
    client.create_topic("orders", "eu", 2, Durability::Persisted).ok();
    assert_eq!(
        client.create_topic("orders", "eu", 2, Durability::Persisted).error(),
        ErrorCode::TopicExists
    );

    let first = client.produce("orders", "eu", 0, &[b"a", b"b", b"c"]);
    assert_eq!((first.partition, first.base_offset, first.record_count), (0, 0, 3));
    let second = client.produce("orders", "eu", 0, &[b"d"]);
    assert_eq!(second.base_offset, 3);
    let other = client.produce("orders", "eu", 1, &[b"x"]);
    assert_eq!((other.partition, other.base_offset), (1, 0));

    let (reply, records) = client.fetch("orders", "eu", 0, FetchFrom::First, 100);
    assert_eq!(reply.next_offset, 4);
    let values: Vec<(u64, &[u8])> = records.iter().map(|(o, v)| (*o, v.as_slice())).collect();
    assert_eq!(values, [(0, &b"a"[..]), (1, b"b"), (2, b"c"), (3, b"d")]);
    let (_, from_three) = client.fetch("orders", "eu", 0, FetchFrom::Offset(3), 100);
    assert_eq!(from_three, [(3, b"d".to_vec())]);
    let (_, last) = client.fetch("orders", "eu", 0, FetchFrom::Last, 1);
    assert_eq!(last.last().map(|(o, _)| *o), Some(3));
    let hour_ago = common::now_ms() - 3_600_000;
    let (_, by_time) = client.fetch("orders", "eu", 0, FetchFrom::Timestamp(hour_ago), 100);
    assert_eq!(by_time.first().map(|(o, _)| *o), Some(0), "appended after an hour ago: all");
    let later = common::now_ms() + 3_600_000;
    let (_, none_later) = client.fetch("orders", "eu", 0, FetchFrom::Timestamp(later), 100);
    assert!(none_later.is_empty(), "nothing appended in the future");
    let (end, nothing) = client.fetch("orders", "eu", 0, FetchFrom::Offset(4), 100);
    assert!(nothing.is_empty());
    assert_eq!(end.next_offset, 4);

    let body = client.call(Operation::DescribeTopic, &protocol::encode_topic_name("orders", "eu"));
    let (topic, partitions) = decode_describe(body.ok()).unwrap();
    assert_eq!(topic.durability, Durability::Persisted);
    assert_eq!(partitions.iter().map(|p| p.next_offset).collect::<Vec<_>>(), [4, 1]);
    let status = client.call(Operation::Status, &[]);
    let status: serde_json::Value = serde_json::from_slice(status.ok()).unwrap();
    assert_eq!(status["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(status["partitions"][0]["next_offset"], 4);

    let session = client.call(Operation::Register, &[]);
    assert!(protocol::decode_session(session.ok()).unwrap() > 0);
    drop(client);
    assert_eq!(terminate(&mut server), 0);

    restart(&mut server);
    let mut client = Raw::connect(server.native(), 2);
    let streams = decode_streams(client.call(Operation::ListStreams, &[]).ok()).unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].name, "orders");
    let topics = client.call(Operation::ListTopics, &protocol::encode_stream_name("orders"));
    let topics = decode_topics(topics.ok()).unwrap();
    assert_eq!((topics[0].name.as_str(), topics[0].partitions), ("eu", 2));
    let (_, records) = client.fetch("orders", "eu", 0, FetchFrom::First, 100);
    assert_eq!(records.len(), 4);
    let hour_ago = common::now_ms() - 3_600_000;
    let (_, by_time) = client.fetch("orders", "eu", 0, FetchFrom::Timestamp(hour_ago), 100);
    assert_eq!(by_time.len(), 4, "found by time after restart");
    assert_eq!(client.produce("orders", "eu", 0, &[b"e"]).base_offset, 4);

    // Deletion is durable too, and takes the partitions' files with it.
    assert_eq!(partition_dirs(dir.path()), 2);
    let delete = client.call(Operation::DeleteTopic, &protocol::encode_topic_name("orders", "eu"));
    delete.ok();
    let deadline = std::time::Instant::now() + common::DEADLINE;
    while partition_dirs(dir.path()) > 0 {
        assert!(std::time::Instant::now() < deadline, "the deleted topic's files stay");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let produce = Raw::produce_body("orders", "eu", 0, &[b"late"]);
    assert_eq!(client.call(Operation::Produce, &produce).error(), ErrorCode::TopicNotFound);
    assert_eq!(terminate(&mut server), 0);
    restart(&mut server);
    let mut client = Raw::connect(server.native(), 3);
    let topics = client.call(Operation::ListTopics, &protocol::encode_stream_name("orders"));
    assert!(decode_topics(topics.ok()).unwrap().is_empty());
    assert_eq!(partition_dirs(dir.path()), 0);
    // The name again is a new topic: new groups, empty.
    client.create_topic("orders", "eu", 1, Durability::Persisted).ok();
    assert_eq!(client.produce("orders", "eu", 0, &[b"f"]).base_offset, 0);
    assert_eq!(terminate(&mut server), 0);
}

/// Partition group directories in the data directory `dir` (the metadata's, group 0, aside).
fn partition_dirs(dir: &std::path::Path) -> usize {
    let shards = std::fs::read_dir(dir).map_or(Vec::new(), |entries| entries.flatten().collect());
    shards
        .iter()
        .flat_map(|shard| std::fs::read_dir(shard.path()).into_iter().flatten().flatten())
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("group-") && name != format!("group-{:020}", 0)
        })
        .count()
}

#[test]
fn bad_input_gets_its_error_and_other_clients_are_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut good = Raw::connect(server.native(), 100);
    good.create_stream("s").ok();
    good.create_topic("s", "t", 1, Durability::Replicated).ok();

    // Random bytes: an InvalidFrame reply, then the connection is closed.
    let mut noise = Raw::connect_only(server.native(), 1);
    let bytes: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    noise.stream.write_all(&bytes).unwrap();
    assert_eq!(noise.receive().error(), ErrorCode::InvalidFrame);
    assert!(noise.closed());

    // A truncated frame: the server waits for the rest; closing the socket costs nothing else.
    let mut truncated = Raw::connect_only(server.native(), 2);
    let frame = truncated.frame(Operation::Hello as u32, b"partial");
    truncated.stream.write_all(&frame[..100]).unwrap();
    drop(truncated);

    // An oversized frame: refused by its header before the body is read.
    let mut oversized = Raw::connect(server.native(), 3);
    let big = vec![0u8; 2 << 20];
    let frame = oversized.frame(Operation::Produce as u32, &big);
    // The server answers from the header alone; the client may or may not get the rest out.
    let _ = oversized.stream.write_all(&frame[..64 << 10]);
    assert_eq!(oversized.receive().error(), ErrorCode::TooLarge);
    assert!(oversized.closed());

    // Requests before Hello, and a Hello with no version in common.
    let mut rude = Raw::connect_only(server.native(), 4);
    assert_eq!(rude.call(Operation::ListStreams, &[]).error(), ErrorCode::InvalidRequest);
    assert!(rude.closed());
    let mut future = Raw::connect_only(server.native(), 5);
    let hello = Hello { version_min: 99, version_max: 100, client_name: "future".into() };
    assert_eq!(
        future.call(Operation::Hello, &hello.encode()).error(),
        ErrorCode::UnsupportedVersion
    );
    assert!(future.closed());

    // Errors that keep the connection: unknown operation, invalid name, bad batch CRC, unknown
    // stream, topic and partition, a malformed body.
    let mut client = Raw::connect(server.native(), 6);
    let frame = client.frame(999, &[]);
    client.stream.write_all(&frame).unwrap();
    assert_eq!(client.receive().error(), ErrorCode::UnknownOperation);
    assert_eq!(client.create_stream("bad name").error(), ErrorCode::InvalidName);
    assert_eq!(client.create_stream(&"x".repeat(250)).error(), ErrorCode::InvalidRequest);
    let mut body = Raw::produce_body("s", "t", 0, &[b"value"]);
    let last = body.len() - 1;
    body[last] ^= 0xff;
    assert_eq!(client.call(Operation::Produce, &body).error(), ErrorCode::InvalidBatch);
    let unknown_stream = Raw::produce_body("nope", "t", 0, &[b"v"]);
    assert_eq!(client.call(Operation::Produce, &unknown_stream).error(), ErrorCode::StreamNotFound);
    let unknown_topic = Raw::produce_body("s", "nope", 0, &[b"v"]);
    assert_eq!(client.call(Operation::Produce, &unknown_topic).error(), ErrorCode::TopicNotFound);
    let unknown_partition = Raw::produce_body("s", "t", 7, &[b"v"]);
    assert_eq!(
        client.call(Operation::Produce, &unknown_partition).error(),
        ErrorCode::PartitionNotFound
    );
    assert_eq!(client.call(Operation::CreateTopic, &[1, 2, 3]).error(), ErrorCode::InvalidRequest);
    // A one-node cluster without [cluster] nodes cannot grow; it has no node to remove either.
    let add = shoal_proto::protocol::AddNode {
        bus: "127.0.0.1:7200".into(),
        client: "127.0.0.1:7070".into(),
        ..Default::default()
    };
    assert_eq!(client.call(Operation::AddNode, &add.encode()).error(), ErrorCode::InvalidArgument);
    assert_eq!(client.call(Operation::AddNode, &[255, 0]).error(), ErrorCode::InvalidRequest);
    let remove = shoal_proto::protocol::RemoveNode { node: 0, replacement: None };
    assert_eq!(
        client.call(Operation::RemoveNode, &remove.encode()).error(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(client.produce("s", "t", 0, &[b"still served"]).base_offset, 0);

    // The well-behaved client never noticed.
    assert_eq!(good.produce("s", "t", 0, &[b"fine"]).base_offset, 1);
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn connections_beyond_the_limit_are_refused_and_the_others_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command.env("SHOAL_NETWORK_CONNECTIONS_MAX", "2");
    let mut server = common::start_command(command);
    let mut first = Raw::connect(server.native(), 1);
    let mut second = Raw::connect(server.native(), 2);
    let mut third = Raw::connect_only(server.native(), 3);
    assert_eq!(third.receive().error(), ErrorCode::LimitReached);
    assert!(third.closed());
    first.create_stream("s").ok();
    second.call(Operation::ListStreams, &[]).ok();
    drop(first);
    // The slot is free once the server has seen the close, which its status reports.
    let mut polls = 0;
    loop {
        let status = second.call(Operation::Status, &[]);
        let status: serde_json::Value = serde_json::from_slice(status.ok()).unwrap();
        if status["connections"] == 1 {
            break;
        }
        polls += 1;
        assert!(polls < 1000, "the closed connection still counts: {status}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut again = Raw::connect(server.native(), 4);
    again.call(Operation::ListStreams, &[]).ok();
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn two_shards_and_four_pipelining_clients_keep_order_and_dense_offsets() {
    const PARTITIONS: u32 = 4;
    const REQUESTS: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 2);
    let mut admin = Raw::connect(server.native(), 1000);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", PARTITIONS, Durability::Replicated).ok();
    let body = admin.call(Operation::DescribeTopic, &protocol::encode_topic_name("s", "t"));
    let (_, partitions) = decode_describe(body.ok()).unwrap();
    let shards: std::collections::BTreeSet<u32> = partitions.iter().map(|p| p.shard).collect();
    assert_eq!(shards.len(), 2, "partitions spread over both shards: {partitions:?}");

    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let address = server.native().to_string();
            std::thread::spawn(move || {
                let mut raw = Raw::connect(&address, 1 + c);
                let first_request = raw.next_request;
                let mut sent = Vec::new();
                for i in 0..REQUESTS {
                    let partition = ((c + i) % u64::from(PARTITIONS)) as u32;
                    let value = format!("{c}-{i}");
                    raw.send(
                        Operation::Produce,
                        &Raw::produce_body("s", "t", partition, &[value.as_bytes()]),
                    );
                    sent.push((partition, value));
                }
                let mut acked = Vec::new();
                for (i, (partition, value)) in sent.into_iter().enumerate() {
                    let answer = raw.receive();
                    assert_eq!(answer.reply.request, first_request + i as u64, "in request order");
                    let reply = protocol::ProduceReply::decode(answer.ok()).unwrap();
                    assert_eq!(reply.partition, partition);
                    acked.push((partition, reply.base_offset, value));
                }
                acked
            })
        })
        .collect();
    let mut all = Vec::new();
    for client in clients {
        let acked = client.join().expect("client thread");
        // One connection's writes to one partition get increasing offsets, in send order.
        for partition in 0..PARTITIONS {
            let offsets: Vec<u64> =
                acked.iter().filter(|a| a.0 == partition).map(|a| a.1).collect();
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
        }
        all.extend(acked);
    }
    for partition in 0..PARTITIONS {
        let mut offsets: Vec<u64> = all.iter().filter(|a| a.0 == partition).map(|a| a.1).collect();
        offsets.sort_unstable();
        assert_eq!(offsets, (0..offsets.len() as u64).collect::<Vec<_>>(), "dense offsets");
        let (_, records) = admin.fetch("s", "t", partition, FetchFrom::First, 1000);
        assert_eq!(records.len(), offsets.len());
        for (offset, value) in records {
            let sent = all.iter().find(|a| a.0 == partition && a.1 == offset).expect("acked");
            assert_eq!(value, sent.2.as_bytes());
        }
    }
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn retention_deletes_the_oldest_segments_beyond_the_size_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_retained_topic("s", "t", 1, Durability::Persisted).ok();
    let value = vec![b'r'; 50_000];
    let body = Raw::produce_body("s", "t", 0, &[&value]);
    for _ in 0..100 {
        client.call(Operation::Produce, &body).ok();
    }
    // Retention runs on the shard's own schedule (every second); wait for it, bounded.
    let mut polls = 0;
    let first_offset = loop {
        let body = client.call(Operation::DescribeTopic, &protocol::encode_topic_name("s", "t"));
        let (_, partitions) = decode_describe(body.ok()).unwrap();
        if partitions[0].first_offset > 0 {
            assert!(partitions[0].size_bytes <= 3 << 20, "{partitions:?}");
            break partitions[0].first_offset;
        }
        polls += 1;
        assert!(polls < 1500, "retention never deleted a segment: {partitions:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (reply, records) = client.fetch("s", "t", 0, FetchFrom::First, 1);
    assert_eq!(reply.first_offset, first_offset);
    assert_eq!(records.first().map(|(o, _)| *o), Some(first_offset));
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn one_request_in_flight_and_a_one_item_inbox_still_serve_a_pipelining_client() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 2);
    command.env("SHOAL_NETWORK_REQUESTS_IN_FLIGHT_MAX", "1");
    command.env("SHOAL_NETWORK_SHARD_INBOX_MAX", "1");
    let mut server = common::start_command(command);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 2, Durability::Replicated).ok();
    let first = client.next_request;
    for i in 0..100u32 {
        client.send(Operation::Produce, &Raw::produce_body("s", "t", i % 2, &[b"v"]));
    }
    let mut next = [0u64; 2];
    for i in 0..100u64 {
        let answer = client.receive();
        assert_eq!(answer.reply.request, first + i, "in order at the bounds");
        let reply = protocol::ProduceReply::decode(answer.ok()).unwrap();
        assert_eq!(reply.base_offset, next[reply.partition as usize]);
        next[reply.partition as usize] += 1;
    }
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn sigterm_answers_what_it_finished_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Persisted).ok();
    for i in 0..200u32 {
        client.send(
            Operation::Produce,
            &Raw::produce_body("s", "t", 0, &[format!("{i}").as_bytes()]),
        );
    }
    server.signal(libc::SIGTERM);
    let mut acked = Vec::new();
    while let Some(answer) = client.try_receive() {
        if answer.reply.error == 0 {
            let reply = protocol::ProduceReply::decode(&answer.body).unwrap();
            acked.push(reply.base_offset);
        } else {
            assert_eq!(answer.error(), ErrorCode::ShuttingDown);
        }
    }
    assert_eq!(common::wait_exit(&mut server), 0);
    restart(&mut server);
    let mut client = Raw::connect(server.native(), 2);
    let (reply, _) = client.fetch("s", "t", 0, FetchFrom::First, 1);
    for offset in &acked {
        assert!(*offset < reply.next_offset, "acknowledged offset {offset} kept");
    }
    assert_eq!(terminate(&mut server), 0);
}

/// A client connection that sends nothing while the server owes it nothing is closed after
/// `[network] idle_timeout_ms` (native and Kafka alike), so silent connections cannot hold
/// `connections_max` for good; one owed a reply (a long-poll longer than the timeout) is not.
#[test]
fn an_idle_connection_is_closed_and_one_owed_a_reply_is_not() {
    use std::io::Read;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command.env("SHOAL_NETWORK_IDLE_TIMEOUT_MS", "1000");
    let server = common::start_command(command);
    let ends = |stream: &mut std::net::TcpStream| {
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut byte = [0u8; 1];
        matches!(stream.read(&mut byte), Ok(0))
    };
    let mut silent = std::net::TcpStream::connect(server.native()).unwrap();
    let mut kafka =
        std::net::TcpStream::connect(server.kafka().expect("a Kafka listener")).unwrap();
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Replicated).ok();
    // Waits 3 s for data that never comes: three idle timeouts with a reply owed.
    let fetch = protocol::Fetch {
        stream: "s".into(),
        topic: "t".into(),
        partition: 0,
        from: FetchFrom::Offset(0),
        bytes_max: 1 << 20,
        count_max: 100,
        wait_ms_max: 3_000,
    };
    let answer = client.call(Operation::Fetch, &fetch.encode());
    assert_eq!(answer.reply.error, 0);
    // The same connection goes on: its read waited through the timeouts whole (a read
    // started anew beside the first would have lost these bytes to it).
    let at_once = protocol::Fetch { wait_ms_max: 0, ..fetch };
    assert_eq!(client.call(Operation::Fetch, &at_once.encode()).reply.error, 0);
    assert!(ends(&mut silent), "a silent native connection is closed");
    assert!(ends(&mut kafka), "a silent Kafka connection is closed");
    assert!(ends(&mut client.stream), "and the long-poller once it has nothing owed");
}
