//! Random scripts of appends, flushes, reads, truncations, clean restarts and retention against a
//! plain in-memory model (a `Vec` of what each op holds): every read returns exactly the
//! model's prepares, offsets stay dense, and a restart changes nothing.

use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;
use shoal_engine::record::build_prepare;
use shoal_engine::shard::{ShardConfig, ShardStore};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::Prepare;

const GROUP: u64 = 3;

#[derive(Clone, Debug)]
enum Step {
    Append { len: usize, records: u32 },
    Flush,
    ReadOffset { at: u16, bytes_max: u32 },
    ReadOp { at: u16 },
    Truncate { back: u8 },
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1usize..20_000, 1u32..6).prop_map(|(len, records)| Step::Append { len, records }),
        2 => Just(Step::Flush),
        2 => (any::<u16>(), 1u32..200_000).prop_map(|(at, bytes_max)| Step::ReadOffset { at, bytes_max }),
        1 => any::<u16>().prop_map(|at| Step::ReadOp { at }),
        1 => (1u8..8).prop_map(|back| Step::Truncate { back }),
        1 => Just(Step::Restart),
    ]
}

/// What the model holds for one op: base offset, record count, body.
type Entry = (u64, u32, Bytes);

fn open(sim: &Sim) -> ShardStore<SimStorage> {
    sim.block_on(ShardStore::open(sim.storage(), Path::new("/m/shard-0"), ShardConfig::small()))
        .expect("open")
        .0
}

fn run(durability: Durability, steps: Vec<Step>) {
    let sim = Sim::new(9, SimConfig::default());
    let mut shard = open(&sim);
    let config = GroupConfig {
        durability,
        segment_size_bytes: 1 << 20,
        record_size_bytes_max: 32 << 10,
        ..GroupConfig::default()
    };
    sim.block_on(shard.create_group(GROUP, config)).expect("create");
    let mut model: Vec<Entry> = Vec::new();
    let mut view = 1;
    for step in steps {
        match step {
            Step::Append { len, records } => {
                let next = shard.next(GROUP).expect("next");
                let body: Bytes =
                    (0..len).map(|i| (i as u64 ^ next.op) as u8).collect::<Vec<u8>>().into();
                let header = build_prepare(
                    &next,
                    view,
                    0,
                    Prepare { record_count: records, ..Prepare::default() },
                    &body,
                );
                match shard.append(GROUP, &header, &body) {
                    Ok(()) => model.push((next.offset, records, body)),
                    Err(shoal_engine::Error::LimitReached(_)) => {
                        sim.block_on(shard.flush()).expect("flush");
                    }
                    Err(error) => panic!("append: {error}"),
                }
            }
            Step::Flush => {
                sim.block_on(shard.flush()).expect("flush");
            }
            Step::ReadOffset { at, bytes_max } => {
                let end =
                    model.last().map_or(0, |(offset, records, _)| offset + u64::from(*records));
                let offset = if end == 0 { 0 } else { u64::from(at) % end };
                let log = shard.group_mut(GROUP).expect("group");
                let read = sim.block_on(log.read_offset(offset, bytes_max as usize)).expect("read");
                if end == 0 {
                    assert!(read.is_empty());
                    continue;
                }
                let first = model
                    .iter()
                    .position(|(base, records, _)| base + u64::from(*records) > offset)
                    .expect("in range");
                assert!(!read.is_empty(), "at least one prepare");
                for (index, prepare) in read.iter().enumerate() {
                    let (base, _, body) = &model[first + index];
                    assert_eq!(prepare.base_offset(), *base);
                    assert_eq!(&prepare.body(), body);
                }
            }
            Step::ReadOp { at } => {
                let op = if model.is_empty() { 1 } else { 1 + u64::from(at) % model.len() as u64 };
                let log = shard.group_mut(GROUP).expect("group");
                let read = sim.block_on(log.read_op(op)).expect("read");
                match model.get(op as usize - 1) {
                    Some((_, _, body)) => assert_eq!(&read.expect("present").body(), body),
                    None => assert!(read.is_none()),
                }
            }
            Step::Truncate { back } => {
                let keep = model.len().saturating_sub(usize::from(back));
                view += 1;
                sim.block_on(shard.truncate_after(GROUP, keep as u64, view)).expect("truncate");
                model.truncate(keep);
            }
            Step::Restart => {
                sim.block_on(shard.close()).expect("close");
                shard = open(&sim);
            }
        }
        let log = shard.group(GROUP).expect("group");
        assert_eq!(log.head_op(), model.len() as u64);
        assert_eq!(
            log.next_offset(),
            model.last().map_or(0, |(offset, records, _)| offset + u64::from(*records))
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn replicated_log_matches_the_model(steps in prop::collection::vec(step(), 1..120)) {
        run(Durability::Replicated, steps);
    }

    #[test]
    fn persisted_log_matches_the_model(steps in prop::collection::vec(step(), 1..120)) {
        run(Durability::Persisted, steps);
    }
}
