//! `shoal-inspect` end to end: data directories built by the engine itself on the real
//! filesystem, damaged on purpose, and checked through the binary's exit status and output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::{ChainNext, build_prepare};
use shoal_engine::shard::{ShardConfig, ShardStore, group_dir, shard_dir};
use shoal_engine::state::GroupState;
use shoal_engine::storage::std_fs::{StdStorage, block_on};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::wire::Prepare;

const REPLICATED: u64 = 7;
const PERSISTED: u64 = 8;
const PREPARES: u64 = 300;
const RECORDS_PER_PREPARE: u64 = 4;

/// A data directory with one shard holding a replicated and a persisted group, each with
/// `PREPARES` prepares over several 1 MiB segments, closed cleanly (so all is checkpointed).
/// The persisted group goes through the journal (its one group would otherwise take the direct
/// path), so the report has journal entries to show.
fn build() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let dir = shard_dir(data.path(), 0);
    let config = ShardConfig { persisted_path: PersistedPath::Journal, ..ShardConfig::small() };
    let (mut shard, _) = block_on(ShardStore::open(StdStorage, &dir, config)).unwrap();
    for (group, durability) in
        [(REPLICATED, Durability::Replicated), (PERSISTED, Durability::Persisted)]
    {
        let config = GroupConfig {
            durability,
            segment_size_bytes: 1 << 20,
            record_size_bytes_max: 64 << 10,
            ..GroupConfig::default()
        };
        block_on(shard.create_group(group, config)).unwrap();
    }
    for i in 0..PREPARES {
        for group in [REPLICATED, PERSISTED] {
            let time = 1_700_000_000_000 + i as i64;
            let mut builder = BatchBuilder::new(time);
            for _ in 0..RECORDS_PER_PREPARE {
                builder.push(time, Some(b"key"), Some(&[b'v'; 2500]), &[]);
            }
            let body = builder.build();
            let fields = Prepare {
                record_count: RECORDS_PER_PREPARE as u32,
                append_time_ms: time,
                ..Prepare::default()
            };
            let header = build_prepare(&shard.next(group).unwrap(), 1, 0, fields, &body);
            shard.append(group, &header, &body).unwrap();
        }
        if i % 20 == 19 {
            block_on(shard.flush()).unwrap();
        }
    }
    block_on(shard.flush()).unwrap();
    block_on(shard.close()).unwrap();
    data
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shoal-inspect")).args(args).output().unwrap()
}

fn inspect_json(path: &Path) -> (i32, Value) {
    let output = run(&[path.as_os_str(), "--json".as_ref()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let json = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!("not JSON ({error}): {}", String::from_utf8_lossy(&output.stdout))
    });
    (output.status.code().expect("exited"), json)
}

fn group(report: &Value, id: u64) -> &Value {
    report["shards"][0]["groups"].as_array().unwrap().iter().find(|g| g["group"] == id).unwrap()
}

fn segments(report: &Value, id: u64) -> Vec<Value> {
    group(report, id)["segments"].as_array().unwrap().clone()
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

#[test]
fn clean_directory_exits_0_with_the_segment_ranges() {
    let data = build();
    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["clean"], true);
    assert!(report["first_corruption"].is_null());
    assert_eq!(report["problems"].as_array().unwrap().len(), 0);
    let superblock = &report["shards"][0]["superblock"];
    assert_eq!(superblock["copies"].as_array().unwrap().len(), 4);
    assert!(superblock["copies"].as_array().unwrap().iter().all(|c| c["current"] == true));
    for id in [REPLICATED, PERSISTED] {
        let g = group(&report, id);
        assert_eq!((u(&g["first_op"]), u(&g["last_op"])), (1, PREPARES));
        assert_eq!(
            (u(&g["first_offset"]), u(&g["next_offset"])),
            (0, PREPARES * RECORDS_PER_PREPARE)
        );
        assert_eq!(u(&g["records"]), PREPARES);
        let checkpoint = &g["slot"]["checkpoint"];
        assert_eq!(u(&checkpoint["op"]), PREPARES);
        let segments = segments(&report, id);
        assert!(segments.len() >= 3, "300 x ~10 KiB in 1 MiB segments: {}", segments.len());
        // Dense offsets: each segment starts where the previous one ends, and is named so.
        let mut expected_base = 0;
        for (i, segment) in segments.iter().enumerate() {
            assert_eq!(u(&segment["base_offset"]), expected_base);
            assert_eq!(u(&segment["first_offset"]), expected_base);
            assert!(
                Path::new(segment["file"].as_str().unwrap())
                    .ends_with(format!("{expected_base:020}.log"))
            );
            assert!(u(&segment["valid_bytes"]) <= u(&segment["file_size_bytes"]));
            assert_eq!(segment["end"]["state"], "clean");
            let sealed = i + 1 < segments.len();
            assert_eq!(segment["index"]["state"], if sealed { "ok" } else { "missing" });
            expected_base = u(&segment["next_offset"]);
        }
        assert_eq!(expected_base, PREPARES * RECORDS_PER_PREPARE);
        assert_eq!(
            g["slot"]["durability"],
            if id == PERSISTED { "persisted" } else { "replicated" }
        );
    }
    assert!(u(&report["shards"][0]["journal"]["entries_valid"]) > 0);

    let text = run(&[data.path().as_os_str()]);
    assert_eq!(text.status.code(), Some(0));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("00000000000000000000.log"), "{text}");
    assert!(text.contains("result: clean"), "{text}");
    // A shard directory inspects on its own too.
    let (code, _) = inspect_json(&shard_dir(data.path(), 0));
    assert_eq!(code, 0);
}

#[test]
fn flipped_byte_before_the_checkpoint_exits_1_naming_file_position_and_offset() {
    let data = build();
    let (_, clean) = inspect_json(data.path());
    let segment = segments(&clean, REPLICATED)[1].clone();
    let file = PathBuf::from(segment["file"].as_str().unwrap());
    let flipped = u(&segment["valid_bytes"]) / 2;
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[flipped as usize] ^= 0x10;
    std::fs::write(&file, bytes).unwrap();

    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 1, "{report:#}");
    let first = &report["first_corruption"];
    assert_eq!(first["file"].as_str().unwrap(), file.to_str().unwrap());
    let position = u(&first["position_bytes"]);
    // The damaged record starts at or before the flipped byte, and no record is longer than
    // the group's bound.
    assert!(position <= flipped && flipped - position < 64 << 10, "{first}");
    let offset = u(&first["offset"]);
    assert!((u(&segment["first_offset"])..u(&segment["next_offset"])).contains(&offset), "{first}");
    assert!(first["op"].is_u64());

    let text = run(&[data.path().as_os_str()]);
    assert_eq!(text.status.code(), Some(1));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("CORRUPTION FOUND"), "{text}");
    assert!(text.contains(&format!("offset {offset}")), "{text}");
}

#[test]
fn torn_superblock_copy_exits_1_but_everything_else_is_still_checked() {
    let data = build();
    let (_, clean) = inspect_json(data.path());
    let copy_size = u(&clean["shards"][0]["superblock"]["copy_size_bytes"]) as usize;
    let path = shard_dir(data.path(), 0).join("superblock");
    let mut bytes = std::fs::read(&path).unwrap();
    for (i, byte) in bytes[copy_size..2 * copy_size].iter_mut().enumerate() {
        *byte = (i * 7 + 13) as u8;
    }
    std::fs::write(&path, bytes).unwrap();

    let (code, report) = inspect_json(data.path());
    // One bad copy loses no data, but the shard has one copy less between it and a lost
    // superblock: an operator must hear of it, so it counts as a problem.
    assert_eq!(code, 1, "{report:#}");
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{report:#}");
    assert!(problems[0]["reason"].as_str().unwrap().contains("superblock copy 1 invalid"));
    assert_eq!(u(&problems[0]["position_bytes"]), copy_size as u64);
    let copies = report["shards"][0]["superblock"]["copies"].as_array().unwrap();
    assert_eq!(copies[1]["valid"], false);
    assert_eq!(copies[0]["current"], true);
    assert_eq!(u(&group(&report, PERSISTED)["last_op"]), PREPARES);
}

#[test]
fn segment_cut_mid_record_before_the_checkpoint_exits_1() {
    let data = build();
    let (_, clean) = inspect_json(data.path());
    let last = segments(&clean, PERSISTED).last().unwrap().clone();
    let file = PathBuf::from(last["file"].as_str().unwrap());
    let cut = u(&last["valid_bytes"]) / 2 + 100;
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(cut).unwrap();

    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 1, "{report:#}");
    let first = &report["first_corruption"];
    assert_eq!(first["file"].as_str().unwrap(), file.to_str().unwrap());
    assert!(u(&first["position_bytes"]) <= cut);
    assert!(first["reason"].as_str().unwrap().contains("cut short"), "{first}");
}

#[test]
fn missing_directory_and_bad_usage_exit_2() {
    let data = tempfile::tempdir().unwrap();
    let missing = data.path().join("nope");
    let output = run(&[missing.as_os_str()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");

    // A directory that is not a data directory.
    let output = run(&[data.path().as_os_str()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("neither shard directories"));

    let (code, report) = inspect_json(&missing);
    assert_eq!(code, 2);
    assert!(report["error"].is_string());

    assert_eq!(run(&[]).status.code(), Some(2));
    assert_eq!(run(&["--frobnicate".as_ref()]).status.code(), Some(2));
    assert_eq!(run(&["a".as_ref(), "b".as_ref()]).status.code(), Some(2));
    assert_eq!(run(&["--help".as_ref()]).status.code(), Some(0));
}

#[test]
fn garbage_files_named_like_segments_never_panic() {
    let data = build();
    let dir = group_dir(&shard_dir(data.path(), 0), REPLICATED);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let garbage: Vec<u8> = (0..700_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    // Past the chain's end: a leftover, a note.
    std::fs::write(dir.join(format!("{:020}.log", 99_999_999)), &garbage).unwrap();
    std::fs::write(dir.join(format!("{:020}.index", 99_999_999)), &garbage).unwrap();
    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 0, "{report:#}");
    assert!(!report["notes"].as_array().unwrap().is_empty());

    // In the middle of the log: the chain breaks there.
    let first = segments(&report, REPLICATED)[0]["file"].as_str().unwrap().to_string();
    std::fs::write(&first, &garbage).unwrap();
    std::fs::write(Path::new(&first).with_extension("index"), &garbage[..1000]).unwrap();
    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["first_corruption"]["file"].as_str().unwrap(), first);
    assert_eq!(u(&report["first_corruption"]["position_bytes"]), 0);

    // Every file of the shard replaced by garbage, and empty files.
    for entry in std::fs::read_dir(shard_dir(data.path(), 0)).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::write(&path, &garbage).unwrap();
        }
    }
    std::fs::write(dir.join(format!("{:020}.log", 5)), b"").unwrap();
    let (code, _) = inspect_json(data.path());
    assert_eq!(code, 1);
    for entry in std::fs::read_dir(shard_dir(data.path(), 0)).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::write(&path, b"").unwrap();
        }
    }
    let (code, _) = inspect_json(data.path());
    assert_eq!(code, 1);
}

#[test]
fn log_installed_by_a_state_transfer_is_clean_and_shown_and_a_staged_leftover_is_a_note() {
    let data = build();
    let dir = shard_dir(data.path(), 0);
    let (mut shard, _) =
        block_on(ShardStore::open(StdStorage, &dir, ShardConfig::small())).unwrap();
    // Op S of a peer whose log retention began far ahead of this one.
    let s = PREPARES + 50;
    let base = 10_000;
    let next = ChainNext { cluster: 0, group: REPLICATED, op: s, parent: 0x5eed, offset: base };
    let mut builder = BatchBuilder::new(1_700_000_100_000);
    for _ in 0..RECORDS_PER_PREPARE {
        builder.push(1_700_000_100_000, Some(b"key"), Some(&[b'p'; 700]), &[]);
    }
    let body = builder.build();
    let fields = Prepare {
        record_count: RECORDS_PER_PREPARE as u32,
        append_time_ms: 1_700_000_100_000,
        ..Prepare::default()
    };
    let header = build_prepare(&next, 3, 1, fields, &body);
    let end_offset = base + RECORDS_PER_PREPARE;
    let state = GroupState { op: s, end_offset, bytes: b"peer state".to_vec() };
    block_on(shard.install_transfer(REPLICATED, &header, &body, &state)).unwrap();
    block_on(shard.close()).unwrap();
    // An install that never reached its commit point leaves its staged files behind.
    let group_path = group_dir(&dir, REPLICATED);
    std::fs::write(group_path.join("transfer-state.staged"), b"half written").unwrap();

    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 0, "{report:#}");
    let g = group(&report, REPLICATED);
    assert_eq!((u(&g["first_op"]), u(&g["last_op"])), (s, s));
    assert_eq!((u(&g["first_offset"]), u(&g["next_offset"])), (base, end_offset));
    assert_eq!(g["slot"]["transfer_pending"], false);
    assert_eq!(
        (u(&g["transfer_state"]["op"]), u(&g["transfer_state"]["end_offset"])),
        (s, end_offset)
    );
    let segments = segments(&report, REPLICATED);
    assert_eq!(segments.len(), 1);
    assert!(segments[0]["file"].as_str().unwrap().ends_with(&format!("{base:020}.log")));
    let notes = report["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n["message"].as_str().unwrap().contains("leftover of a state transfer")),
        "{notes:#?}"
    );
    let text = String::from_utf8(run(&[data.path().as_os_str()]).stdout).unwrap();
    assert!(text.contains("installed by a state transfer"), "{text}");

    // The transferred state is checked like the group's own snapshot.
    let path = group_path.join("transfer-state");
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[10] ^= 1;
    std::fs::write(&path, &damaged).unwrap();
    let (code, report) = inspect_json(data.path());
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["first_corruption"]["file"].as_str().unwrap(), path.to_str().unwrap());
}
