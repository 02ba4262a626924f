//! Consuming end to end, on the real binary: long-poll fetches woken by the commit of new data,
//! their bounds, and the committed end they report.

mod common;

use common::{Raw, decode_fetch, start, start_command};
use shoal_engine::protocol::{ErrorCode, Fetch, FetchFrom, Operation};
use shoal_engine::superblock::Durability;

/// Longer than any test should need, shorter than the harness's 30 s read timeout: a parked
/// fetch that is not woken comes back empty after this, and the test fails on it.
const WAIT_MS: u32 = 20_000;

fn fetch_body(from: FetchFrom, wait_ms_max: u32) -> Vec<u8> {
    Fetch {
        stream: "s".into(),
        topic: "t".into(),
        partition: 0,
        from,
        bytes_max: 1 << 20,
        count_max: 100,
        wait_ms_max,
    }
    .encode()
}

#[test]
fn a_long_poll_is_answered_by_the_commit_of_new_data_not_by_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut admin = Raw::connect(&server.address, 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 1, Durability::Persisted).ok();
    admin.produce("s", "t", 0, &[b"old"]);

    // A fetch at the end of the partition, then a write pipelined behind it on the same
    // connection: the shard takes them in order, so the fetch is parked before the write exists.
    let mut consumer = Raw::connect(&server.address, 2);
    consumer.send(Operation::Fetch, &fetch_body(FetchFrom::Offset(1), WAIT_MS));
    consumer.send(Operation::Produce, &Raw::produce_body("s", "t", 0, &[b"new", b"newer"]));
    let (reply, records) = decode_fetch(consumer.receive().ok());
    assert_eq!(records, [(1, b"new".to_vec()), (2, b"newer".to_vec())]);
    assert_eq!(reply.next_offset, 3, "the committed end");
    consumer.receive().ok();

    let (_, last) =
        decode_fetch(consumer.call(Operation::Fetch, &fetch_body(FetchFrom::Last, 0)).ok());
    // The batch holding the last committed message (the client skips what precedes it).
    assert_eq!(last.last(), Some(&(2, b"newer".to_vec())));

    // A wait that runs out answers with nothing; no wait answers at once.
    let (reply, records) =
        decode_fetch(consumer.call(Operation::Fetch, &fetch_body(FetchFrom::Offset(3), 50)).ok());
    assert!(records.is_empty());
    assert_eq!(reply.next_offset, 3);
    let (_, records) =
        decode_fetch(consumer.call(Operation::Fetch, &fetch_body(FetchFrom::Offset(3), 0)).ok());
    assert!(records.is_empty());
}

#[test]
fn long_polls_are_bounded_per_request_and_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command.env("SHOAL_NETWORK_FETCH_PARKED_MAX", "1");
    command.env("SHOAL_NETWORK_FETCH_WAIT_MS_MAX", "25000");
    let server = start_command(command);
    let mut admin = Raw::connect(&server.address, 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 1, Durability::Replicated).ok();

    let mut consumer = Raw::connect(&server.address, 2);
    let too_long = consumer.call(Operation::Fetch, &fetch_body(FetchFrom::First, 25_001));
    assert_eq!(too_long.error(), ErrorCode::InvalidArgument);

    // Everything pipelined on one connection reaches the shard in order: the first wait takes
    // the shard's only place, the second is answered at once (its reply queued behind the
    // first's), and only then does the write arrive and wake the first.
    consumer.send(Operation::Fetch, &fetch_body(FetchFrom::First, WAIT_MS));
    consumer.send(Operation::Fetch, &fetch_body(FetchFrom::First, WAIT_MS));
    consumer.send(Operation::Produce, &Raw::produce_body("s", "t", 0, &[b"a"]));
    let (_, first) = decode_fetch(consumer.receive().ok());
    assert_eq!(first, [(0, b"a".to_vec())]);
    let (reply, second) = decode_fetch(consumer.receive().ok());
    assert!(second.is_empty(), "beyond fetch_parked_max a fetch does not wait");
    assert_eq!(reply.next_offset, 0, "it was answered before the write committed");
    consumer.receive().ok();
}
