//! Process-crash safety of `persisted` topics on the real binary: `kill -9` while a client
//! pipelines produce requests, then every acknowledged offset must hold exactly its payload after
//! restart, offsets must be dense, and none may be issued again. (`kill -9` keeps the page cache;
//! power loss is the engine's simulated-disk and post-crash-image tests.)

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{Raw, kill, start, terminate};
use shoal_engine::protocol::{FetchFrom, Operation, ProduceReply};
use shoal_engine::superblock::Durability;

/// Produces until the connection breaks, `window` requests in flight; reports each
/// acknowledgement as it arrives.
fn produce_until_killed(address: String, acks: mpsc::Sender<(u64, String)>) {
    let mut raw = Raw::connect(&address, 7);
    let window = 8;
    let mut in_flight = std::collections::VecDeque::new();
    for i in 0.. {
        if in_flight.len() == window {
            let value: String = in_flight.pop_front().expect("in flight");
            let Some(answer) = raw.try_receive() else { return };
            if answer.reply.error != 0 {
                return;
            }
            let reply = ProduceReply::decode(&answer.body).expect("a produce reply");
            if acks.send((reply.base_offset, value)).is_err() {
                return;
            }
        }
        let value = format!("message-{i}");
        let body = Raw::produce_body("s", "t", 0, &[value.as_bytes()]);
        let bytes = raw.frame(Operation::Produce as u32, &body);
        if std::io::Write::write_all(&mut raw.stream, &bytes).is_err() {
            return;
        }
        in_flight.push_back(value);
    }
}

#[test]
fn kill_9_during_persisted_produce_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut admin = Raw::connect(&server.address, 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 1, Durability::Persisted).ok();

    let (tx, rx) = mpsc::channel();
    let address = server.address.clone();
    let producer = std::thread::spawn(move || produce_until_killed(address, tx));
    let mut acked = Vec::new();
    while acked.len() < 300 {
        acked.push(rx.recv_timeout(Duration::from_secs(60)).expect("acknowledgements flow"));
    }
    kill(server);
    producer.join().expect("producer thread");
    acked.extend(rx.try_iter());

    let server = start(dir.path(), 1);
    let mut client = Raw::connect(&server.address, 2);
    let mut records = Vec::new();
    let mut next = 0;
    let end = loop {
        let (reply, batch) = client.fetch("s", "t", 0, FetchFrom::Offset(next), 10_000);
        match batch.last() {
            Some((offset, _)) => next = offset + 1,
            None => break reply.next_offset,
        }
        records.extend(batch);
        assert!(records.len() < 1_000_000, "bounded");
    };
    let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..end).collect::<Vec<_>>(), "dense offsets from 0");
    for (offset, value) in &acked {
        let stored = records.get(*offset as usize).map(|(_, v)| v.as_slice());
        assert_eq!(stored, Some(value.as_bytes()), "acknowledged offset {offset} (log end {end})");
    }
    let after = client.produce("s", "t", 0, &[b"after"]);
    assert_eq!(after.base_offset, end, "no offset issued twice");
    assert!(end as usize >= acked.len());
    assert_eq!(terminate(server), 0);
}
