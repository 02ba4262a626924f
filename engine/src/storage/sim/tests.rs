//! Tests of the simulated disk and its executor, through the public API of `Sim`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use super::disk::{EIO, ENOSPC, to_usize};
use super::{Sim, SimConfig, SimFile, SimStats, SimStorage};
use crate::rng::Rng;
use crate::storage::{AlignedBuf, OpenMode, Storage, StorageFile};

const SEEDS: u64 = 200;

fn sim(seed: u64) -> Sim {
    Sim::new(seed, SimConfig::default())
}

fn block(byte: u8, len: usize) -> Bytes {
    Bytes::from(vec![byte; len])
}

/// Creates `/d/name` with `contents`, durably (data and directory entry).
async fn create_durable(storage: &SimStorage, name: &str, contents: Bytes) -> SimFile {
    storage.create_dir_all(Path::new("/d")).await.expect("mkdir");
    storage.sync_dir(Path::new("/")).await.expect("sync /");
    let file = storage
        .open(&Path::new("/d").join(name), OpenMode::CreateReadWrite, false)
        .await
        .expect("create");
    file.write_at(contents, 0).await.expect("write");
    file.sync_data().await.expect("sync");
    storage.sync_dir(Path::new("/d")).await.expect("sync /d");
    file
}

#[test]
fn rng_is_seeded_and_bounded() {
    let mut a = Rng::new(7);
    let mut b = Rng::new(7);
    let mut c = Rng::new(8);
    let first: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
    assert_eq!(first, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
    assert_ne!(first, (0..8).map(|_| c.next_u64()).collect::<Vec<_>>());
    let mut seen = [0_u32; 5];
    for _ in 0..5000 {
        seen[to_usize(a.below(5))] += 1;
    }
    assert!(seen.iter().all(|&count| (800..1200).contains(&count)), "{seen:?}");
    assert!(!a.chance(0, 3));
    assert!(a.chance(3, 3));
}

#[test]
fn a_synced_write_survives_every_crash() {
    for seed in 0..SEEDS {
        let sim = sim(seed);
        let storage = sim.storage();
        let synced = vec![0x5A; 4096];
        let file = sim.block_on(create_durable(&storage, "f", Bytes::from(synced.clone())));
        // Unsynced writes past and over the synced region must not damage it wherever they
        // land, apart from what they overwrite.
        sim.block_on(file.write_at(block(0xEE, 2048), 4096)).expect("write");
        sim.crash();
        let after = sim.file_contents(Path::new("/d/f")).expect("file survives");
        assert_eq!(&after[..4096], &synced[..], "seed {seed}");
        assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(after));
    }
}

#[test]
fn a_filesystem_sync_makes_every_files_completed_writes_durable_and_only_those() {
    for seed in 0..SEEDS {
        let sim = sim(seed);
        let storage = sim.storage();
        let a = sim.block_on(create_durable(&storage, "a", block(0, 4096)));
        let b = sim.block_on(create_durable(&storage, "b", block(0, 4096)));
        sim.block_on(a.write_at(block(1, 4096), 0)).expect("write");
        sim.block_on(b.write_at(block(2, 4096), 4096)).expect("write");
        sim.block_on(storage.sync_filesystem(Path::new("/d"))).expect("sync");
        sim.block_on(b.write_at(block(3, 4096), 0)).expect("write after the sync");
        sim.crash();
        let a_after = sim.durable_contents(Path::new("/d/a")).expect("a");
        let b_after = sim.durable_contents(Path::new("/d/b")).expect("b");
        assert_eq!(a_after, vec![1; 4096], "seed {seed}");
        assert_eq!(&b_after[4096..], &[2; 4096][..], "seed {seed}");
    }
    // A write-back error on any file it covers fails it, making nothing durable.
    let sim = sim(1);
    let storage = sim.storage();
    let a = sim.block_on(create_durable(&storage, "a", block(0, 4096)));
    let b = sim.block_on(create_durable(&storage, "b", block(0, 4096)));
    sim.block_on(a.write_at(block(1, 4096), 0)).expect("write");
    sim.block_on(b.write_at(block(2, 4096), 0)).expect("write");
    sim.fail_next_sync(Path::new("/d/b"));
    let error = sim.block_on(storage.sync_filesystem(Path::new("/d"))).expect_err("injected");
    assert_eq!(error.raw_os_error(), Some(EIO));
    assert_eq!(sim.durable_contents(Path::new("/d/a")), Some(vec![0; 4096]));
    sim.block_on(storage.sync_filesystem(Path::new("/d"))).expect("the next one");
    assert_eq!(sim.durable_contents(Path::new("/d/b")), Some(vec![2; 4096]));
}

#[test]
fn an_unsynced_write_is_kept_lost_or_torn_across_seeds() {
    let (mut kept, mut lost, mut torn) = (0, 0, 0);
    let mut stats = SimStats::default();
    for seed in 0..SEEDS {
        let sim = Sim::new(seed, SimConfig { torn_write_one_in: 3, ..SimConfig::default() });
        let storage = sim.storage();
        let file = sim.block_on(create_durable(&storage, "f", block(0, 8192)));
        sim.block_on(file.write_at(block(0xAB, 8192), 0)).expect("write");
        assert_eq!(sim.file_contents(Path::new("/d/f")), Some(vec![0xAB; 8192]));
        sim.crash();
        let after = sim.file_contents(Path::new("/d/f")).expect("file survives");
        assert_eq!(after.len(), 8192);
        let sectors: Vec<u8> = after
            .chunks(512)
            .map(|sector| {
                assert!(
                    sector.iter().all(|&b| b == sector[0]),
                    "seed {seed}: a sector tore inside"
                );
                sector[0]
            })
            .collect();
        match (sectors.contains(&0xAB), sectors.contains(&0)) {
            (true, false) => kept += 1,
            (false, true) => lost += 1,
            _ => torn += 1,
        }
        let run = sim.stats();
        stats.writes_kept_at_crash += run.writes_kept_at_crash;
        stats.writes_lost_at_crash += run.writes_lost_at_crash;
        stats.writes_torn_at_crash += run.writes_torn_at_crash;
    }
    println!("kept {kept}, lost {lost}, torn {torn}; {stats:?}");
    assert!(kept > 0 && lost > 0 && torn > 0);
    assert_eq!(stats.writes_kept_at_crash, kept);
    assert_eq!(stats.writes_lost_at_crash, lost);
    assert_eq!(stats.writes_torn_at_crash, torn);
}

#[test]
fn a_sync_covers_only_writes_completed_before_it_was_submitted() {
    for seed in 0..50 {
        let sim = sim(seed);
        let storage = sim.storage();
        let file = Rc::new(sim.block_on(create_durable(&storage, "f", block(0, 4096))));
        let writer = Rc::clone(&file);
        let write = sim.spawn(async move { writer.write_at(block(1, 4096), 0).await });
        let syncer = Rc::clone(&file);
        let sync = sim.spawn(async move { syncer.sync_data().await });
        sim.block_on(async {
            write.await.expect("write");
            sync.await.expect("sync");
        });
        assert_eq!(sim.file_contents(Path::new("/d/f")), Some(vec![1; 4096]));
        assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(vec![0; 4096]), "seed {seed}");
    }
}

/// Runs `change` on a fresh disk holding a durable `/d/a`, optionally syncs `/d`, crashes,
/// and returns whether `/d/a` and `/d/b` exist afterwards.
fn namespace_outcome(seed: u64, change: &str, sync: bool) -> (bool, bool) {
    let sim = sim(seed);
    let storage = sim.storage();
    sim.block_on(async {
        if change == "create" {
            storage.create_dir_all(Path::new("/d")).await.expect("mkdir");
            storage.sync_dir(Path::new("/")).await.expect("sync /");
            storage.sync_dir(Path::new("/d")).await.expect("sync /d");
            let file = storage
                .open(Path::new("/d/a"), OpenMode::CreateReadWrite, false)
                .await
                .expect("create");
            file.write_at(block(3, 10), 0).await.expect("write");
            file.sync_data().await.expect("sync");
        } else {
            drop(create_durable(&storage, "a", block(3, 10)).await);
            match change {
                "rename" => storage.rename(Path::new("/d/a"), Path::new("/d/b")).await,
                "remove" => storage.remove_file(Path::new("/d/a")).await,
                _ => unreachable!(),
            }
            .expect("change");
        }
        if sync {
            storage.sync_dir(Path::new("/d")).await.expect("sync /d");
        }
    });
    sim.crash();
    let a = sim.file_contents(Path::new("/d/a"));
    let b = sim.file_contents(Path::new("/d/b"));
    for contents in [&a, &b].into_iter().flatten() {
        assert_eq!(contents, &vec![3; 10], "seed {seed}: {change}");
    }
    (a.is_some(), b.is_some())
}

#[test]
fn unsynced_namespace_changes_may_or_may_not_survive() {
    for (change, before, after) in [
        ("create", (false, false), (true, false)),
        ("rename", (true, false), (false, true)),
        ("remove", (true, false), (false, false)),
    ] {
        let mut outcomes = BTreeMap::new();
        for seed in 0..SEEDS {
            *outcomes.entry(namespace_outcome(seed, change, false)).or_insert(0) += 1;
        }
        println!("{change}: {outcomes:?}");
        assert_eq!(outcomes.len(), 2, "{change}: {outcomes:?}");
        assert!(outcomes[&before] > 0 && outcomes[&after] > 0, "{change}: {outcomes:?}");
    }
}

#[test]
fn synced_namespace_changes_always_survive() {
    for seed in 0..SEEDS {
        assert_eq!(namespace_outcome(seed, "create", true), (true, false), "seed {seed}");
        assert_eq!(namespace_outcome(seed, "rename", true), (false, true), "seed {seed}");
        assert_eq!(namespace_outcome(seed, "remove", true), (false, false), "seed {seed}");
    }
}

#[test]
fn an_unsynced_directory_takes_its_synced_entries_with_it() {
    let mut outcomes = BTreeSet::new();
    for seed in 0..50 {
        let sim = sim(seed);
        let storage = sim.storage();
        sim.block_on(async {
            storage.create_dir_all(Path::new("/x/y")).await.expect("mkdir");
            storage.sync_dir(Path::new("/x")).await.expect("sync /x");
            let file = storage
                .open(Path::new("/x/y/f"), OpenMode::CreateReadWrite, false)
                .await
                .expect("create");
            file.sync_data().await.expect("sync");
            storage.sync_dir(Path::new("/x/y")).await.expect("sync /x/y");
        });
        sim.crash();
        let paths = sim.paths();
        assert!(paths.is_empty() || paths.len() == 3, "seed {seed}: {paths:?}");
        outcomes.insert(paths.len());
    }
    assert_eq!(outcomes, BTreeSet::from([0, 3]));
}

/// Every visible path with what a read of it sees.
type Observed = Vec<(PathBuf, Option<Vec<u8>>)>;

/// A workload with several writes in flight, crashed part way; returns everything a test
/// could observe.
fn crashed_workload(seed: u64) -> (SimStats, Observed) {
    let sim = sim(seed);
    let storage = sim.storage();
    let spawner = sim.spawner();
    let finished = sim.run_until_crash(
        async move {
            storage.create_dir_all(Path::new("/d")).await.expect("mkdir");
            let file = Rc::new(
                storage
                    .open(Path::new("/d/log"), OpenMode::CreateReadWrite, true)
                    .await
                    .expect("open"),
            );
            for round in 0..4_u8 {
                let writes: Vec<_> = (0..4_u8)
                    .map(|i| {
                        let file = Rc::clone(&file);
                        let offset = u64::from(round * 4 + i) * 4096;
                        spawner.spawn(async move {
                            file.write_at(block(round * 4 + i + 1, 4096), offset).await
                        })
                    })
                    .collect();
                for write in writes {
                    write.await.expect("write");
                }
                file.sync_data().await.expect("sync");
                storage.sync_dir(Path::new("/d")).await.expect("sync dir");
            }
        },
        14,
    );
    assert!(finished.is_none(), "the workload needs more than 14 completions");
    let observed = sim.paths().into_iter().map(|p| (p.clone(), sim.file_contents(&p))).collect();
    (sim.stats(), observed)
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let mut distinct = BTreeSet::new();
    for seed in 0..20 {
        let first = crashed_workload(seed);
        assert_eq!(first, crashed_workload(seed), "seed {seed}");
        assert_eq!(first.0.crashes, 1);
        assert_eq!(first.0.io_completions, 14);
        distinct.insert(format!("{first:?}"));
    }
    assert!(distinct.len() > 1, "every seed ran the same");
}

#[test]
fn concurrent_writes_complete_in_seeded_order() {
    let mut winners = BTreeMap::new();
    for seed in 0..50 {
        let sim = sim(seed);
        let storage = sim.storage();
        let file = Rc::new(sim.block_on(create_durable(&storage, "f", block(0, 512))));
        let handles: Vec<_> = [1_u8, 2]
            .into_iter()
            .map(|byte| {
                let file = Rc::clone(&file);
                sim.spawn(async move { file.write_at(block(byte, 512), 0).await })
            })
            .collect();
        sim.block_on(async {
            for handle in handles {
                handle.await.expect("write");
            }
        });
        let last = sim.file_contents(Path::new("/d/f")).expect("file")[0];
        *winners.entry(last).or_insert(0) += 1;
    }
    println!("last writer: {winners:?}");
    assert_eq!(winners.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn enospc_at_exactly_the_capacity() {
    let sim = Sim::new(1, SimConfig { capacity_bytes: 8192, ..SimConfig::default() });
    let storage = sim.storage();
    sim.block_on(async {
        let a = storage.open(Path::new("/a"), OpenMode::CreateReadWrite, false).await.expect("a");
        let b = storage.open(Path::new("/b"), OpenMode::CreateReadWrite, false).await.expect("b");
        a.write_at(block(1, 4096), 0).await.expect("a fits");
        b.write_at(block(2, 4095), 0).await.expect("b fits");
        b.write_at(block(2, 1), 4095).await.expect("the last byte fits");
        let error = b.write_at(block(2, 1), 4096).await.expect_err("one byte more");
        assert_eq!(error.kind(), io::ErrorKind::StorageFull);
        assert_eq!(error.raw_os_error(), Some(ENOSPC));
        // Overwriting in place needs no space.
        a.write_at(block(3, 4096), 0).await.expect("overwrite");
        assert_eq!(b.size_bytes().await.expect("size"), 4096);
    });
    assert_eq!(sim.stats().enospc_errors, 1);
}

#[test]
fn read_errors_appear_at_the_configured_rate() {
    let sim = Sim::new(9, SimConfig { read_error_one_in: 10, ..SimConfig::default() });
    let storage = sim.storage();
    let failures = sim.block_on(async {
        let file = create_durable(&storage, "f", block(7, 100)).await;
        let mut failures = 0;
        let mut buf = AlignedBuf::zeroed(4096, 4096);
        for _ in 0..2000 {
            let (result, back) = file.read_at(buf, 0).await;
            buf = back;
            match result {
                Ok(()) => assert_eq!(buf.as_slice(), &[7; 100][..]),
                Err(error) => {
                    assert_eq!(error.raw_os_error(), Some(EIO));
                    failures += 1;
                }
            }
        }
        failures
    });
    println!("{failures} of 2000 reads failed");
    assert!((120..=280).contains(&failures), "{failures}");
    assert_eq!(sim.stats().read_errors, failures);
}

#[test]
fn reads_past_the_end_are_short() {
    let sim = sim(3);
    let storage = sim.storage();
    sim.block_on(async {
        let file = create_durable(&storage, "f", block(7, 100)).await;
        let (result, buf) = file.read_at(AlignedBuf::zeroed(64, 1), 90).await;
        result.expect("read");
        assert_eq!(buf.as_slice(), &[7; 10][..]);
        let (result, buf) = file.read_at(buf, 1000).await;
        result.expect("read");
        assert!(buf.is_empty());
    });
}

#[test]
fn corrupt_flips_exactly_one_bit() {
    let sim = sim(4);
    let storage = sim.storage();
    drop(sim.block_on(create_durable(&storage, "f", block(0x0F, 4096))));
    sim.corrupt(Path::new("/d/f"), 1000, 6);
    for contents in [sim.file_contents(Path::new("/d/f")), sim.durable_contents(Path::new("/d/f"))]
    {
        let contents = contents.expect("file");
        let flipped: u32 = contents.iter().map(|&b| (b ^ 0x0F).count_ones()).sum();
        assert_eq!(flipped, 1);
        assert_eq!(contents[1000], 0x4F);
    }
    assert_eq!(sim.stats().bit_flips, 1);
}

#[test]
fn injected_write_and_sync_errors_fail_once_without_effect() {
    let sim = sim(5);
    let storage = sim.storage();
    let file = sim.block_on(create_durable(&storage, "f", block(1, 10)));
    sim.fail_next_write(Path::new("/d/f"));
    sim.fail_next_sync(Path::new("/d/f"));
    sim.block_on(async {
        let error = file.write_at(block(2, 10), 0).await.expect_err("injected");
        assert_eq!(error.raw_os_error(), Some(EIO));
        file.write_at(block(3, 10), 0).await.expect("next write");
        file.sync_data().await.expect_err("injected");
    });
    assert_eq!(sim.file_contents(Path::new("/d/f")), Some(vec![3; 10]));
    assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(vec![1; 10]));
    sim.block_on(file.sync_data()).expect("next sync");
    assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(vec![3; 10]));
    assert_eq!(sim.stats().injected_errors, 2);
}

#[test]
fn handles_from_before_a_crash_are_dead() {
    let sim = sim(6);
    let storage = sim.storage();
    let file = sim.block_on(create_durable(&storage, "f", block(1, 10)));
    sim.crash();
    assert!(sim.block_on(file.write_at(block(2, 1), 0)).is_err());
    assert!(sim.block_on(file.sync_data()).is_err());
    assert!(sim.block_on(file.size_bytes()).is_err());
    let reopened =
        sim.block_on(storage.open(Path::new("/d/f"), OpenMode::Read, false)).expect("open");
    assert_eq!(sim.block_on(reopened.size_bytes()).expect("size"), 10);
    assert!(sim.block_on(reopened.write_at(block(2, 1), 0)).is_err(), "read-only");
}

#[test]
fn run_until_crash_returns_the_output_when_the_future_finishes_first() {
    let sim = sim(7);
    let storage = sim.storage();
    let output = sim
        .run_until_crash(async { storage.create_dir_all(Path::new("/d")).await.map(|()| 42) }, 5);
    assert_eq!(output.map(Result::unwrap), Some(42));
    assert_eq!(sim.stats().crashes, 0);
    assert!(sim.run_until_crash(storage.sync_dir(Path::new("/")), 0).is_none());
    assert_eq!(sim.stats().crashes, 1);
}

#[test]
fn metadata_follows_the_visible_namespace() {
    let sim = sim(8);
    let storage = sim.storage();
    sim.block_on(async {
        storage.create_dir_all(Path::new("/d/sub")).await.expect("mkdir");
        for name in ["b", "a", "c"] {
            storage
                .open(&Path::new("/d").join(name), OpenMode::CreateReadWrite, false)
                .await
                .expect("create");
        }
        assert_eq!(storage.list_dir(Path::new("/d")).await.expect("list"), ["a", "b", "c", "sub"]);
        storage.remove_file(Path::new("/d/b")).await.expect("remove");
        assert!(!storage.exists(Path::new("/d/b")).await.expect("exists"));
        assert!(storage.exists(Path::new("/d/sub")).await.expect("exists"));
        let missing =
            storage.open(Path::new("/d/b"), OpenMode::ReadWrite, false).await.expect_err("gone");
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        let orphan = storage
            .open(Path::new("/nope/f"), OpenMode::CreateReadWrite, false)
            .await
            .expect_err("no dir");
        assert_eq!(orphan.kind(), io::ErrorKind::NotFound);
    });
}

#[test]
fn a_write_in_flight_at_a_crash_may_land() {
    let mut both_landed = 0;
    for seed in 0..SEEDS {
        let sim = sim(seed);
        let storage = sim.storage();
        let spawner = sim.spawner();
        // `create_durable` takes six completions; the seventh completes one of the two
        // writes and the crash comes before the other has completed.
        let crashed = sim.run_until_crash(
            async {
                let file = Rc::new(create_durable(&storage, "f", block(0, 1024)).await);
                let other = Rc::clone(&file);
                let first = spawner.spawn(async move { other.write_at(block(9, 512), 0).await });
                file.write_at(block(9, 512), 512).await.expect("write");
                first.await.expect("write");
            },
            7,
        );
        assert!(crashed.is_none());
        let after = sim.file_contents(Path::new("/d/f")).expect("durable file");
        if after.iter().all(|&b| b == 9) {
            both_landed += 1;
        }
    }
    println!("both writes landed for {both_landed} of {SEEDS} seeds");
    assert!(both_landed > 0);
}

#[test]
fn a_removed_file_stays_readable_while_open() {
    let sim = sim(2);
    let storage = sim.storage();
    sim.block_on(async {
        let file = create_durable(&storage, "f", block(4, 64)).await;
        storage.remove_file(Path::new("/d/f")).await.expect("remove");
        storage.sync_dir(Path::new("/d")).await.expect("sync /d");
        let (result, buf) = file.read_at(AlignedBuf::zeroed(64, 1), 0).await;
        result.expect("read");
        assert_eq!(buf.as_slice(), &[4; 64][..]);
    });
    assert!(sim.paths().iter().all(|p| p != Path::new("/d/f")));
    // The handle is gone now; the next collection frees the bytes.
    sim.block_on(storage.sync_dir(Path::new("/d"))).expect("sync /d");
    assert_eq!(sim.shared.disk.borrow().files.len(), 0);
}

#[test]
#[should_panic(expected = "misaligned direct write")]
fn a_misaligned_direct_write_panics() {
    let sim = sim(0);
    let storage = sim.storage();
    sim.block_on(async {
        let file =
            storage.open(Path::new("/f"), OpenMode::CreateReadWrite, true).await.expect("open");
        assert_eq!(file.alignment_bytes(), 4096);
        let _ = file.write_at(block(1, 4096), 512).await;
    });
}

#[test]
#[should_panic(expected = "stalled")]
fn a_stalled_simulation_panics() {
    sim(0).block_on(std::future::pending::<()>());
}
