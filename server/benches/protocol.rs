//! Micro-benchmarks of the server's per-request CPU path, without sockets or storage: decoding
//! and checking a produce frame (header checksum, body checksum, arguments, the whole record
//! batch) and routing it through the catalog to its partition's group and shard.
//!
//! `cargo bench -p shoal-server --bench protocol`

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use shoal_proto::Durability;
use shoal_proto::batch::{self, BatchBuilder, BatchLimits};
use shoal_proto::protocol::{Operation, Partitioning, Produce};
use shoal_proto::wire::{ClientRequest, HEADER_SIZE, Header};
use shoal_server::metadata::{Catalog, MetaCommand, TopicSettings};

/// A produce frame of `messages` messages of `size` bytes.
fn frame(messages: usize, size: usize) -> Vec<u8> {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    let value = vec![b'v'; size];
    for _ in 0..messages {
        builder.push(1_700_000_000_000, None, Some(&value), &[]);
    }
    let produce = Produce {
        stream: "bench-0".into(),
        topic: "topic-0".into(),
        partitioning: Partitioning::Explicit(3),
    };
    let body = produce.encode(&builder.build());
    let fields =
        ClientRequest { client: 1, session: 0, request: 1, operation: Operation::Produce as u32 };
    let mut bytes = Header::request(1, fields, &body).encode().to_vec();
    bytes.extend_from_slice(&body);
    bytes
}

/// What the connection does with a frame before it forwards it.
fn decode_and_check(bytes: &[u8]) -> (u32, usize) {
    let header = Header::decode_prefix(bytes).expect("header");
    let body = &bytes[HEADER_SIZE..];
    header.verify_body(body).expect("body checksum");
    let (produce, at) = Produce::decode(body).expect("arguments");
    let limits = BatchLimits { batch_size_bytes_max: 2 << 20, ..BatchLimits::default() };
    let checked = batch::validate(&body[at..], &limits).expect("batch");
    let Partitioning::Explicit(partition) = produce.partitioning else { unreachable!() };
    (partition, checked.record_count() as usize)
}

fn frame_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("server/frame_decode");
    for (name, messages, size) in
        [("1000x1000B", 1000, 1000), ("100x100B", 100, 100), ("1x16KiB", 1, 16 << 10)]
    {
        let bytes = frame(messages, size);
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name, |b| b.iter(|| decode_and_check(std::hint::black_box(&bytes))));
    }
    group.finish();
}

fn routing(c: &mut Criterion) {
    // 100 streams × 10 topics × 4 partitions over 2 shards.
    let mut catalog = Catalog::new(2, 1 << 20);
    let settings = TopicSettings {
        partitions: 4,
        durability: Durability::Replicated,
        retention_bytes: 0,
        retention_ms: 0,
        segment_size_bytes: 1 << 30,
        message_size_bytes_max: 1 << 20,
        replica_lag_time_max_ms: 0,
        replication_factor: 1,
    };
    let mut op = 0;
    for stream in 0..100 {
        op += 1;
        catalog
            .apply(op, 0, &MetaCommand::CreateStream { name: format!("bench-{stream}") })
            .unwrap();
        for topic in 0..10 {
            op += 1;
            let command = MetaCommand::CreateTopic {
                stream: format!("bench-{stream}"),
                topic: format!("topic-{topic}"),
                settings,
                nodes: 1,
            };
            catalog.apply(op, 0, &command).unwrap();
        }
    }
    c.bench_function("server/route_to_partition", |b| {
        b.iter_batched(
            || (String::from("bench-57"), String::from("topic-7")),
            |(stream, topic)| catalog.partition(&stream, &topic, 3).map(|(_, place)| place.shard),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, frame_decode, routing);
criterion_main!(benches);
