//! Zero allocations per message on the produce path at steady state, measured in the real
//! server: its allocator counts allocations per thread and `Status` reports each shard's count.
//! With one shard, that thread runs the whole produce path (connection, validation, replica,
//! engine, reply). A message that cost even one allocation would make a request of 64 messages
//! cost 63 more than a request of one; the test allows fewer than 4 extra per request (the
//! amortized growth of byte-proportional tables such as the sparse indexes), so it fails on any
//! per-message allocation. The per-request figure it prints is a constant, not asserted here.

mod common;

use common::{Raw, start, terminate};
use shoal_proto::Durability;
use shoal_proto::protocol::Operation;

const REQUESTS: u64 = 400;

/// The shard's allocation count.
fn allocations(client: &mut Raw) -> u64 {
    let status = client.call(Operation::Status, &[]);
    let status: serde_json::Value = serde_json::from_slice(status.ok()).unwrap();
    status["shard_reports"][0]["allocations"].as_u64().expect("an allocation count")
}

/// Allocations per produce request of `messages` messages, over `REQUESTS` requests.
fn per_request(client: &mut Raw, messages: usize, status_cost: u64) -> f64 {
    let value = [7u8; 100];
    let values: Vec<&[u8]> = vec![&value[..]; messages];
    let body = Raw::produce_body("s", "t", 0, &values);
    let before = allocations(client);
    for _ in 0..REQUESTS {
        let answer = client.call(Operation::Produce, &body);
        answer.ok();
    }
    let after = allocations(client);
    (after - before - status_cost) as f64 / REQUESTS as f64
}

#[test]
fn the_produce_path_allocates_nothing_per_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Persisted).ok();
    // Warm up: fill the write buffers, rings and tables to their steady-state sizes.
    for messages in [64, 1, 64, 1] {
        per_request(&mut client, messages, 0);
    }
    let status_cost = {
        let a = allocations(&mut client);
        let b = allocations(&mut client);
        b - a
    };
    // Each size is measured after a window at that size: the first requests after a change of
    // size resize bounded tables (rings, indexes) once, which is not the steady state.
    per_request(&mut client, 1, status_cost);
    let one = per_request(&mut client, 1, status_cost);
    per_request(&mut client, 64, status_cost);
    let many = per_request(&mut client, 64, status_cost);
    eprintln!("allocations per produce request: {one:.2} (1 message), {many:.2} (64 messages)");
    assert!(
        many < one + 4.0,
        "64-message requests cost {many:.2} allocations against {one:.2} for one message"
    );
    assert_eq!(terminate(&mut server), 0);
}
