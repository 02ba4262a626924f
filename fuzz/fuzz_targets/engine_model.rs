//! Model fuzzer: the input is a script of appends, flushes, view changes (superblock writes),
//! truncations and crashes run against the engine on the simulated disk and against a plain
//! model. After every crash and recovery, each `persisted` append reported durable is present
//! and byte-identical, and nothing but what was appended at each op is ever served.
#![no_main]

use std::path::Path;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shoal_engine::record::build_prepare;
use shoal_engine::shard::{ShardStore, ShardConfig};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::Prepare;

const GROUP: u64 = 1;

fn open(sim: &Sim) -> ShardStore<SimStorage> {
    let opened =
        sim.block_on(ShardStore::open(sim.storage(), Path::new("/f/shard-0"), ShardConfig::small()));
    let (shard, report) = opened.expect("a crash never prevents opening");
    assert!(report.groups.iter().all(|g| g.corruption.is_none()), "a crash is not corruption");
    shard
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, script)) = data.split_first() else { return };
    let sim = Sim::new(u64::from(seed), SimConfig::default());
    let mut shard = open(&sim);
    let config = GroupConfig {
        durability: Durability::Persisted,
        segment_size_bytes: 1 << 20,
        record_size_bytes_max: 32 << 10,
        ..GroupConfig::default()
    };
    sim.block_on(shard.create_group(GROUP, config)).expect("create");
    // op -> body of every append not truncated; the highest op reported durable.
    let mut appended: Vec<Bytes> = Vec::new();
    let mut durable = 0u64;
    let mut view = 1u32;
    for chunk in script.chunks(2).take(300) {
        let (code, arg) = (chunk[0], *chunk.get(1).unwrap_or(&0));
        match code % 5 {
            0 | 1 => {
                let next = shard.next(GROUP).expect("next");
                let len = 1 + usize::from(arg) * 97;
                let body: Bytes =
                    (0..len).map(|i| (i as u64 ^ next.op) as u8).collect::<Vec<u8>>().into();
                let header = build_prepare(
                    &next,
                    view,
                    0,
                    Prepare { record_count: 1, ..Prepare::default() },
                    &body,
                );
                if shard.append(GROUP, &header, &body).is_ok() {
                    appended.push(body);
                }
            }
            2 => {
                if let Ok(report) = sim.block_on(shard.flush()) {
                    for (_, op) in report.durable {
                        durable = durable.max(op);
                    }
                }
            }
            3 => {
                view += 1;
                let _ = shard.set_views(GROUP, view, view, None);
                let keep = appended.len().saturating_sub(usize::from(arg % 4));
                if keep < appended.len() {
                    sim.block_on(shard.truncate_after(GROUP, keep as u64, view)).expect("truncate");
                    appended.truncate(keep);
                    durable = durable.min(keep as u64);
                } else {
                    let _ = sim.block_on(shard.flush());
                }
            }
            _ => {
                let crash_after = u64::from(arg);
                let flush = shard.begin_flush();
                if let Some(flush) = flush {
                    let _ = sim.run_until_crash(flush.run(), crash_after);
                }
                sim.crash();
                shard = open(&sim);
                let log = shard.group_mut(GROUP).expect("group");
                let head = log.head_op();
                assert!(head >= durable, "durable op {durable} lost (head {head})");
                let served = sim.block_on(log.read_offset(0, usize::MAX)).expect("read");
                assert_eq!(served.len() as u64, head);
                for prepare in &served {
                    assert_eq!(
                        Some(&prepare.body()),
                        appended.get(prepare.op() as usize - 1),
                        "op {}",
                        prepare.op()
                    );
                }
                appended.truncate(head as usize);
                durable = head;
            }
        }
    }
});
