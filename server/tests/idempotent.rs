//! Exactly-once produce on the real binary (DESIGN.md §4): an idempotent producer's batch sent
//! twice is appended once and both sends get its offset; a gap gets `OutOfOrderSequence`, an
//! unknown producer's non-zero sequence `UnknownProducer`, an older epoch `ProducerFenced`; and
//! the partition still recognises a retry after `kill -9` (the producer table rebuilt from the
//! log) and after a clean restart (from the state snapshot's producer section).
//!
//! The `canary-no-dedup` feature (DESIGN.md §7) must make this test fail.

mod common;

use common::{Raw, restart, start, terminate};
use shoal_proto::Durability;
use shoal_proto::batch::BatchBuilder;
use shoal_proto::protocol::{ErrorCode, FetchFrom, Operation, Partitioning, Produce, ProduceReply};

const PRODUCER: i64 = 4_242;

/// A produce body whose batch comes from `producer` at `epoch`, sequence `first` on.
fn body(producer: i64, epoch: i16, first: i32, values: &[&str]) -> Vec<u8> {
    let mut batch = BatchBuilder::new(1_700_000_000_000).producer(producer, epoch, first);
    for value in values {
        batch.push(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    }
    let produce =
        Produce { stream: "s".into(), topic: "t".into(), partitioning: Partitioning::Explicit(0) };
    produce.encode(&batch.build())
}

/// Sends a batch; its base offset, or the error code.
fn send(
    raw: &mut Raw,
    producer: i64,
    epoch: i16,
    first: i32,
    values: &[&str],
) -> Result<u64, ErrorCode> {
    let answer = raw.call(Operation::Produce, &body(producer, epoch, first, values));
    if answer.reply.error != 0 {
        return Err(answer.error());
    }
    Ok(ProduceReply::decode(&answer.body).expect("a produce reply").base_offset)
}

/// Every record value of partition 0, in offset order.
fn values(raw: &mut Raw) -> Vec<String> {
    let (_, records) = raw.fetch("s", "t", 0, FetchFrom::Offset(0), 10_000);
    records.into_iter().map(|(_, v)| String::from_utf8(v).expect("utf-8")).collect()
}

#[test]
fn a_retried_batch_is_appended_once_across_kill_9_and_clean_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut raw = Raw::connect(server.native(), 1);
    raw.create_stream("s").ok();
    raw.create_topic("s", "t", 1, Durability::Persisted).ok();

    assert_eq!(send(&mut raw, PRODUCER, 0, 0, &["a", "b"]), Ok(0));
    assert_eq!(send(&mut raw, PRODUCER, 0, 0, &["a", "b"]), Ok(0), "the retry gets the offset");
    assert_eq!(send(&mut raw, PRODUCER, 0, 2, &["c"]), Ok(2));
    assert_eq!(send(&mut raw, PRODUCER, 0, 5, &["gap"]), Err(ErrorCode::OutOfOrderSequence));
    assert_eq!(send(&mut raw, PRODUCER + 1, 0, 3, &["x"]), Err(ErrorCode::UnknownProducer));
    // A batch without a producer is never deduplicated.
    raw.produce("s", "t", 0, &[b"plain"]);
    raw.produce("s", "t", 0, &[b"plain"]);
    assert_eq!(values(&mut raw), ["a", "b", "c", "plain", "plain"]);

    // kill -9: no snapshot holds the producer; the log does.
    server.kill_9();
    restart(&mut server);
    let mut raw = Raw::connect(server.native(), 2);
    assert_eq!(send(&mut raw, PRODUCER, 0, 2, &["c"]), Ok(2), "a retry after kill -9");
    assert_eq!(send(&mut raw, PRODUCER, 0, 4, &["gap"]), Err(ErrorCode::OutOfOrderSequence));
    assert_eq!(send(&mut raw, PRODUCER, 0, 3, &["d"]), Ok(5));

    // A clean stop saves the producer table in the state snapshot; the restart starts from it.
    assert_eq!(terminate(&mut server), 0);
    restart(&mut server);
    let mut raw = Raw::connect(server.native(), 3);
    assert_eq!(send(&mut raw, PRODUCER, 0, 3, &["d"]), Ok(5), "a retry after a clean restart");
    assert_eq!(send(&mut raw, PRODUCER, 1, 0, &["e"]), Ok(6), "a new epoch starts at 0");
    assert_eq!(send(&mut raw, PRODUCER, 0, 4, &["old"]), Err(ErrorCode::ProducerFenced));
    assert_eq!(values(&mut raw), ["a", "b", "c", "plain", "plain", "d", "e"]);
    assert_eq!(terminate(&mut server), 0);
}
