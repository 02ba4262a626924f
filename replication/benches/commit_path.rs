//! The replica's commit path in isolation: three replicas of one group, in memory, every write
//! durable at once and every message delivered at once, so the figure is the protocol's own
//! cost per op (build and checksum the prepare, send, acknowledge, commit, reply) with no I/O.
//!
//! `cargo bench -p shoal-replication --bench commit_path`

use std::collections::VecDeque;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shoal_replication::{Message, Persisted, Replica, ReplicaConfig, Request, Write};

struct Group {
    replicas: Vec<Replica>,
    queue: VecDeque<(u8, u8, Message)>,
    committed: u64,
}

impl Group {
    fn new(n: u8) -> Group {
        let mut config = ReplicaConfig::new(1, 0, n, 0);
        config.stamp_batches = false;
        config.pipeline_prepares_max = 64;
        config.view_headers_max = 128;
        let replicas =
            (0..n).map(|r| Replica::new(ReplicaConfig { replica: r, ..config }, 7)).collect();
        Group { replicas, queue: VecDeque::new(), committed: 0 }
    }

    fn drain(&mut self, index: u8) {
        let ready = self.replicas[usize::from(index)].take_ready();
        let mut durable = None;
        for write in ready.writes {
            if let Write::Append { header, .. } = write {
                durable = header.as_prepare().map(|p| p.op);
            }
        }
        for envelope in ready.messages.into_iter().chain(ready.persisted_messages) {
            self.queue.push_back((envelope.from, envelope.to, envelope.message));
        }
        self.committed += ready.replies.len() as u64;
        if let Some(op) = durable {
            self.replicas[usize::from(index)].on_persisted(Persisted::Appended { op });
            self.drain(index);
        }
    }

    fn request(&mut self, request: u64, body: &[u8]) {
        self.replicas[0].on_client_request(Request {
            client: 1,
            session: 1,
            request,
            body: BytesMut::from(body),
            body_checksum: shoal_proto::checksum::crc32c(body),
            record_count: 1,
            first_timestamp_ms: 0,
            max_timestamp_ms: 0,
            append_time_ms: 0,
        });
        self.drain(0);
        while let Some((from, to, message)) = self.queue.pop_front() {
            self.replicas[usize::from(to)].on_message(from, message);
            self.drain(to);
        }
    }
}

fn commit_path(c: &mut Criterion) {
    let body = vec![7u8; 1024];
    let mut group = c.benchmark_group("replica_commit_path");
    group.throughput(Throughput::Elements(1));
    group.bench_function("three_replicas_1KiB_op", |b| {
        let mut cluster = Group::new(3);
        let mut request = 0;
        b.iter(|| {
            request += 1;
            cluster.request(request, &body);
        });
        assert_eq!(cluster.committed, request, "every request committed");
    });
    group.finish();
}

criterion_group!(benches, commit_path);
criterion_main!(benches);
