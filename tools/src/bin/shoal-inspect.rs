//! `shoal-inspect`: verifies a Shoal data directory (or one shard directory) offline and reports
//! what it holds and where the first damage lies.
//!
//! It runs the engine's checker (`shoal_engine::inspect`) over read-only memory maps
//! (`shoal_tools::mapped`), so it needs no io_uring runtime and cannot write. Exit status: 0 when clean, 1 when
//! a problem was found, 2 on a usage error or a path that cannot be inspected.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use serde::Serialize;
use shoal_engine::Corruption;
use shoal_engine::inspect::{
    CopyReport, GroupReport, IndexStatus, InspectReport, JournalReport, Note, SegmentEnd,
    SegmentReport, ShardReport, SuperblockReport, inspect,
};
use shoal_engine::storage::std_fs::block_on;
use shoal_engine::superblock::{Durability, GroupSlot, Identity};
use shoal_tools::mapped::MappedStorage;

const EXIT_CLEAN: u8 = 0;
const EXIT_PROBLEMS: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// A parsed command line.
#[derive(Debug, Parser)]
#[command(
    max_term_width = 100,
    name = "shoal-inspect",
    about = "Verifies a Shoal data directory (holding shard-N directories) or a single shard \
             directory: superblock copies, every group's segments and indexes, and the shard \
             journal. Never writes.",
    after_help = "exit status: 0 clean, 1 problems found, 2 usage error or unreadable path",
    // `--json` given twice is still JSON, as it always was.
    args_override_self = true
)]
struct Args {
    /// The data directory or shard directory
    #[arg(value_name = "data-dir")]
    path: PathBuf,
    /// Print the report as JSON instead of text
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let report = block_on(inspect(&MappedStorage, &args.path));
    let text = if args.json {
        // Through a `Value`, whose keys print sorted, as they always did.
        let mut text = serde_json::to_value(ReportJson::of(&report))
            .and_then(|value| serde_json::to_string_pretty(&value))
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot encode the report: {e}\"}}"));
        text.push('\n');
        text
    } else {
        human(&report)
    };
    // A closed pipe (`shoal-inspect ... | head`) must not turn into a panic; the exit status
    // still tells the verdict.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    if let Some(error) = &report.error {
        eprintln!("shoal-inspect: {error}");
        return ExitCode::from(EXIT_USAGE);
    }
    ExitCode::from(if report.is_clean() { EXIT_CLEAN } else { EXIT_PROBLEMS })
}

// ---------------------------------------------------------------------------------------------
// JSON: views of the report, one struct per object, serialized by serde
// ---------------------------------------------------------------------------------------------

/// The whole report (`--json`).
#[derive(Serialize)]
struct ReportJson<'a> {
    path: String,
    clean: bool,
    error: &'a Option<String>,
    first_corruption: Option<CorruptionJson<'a>>,
    problems: Vec<CorruptionJson<'a>>,
    notes: Vec<NoteJson<'a>>,
    shards: Vec<ShardJson<'a>>,
}

impl<'a> ReportJson<'a> {
    fn of(report: &'a InspectReport) -> Self {
        ReportJson {
            path: report.path.display().to_string(),
            clean: report.is_clean(),
            error: &report.error,
            first_corruption: report.first_corruption().map(CorruptionJson::of),
            problems: report.problems.iter().map(CorruptionJson::of).collect(),
            notes: report.notes.iter().map(NoteJson::of).collect(),
            shards: report.shards.iter().map(ShardJson::of).collect(),
        }
    }
}

#[derive(Serialize)]
struct CorruptionJson<'a> {
    file: String,
    position_bytes: u64,
    offset: Option<u64>,
    op: Option<u64>,
    reason: &'a str,
}

impl<'a> CorruptionJson<'a> {
    fn of(corruption: &'a Corruption) -> Self {
        CorruptionJson {
            file: corruption.file.display().to_string(),
            position_bytes: corruption.position_bytes,
            offset: corruption.offset,
            op: corruption.op,
            reason: &corruption.reason,
        }
    }
}

#[derive(Serialize)]
struct NoteJson<'a> {
    file: String,
    position_bytes: Option<u64>,
    message: &'a str,
}

impl<'a> NoteJson<'a> {
    fn of(note: &'a Note) -> Self {
        NoteJson {
            file: note.file.display().to_string(),
            position_bytes: note.position_bytes,
            message: &note.message,
        }
    }
}

#[derive(Serialize)]
struct IdentityJson {
    cluster: u64,
    node: u64,
    shard: u32,
    shard_count: u32,
}

impl IdentityJson {
    fn of(identity: &Identity) -> Self {
        IdentityJson {
            cluster: identity.cluster,
            node: identity.node,
            shard: identity.shard,
            shard_count: identity.shard_count,
        }
    }
}

#[derive(Serialize)]
struct ShardJson<'a> {
    dir: String,
    shard: Option<u32>,
    superblock: SuperblockJson,
    groups: Vec<GroupJson<'a>>,
    journal: Option<JournalJson>,
}

impl<'a> ShardJson<'a> {
    fn of(shard: &'a ShardReport) -> Self {
        ShardJson {
            dir: shard.dir.display().to_string(),
            shard: shard.shard,
            superblock: SuperblockJson::of(&shard.superblock),
            groups: shard.groups.iter().map(GroupJson::of).collect(),
            journal: shard.journal.as_ref().map(JournalJson::of),
        }
    }
}

/// The superblock: its file, the copies, and the newest valid state's identity.
#[derive(Serialize)]
struct SuperblockJson {
    file: String,
    file_size_bytes: u64,
    copy_size_bytes: u64,
    newest: Option<usize>,
    sequence: Option<u64>,
    clean_shutdown: Option<bool>,
    identity: Option<IdentityJson>,
    copies: Vec<CopyJson>,
}

impl SuperblockJson {
    fn of(superblock: &SuperblockReport) -> Self {
        let state = superblock.state.as_ref();
        SuperblockJson {
            file: superblock.file.display().to_string(),
            file_size_bytes: superblock.file_size_bytes,
            copy_size_bytes: superblock.copy_size_bytes,
            newest: superblock.newest,
            sequence: state.map(|s| s.sequence),
            clean_shutdown: state.map(|s| s.clean_shutdown),
            identity: state.map(|s| IdentityJson::of(&s.identity)),
            copies: superblock.copies.iter().map(CopyJson::of).collect(),
        }
    }
}

/// One superblock copy: a valid one with what it holds, or why it is not valid.
#[derive(Serialize)]
#[serde(untagged)]
enum CopyJson {
    Valid {
        index: usize,
        position_bytes: u64,
        valid: bool,
        current: bool,
        sequence: u64,
        checksum: u32,
        parent: u32,
        identity: IdentityJson,
        slot_count: usize,
        slots_max: usize,
    },
    Invalid {
        index: usize,
        position_bytes: u64,
        valid: bool,
        reason: String,
    },
}

impl CopyJson {
    fn of(copy: &CopyReport) -> Self {
        match &copy.status {
            Ok(info) => CopyJson::Valid {
                index: copy.index,
                position_bytes: copy.position_bytes,
                valid: true,
                current: info.current,
                sequence: info.sequence,
                checksum: info.checksum,
                parent: info.parent,
                identity: IdentityJson::of(&info.identity),
                slot_count: info.slot_count,
                slots_max: info.slots_max,
            },
            Err(reason) => CopyJson::Invalid {
                index: copy.index,
                position_bytes: copy.position_bytes,
                valid: false,
                reason: reason.clone(),
            },
        }
    }
}

/// A group's superblock slot: the fields an operator reads.
#[derive(Serialize)]
struct SlotJson {
    durability: Durability,
    view: u32,
    log_view: u32,
    log_view_head_op: Option<u64>,
    checkpoint: CheckpointJson,
    fence: FenceJson,
    transfer_pending: bool,
    config: SlotConfigJson,
}

#[derive(Serialize)]
struct CheckpointJson {
    op: u64,
    checksum: u32,
    next_offset: u64,
    segment_base_offset: u64,
    position_bytes: u64,
}

#[derive(Serialize)]
struct FenceJson {
    op: u64,
    view: u32,
}

#[derive(Serialize)]
struct SlotConfigJson {
    segment_size_bytes: u64,
    segment_age_ms_max: u64,
    retention_bytes: u64,
    retention_ms: u64,
    record_size_bytes_max: u32,
}

impl SlotJson {
    fn of(slot: &GroupSlot) -> Self {
        let (checkpoint, config) = (&slot.checkpoint, &slot.config);
        SlotJson {
            durability: config.durability,
            view: slot.view,
            log_view: slot.log_view,
            log_view_head_op: slot.log_view_head_op,
            checkpoint: CheckpointJson {
                op: checkpoint.op,
                checksum: checkpoint.checksum,
                next_offset: checkpoint.next_offset,
                segment_base_offset: checkpoint.segment_base_offset,
                position_bytes: checkpoint.position_bytes,
            },
            fence: FenceJson { op: slot.fence.op, view: slot.fence.view },
            transfer_pending: slot.transfer_pending,
            config: SlotConfigJson {
                segment_size_bytes: config.segment_size_bytes,
                segment_age_ms_max: config.segment_age_ms_max,
                retention_bytes: config.retention_bytes,
                retention_ms: config.retention_ms,
                record_size_bytes_max: config.record_size_bytes_max,
            },
        }
    }
}

#[derive(Serialize)]
struct GroupJson<'a> {
    group: u64,
    dir: String,
    slot: Option<SlotJson>,
    first_op: Option<u64>,
    last_op: Option<u64>,
    first_offset: Option<u64>,
    next_offset: Option<u64>,
    records: u64,
    valid_bytes: u64,
    transfer_state: Option<TransferStateJson>,
    segments: Vec<SegmentJson<'a>>,
}

#[derive(Serialize)]
struct TransferStateJson {
    op: u64,
    end_offset: u64,
}

impl<'a> GroupJson<'a> {
    fn of(group: &'a GroupReport) -> Self {
        GroupJson {
            group: group.group,
            dir: group.dir.display().to_string(),
            slot: group.slot.as_ref().map(SlotJson::of),
            first_op: group.first_op,
            last_op: group.last_op,
            first_offset: group.first_offset,
            next_offset: group.next_offset,
            records: group.records,
            valid_bytes: group.valid_bytes,
            transfer_state: group
                .transfer_state
                .map(|(op, end_offset)| TransferStateJson { op, end_offset }),
            segments: group.segments.iter().map(SegmentJson::of).collect(),
        }
    }
}

#[derive(Serialize)]
struct SegmentJson<'a> {
    file: String,
    base_offset: u64,
    file_size_bytes: u64,
    valid_bytes: u64,
    records: u64,
    damaged_records: u64,
    first_op: Option<u64>,
    last_op: Option<u64>,
    first_offset: Option<u64>,
    next_offset: Option<u64>,
    leftover: bool,
    end: EndJson<'a>,
    index: IndexJson<'a>,
}

/// How a segment's records end, tagged by `state`.
#[derive(Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum EndJson<'a> {
    Clean,
    DataAfterEnd { position_bytes: u64, reason: &'a str, corruption: bool },
    Unreadable { reason: &'a str },
    NotScanned,
}

/// The segment's index file against a rebuild, tagged by `state`.
#[derive(Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum IndexJson<'a> {
    Missing,
    Ok { entries: usize },
    Damaged { reason: &'a str },
    Disagrees { reason: &'a str },
    NotCompared { entries: usize },
}

impl<'a> SegmentJson<'a> {
    fn of(segment: &'a SegmentReport) -> Self {
        let end = match &segment.end {
            SegmentEnd::Clean => EndJson::Clean,
            SegmentEnd::DataAfterEnd { position_bytes, reason, corruption } => {
                EndJson::DataAfterEnd {
                    position_bytes: *position_bytes,
                    reason,
                    corruption: *corruption,
                }
            }
            SegmentEnd::Unreadable(reason) => EndJson::Unreadable { reason },
            SegmentEnd::NotScanned => EndJson::NotScanned,
        };
        let index = match &segment.index {
            IndexStatus::Missing => IndexJson::Missing,
            IndexStatus::Ok { entries } => IndexJson::Ok { entries: *entries },
            IndexStatus::Damaged(reason) => IndexJson::Damaged { reason },
            IndexStatus::Disagrees(reason) => IndexJson::Disagrees { reason },
            IndexStatus::NotCompared { entries } => IndexJson::NotCompared { entries: *entries },
        };
        SegmentJson {
            file: segment.file.display().to_string(),
            base_offset: segment.base_offset,
            file_size_bytes: segment.file_size_bytes,
            valid_bytes: segment.valid_bytes,
            records: segment.records,
            damaged_records: segment.damaged_records,
            first_op: segment.first_op,
            last_op: segment.last_op,
            first_offset: segment.first_offset,
            next_offset: segment.next_offset,
            leftover: segment.leftover,
            end,
            index,
        }
    }
}

#[derive(Serialize)]
struct JournalJson {
    file: String,
    file_size_bytes: u64,
    entries_valid: u64,
    markers: u64,
    seq_first: Option<u64>,
    seq_last: Option<u64>,
    durable_seq: u64,
    tail_seq: u64,
    groups: Vec<JournalGroupJson>,
}

#[derive(Serialize)]
struct JournalGroupJson {
    group: u64,
    entries: u64,
    first_op: u64,
    last_op: u64,
    replayable: u64,
}

impl JournalJson {
    fn of(journal: &JournalReport) -> Self {
        JournalJson {
            file: journal.file.display().to_string(),
            file_size_bytes: journal.file_size_bytes,
            entries_valid: journal.entries_valid,
            markers: journal.markers,
            seq_first: journal.seq_first,
            seq_last: journal.seq_last,
            durable_seq: journal.durable_seq,
            tail_seq: journal.tail_seq,
            groups: journal
                .groups
                .iter()
                .map(|g| JournalGroupJson {
                    group: g.group,
                    entries: g.entries,
                    first_op: g.first_op,
                    last_op: g.last_op,
                    replayable: g.replayable,
                })
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------------------------

fn human(report: &InspectReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "shoal-inspect {}", report.path.display());
    if let Some(error) = &report.error {
        let _ = writeln!(out, "cannot inspect: {error}");
        return out;
    }
    for shard in &report.shards {
        human_shard(&mut out, shard);
    }
    if !report.notes.is_empty() {
        let _ = writeln!(out, "\nnotes ({}):", report.notes.len());
        for note in &report.notes {
            let at = note.position_bytes.map(|p| format!(" at byte {p}")).unwrap_or_default();
            let _ = writeln!(out, "  {}{at}: {}", note.file.display(), note.message);
        }
    }
    if report.problems.is_empty() {
        let _ = writeln!(out, "\nresult: clean");
    } else {
        let _ = writeln!(out, "\nproblems ({}):", report.problems.len());
        for problem in &report.problems {
            let _ = writeln!(out, "  {problem}");
        }
        let first = report.first_corruption().map(ToString::to_string).unwrap_or_default();
        let _ = writeln!(out, "\nresult: CORRUPTION FOUND; first: {first}");
    }
    out
}

fn human_shard(out: &mut String, shard: &ShardReport) {
    use std::fmt::Write;
    let name = shard.shard.map_or_else(|| "shard".to_string(), |n| format!("shard {n}"));
    let _ = writeln!(out, "\n{name} ({})", shard.dir.display());
    let superblock = &shard.superblock;
    match &superblock.state {
        Some(state) => {
            let id = &state.identity;
            let _ = writeln!(
                out,
                "  superblock: sequence {} (copy {}){}, cluster {} node {} shard {}/{}, {} of {} \
                 group slots, copies of {} bytes",
                state.sequence,
                superblock.newest.unwrap_or(0),
                if state.clean_shutdown { ", clean shutdown" } else { "" },
                id.cluster,
                id.node,
                id.shard,
                id.shard_count,
                state.groups.len(),
                state.slots_max,
                superblock.copy_size_bytes
            );
        }
        None => {
            let _ = writeln!(out, "  superblock: no valid copy");
        }
    }
    for copy in &superblock.copies {
        let status = match &copy.status {
            Ok(info) => format!(
                "sequence {} checksum {:#010x} parent {:#010x}{}",
                info.sequence,
                info.checksum,
                info.parent,
                if info.current { "" } else { " (stale)" }
            ),
            Err(reason) => format!("INVALID: {reason}"),
        };
        let _ = writeln!(out, "    copy {} at byte {}: {status}", copy.index, copy.position_bytes);
    }
    for group in &shard.groups {
        human_group(out, group);
    }
    match &shard.journal {
        Some(journal) => {
            let seqs = match (journal.seq_first, journal.seq_last) {
                (Some(first), Some(last)) => format!("seq {first}..={last}"),
                _ => "no entries".to_string(),
            };
            let _ = writeln!(
                out,
                "  journal: {} bytes, {} valid entries, {seqs}, durable {}, tail {}",
                journal.file_size_bytes,
                journal.entries_valid,
                journal.durable_seq,
                journal.tail_seq
            );
            for group in &journal.groups {
                let _ = writeln!(
                    out,
                    "    group {}: {} needed entries (ops {}..={}), {} to replay past the segments",
                    group.group, group.entries, group.first_op, group.last_op, group.replayable
                );
            }
        }
        None => {
            let _ = writeln!(out, "  journal: missing or unreadable");
        }
    }
}

fn human_group(out: &mut String, group: &GroupReport) {
    use std::fmt::Write;
    let _ = match &group.slot {
        Some(slot) => writeln!(
            out,
            "  group {} ({}): view {} log_view {} (began at op {}), checkpoint op {} in \
             {:020}.log at byte {}, fence {}",
            group.group,
            slot.config.durability.as_str(),
            slot.view,
            slot.log_view,
            slot.log_view_head_op.map_or("?".to_string(), |op| op.to_string()),
            slot.checkpoint.op,
            slot.checkpoint.segment_base_offset,
            slot.checkpoint.position_bytes,
            if slot.fence.view == 0 {
                "none".to_string()
            } else {
                format!("op {} view {}", slot.fence.op, slot.fence.view)
            }
        ),
        None => writeln!(out, "  group {} (not in the superblock)", group.group),
    };
    if group.slot.is_some_and(|slot| slot.transfer_pending) {
        let _ = writeln!(out, "    state transfer pending: open rolls it forward");
    }
    if let Some((op, end_offset)) = group.transfer_state {
        let _ = writeln!(
            out,
            "    log installed by a state transfer: transferred state as of op {op}, end \
             offset {end_offset}"
        );
    }
    let _ = match (group.first_op, group.last_op, group.first_offset, group.next_offset) {
        (Some(first_op), Some(last_op), Some(first_offset), Some(next_offset)) => writeln!(
            out,
            "    ops {first_op}..={last_op}, offsets {first_offset}..{next_offset}, {} records, \
             {} bytes in {} segments",
            group.records,
            group.valid_bytes,
            group.segments.len()
        ),
        _ => writeln!(out, "    no records ({} segments)", group.segments.len()),
    };
    for segment in &group.segments {
        let name = segment
            .file
            .file_name()
            .map_or_else(|| segment.file.display().to_string(), |n| n.to_string_lossy().into());
        let range =
            match (segment.first_offset, segment.next_offset, segment.first_op, segment.last_op) {
                (Some(first), Some(next), Some(first_op), Some(last_op)) => {
                    format!("offsets {first}..{next}, ops {first_op}..={last_op}")
                }
                _ => "no records".to_string(),
            };
        let end = match &segment.end {
            SegmentEnd::Clean => "clean end".to_string(),
            SegmentEnd::DataAfterEnd { position_bytes, corruption: true, .. } => {
                format!("DAMAGED at byte {position_bytes}")
            }
            SegmentEnd::DataAfterEnd { position_bytes, .. } => {
                format!("data after end at byte {position_bytes}")
            }
            SegmentEnd::Unreadable(reason) => format!("UNREADABLE: {reason}"),
            SegmentEnd::NotScanned => "leftover past the chain's end".to_string(),
        };
        let index = match &segment.index {
            IndexStatus::Missing => "no index".to_string(),
            IndexStatus::Ok { entries } => format!("index ok ({entries} entries)"),
            IndexStatus::Damaged(reason) => format!("index damaged: {reason}"),
            IndexStatus::Disagrees(reason) => format!("index DISAGREES: {reason}"),
            IndexStatus::NotCompared { entries } => {
                format!("index not compared ({entries} entries)")
            }
        };
        let damaged = match segment.damaged_records {
            0 => String::new(),
            n => format!(" ({n} DAMAGED)"),
        };
        let _ = writeln!(
            out,
            "    {name}: {range}, {} records{damaged}, {} of {} bytes; {end}; {index}",
            segment.records, segment.valid_bytes, segment.file_size_bytes
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["shoal-inspect"].iter().chain(args))
    }

    #[test]
    fn arguments() {
        let args = parse(&["/d", "--json"]).unwrap();
        assert_eq!((args.path, args.json), (PathBuf::from("/d"), true));
        assert!(!parse(&["/d"]).unwrap().json);
        assert!(parse(&["--json", "/d", "--json"]).unwrap().json);
        assert_eq!(parse(&["--help"]).unwrap_err().kind(), ErrorKind::DisplayHelp);
        assert!(parse(&[]).is_err());
        assert!(parse(&["/a", "/b"]).is_err());
        assert!(parse(&["/a", "--jsn"]).is_err());
    }
}
