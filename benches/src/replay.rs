//! `shoal-bench replay`: the disk I/O one `persisted` form of the engine issues per acknowledged
//! append, replayed alone — no engine code, no copies, no checksums, no runtime — as the
//! yardstick `scripts/design-ceilings` reports beside fio's. fio replays a form's bytes and
//! syncs, but one write per sync; this replays the writes where the form puts them, in flight
//! together, then the one sync:
//!
//! - `direct` (one partition, 64 KiB batches): the batch's blocks from the one holding the
//!   previous tail, the padded tail block (a second buffer, as the engine's tail copy), and the
//!   sync mark in one of the two trailer slots past the segment's data; then `fdatasync` of the
//!   segment. Into a pre-written file: a recycled segment.
//! - `journal` (64 partitions × 16 KiB per cycle): the cycle's journal entry, and beside it the
//!   same bytes written to a segment file (the segment writes the form also owes, which the
//!   engine batches over cycles); then `fdatasync` of the journal. Both files pre-written.
//!   `--in-flight N` keeps N such rounds going at once, each syncing once its own two writes
//!   completed, as the engine's journal cycles in flight do. `--segment-files N` lays the
//!   segment writes out as the engine's 64 groups do in the steady state under retention: each
//!   round's segment bytes go to the next of N pre-written files in turn (a group writes its
//!   gathered batch to its own segment, one group per cycle), and `--checkpoint-rounds K` adds
//!   the checkpoints beside the rounds: every K rounds, `fdatasync` of all N files, then the
//!   superblock's copies written and synced one after the other.
//!
//! It owns its files under the directory it is given and removes them; it never touches
//! anything else, and never runs beside another measurement (the disk must be its own).

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};
use serde_json::{Value, json};

/// The block every direct write is aligned to.
const BLOCK_BYTES: u64 = 4096;
/// A record's header ahead of its body (the prepare header).
const RECORD_HEADER_BYTES: u64 = 256;
/// A journal entry's header ahead of its records.
const ENTRY_HEADER_BYTES: u64 = 256;
/// The direct form's batch.
const DIRECT_BODY_BYTES: u64 = 64 << 10;
/// The journal form's cycle: this many partitions, one batch each.
const JOURNAL_PARTITIONS: u64 = 64;
const JOURNAL_BODY_BYTES: u64 = 16 << 10;
/// Sync mark slots in a segment's trailer, used in turn.
const MARK_SLOTS: u64 = 2;
/// The superblock's copies, written and synced one after the other (engine `COPIES`).
const SUPERBLOCK_COPIES: u64 = 4;
/// One superblock copy of 64 groups: a 64-byte header and 160-byte slots, in whole blocks.
const SUPERBLOCK_COPY_BYTES: u64 =
    (64 + JOURNAL_PARTITIONS * 160).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
/// Bounds of `--segment-files`.
pub const SEGMENT_FILES_MAX: u64 = 1024;

/// Which form's I/O to replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One partition's direct job per 64 KiB append.
    Direct,
    /// One journal cycle per 64 × 16 KiB appends.
    Journal,
}

impl Form {
    /// `direct` or `journal`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "direct" => Some(Self::Direct),
            "journal" => Some(Self::Journal),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Journal => "journal",
        }
    }

    /// Bytes of payload (batch bodies) one acknowledged round carries.
    fn payload_bytes(self) -> u64 {
        match self {
            Self::Direct => DIRECT_BODY_BYTES,
            Self::Journal => JOURNAL_PARTITIONS * JOURNAL_BODY_BYTES,
        }
    }
}

/// Where the journal form's segment writes go and how often they are checkpointed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Files the rounds' segment writes go to, one per round in turn.
    pub files: u64,
    /// Rounds between checkpoints (0: none).
    pub checkpoint_rounds: u64,
}

impl Default for SegmentLayout {
    fn default() -> Self {
        Self { files: 1, checkpoint_rounds: 0 }
    }
}

/// Replays `form` for `duration` in files of `wrap_bytes` of data each (written over and over,
/// pre-written first) under `dir`; returns the report object.
pub fn measure(
    form: Form,
    dir: &Path,
    duration: Duration,
    wrap_bytes: u64,
    in_flight: u64,
    layout: SegmentLayout,
) -> Result<Value, String> {
    let wrap_bytes = wrap_bytes - wrap_bytes % BLOCK_BYTES;
    if form == Form::Direct && layout != SegmentLayout::default() {
        return Err("--segment-files and --checkpoint-rounds are for the journal form".into());
    }
    if layout.files == 0 || layout.files > SEGMENT_FILES_MAX {
        return Err(format!("--segment-files is 1..={SEGMENT_FILES_MAX}"));
    }
    let round_bytes = match form {
        Form::Direct => DIRECT_BODY_BYTES + RECORD_HEADER_BYTES + 2 * BLOCK_BYTES,
        Form::Journal => journal_entry_bytes(),
    };
    // One append in flight is what the direct form's row measures.
    if in_flight == 0 || (form == Form::Direct && in_flight > 1) {
        return Err("--in-flight is 1 for the direct form, 1 or more for the journal".into());
    }
    // Rounds in flight write apart, with one more round of room behind them.
    let rounds_held = in_flight + 1;
    if wrap_bytes < rounds_held * round_bytes {
        return Err(format!(
            "--wrap-bytes must hold {rounds_held} rounds ({} bytes)",
            rounds_held * round_bytes
        ));
    }
    let files = Files::create(form, dir, wrap_bytes, layout.files)?;
    let result = match form {
        Form::Direct => replay_direct(&files, duration, wrap_bytes).map(|done| (done, 0)),
        Form::Journal => {
            replay_journal(&files, duration, wrap_bytes, in_flight, layout.checkpoint_rounds)
        }
    };
    drop(files);
    let ((rounds, elapsed), checkpoints) = result?;
    let per_s = rounds as f64 / elapsed.as_secs_f64();
    Ok(json!({
        "form": form.name(),
        "in_flight": in_flight,
        "segment_files": layout.files,
        "checkpoint_rounds": layout.checkpoint_rounds,
        "checkpoints": checkpoints,
        "rounds": rounds,
        "rounds_per_s": per_s.round(),
        // MiB/s, as the engine benchmarks report (and fio's bandwidth / 1024).
        "payload_mib_s": (per_s * form.payload_bytes() as f64 / f64::from(1u32 << 20)).round(),
    }))
}

/// One journal entry of the cycle, padded to whole blocks.
fn journal_entry_bytes() -> u64 {
    let bytes =
        ENTRY_HEADER_BYTES + JOURNAL_PARTITIONS * (JOURNAL_BODY_BYTES + RECORD_HEADER_BYTES);
    bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

/// The direct form: per round the blocks of one record from the block the previous one ended
/// in, its padded tail block, a mark; then the segment's sync.
fn replay_direct(
    files: &Files,
    duration: Duration,
    wrap_bytes: u64,
) -> Result<(u64, Duration), String> {
    let record_bytes = DIRECT_BODY_BYTES + RECORD_HEADER_BYTES;
    let data = AlignedBuf::new((record_bytes + BLOCK_BYTES) as usize)?;
    let tail = AlignedBuf::new(BLOCK_BYTES as usize)?;
    let mark = AlignedBuf::new(BLOCK_BYTES as usize)?;
    let segment = &files.first;
    let mut ring = IoUring::new(8).map_err(|e| format!("io_uring: {e}"))?;
    let mut end = 0u64;
    let mut rounds = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        let round = DirectRound::after(end, rounds, wrap_bytes);
        end = round.end_bytes;
        let mut writes = vec![(data.slice(round.data.1 as usize), round.data.0)];
        if let Some(at) = round.tail_at {
            writes.push((tail.slice(BLOCK_BYTES as usize), at));
        }
        writes.push((mark.slice(BLOCK_BYTES as usize), round.mark_at));
        submit_and_reap(&mut ring, writes.into_iter().map(|write| (segment, write)).collect())?;
        sync_data(&mut ring, segment)?;
        rounds += 1;
    }
    Ok((rounds, start.elapsed()))
}

/// Where one direct round writes in a segment of `wrap_bytes` of data followed by its trailer.
#[derive(Debug, PartialEq, Eq)]
struct DirectRound {
    /// `(offset, len)`: from the block holding the previous record's end (written again, as a
    /// job rewrites the partial block it shares) through the new record's last whole block.
    data: (u64, u64),
    /// The new record's partial last block, from the tail copy; None when it ends on a block.
    tail_at: Option<u64>,
    /// The sync mark's trailer slot (the two used in turn).
    mark_at: u64,
    /// Where the new record ends.
    end_bytes: u64,
}

impl DirectRound {
    /// The round after a record ending at `end_bytes`, the `round`-th (from 0); the log starts
    /// over at 0 when the next record and its tail block would pass `wrap_bytes`.
    fn after(end_bytes: u64, round: u64, wrap_bytes: u64) -> Self {
        let record_bytes = DIRECT_BODY_BYTES + RECORD_HEADER_BYTES;
        let end = if end_bytes + record_bytes + BLOCK_BYTES > wrap_bytes { 0 } else { end_bytes };
        let from = end - end % BLOCK_BYTES;
        let new_end = end + record_bytes;
        let whole_end = new_end - new_end % BLOCK_BYTES;
        Self {
            data: (from, whole_end - from),
            tail_at: (new_end > whole_end).then_some(whole_end),
            mark_at: wrap_bytes + (round % MARK_SLOTS) * BLOCK_BYTES,
            end_bytes: new_end,
        }
    }
}

/// The journal form: per round the cycle's entry and the same bytes into a segment file (the
/// next in turn), then the journal's sync once both wrote. `in_flight` rounds run at once, as
/// the engine's journal cycles in flight do, each with its own sync; a round ends when its sync
/// completes, and the next one starts in its place. With `checkpoint_rounds`, a checkpoint
/// starts beside the rounds every that many rounds (once the previous one finished). Returns
/// the rounds, their time and the checkpoints finished.
fn replay_journal(
    files: &Files,
    duration: Duration,
    wrap_bytes: u64,
    in_flight: u64,
    checkpoint_rounds: u64,
) -> Result<((u64, Duration), u64), String> {
    let entry_bytes = journal_entry_bytes();
    let entry = AlignedBuf::new(entry_bytes as usize)?;
    let copy = AlignedBuf::new(SUPERBLOCK_COPY_BYTES as usize)?;
    let journal = &files.first;
    let segments = &files.segments;
    let superblock = files.superblock.as_ref().expect("the journal form has a superblock");
    let entries = u32::try_from(4 * in_flight + segments.len() as u64 + 4)
        .map_err(|_| "--in-flight too large".to_string())?
        .next_power_of_two();
    let mut ring = IoUring::new(entries).map_err(|e| format!("io_uring: {e}"))?;
    // Per round in flight (its slot): the writes it still waits for.
    let mut writing = vec![0u8; in_flight as usize];
    let mut at = 0u64;
    let mut segment_at = vec![0u64; segments.len()];
    let mut begun = 0u64;
    let mut begin = |ring: &mut IoUring, slot: u64| -> Result<(), String> {
        if at + entry_bytes > wrap_bytes {
            at = 0;
        }
        let file = (begun % segments.len() as u64) as usize;
        if segment_at[file] + entry_bytes > wrap_bytes {
            segment_at[file] = 0;
        }
        let round = entry.slice(entry_bytes as usize);
        push_write(ring, journal, (round, at), JournalOp::Write { slot, which: 0 }.user_data())?;
        let segment_write = (round, segment_at[file]);
        push_write(
            ring,
            &segments[file],
            segment_write,
            JournalOp::Write { slot, which: 1 }.user_data(),
        )?;
        at += entry_bytes;
        segment_at[file] += entry_bytes;
        begun += 1;
        Ok(())
    };
    let (mut rounds, mut active) = (0u64, 0u64);
    let mut checkpoint = Checkpoint::Idle { since_round: 0 };
    let mut checkpoints = 0u64;
    let mut first_error = None;
    let start = Instant::now();
    for slot in 0..in_flight {
        begin(&mut ring, slot)?;
        writing[slot as usize] = 2;
        active += 1;
    }
    // Every round in flight and the checkpoint are reaped before returning, whatever failed:
    // no buffer is freed while the kernel may still read it.
    while active > 0 || !matches!(checkpoint, Checkpoint::Idle { .. }) {
        ring.submit_and_wait(1).map_err(|e| format!("io_uring_enter: {e}"))?;
        let done: Vec<(u64, i32)> =
            ring.completion().map(|entry| (entry.user_data(), entry.result())).collect();
        for (user_data, result) in done {
            match JournalOp::of(user_data) {
                JournalOp::Sync { slot } => {
                    if result != 0 {
                        first_error.get_or_insert(format!("fdatasync returned {result}"));
                    }
                    rounds += 1;
                    if first_error.is_none() && start.elapsed() < duration {
                        begin(&mut ring, slot)?;
                        writing[slot as usize] = 2;
                    } else {
                        active -= 1;
                    }
                }
                JournalOp::Write { slot, .. } => {
                    if usize::try_from(result).ok() != Some(entry_bytes as usize) {
                        first_error.get_or_insert(format!(
                            "a write of {entry_bytes} bytes returned {result}"
                        ));
                    }
                    writing[slot as usize] -= 1;
                    if writing[slot as usize] == 0 {
                        push_sync(&mut ring, journal, JournalOp::Sync { slot }.user_data())?;
                    }
                }
                JournalOp::Checkpoint(step) => {
                    let expected = match step {
                        CheckpointStep::CopyWrite => SUPERBLOCK_COPY_BYTES as i32,
                        CheckpointStep::SegmentSync | CheckpointStep::CopySync => 0,
                    };
                    if result != expected {
                        first_error
                            .get_or_insert(format!("a checkpoint's {step:?} returned {result}"));
                    }
                    checkpoint = checkpoint.advance(&mut ring, superblock, &copy, rounds)?;
                    if matches!(checkpoint, Checkpoint::Idle { .. }) {
                        checkpoints += 1;
                    }
                }
            }
        }
        if let Checkpoint::Idle { since_round } = checkpoint
            && checkpoint_rounds > 0
            && rounds >= since_round + checkpoint_rounds
            && active > 0
        {
            for segment in segments {
                push_sync(
                    &mut ring,
                    segment,
                    JournalOp::Checkpoint(CheckpointStep::SegmentSync).user_data(),
                )?;
            }
            checkpoint = Checkpoint::SegmentSyncs { left: segments.len() };
        }
    }
    first_error.map_or(Ok(((rounds, start.elapsed()), checkpoints)), Err)
}

/// Where a journal replay's checkpoint is: the segment files' syncs, then each superblock copy
/// written and synced before the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checkpoint {
    /// None in flight; the last one started at round `since_round`.
    Idle {
        since_round: u64,
    },
    SegmentSyncs {
        left: usize,
    },
    CopyWrite {
        copy: u64,
    },
    CopySync {
        copy: u64,
    },
}

impl Checkpoint {
    /// The state after one of its operations completed (queueing the next, if any); `rounds`
    /// is the replay's count when the checkpoint ends.
    fn advance(
        self,
        ring: &mut IoUring,
        superblock: &File,
        copy: &AlignedBuf,
        rounds: u64,
    ) -> Result<Self, String> {
        let write_copy = |ring: &mut IoUring, copy_index: u64| {
            let write =
                (copy.slice(SUPERBLOCK_COPY_BYTES as usize), copy_index * SUPERBLOCK_COPY_BYTES);
            push_write(
                ring,
                superblock,
                write,
                JournalOp::Checkpoint(CheckpointStep::CopyWrite).user_data(),
            )
        };
        Ok(match self {
            Self::Idle { .. } => unreachable!("no checkpoint operation is in flight"),
            Self::SegmentSyncs { left } if left > 1 => Self::SegmentSyncs { left: left - 1 },
            Self::SegmentSyncs { .. } => {
                write_copy(ring, 0)?;
                Self::CopyWrite { copy: 0 }
            }
            Self::CopyWrite { copy } => {
                push_sync(
                    ring,
                    superblock,
                    JournalOp::Checkpoint(CheckpointStep::CopySync).user_data(),
                )?;
                Self::CopySync { copy }
            }
            Self::CopySync { copy } if copy + 1 < SUPERBLOCK_COPIES => {
                write_copy(ring, copy + 1)?;
                Self::CopyWrite { copy: copy + 1 }
            }
            Self::CopySync { .. } => Self::Idle { since_round: rounds },
        })
    }
}

/// What a journal replay's completion is for, kept in its user data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JournalOp {
    /// One of a round's two writes (0: the journal entry, 1: the segment write).
    Write {
        slot: u64,
        which: u64,
    },
    /// A round's journal sync.
    Sync {
        slot: u64,
    },
    Checkpoint(CheckpointStep),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CheckpointStep {
    SegmentSync,
    CopyWrite,
    CopySync,
}

/// User data of the checkpoint's operations: above every round slot's.
const CHECKPOINT_USER_DATA: u64 = 1 << 32;

impl JournalOp {
    fn user_data(self) -> u64 {
        match self {
            Self::Write { slot, which } => slot * 4 + which,
            Self::Sync { slot } => slot * 4 + 2,
            Self::Checkpoint(step) => CHECKPOINT_USER_DATA + step as u64,
        }
    }

    fn of(user_data: u64) -> Self {
        if user_data >= CHECKPOINT_USER_DATA {
            return Self::Checkpoint(match user_data - CHECKPOINT_USER_DATA {
                0 => CheckpointStep::SegmentSync,
                1 => CheckpointStep::CopyWrite,
                _ => CheckpointStep::CopySync,
            });
        }
        let slot = user_data / 4;
        match user_data % 4 {
            2 => Self::Sync { slot },
            which => Self::Write { slot, which },
        }
    }
}

/// Queues one write (submitted by the next `submit_and_wait`).
fn push_write(
    ring: &mut IoUring,
    file: &File,
    (slice, offset): Write,
    user_data: u64,
) -> Result<(), String> {
    let len = u32::try_from(slice.len).map_err(|_| "a write over 4 GiB".to_string())?;
    let entry = opcode::Write::new(types::Fd(file.as_raw_fd()), slice.ptr, len)
        .offset(offset)
        .build()
        .user_data(user_data);
    // SAFETY: the buffer behind `slice` lives until the caller has reaped every completion (its
    // `AlignedBuf` outlives the loop that reaps them), and the fd stays open as long.
    unsafe { ring.submission().push(&entry) }.map_err(|_| "the ring is full".to_string())
}

/// Queues one `fdatasync` (submitted by the next `submit_and_wait`).
fn push_sync(ring: &mut IoUring, file: &File, user_data: u64) -> Result<(), String> {
    let entry = opcode::Fsync::new(types::Fd(file.as_raw_fd()))
        .flags(types::FsyncFlags::DATASYNC)
        .build()
        .user_data(user_data);
    // SAFETY: no buffer; the fd stays open until the completion is reaped.
    unsafe { ring.submission().push(&entry) }.map_err(|_| "the ring is full".to_string())
}

/// A run of `len` bytes of an [`AlignedBuf`], by address: the buffer outlives every write
/// that uses it (each write completes before its call returns).
#[derive(Clone, Copy)]
struct Slice {
    ptr: *const u8,
    len: usize,
}

type Write = (Slice, u64);

/// Submits every write at once and waits for all of them, whatever happens to one: no buffer
/// is reused while the kernel may still read it.
fn submit_and_reap(ring: &mut IoUring, ops: Vec<(&File, Write)>) -> Result<(), String> {
    for (index, (file, write)) in ops.iter().enumerate() {
        push_write(ring, file, *write, index as u64)?;
    }
    reap(ring, ops.len(), |index, result| {
        let expected = ops[index as usize].1.0.len;
        if usize::try_from(result).ok() == Some(expected) {
            Ok(())
        } else {
            Err(format!("a write of {expected} bytes returned {result}"))
        }
    })
}

fn sync_data(ring: &mut IoUring, file: &File) -> Result<(), String> {
    push_sync(ring, file, 0)?;
    reap(
        ring,
        1,
        |_, result| {
            if result == 0 { Ok(()) } else { Err(format!("fdatasync returned {result}")) }
        },
    )
}

/// Waits for `count` completions, checking each; the first failure is returned once all are in.
fn reap(
    ring: &mut IoUring,
    count: usize,
    mut check: impl FnMut(u64, i32) -> Result<(), String>,
) -> Result<(), String> {
    let mut reaped = 0;
    let mut first_error = None;
    while reaped < count {
        ring.submit_and_wait(1).map_err(|e| format!("io_uring_enter: {e}"))?;
        for completion in ring.completion() {
            reaped += 1;
            if let Err(error) = check(completion.user_data(), completion.result()) {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The replay's files: the segment (direct), or the journal, its segment files and a
/// superblock (journal), opened with O_DIRECT, pre-written and synced; removed when dropped.
struct Files {
    first: File,
    segments: Vec<File>,
    superblock: Option<File>,
    paths: Vec<PathBuf>,
}

impl Files {
    fn create(form: Form, dir: &Path, wrap_bytes: u64, segment_files: u64) -> Result<Self, String> {
        let mut files = Self {
            first: prewritten(&dir.join("replay-0.dat"), wrap_bytes + MARK_SLOTS * BLOCK_BYTES)?,
            segments: Vec::new(),
            superblock: None,
            paths: vec![dir.join("replay-0.dat")],
        };
        if form == Form::Journal {
            for index in 0..segment_files {
                let path = dir.join(format!("replay-segment-{index}.dat"));
                files.paths.push(path.clone());
                files.segments.push(prewritten(&path, wrap_bytes)?);
            }
            let path = dir.join("replay-superblock.dat");
            files.paths.push(path.clone());
            files.superblock = Some(prewritten(&path, SUPERBLOCK_COPIES * SUPERBLOCK_COPY_BYTES)?);
        }
        Ok(files)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A file of `len_bytes` written whole (blocks written, not only reserved) and synced.
fn prewritten(path: &Path, len_bytes: u64) -> Result<File, String> {
    let shown = path.display();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("{shown}: {e}"))?;
    const PIECE_BYTES: u64 = 1 << 20;
    let piece = AlignedBuf::new(PIECE_BYTES as usize)?;
    let mut at = 0;
    while at < len_bytes {
        let len = PIECE_BYTES.min(len_bytes - at) as usize;
        file.write_all_at(piece.as_slice(len), at).map_err(|e| format!("{shown}: {e}"))?;
        at += len as u64;
    }
    file.sync_all().map_err(|e| format!("{shown}: {e}"))?;
    Ok(file)
}

/// Block-aligned memory, touched once when made (first touch of fresh memory is slow here:
/// no round pays it).
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Result<Self, String> {
        let layout = Layout::from_size_align(len.max(1), BLOCK_BYTES as usize)
            .map_err(|e| format!("buffer layout: {e}"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(format!("allocating {len} bytes"));
        }
        // SAFETY: `ptr` is valid for `layout.size()` bytes, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0xa5, layout.size()) };
        Ok(Self { ptr, layout })
    }

    fn slice(&self, len: usize) -> Slice {
        assert!(len <= self.layout.size() && (len as u64).is_multiple_of(BLOCK_BYTES));
        Slice { ptr: self.ptr, len }
    }

    fn as_slice(&self, len: usize) -> &[u8] {
        assert!(len <= self.layout.size());
        // SAFETY: initialized above, `len` within the allocation, borrowed for `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; no write still reads it (every write is
        // reaped before its call returns).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_replay_rounds_and_leave_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one_file = SegmentLayout::default();
        let files_4 = SegmentLayout { files: 4, checkpoint_rounds: 2 };
        for (form, in_flight, layout) in [
            (Form::Direct, 1, one_file),
            (Form::Journal, 1, one_file),
            (Form::Journal, 3, one_file),
            (Form::Journal, 3, files_4),
        ] {
            let report =
                measure(form, dir.path(), Duration::from_millis(100), 8 << 20, in_flight, layout)
                    .unwrap_or_else(|e| panic!("{}: {e}", form.name()));
            assert!(report["rounds"].as_u64().is_some_and(|n| n >= in_flight), "{report}");
            assert_eq!(report["form"], form.name());
            assert_eq!(report["in_flight"], in_flight);
            assert_eq!(report["segment_files"], layout.files);
            if layout.checkpoint_rounds > 0 {
                // Every checkpoint started is finished before the replay returns.
                let rounds = report["rounds"].as_u64().unwrap();
                let checkpoints = report["checkpoints"].as_u64().unwrap();
                assert!(checkpoints >= 1 && checkpoints <= rounds / 2, "{report}");
            }
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }

    #[test]
    fn a_direct_round_rewrites_the_shared_block_pads_its_tail_and_marks_in_turn() {
        let wrap = 1 << 20;
        let record = DIRECT_BODY_BYTES + RECORD_HEADER_BYTES;
        let first = DirectRound::after(0, 0, wrap);
        assert_eq!(first.data, (0, 16 * BLOCK_BYTES), "16 whole blocks of the 65,792 bytes");
        assert_eq!(first.tail_at, Some(16 * BLOCK_BYTES), "256 bytes left in a padded block");
        assert_eq!(first.mark_at, wrap);
        assert_eq!(first.end_bytes, record);
        let second = DirectRound::after(first.end_bytes, 1, wrap);
        assert_eq!(second.data, (16 * BLOCK_BYTES, 16 * BLOCK_BYTES), "from the shared block");
        assert_eq!(second.tail_at, Some(32 * BLOCK_BYTES));
        assert_eq!(second.mark_at, wrap + BLOCK_BYTES, "the other slot");
        assert_eq!(DirectRound::after(second.end_bytes, 2, wrap).mark_at, wrap, "in turn");
        // A record ending on a block boundary has no tail block.
        let aligned = DirectRound::after(BLOCK_BYTES * 16 - RECORD_HEADER_BYTES, 0, wrap);
        assert_eq!(aligned.tail_at, None);
        // Past the wrap, the log starts over, its writes never reaching the trailer.
        let wrapped = DirectRound::after(wrap - record, 5, wrap);
        assert_eq!(wrapped.data.0, 0);
        assert_eq!(wrapped.end_bytes, record);
    }

    #[test]
    fn a_wrap_too_small_for_the_rounds_in_flight_and_a_bad_in_flight_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = SegmentLayout::default();
        let error =
            measure(Form::Journal, dir.path(), Duration::from_millis(1), 1 << 20, 1, layout)
                .expect_err("refused");
        assert!(error.contains("--wrap-bytes must hold 2 rounds"), "{error}");
        let error =
            measure(Form::Journal, dir.path(), Duration::from_millis(1), 3 << 20, 3, layout)
                .expect_err("refused");
        assert!(error.contains("--wrap-bytes must hold 4 rounds"), "{error}");
        for (form, in_flight) in [(Form::Direct, 2), (Form::Journal, 0)] {
            let error =
                measure(form, dir.path(), Duration::from_millis(1), 4 << 20, in_flight, layout)
                    .expect_err("refused");
            assert!(error.contains("--in-flight"), "{error}");
        }
        let direct_in_files = SegmentLayout { files: 4, checkpoint_rounds: 0 };
        let error = measure(
            Form::Direct,
            dir.path(),
            Duration::from_millis(1),
            4 << 20,
            1,
            direct_in_files,
        )
        .expect_err("refused");
        assert!(error.contains("--segment-files"), "{error}");
        let no_files = SegmentLayout { files: 0, checkpoint_rounds: 0 };
        let error =
            measure(Form::Journal, dir.path(), Duration::from_millis(1), 4 << 20, 1, no_files)
                .expect_err("refused");
        assert!(error.contains("--segment-files"), "{error}");
    }
}
