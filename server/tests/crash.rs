//! Process-crash safety of `persisted` topics on the real binary: `kill -9` while a client
//! pipelines produce requests, then every acknowledged offset must hold exactly its payload after
//! restart, offsets must be dense, and none may be issued again. (`kill -9` keeps the page cache;
//! power loss is the engine's simulated-disk and post-crash-image tests.)

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{Raw, restart, start, terminate};
use shoal_proto::Durability;
use shoal_proto::protocol::{FetchFrom, Operation, ProduceReply};

/// Produces until the connection breaks, `window` requests in flight; reports each
/// acknowledgement as it arrives.
fn produce_until_killed(address: String, round: u32, acks: mpsc::Sender<(u64, String)>) {
    let mut raw = Raw::connect(&address, 7 + u64::from(round));
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
        let value = format!("round-{round}-message-{i}");
        let body = Raw::produce_body("s", "t", 0, &[value.as_bytes()]);
        let bytes = raw.frame(Operation::Produce as u32, &body);
        if std::io::Write::write_all(&mut raw.stream, &bytes).is_err() {
            return;
        }
        in_flight.push_back(value);
    }
}

/// Kill rounds to run: 1 in the CI gate; `scripts/crash-soak` runs many (`CRASH_SOAK_ROUNDS`).
fn rounds() -> u32 {
    std::env::var("CRASH_SOAK_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// Every record of partition 0 from offset 0 to the log end, with the log end.
fn read_all(client: &mut Raw) -> (Vec<(u64, Vec<u8>)>, u64) {
    let mut records = Vec::new();
    let mut next = 0;
    loop {
        let (reply, batch) = client.fetch("s", "t", 0, FetchFrom::Offset(next), 10_000);
        match batch.last() {
            Some((offset, _)) => next = offset + 1,
            None => return (records, reply.next_offset),
        }
        records.extend(batch);
        assert!(records.len() < 10_000_000, "bounded");
    }
}

#[test]
fn kill_9_during_persisted_produce_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut admin = Raw::connect(server.native(), 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 1, Durability::Persisted).ok();
    drop(admin);

    // Every acknowledgement of every round, checked after every restart.
    let mut acked: Vec<(u64, String)> = Vec::new();
    for round in 0..rounds() {
        let (tx, rx) = mpsc::channel();
        let address = server.native().to_string();
        let producer = std::thread::spawn(move || produce_until_killed(address, round, tx));
        let target = acked.len() + 300 + (round as usize * 37) % 200;
        while acked.len() < target {
            acked.push(rx.recv_timeout(Duration::from_secs(60)).expect("acknowledgements flow"));
        }
        server.kill_9();
        producer.join().expect("producer thread");
        acked.extend(rx.try_iter());

        restart(&mut server);
        let mut client = Raw::connect(server.native(), 2);
        let (records, end) = read_all(&mut client);
        let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, (0..end).collect::<Vec<_>>(), "round {round}: dense offsets from 0");
        for (offset, value) in &acked {
            let stored = records.get(*offset as usize).map(|(_, v)| v.as_slice());
            assert_eq!(
                stored,
                Some(value.as_bytes()),
                "round {round}: acknowledged offset {offset} (log end {end})"
            );
        }
        let after = client.produce("s", "t", 0, &[b"after"]);
        assert_eq!(after.base_offset, end, "round {round}: no offset issued twice");
        acked.push((after.base_offset, "after".to_string()));
    }
    assert_eq!(terminate(&mut server), 0);
}
