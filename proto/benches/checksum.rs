//! CRC-32C per input size: `shoal_proto::checksum::crc32c` (the wide path from 512 bytes on,
//! where the CPU has it) against the `crc32c` crate alone, from a short record to a large batch
//! (docs/benchmarks.md, "A wider CRC-32C").
//!
//! Run: `cargo bench -p shoal-proto --bench checksum`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn checksum(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c");
    for size_bytes in [256usize, 512, 4096, 16 * 1024, 64 * 1024, 1 << 20] {
        let data: Vec<u8> = (0..size_bytes).map(|i| (i * 131 + 7) as u8).collect();
        group.throughput(Throughput::Bytes(size_bytes as u64));
        group.bench_with_input(BenchmarkId::new("shoal", size_bytes), &data, |b, data| {
            b.iter(|| shoal_proto::checksum::crc32c(std::hint::black_box(data)));
        });
        group.bench_with_input(BenchmarkId::new("crc32c_crate", size_bytes), &data, |b, data| {
            b.iter(|| crc32c::crc32c(std::hint::black_box(data)));
        });
    }
    group.finish();
}

criterion_group!(benches, checksum);
criterion_main!(benches);
