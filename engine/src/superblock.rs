//! The shard superblock: the durable control state of one shard — its identity and, per group,
//! view, log_view, checkpoint and truncation fence — in a bounded slot table.
//!
//! It is written as [`COPIES`] checksummed copies, one after the other, each synced before the
//! next is touched, so a crash at any point leaves at least one intact copy of either the old or
//! the new version. Each version carries a sequence number and its parent's checksum. An update
//! is durable only when every copy is synced. Open reads every copy, takes the newest valid one
//! and rewrites the stale or torn ones. This module never decides *when* to write: the shard
//! writes it only for view/log_view changes, truncations and checkpoints (never for a commit),
//! and batches all groups' updates of a flush cycle into one write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};

pub use shoal_proto::Durability;

/// Copies written per version.
pub const COPIES: usize = 4;
/// The superblock's file name inside a shard directory.
pub const FILE_NAME: &str = "superblock";
/// The name a new superblock is written under before it is renamed into place.
pub const TEMP_FILE_NAME: &str = "superblock.new";
/// Format version of the superblock copy layout: 2 grew the group slot from 128 to 160 bytes
/// (the group's members). Version 1 copies are read, and open lays the file out again as 2.
pub const VERSION: u8 = 2;
/// The first format, with 128-byte slots.
const VERSION_128_BYTE_SLOTS: u8 = 1;

// Copy header layout (little-endian), chained from sizes.
const OFF_CHECKSUM: usize = 0;
const OFF_PARENT: usize = OFF_CHECKSUM + 4;
const OFF_SEQUENCE: usize = OFF_PARENT + 4;
const OFF_CLUSTER: usize = OFF_SEQUENCE + 8;
const OFF_NODE: usize = OFF_CLUSTER + 8;
const OFF_SHARD: usize = OFF_NODE + 8;
const OFF_SHARD_COUNT: usize = OFF_SHARD + 4;
const OFF_SLOT_COUNT: usize = OFF_SHARD_COUNT + 4;
const OFF_VERSION: usize = OFF_SLOT_COUNT + 4;
const OFF_SLOTS_MAX: usize = OFF_VERSION + 4;
const OFF_FLAGS: usize = OFF_SLOTS_MAX + 4;
const OFF_HEADER_RESERVED: usize = OFF_FLAGS + 4;
/// Flag: the shard was closed cleanly (everything synced and checkpointed) by this version.
const FLAG_CLEAN_SHUTDOWN: u32 = 1;
/// Bytes of the copy header.
pub const HEADER_SIZE_BYTES: usize = 64;
const _: () = assert!(OFF_HEADER_RESERVED <= HEADER_SIZE_BYTES);

// Slot layout, relative to the slot's start.
const SLOT_GROUP: usize = 0;
const SLOT_VIEW: usize = SLOT_GROUP + 8;
const SLOT_LOG_VIEW: usize = SLOT_VIEW + 4;
const SLOT_CHECKPOINT_OP: usize = SLOT_LOG_VIEW + 4;
const SLOT_CHECKPOINT_NEXT_OFFSET: usize = SLOT_CHECKPOINT_OP + 8;
const SLOT_CHECKPOINT_SEGMENT: usize = SLOT_CHECKPOINT_NEXT_OFFSET + 8;
const SLOT_CHECKPOINT_POSITION: usize = SLOT_CHECKPOINT_SEGMENT + 8;
const SLOT_CHECKPOINT_CHECKSUM: usize = SLOT_CHECKPOINT_POSITION + 8;
const SLOT_DURABILITY: usize = SLOT_CHECKPOINT_CHECKSUM + 4;
const SLOT_FENCE_OP: usize = SLOT_DURABILITY + 4;
const SLOT_FENCE_VIEW: usize = SLOT_FENCE_OP + 8;
const SLOT_RECORD_SIZE_MAX: usize = SLOT_FENCE_VIEW + 4;
const SLOT_SEGMENT_SIZE: usize = SLOT_RECORD_SIZE_MAX + 4;
const SLOT_SEGMENT_AGE_MS: usize = SLOT_SEGMENT_SIZE + 8;
const SLOT_RETENTION_BYTES: usize = SLOT_SEGMENT_AGE_MS + 8;
const SLOT_RETENTION_MS: usize = SLOT_RETENTION_BYTES + 8;
const SLOT_FENCE_SEQ: usize = SLOT_RETENTION_MS + 8;
const SLOT_FENCE_FINISHED: usize = SLOT_FENCE_SEQ + 8;
/// Bit flags of the slot (`SLOT_FLAG_*`). Zero in slots from before it existed (the byte was
/// reserved, written as zero), which reads as "no flag set": no version change needed.
const SLOT_FLAGS: usize = SLOT_FENCE_FINISHED + 1;
/// Flag: a state transfer's install passed its commit point and its roll-forward has not been
/// made durable yet ([`GroupSlot::transfer_pending`]).
const SLOT_FLAG_TRANSFER_PENDING: u8 = 1;
/// Every flag this build knows; a slot with any other bit set comes from a newer format.
const SLOT_FLAGS_KNOWN: u8 = SLOT_FLAG_TRANSFER_PENDING;
/// [`GroupSlot::log_view_head_op`] plus one, in 48 bits; 0 is "unknown", which slots from before
/// it existed read as (the bytes were reserved, written as zeros): no version change needed.
const SLOT_LOG_VIEW_HEAD: usize = SLOT_FLAGS + 1;
const SLOT_LOG_VIEW_HEAD_BYTES: usize = 6;
/// Zero in superblocks from before it existed (the bytes were reserved, written as zeros), which
/// reads as "no damage cut": no version change needed.
const SLOT_DAMAGED_FROM: usize = 120;
/// Version 2 on: the group's members (`GroupConfig::members`), the end of a version 1 slot.
const SLOT_MEMBERS: usize = SLOT_DAMAGED_FROM + 8;
/// [`GroupSlot::journal_floor_seq`]; zero in slots from before it existed (the bytes were
/// reserved, written as zeros), which reads as "no floor": no version change needed.
const SLOT_JOURNAL_FLOOR: usize = SLOT_MEMBERS + 8;
const SLOT_RESERVED: usize = SLOT_JOURNAL_FLOOR + 8;
const _: () = assert!(SLOT_LOG_VIEW_HEAD + SLOT_LOG_VIEW_HEAD_BYTES == SLOT_DAMAGED_FROM);
/// Bytes of one group slot.
pub const SLOT_SIZE_BYTES: usize = 160;
/// Bytes of one group slot in version 1.
const SLOT_SIZE_BYTES_V1: usize = 128;
const _: () = assert!(SLOT_MEMBERS == SLOT_SIZE_BYTES_V1);
/// The most slots a superblock may have (a copy region of 160 MiB).
pub const SLOTS_MAX_LIMIT: usize = 1 << 20;
const _: () = assert!(SLOT_RESERVED <= SLOT_SIZE_BYTES);
const _: () = assert!(SLOT_CHECKPOINT_OP.is_multiple_of(8) && SLOT_FENCE_OP.is_multiple_of(8));
const _: () = assert!(SLOT_FENCE_SEQ == 104 && SLOT_FENCE_SEQ.is_multiple_of(8));
const _: () = assert!(SLOT_FLAGS == 113);
const _: () = assert!(SLOT_DAMAGED_FROM.is_multiple_of(8));

/// Per-group settings, chosen when the group is created and kept in its superblock slot so the
/// engine can reopen the group on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// How appends become durable.
    pub durability: Durability,
    /// A segment rolls before it would grow past this size.
    pub segment_size_bytes: u64,
    /// A segment rolls once its first record is older than this (0: never by age).
    pub segment_age_ms_max: u64,
    /// Retention keeps the log at most this big, deleting whole sealed segments (0: no bound).
    pub retention_bytes: u64,
    /// Retention deletes sealed segments whose newest record is older than this (0: keep).
    pub retention_ms: u64,
    /// Largest record (prepare header + batch) the log accepts.
    pub record_size_bytes_max: u32,
    /// The group's members as the replication layer records them when it creates the group;
    /// opaque here (0: none recorded, as in slots of superblock version 1).
    pub members: u64,
}

/// Smallest segment size a group may configure.
pub const SEGMENT_SIZE_BYTES_MIN: u64 = 1 << 20;
/// Largest segment size a group may configure.
pub const SEGMENT_SIZE_BYTES_MAX: u64 = 4 << 30;

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            durability: Durability::Replicated,
            segment_size_bytes: 1 << 30,
            segment_age_ms_max: 7 * 24 * 3600 * 1000,
            retention_bytes: 0,
            retention_ms: 0,
            record_size_bytes_max: (crate::wire::HEADER_SIZE + (1 << 20)) as u32,
            members: 0,
        }
    }
}

impl GroupConfig {
    /// Checks the bounds; names the setting that is out of them.
    pub fn validate(&self) -> Result<()> {
        if !(SEGMENT_SIZE_BYTES_MIN..=SEGMENT_SIZE_BYTES_MAX).contains(&self.segment_size_bytes) {
            return Err(Error::Invalid(format!(
                "segment_size_bytes {} is outside {SEGMENT_SIZE_BYTES_MIN}..={SEGMENT_SIZE_BYTES_MAX}",
                self.segment_size_bytes
            )));
        }
        if self.record_size_bytes_max as usize <= crate::wire::HEADER_SIZE
            || u64::from(self.record_size_bytes_max) > self.segment_size_bytes
        {
            return Err(Error::Invalid(format!(
                "record_size_bytes_max {} must exceed the {}-byte header and fit a segment",
                self.record_size_bytes_max,
                crate::wire::HEADER_SIZE
            )));
        }
        Ok(())
    }
}

/// The point up to which a group's segments are known durable: recovery scans forward from here
/// and treats everything past it as the torn window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// The last op covered (0: nothing yet).
    pub op: u64,
    /// `checksum_header` of that op: the parent the next op must name.
    pub checksum: u32,
    /// The offset the next op starts at.
    pub next_offset: u64,
    /// Base offset (file name) of the segment holding the end of `op`.
    pub segment_base_offset: u64,
    /// Byte position in that segment just past `op`.
    pub position_bytes: u64,
}

/// A durable truncation of a group's log above `op`, for view `view`.
///
/// While the truncation is unfinished (the fence durable, the files not yet cut), every segment
/// record above `op` from a view below `view` is dead. Once the files are cut (`finished`, made
/// durable by a second superblock write) segment records above `op` are the new suffix, in
/// whatever view they were prepared: a view change may re-adopt an op from an older view. Shard
/// journal entries above `op` written up to `seq` (the journal's last sequence number at the
/// truncation) stay dead for as long as they lie in the journal, so a crash can never resurrect a
/// truncated op; entries written after it belong to the new suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Fence {
    /// Ops above this one from before the truncation are dead.
    pub op: u64,
    /// The view the truncation belongs to (0: no fence).
    pub view: u32,
    /// The shard journal's last sequence number when the truncation began (0 in fences from
    /// before this field existed: then journal entries are judged by view, as segments).
    pub seq: u64,
    /// The files are cut: segment records above `op` are new, not dead.
    pub finished: bool,
}

impl Fence {
    /// Whether a segment record (or a prepare about to be appended) with this op and view was
    /// cut off by the fence.
    #[must_use]
    pub fn kills(&self, op: u64, view: u32) -> bool {
        self.view != 0 && !self.finished && op > self.op && view < self.view
    }

    /// Whether a shard journal entry with this op, view and sequence number was cut off.
    #[must_use]
    pub fn kills_journal_entry(&self, op: u64, view: u32, seq: u64) -> bool {
        if self.view == 0 || op <= self.op {
            return false;
        }
        if self.seq == 0 { view < self.view } else { seq <= self.seq }
    }
}

/// The durable control state of one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GroupSlot {
    /// The group id.
    pub group: u64,
    /// The group's settings.
    pub config: GroupConfig,
    /// Highest view the replica has seen (persisted before it votes).
    pub view: u32,
    /// Highest view in which the replica's log was accepted by a primary.
    pub log_view: u32,
    /// The head op of the log `log_view` began with (its StartView's), when known: every op
    /// above it was prepared in `log_view` or later, which lets a view change prove an older
    /// view's op there dead even after this replica restarted (`docs/protocol.md`, "Merging").
    /// Stored in 48 bits: a head at or above 2^48 − 1 is kept as unknown, the old rule.
    pub log_view_head_op: Option<u64>,
    /// Where recovery starts.
    pub checkpoint: Checkpoint,
    /// The newest truncation.
    pub fence: Fence,
    /// Non-zero when protocol-aware recovery cut the log at a damaged record (this op): the ops
    /// the log lacks past its head may have been acknowledged, so they stay *faulty*, not
    /// absent, across restarts until the replica has them back (DESIGN.md §3). 0: no cut.
    pub damaged_from: u64,
    /// A state transfer's install wrote this slot (its commit point) and may not have finished
    /// replacing the group's files: open rolls the install forward before it recovers the group
    /// (see `ShardStore::install_transfer`). Cleared by the install's second superblock write, or by
    /// the write open makes after recovery.
    pub transfer_pending: bool,
    /// Shard journal entries numbered at or below this belong to an earlier group of the same
    /// id, deleted before this one was created: recovery never replays them into this log
    /// (0: none can exist). A group id comes back to a node when a partition moves away and
    /// later back.
    pub journal_floor_seq: u64,
}

/// Who owns the data directory: checked on open so a directory is never served by a different
/// cluster, node or shard layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Cluster id.
    pub cluster: u64,
    /// Node id within the cluster.
    pub node: u64,
    /// This shard's index.
    pub shard: u32,
    /// The number of shards the directory was created with.
    pub shard_count: u32,
}

impl Identity {
    /// The fields in which `self` and `other` differ, as each names them ("cluster id 1, node
    /// 2"), so an operator sees both values of what does not match.
    pub fn differences(&self, other: &Identity) -> (String, String) {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        let mut differ = |name: &str, a: u64, b: u64| {
            if a != b {
                ours.push(format!("{name} {a}"));
                theirs.push(format!("{name} {b}"));
            }
        };
        differ("cluster id", self.cluster, other.cluster);
        differ("node", self.node, other.node);
        differ("shard", u64::from(self.shard), u64::from(other.shard));
        differ("shard count", u64::from(self.shard_count), u64::from(other.shard_count));
        (ours.join(", "), theirs.join(", "))
    }
}

/// What open found in each copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyStatus {
    /// Valid and the newest.
    Current {
        /// Its sequence number.
        sequence: u64,
    },
    /// Valid but older than the newest (a crash during a write); rewritten on open.
    Stale {
        /// Its sequence number.
        sequence: u64,
    },
    /// Failed its checks (torn, corrupt or missing); rewritten on open.
    Invalid {
        /// Why.
        reason: String,
    },
}

/// A decoded superblock version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperblockState {
    /// The format it was read in ([`VERSION`] once written by this build).
    pub version: u8,
    /// Whose directory this is.
    pub identity: Identity,
    /// Version sequence number (1 for the first).
    pub sequence: u64,
    /// Checksum of this version.
    pub checksum: u32,
    /// Checksum of the previous version (0 for the first).
    pub parent: u32,
    /// The slot table's bound, which fixes the size of each copy's region.
    pub slots_max: usize,
    /// Written by a clean shutdown; the first write after open clears it. Without it, data past
    /// a `replicated` group's checkpoint may have been lost after it was acknowledged.
    pub clean_shutdown: bool,
    /// Per-group control state, keyed by group id.
    pub groups: BTreeMap<u64, GroupSlot>,
}

/// The open superblock of one shard.
pub struct Superblock<F> {
    file: Rc<F>,
    path: PathBuf,
    copy_size_bytes: usize,
    slots_max: usize,
    state: SuperblockState,
    writes: u64,
}

impl<F: StorageFile> Superblock<F> {
    /// Opens the superblock in `dir`, creating it when the directory holds none. Reports every
    /// copy's status; rewrites stale and invalid copies before returning. A superblock whose
    /// slot table was made for another `slots_max` is laid out again for this one (crash-safely:
    /// written whole under a temporary name, then renamed into place), so a data directory's
    /// group bound can be raised; lowering it below the groups it holds is refused.
    ///
    /// Fails with [`Error::Mismatch`] when the directory belongs to another identity or holds
    /// more groups than `slots_max`, and with [`Error::Corruption`] when no copy is valid.
    pub async fn open<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        identity: Identity,
        slots_max: usize,
    ) -> Result<(Self, Vec<CopyStatus>)> {
        assert!(slots_max <= SLOTS_MAX_LIMIT, "slots_max {slots_max} beyond the format's bound");
        let path = dir.join(FILE_NAME);
        let copy_size_bytes = copy_size_bytes(slots_max);
        let exists = storage.exists(&path).await.map_err(|e| Error::io("probing superblock", e))?;
        let fresh = |sequence, parent, groups| SuperblockState {
            version: VERSION,
            identity,
            sequence,
            checksum: 0,
            parent,
            slots_max,
            clean_shutdown: false,
            groups,
        };
        if !exists {
            let superblock =
                Self::create(storage, dir, fresh(0, 0, BTreeMap::new()), BTreeMap::new()).await?;
            let status = (0..COPIES)
                .map(|_| CopyStatus::Current { sequence: superblock.state.sequence })
                .collect();
            return Ok((superblock, status));
        }
        let file = storage
            .open(&path, OpenMode::ReadWrite, true)
            .await
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let (decoded, newest) = read_layout(&file, &path, copy_size_bytes).await?;
        let Some(newest) = newest else {
            let reasons: Vec<String> =
                decoded.iter().filter_map(|copy| copy.as_ref().err().cloned()).collect();
            return Err(Error::Corruption(crate::Corruption {
                file: path,
                position_bytes: 0,
                offset: None,
                op: None,
                reason: format!("no valid superblock copy: {}", reasons.join("; ")),
            }));
        };
        if newest.identity != identity {
            let (found, configured) = newest.identity.differences(&identity);
            let hint = if newest.identity.shard_count != identity.shard_count {
                " (a changed shard count needs an offline reshard)"
            } else {
                ""
            };
            return Err(Error::Mismatch(format!(
                "{} belongs to {found}, but this server is {configured}{hint}",
                path.display(),
            )));
        }
        if newest.slots_max != slots_max || newest.version != VERSION {
            if newest.groups.len() > slots_max {
                return Err(Error::Mismatch(format!(
                    "{} holds {} groups, more than groups_max {slots_max}",
                    path.display(),
                    newest.groups.len()
                )));
            }
            // The next version, in the new layout: nothing in it changes but the bound and the
            // format.
            let next = fresh(newest.sequence + 1, newest.checksum, BTreeMap::new());
            let superblock = Self::create(storage, dir, next, newest.groups).await?;
            let status = (0..COPIES)
                .map(|_| CopyStatus::Current { sequence: superblock.state.sequence })
                .collect();
            return Ok((superblock, status));
        }
        let status: Vec<CopyStatus> = decoded
            .iter()
            .map(|copy| match copy {
                Ok(state)
                    if state.sequence == newest.sequence && state.checksum == newest.checksum =>
                {
                    CopyStatus::Current { sequence: state.sequence }
                }
                Ok(state) => CopyStatus::Stale { sequence: state.sequence },
                Err(reason) => CopyStatus::Invalid { reason: reason.clone() },
            })
            .collect();
        let mut superblock = Superblock {
            file: Rc::new(file),
            path,
            copy_size_bytes,
            slots_max,
            state: newest,
            writes: 0,
        };
        if status.iter().any(|s| !matches!(s, CopyStatus::Current { .. })) {
            // Rewrite the same version into every copy: nothing new becomes visible, and the next
            // crash again finds COPIES intact copies.
            let encoded = encode_version(&superblock.state, copy_size_bytes);
            superblock.write_copies(encoded).await?;
        }
        Ok((superblock, status))
    }

    /// Writes a whole superblock holding `base` with `groups` (its sequence, parent and bound)
    /// under a temporary name, every copy synced, then renames it into place and syncs the
    /// directory: a crash at any point leaves either the old file or the whole new one. The
    /// file is then exactly [`COPIES`] copy regions long, which is how an open that finds copy 0
    /// torn still tells the layout.
    async fn create<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        base: SuperblockState,
        groups: BTreeMap<u64, GroupSlot>,
    ) -> Result<Self> {
        let path = dir.join(FILE_NAME);
        let temp = dir.join(TEMP_FILE_NAME);
        // A temporary file an interrupted creation left holds nothing anyone needs.
        if storage.exists(&temp).await.map_err(|e| Error::io("probing superblock", e))? {
            storage
                .remove_file(&temp)
                .await
                .map_err(|e| Error::io("removing a stale superblock", e))?;
        }
        let file = storage
            .open(&temp, OpenMode::CreateReadWrite, true)
            .await
            .map_err(|e| Error::io(format!("opening {}", temp.display()), e))?;
        let copy_size_bytes = copy_size_bytes(base.slots_max);
        let mut superblock = Superblock {
            file: Rc::new(file),
            path,
            copy_size_bytes,
            slots_max: base.slots_max,
            // The version before this one, as far as `begin_write` asks: its parent is the one
            // given (a relayout continues the old file's chain).
            state: SuperblockState {
                sequence: base.sequence.saturating_sub(1),
                checksum: base.parent,
                ..base
            },
            writes: 0,
        };
        let write = superblock.begin_write(groups)?;
        write.run().await?;
        let end = (COPIES * copy_size_bytes) as u64;
        if write.bytes.len() < copy_size_bytes {
            let mut zeros = AlignedBuf::zeroed(BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES);
            zeros.set_len(BLOCK_SIZE_BYTES);
            let last_block = end - BLOCK_SIZE_BYTES as u64;
            superblock
                .file
                .write_at(zeros.freeze(), last_block)
                .await
                .map_err(|e| Error::io("sizing the new superblock", e))?;
            superblock.file.sync_data().await.map_err(|e| Error::io("syncing superblock", e))?;
        }
        superblock.state = write.next;
        storage
            .rename(&temp, &superblock.path)
            .await
            .map_err(|e| Error::io("renaming the new superblock into place", e))?;
        storage.sync_dir(dir).await.map_err(|e| Error::io("syncing shard directory", e))?;
        Ok(superblock)
    }

    /// The current durable version.
    pub fn state(&self) -> &SuperblockState {
        &self.state
    }

    /// How many versions this handle has written (a counter tests and metrics read).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Writes a new version holding `groups`, copy by copy, each synced before the next. On
    /// success the new version is durable and current.
    pub async fn write(&mut self, groups: BTreeMap<u64, GroupSlot>) -> Result<()> {
        self.write_with(groups, false).await
    }

    /// As [`Superblock::write`], saying whether this version ends a clean shutdown.
    pub async fn write_with(
        &mut self,
        groups: BTreeMap<u64, GroupSlot>,
        clean_shutdown: bool,
    ) -> Result<()> {
        let mut write = self.begin_write(groups)?;
        if clean_shutdown {
            write = self.begin_write_clean(write);
        }
        write.run().await?;
        self.finish_write(write);
        Ok(())
    }

    /// Encodes a new version holding `groups`; run the returned write, then
    /// [`Superblock::finish_write`]. Nothing changes until then.
    pub fn begin_write(&mut self, groups: BTreeMap<u64, GroupSlot>) -> Result<SuperblockWrite<F>> {
        if groups.len() > self.slots_max {
            return Err(Error::LimitReached(format!(
                "superblock holds at most {} groups, asked for {}",
                self.slots_max,
                groups.len()
            )));
        }
        let mut next = SuperblockState {
            version: VERSION,
            identity: self.state.identity,
            sequence: self.state.sequence + 1,
            checksum: 0,
            parent: self.state.checksum,
            slots_max: self.slots_max,
            clean_shutdown: false,
            groups,
        };
        let encoded = encode_version(&next, self.copy_size_bytes);
        next.checksum = u32::from_le_bytes(encoded[..4].try_into().expect("4 bytes"));
        Ok(SuperblockWrite {
            file: Rc::clone(&self.file),
            bytes: self.block_image(&encoded),
            copy_size_bytes: self.copy_size_bytes,
            next,
        })
    }

    fn begin_write_clean(&self, write: SuperblockWrite<F>) -> SuperblockWrite<F> {
        let mut next = write.next;
        next.clean_shutdown = true;
        let encoded = encode_version(&next, self.copy_size_bytes);
        next.checksum = u32::from_le_bytes(encoded[..4].try_into().expect("4 bytes"));
        SuperblockWrite { bytes: self.block_image(&encoded), next, ..write }
    }

    /// Adopts a version whose write completed.
    pub fn finish_write(&mut self, write: SuperblockWrite<F>) {
        assert_eq!(write.next.sequence, self.state.sequence + 1, "superblock writes in order");
        self.state = write.next;
        self.writes += 1;
    }

    async fn write_copies(&mut self, encoded: Vec<u8>) -> Result<()> {
        let bytes = self.block_image(&encoded);
        write_copies(&*self.file, &bytes, self.copy_size_bytes).await
    }

    /// `encoded` zero-padded to whole blocks, in an aligned buffer.
    fn block_image(&self, encoded: &[u8]) -> Bytes {
        let len = encoded.len().next_multiple_of(BLOCK_SIZE_BYTES).min(self.copy_size_bytes);
        let mut buffer = AlignedBuf::zeroed(len, BLOCK_SIZE_BYTES);
        buffer.extend_from_slice(encoded);
        buffer.set_len(len);
        buffer.freeze()
    }
}

/// A superblock version being written: the copies go out one by one, each synced.
pub struct SuperblockWrite<F> {
    file: Rc<F>,
    bytes: Bytes,
    copy_size_bytes: usize,
    next: SuperblockState,
}

impl<F: StorageFile> SuperblockWrite<F> {
    /// Writes and syncs every copy in turn.
    pub async fn run(&self) -> Result<()> {
        write_copies(&*self.file, &self.bytes, self.copy_size_bytes).await
    }
}

async fn write_copies<F: StorageFile>(
    file: &F,
    bytes: &Bytes,
    copy_size_bytes: usize,
) -> Result<()> {
    for copy in 0..COPIES {
        let offset = (copy * copy_size_bytes) as u64;
        file.write_at(bytes.clone(), offset)
            .await
            .map_err(|e| Error::io(format!("writing superblock copy {copy}"), e))?;
        file.sync_data()
            .await
            .map_err(|e| Error::io(format!("syncing superblock copy {copy}"), e))?;
    }
    Ok(())
}

/// The size of one copy's region in the file: header and every slot, block-aligned.
#[must_use]
pub fn copy_size_bytes(slots_max: usize) -> usize {
    copy_size_bytes_in(VERSION, slots_max)
}

/// [`copy_size_bytes`] in format `version`.
#[must_use]
pub fn copy_size_bytes_in(version: u8, slots_max: usize) -> usize {
    (HEADER_SIZE_BYTES + slots_max * slot_size_bytes(version)).next_multiple_of(BLOCK_SIZE_BYTES)
}

/// A group slot's size in format `version` (an unknown version is refused before slots are read).
fn slot_size_bytes(version: u8) -> usize {
    if version == VERSION_128_BYTE_SLOTS { SLOT_SIZE_BYTES_V1 } else { SLOT_SIZE_BYTES }
}

fn used_size_bytes(version: u8, slot_count: usize) -> usize {
    HEADER_SIZE_BYTES + slot_count * slot_size_bytes(version)
}

/// Reads every copy's region (short or missing regions come back zero-filled, hence invalid).
async fn read_copies<F: StorageFile>(file: &F, copy_size_bytes: usize) -> Result<Vec<Vec<u8>>> {
    let mut copies = Vec::with_capacity(COPIES);
    let mut buffer = AlignedBuf::zeroed(copy_size_bytes, BLOCK_SIZE_BYTES);
    for copy in 0..COPIES {
        buffer.clear_zeroed();
        let (result, filled) = file.read_at(buffer, (copy * copy_size_bytes) as u64).await;
        buffer = filled;
        match result {
            Ok(()) => {
                let mut bytes = buffer.as_slice().to_vec();
                bytes.resize(copy_size_bytes, 0);
                copies.push(bytes);
            }
            // A read error on one copy is what the copies are for: treat it as invalid.
            Err(_) => copies.push(vec![0; copy_size_bytes]),
        }
    }
    Ok(copies)
}

/// Every copy decoded, and the newest valid one, read in the layout the file was written in:
/// the configured one (`configured_bytes` per copy) if a valid copy says so; else the one the newest valid
/// copy names (copy 0 lies at the start in every layout); else, when no copy decodes, the one
/// the file's size gives (a file written by [`Superblock::create`] is exactly its copies long).
async fn read_layout<F: StorageFile>(
    file: &F,
    path: &Path,
    configured_bytes: usize,
) -> Result<(Vec<std::result::Result<SuperblockState, String>>, Option<SuperblockState>)> {
    let read = |region_bytes| async move {
        let copies = read_copies(file, region_bytes).await?;
        let decoded: Vec<_> = copies.iter().map(|bytes| decode_copy(bytes)).collect();
        let newest = decoded
            .iter()
            .filter_map(|copy| copy.as_ref().ok())
            .max_by_key(|state| state.sequence)
            .cloned();
        Ok::<_, Error>((decoded, newest))
    };
    let (decoded, newest) = read(configured_bytes).await?;
    let other = match &newest {
        Some(state) if copy_size_bytes_in(state.version, state.slots_max) == configured_bytes => {
            None
        }
        Some(state) => Some(copy_size_bytes_in(state.version, state.slots_max)),
        None => {
            let size = file.size_bytes().await.map_err(|e| Error::io("sizing superblock", e))?;
            let region = size / COPIES as u64;
            (size.is_multiple_of(COPIES as u64)
                && region.is_multiple_of(BLOCK_SIZE_BYTES as u64)
                && region != configured_bytes as u64
                && region <= copy_size_bytes(SLOTS_MAX_LIMIT) as u64)
                .then_some(region as usize)
        }
    };
    match other {
        Some(size) if size <= copy_size_bytes(SLOTS_MAX_LIMIT) => {
            let (decoded, newest) = read(size).await?;
            Ok((decoded, newest))
        }
        Some(size) => Err(Error::Corruption(crate::Corruption {
            file: path.to_path_buf(),
            position_bytes: 0,
            offset: None,
            op: None,
            reason: format!("superblock copies of {size} bytes exceed the format's bound"),
        })),
        None => Ok((decoded, newest)),
    }
}

fn encode_version(state: &SuperblockState, copy_size_bytes: usize) -> Vec<u8> {
    let used = used_size_bytes(VERSION, state.groups.len());
    let mut bytes = vec![0u8; used.max(HEADER_SIZE_BYTES)];
    bytes[OFF_PARENT..OFF_PARENT + 4].copy_from_slice(&state.parent.to_le_bytes());
    bytes[OFF_SEQUENCE..OFF_SEQUENCE + 8].copy_from_slice(&state.sequence.to_le_bytes());
    bytes[OFF_CLUSTER..OFF_CLUSTER + 8].copy_from_slice(&state.identity.cluster.to_le_bytes());
    bytes[OFF_NODE..OFF_NODE + 8].copy_from_slice(&state.identity.node.to_le_bytes());
    bytes[OFF_SHARD..OFF_SHARD + 4].copy_from_slice(&state.identity.shard.to_le_bytes());
    bytes[OFF_SHARD_COUNT..OFF_SHARD_COUNT + 4]
        .copy_from_slice(&state.identity.shard_count.to_le_bytes());
    let slot_count = u32::try_from(state.groups.len()).expect("slot count bounded by slots_max");
    bytes[OFF_SLOT_COUNT..OFF_SLOT_COUNT + 4].copy_from_slice(&slot_count.to_le_bytes());
    bytes[OFF_VERSION] = VERSION;
    let slots_max = u32::try_from(state.slots_max).expect("slots_max fits u32");
    bytes[OFF_SLOTS_MAX..OFF_SLOTS_MAX + 4].copy_from_slice(&slots_max.to_le_bytes());
    let flags = if state.clean_shutdown { FLAG_CLEAN_SHUTDOWN } else { 0 };
    bytes[OFF_FLAGS..OFF_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
    for (index, slot) in state.groups.values().enumerate() {
        let start = HEADER_SIZE_BYTES + index * SLOT_SIZE_BYTES;
        encode_slot(&mut bytes[start..start + SLOT_SIZE_BYTES], slot);
    }
    let checksum = shoal_proto::checksum::crc32c(&bytes[OFF_PARENT..]);
    bytes[OFF_CHECKSUM..OFF_CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
    debug_assert!(bytes.len() <= copy_size_bytes);
    bytes
}

fn encode_slot(bytes: &mut [u8], slot: &GroupSlot) {
    let put = |bytes: &mut [u8], at: usize, value: &[u8]| {
        bytes[at..at + value.len()].copy_from_slice(value);
    };
    put(bytes, SLOT_GROUP, &slot.group.to_le_bytes());
    put(bytes, SLOT_VIEW, &slot.view.to_le_bytes());
    put(bytes, SLOT_LOG_VIEW, &slot.log_view.to_le_bytes());
    put(bytes, SLOT_CHECKPOINT_OP, &slot.checkpoint.op.to_le_bytes());
    put(bytes, SLOT_CHECKPOINT_NEXT_OFFSET, &slot.checkpoint.next_offset.to_le_bytes());
    put(bytes, SLOT_CHECKPOINT_SEGMENT, &slot.checkpoint.segment_base_offset.to_le_bytes());
    put(bytes, SLOT_CHECKPOINT_POSITION, &slot.checkpoint.position_bytes.to_le_bytes());
    put(bytes, SLOT_CHECKPOINT_CHECKSUM, &slot.checkpoint.checksum.to_le_bytes());
    bytes[SLOT_DURABILITY] = slot.config.durability.to_byte();
    put(bytes, SLOT_FENCE_OP, &slot.fence.op.to_le_bytes());
    put(bytes, SLOT_FENCE_VIEW, &slot.fence.view.to_le_bytes());
    put(bytes, SLOT_FENCE_SEQ, &slot.fence.seq.to_le_bytes());
    bytes[SLOT_FENCE_FINISHED] = u8::from(slot.fence.finished);
    put(bytes, SLOT_RECORD_SIZE_MAX, &slot.config.record_size_bytes_max.to_le_bytes());
    put(bytes, SLOT_SEGMENT_SIZE, &slot.config.segment_size_bytes.to_le_bytes());
    put(bytes, SLOT_SEGMENT_AGE_MS, &slot.config.segment_age_ms_max.to_le_bytes());
    put(bytes, SLOT_RETENTION_BYTES, &slot.config.retention_bytes.to_le_bytes());
    put(bytes, SLOT_RETENTION_MS, &slot.config.retention_ms.to_le_bytes());
    put(bytes, SLOT_DAMAGED_FROM, &slot.damaged_from.to_le_bytes());
    put(bytes, SLOT_MEMBERS, &slot.config.members.to_le_bytes());
    put(bytes, SLOT_JOURNAL_FLOOR, &slot.journal_floor_seq.to_le_bytes());
    let head_plus_one = slot
        .log_view_head_op
        .and_then(|op| op.checked_add(1))
        .filter(|&value| value < 1 << (8 * SLOT_LOG_VIEW_HEAD_BYTES))
        .unwrap_or(0);
    put(bytes, SLOT_LOG_VIEW_HEAD, &head_plus_one.to_le_bytes()[..SLOT_LOG_VIEW_HEAD_BYTES]);
    bytes[SLOT_FLAGS] = if slot.transfer_pending { SLOT_FLAG_TRANSFER_PENDING } else { 0 };
}

/// Decodes one copy's bytes: checks the checksum before trusting any field, then the version,
/// the slot count bound and every slot. Errors are human-readable reasons (the copy is invalid).
///
/// The copy names its own slot bound (`slots_max`), so a reader needs no configuration; the
/// bound is checked against the bytes at hand before any slot is read.
pub fn decode_copy(bytes: &[u8]) -> Result<SuperblockState, String> {
    if bytes.len() < HEADER_SIZE_BYTES {
        return Err(format!("copy is {} bytes, shorter than its header", bytes.len()));
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let slots_max = u32_at(OFF_SLOTS_MAX) as usize;
    let slot_count = u32_at(OFF_SLOT_COUNT) as usize;
    if slot_count > slots_max {
        return Err(format!("slot count {slot_count} exceeds the bound {slots_max}"));
    }
    // The version byte picks the slot size before the checksum vouches for it: a damaged byte
    // at worst makes the checksum cover the wrong length, and fail.
    let version = bytes[OFF_VERSION];
    let used = used_size_bytes(version, slot_count);
    if used > bytes.len() {
        return Err(format!("slot count {slot_count} does not fit the copy"));
    }
    let stored = u32_at(OFF_CHECKSUM);
    let computed = shoal_proto::checksum::crc32c(&bytes[OFF_PARENT..used]);
    if stored != computed {
        return Err(format!(
            "checksum {stored:#010x} != computed {computed:#010x} (torn or corrupt)"
        ));
    }
    if version != VERSION && version != VERSION_128_BYTE_SLOTS {
        return Err(format!("unsupported superblock version {version}"));
    }
    let slot_size = slot_size_bytes(version);
    let mut groups = BTreeMap::new();
    for index in 0..slot_count {
        let start = HEADER_SIZE_BYTES + index * slot_size;
        let slot = &bytes[start..start + slot_size];
        let s32 = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
        let s64 = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
        let durability = Durability::from_byte(slot[SLOT_DURABILITY])
            .ok_or_else(|| format!("slot {index}: unknown durability {}", slot[SLOT_DURABILITY]))?;
        let config = GroupConfig {
            durability,
            segment_size_bytes: s64(SLOT_SEGMENT_SIZE),
            segment_age_ms_max: s64(SLOT_SEGMENT_AGE_MS),
            retention_bytes: s64(SLOT_RETENTION_BYTES),
            retention_ms: s64(SLOT_RETENTION_MS),
            record_size_bytes_max: s32(SLOT_RECORD_SIZE_MAX),
            members: if version == VERSION { s64(SLOT_MEMBERS) } else { 0 },
        };
        if let Err(error) = config.validate() {
            return Err(format!("slot {index}: {error}"));
        }
        let flags = slot[SLOT_FLAGS];
        if flags & !SLOT_FLAGS_KNOWN != 0 {
            return Err(format!("slot {index}: unknown flags {flags:#04x}"));
        }
        let mut head_plus_one = [0u8; 8];
        head_plus_one[..SLOT_LOG_VIEW_HEAD_BYTES].copy_from_slice(
            &slot[SLOT_LOG_VIEW_HEAD..SLOT_LOG_VIEW_HEAD + SLOT_LOG_VIEW_HEAD_BYTES],
        );
        let log_view_head_op = u64::from_le_bytes(head_plus_one).checked_sub(1);
        let group = GroupSlot {
            group: s64(SLOT_GROUP),
            config,
            view: s32(SLOT_VIEW),
            log_view: s32(SLOT_LOG_VIEW),
            log_view_head_op,
            checkpoint: Checkpoint {
                op: s64(SLOT_CHECKPOINT_OP),
                checksum: s32(SLOT_CHECKPOINT_CHECKSUM),
                next_offset: s64(SLOT_CHECKPOINT_NEXT_OFFSET),
                segment_base_offset: s64(SLOT_CHECKPOINT_SEGMENT),
                position_bytes: s64(SLOT_CHECKPOINT_POSITION),
            },
            fence: Fence {
                op: s64(SLOT_FENCE_OP),
                view: s32(SLOT_FENCE_VIEW),
                seq: s64(SLOT_FENCE_SEQ),
                finished: slot[SLOT_FENCE_FINISHED] != 0,
            },
            damaged_from: s64(SLOT_DAMAGED_FROM),
            transfer_pending: flags & SLOT_FLAG_TRANSFER_PENDING != 0,
            journal_floor_seq: if version == VERSION { s64(SLOT_JOURNAL_FLOOR) } else { 0 },
        };
        if groups.insert(group.group, group).is_some() {
            return Err(format!("slot {index}: group {} appears twice", group.group));
        }
    }
    Ok(SuperblockState {
        version,
        identity: Identity {
            cluster: u64_at(OFF_CLUSTER),
            node: u64_at(OFF_NODE),
            shard: u32_at(OFF_SHARD),
            shard_count: u32_at(OFF_SHARD_COUNT),
        },
        sequence: u64_at(OFF_SEQUENCE),
        checksum: stored,
        parent: u32_at(OFF_PARENT),
        slots_max,
        clean_shutdown: u32_at(OFF_FLAGS) & FLAG_CLEAN_SHUTDOWN != 0,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sim::{Sim, SimConfig, SimStorage};

    const SLOTS: usize = 16;

    fn identity() -> Identity {
        Identity { cluster: 9, node: 1, shard: 0, shard_count: 1 }
    }

    fn groups(count: u64, view: u32) -> BTreeMap<u64, GroupSlot> {
        (0..count)
            .map(|group| {
                let slot = GroupSlot { group, view, log_view: view, ..GroupSlot::default() };
                (group, slot)
            })
            .collect()
    }

    /// A version holding `groups`, to encode directly.
    fn version_of(groups: BTreeMap<u64, GroupSlot>) -> SuperblockState {
        SuperblockState {
            version: VERSION,
            identity: identity(),
            sequence: 3,
            checksum: 0,
            parent: 0,
            slots_max: SLOTS,
            clean_shutdown: false,
            groups,
        }
    }

    fn open(sim: &Sim) -> Result<(Superblock<<SimStorage as Storage>::File>, Vec<CopyStatus>)> {
        let storage = sim.storage();
        sim.block_on(async {
            storage.create_dir_all(Path::new("/s")).await.expect("mkdir");
            storage.sync_dir(Path::new("/")).await.expect("sync root");
            Superblock::open(&storage, Path::new("/s"), identity(), SLOTS).await
        })
    }

    #[test]
    fn survives_a_crash_between_any_two_of_its_writes() {
        // One version is 4 writes and 4 syncs; crash after each possible completion.
        let mut crashed_mid_write = 0;
        for crash_after in 0..12u64 {
            for seed in 0..8 {
                let sim = Sim::new(seed * 100 + crash_after, SimConfig::default());
                let (mut superblock, _) = open(&sim).expect("create");
                sim.block_on(superblock.write(groups(3, 1))).expect("version 2");
                let finished = sim.run_until_crash(superblock.write(groups(5, 2)), crash_after);
                if finished.is_none() {
                    crashed_mid_write += 1;
                }
                sim.crash();
                let (superblock, status) = open(&sim).expect("some copy always survives");
                let state = superblock.state();
                assert!(state.sequence == 2 || state.sequence == 3, "old or new, nothing else");
                let expected = if state.sequence == 2 { groups(3, 1) } else { groups(5, 2) };
                assert_eq!(state.groups, expected);
                assert_eq!(status.len(), COPIES);
                // Open rewrote stale and torn copies: a second open finds all current.
                drop(superblock);
                let (_, status) = open(&sim).expect("reopen");
                assert!(
                    status.iter().all(|s| matches!(s, CopyStatus::Current { .. })),
                    "{status:?}"
                );
            }
        }
        assert!(crashed_mid_write >= 40, "the crash points must fall inside the write");
    }

    #[test]
    fn corruption_of_any_one_copy_is_survived_and_repaired() {
        for copy in 0..COPIES {
            let sim = Sim::new(copy as u64, SimConfig::default());
            let (mut superblock, _) = open(&sim).expect("create");
            sim.block_on(superblock.write(groups(4, 7))).expect("write");
            drop(superblock);
            let offset = (copy * copy_size_bytes(SLOTS) + 70) as u64;
            sim.corrupt(Path::new("/s/superblock"), offset, 5);
            let (superblock, status) = open(&sim).expect("three copies remain");
            assert_eq!(superblock.state().groups, groups(4, 7));
            assert!(matches!(status[copy], CopyStatus::Invalid { .. }), "{status:?}");
            drop(superblock);
            let (_, status) = open(&sim).expect("reopen");
            assert!(status.iter().all(|s| matches!(s, CopyStatus::Current { .. })));
        }
    }

    #[test]
    fn every_copy_corrupt_is_corruption_and_a_foreign_directory_is_refused() {
        let sim = Sim::new(1, SimConfig::default());
        let (superblock, _) = open(&sim).expect("create");
        drop(superblock);
        for copy in 0..COPIES {
            sim.corrupt(Path::new("/s/superblock"), (copy * copy_size_bytes(SLOTS) + 8) as u64, 0);
        }
        assert!(matches!(open(&sim), Err(Error::Corruption(_))));

        let sim = Sim::new(2, SimConfig::default());
        drop(open(&sim).expect("create"));
        let storage = sim.storage();
        let other = Identity { shard_count: 2, ..identity() };
        let result = sim.block_on(Superblock::open(&storage, Path::new("/s"), other, SLOTS));
        assert!(matches!(result, Err(Error::Mismatch(_))), "a changed shard count is refused");
    }

    fn open_with(sim: &Sim, slots_max: usize) -> Result<Superblock<<SimStorage as Storage>::File>> {
        let storage = sim.storage();
        sim.block_on(Superblock::open(&storage, Path::new("/s"), identity(), slots_max))
            .map(|(superblock, _)| superblock)
    }

    #[test]
    fn a_changed_slot_bound_lays_the_table_out_again_unless_the_groups_do_not_fit() {
        let sim = Sim::new(5, SimConfig::default());
        let (mut superblock, _) = open(&sim).expect("create");
        sim.block_on(superblock.write(groups(6, 3))).expect("write");
        let sequence = superblock.state().sequence;
        drop(superblock);
        let grown = open_with(&sim, SLOTS * 4).expect("grown");
        assert_eq!(grown.state().groups, groups(6, 3));
        assert_eq!(grown.state().slots_max, SLOTS * 4);
        assert_eq!(grown.state().sequence, sequence + 1, "the relayout is the next version");
        drop(grown);
        assert!(!sim.paths().iter().any(|path| path.ends_with(TEMP_FILE_NAME)));
        let size = sim.file_contents(Path::new("/s/superblock")).expect("file").len();
        assert_eq!(size, COPIES * copy_size_bytes(SLOTS * 4), "exactly its copies long");

        let result = open_with(&sim, 5);
        assert!(matches!(result, Err(Error::Mismatch(_))), "six groups never fit five slots");
        let shrunk = open_with(&sim, 6).expect("six groups fit six slots");
        assert_eq!(shrunk.state().groups, groups(6, 3));
        drop(shrunk);

        // Copy 0 torn and the bound changed again: the file's size still tells its layout.
        sim.corrupt(Path::new("/s/superblock"), 8, 0);
        let regrown = open_with(&sim, SLOTS * 2).expect("copies 1-3 found by the file's size");
        assert_eq!(regrown.state().groups, groups(6, 3));
    }

    #[test]
    fn a_relayout_survives_a_crash_at_any_point() {
        let mut crashed = 0;
        for crash_after in 0..16u64 {
            let sim = Sim::new(100 + crash_after, SimConfig::default());
            let (mut superblock, _) = open(&sim).expect("create");
            sim.block_on(superblock.write(groups(5, 2))).expect("write");
            drop(superblock);
            let storage = sim.storage();
            let relayout = Superblock::open(&storage, Path::new("/s"), identity(), SLOTS * 3);
            if sim.run_until_crash(relayout, crash_after).is_none() {
                crashed += 1;
            }
            sim.crash();
            // Whichever layout survived, both bounds open it with every group intact.
            for slots_max in [SLOTS * 3, SLOTS] {
                let superblock = open_with(&sim, slots_max).expect("reopen after the crash");
                assert_eq!(superblock.state().groups, groups(5, 2), "crash after {crash_after}");
            }
        }
        assert!(crashed >= 8, "the crash points must fall inside the relayout");
    }

    #[test]
    fn transfer_pending_flag_round_trips_and_an_old_zero_byte_reads_as_clear() {
        let mut state = version_of(groups(2, 1));
        state.groups.get_mut(&1).expect("slot").transfer_pending = true;
        let copy_size = copy_size_bytes(SLOTS);
        let mut bytes = encode_version(&state, copy_size);
        bytes.resize(copy_size, 0);
        let decoded = decode_copy(&bytes).expect("decodes");
        assert!(!decoded.groups[&0].transfer_pending);
        assert!(decoded.groups[&1].transfer_pending);
        // The flag is byte 113 of the second slot; a slot of an older build has zero there.
        let flags_at = HEADER_SIZE_BYTES + SLOT_SIZE_BYTES + 113;
        assert_eq!(bytes[flags_at], SLOT_FLAG_TRANSFER_PENDING);
        let reseal = |bytes: &mut Vec<u8>| {
            let used = used_size_bytes(VERSION, 2);
            let checksum = shoal_proto::checksum::crc32c(&bytes[OFF_PARENT..used]);
            bytes[OFF_CHECKSUM..OFF_CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
        };
        bytes[flags_at] = 0;
        reseal(&mut bytes);
        assert!(!decode_copy(&bytes).expect("decodes").groups[&1].transfer_pending);
        // A bit this build does not know is a newer format: the copy is refused, not misread.
        bytes[flags_at] = 0x80;
        reseal(&mut bytes);
        let error = decode_copy(&bytes).expect_err("unknown flag");
        assert!(error.contains("unknown flags"), "{error}");
    }

    #[test]
    fn log_view_head_op_round_trips_in_48_bits_and_an_old_zero_field_reads_as_unknown() {
        let bound = (1u64 << 48) - 2;
        let cases = [
            (None, None),
            (Some(0), Some(0)),
            (Some(4_711), Some(4_711)),
            (Some(bound), Some(bound)),
            // Beyond 48 bits the head is kept as unknown: the rule from before it was kept.
            (Some(bound + 1), None),
            (Some(u64::MAX), None),
        ];
        let copy_size = copy_size_bytes(SLOTS);
        for (written, read) in cases {
            let mut state = version_of(groups(2, 1));
            let slot = state.groups.get_mut(&1).expect("slot");
            slot.log_view_head_op = written;
            slot.damaged_from = u64::MAX;
            slot.transfer_pending = true;
            let mut bytes = encode_version(&state, copy_size);
            bytes.resize(copy_size, 0);
            let decoded = decode_copy(&bytes).expect("decodes");
            assert_eq!(decoded.groups[&1].log_view_head_op, read, "{written:?}");
            assert_eq!(decoded.groups[&0].log_view_head_op, None);
            // Bytes 114..120 of the slot, zero in a slot written before the field existed.
            let field = HEADER_SIZE_BYTES + SLOT_SIZE_BYTES + 114;
            assert_eq!(bytes[field..field + 6] == [0; 6], read.is_none());
            // The neighbours, filled, keep their own values.
            assert_eq!(decoded.groups[&1].damaged_from, u64::MAX);
            assert!(decoded.groups[&1].transfer_pending);
        }
    }

    /// `state` as version 1 wrote it: 128-byte slots (no members), sealed.
    fn encode_version_1(state: &SuperblockState) -> Vec<u8> {
        let current = encode_version(state, copy_size_bytes(state.slots_max));
        let mut bytes = current[..HEADER_SIZE_BYTES].to_vec();
        bytes[OFF_VERSION] = VERSION_128_BYTE_SLOTS;
        for index in 0..state.groups.len() {
            let start = HEADER_SIZE_BYTES + index * SLOT_SIZE_BYTES;
            bytes.extend_from_slice(&current[start..start + SLOT_SIZE_BYTES_V1]);
        }
        let checksum = shoal_proto::checksum::crc32c(&bytes[OFF_PARENT..]);
        bytes[OFF_CHECKSUM..OFF_CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    #[test]
    fn members_round_trip_and_a_version_1_file_opens_and_is_laid_out_again() {
        // A bound at which the two layouts differ in size.
        let slots = 200;
        let mut state = SuperblockState { slots_max: slots, ..version_of(groups(3, 2)) };
        for (index, slot) in state.groups.values_mut().enumerate() {
            slot.config.members = 0x0000_0002_0000_0005 << index;
        }
        let copy_size = copy_size_bytes(slots);
        let mut bytes = encode_version(&state, copy_size);
        bytes.resize(copy_size, 0);
        assert_eq!(decode_copy(&bytes).expect("decodes").groups, state.groups);

        // A data directory written by version 1: four copies of 128-byte slots.
        let old = encode_version_1(&state);
        let old_copy = copy_size_bytes_in(VERSION_128_BYTE_SLOTS, slots);
        assert!(old_copy < copy_size);
        let decoded = decode_copy(&old).expect("a version 1 copy decodes");
        assert_eq!(decoded.version, VERSION_128_BYTE_SLOTS);
        assert!(decoded.groups.values().all(|slot| slot.config.members == 0));
        let sim = Sim::new(9, SimConfig::default());
        let storage = sim.storage();
        sim.block_on(async {
            storage.create_dir_all(Path::new("/s")).await.expect("mkdir");
            let file = storage
                .open(Path::new("/s/superblock"), OpenMode::CreateReadWrite, true)
                .await
                .expect("create");
            let mut image = old.clone();
            image.resize(old_copy, 0);
            for copy in 0..COPIES {
                let mut buffer = AlignedBuf::zeroed(old_copy, BLOCK_SIZE_BYTES);
                buffer.extend_from_slice(&image);
                file.write_at(buffer.freeze(), (copy * old_copy) as u64).await.expect("write");
            }
            file.sync_data().await.expect("sync");
            storage.sync_dir(Path::new("/s")).await.expect("sync dir");
        });
        let superblock = open_with(&sim, slots).expect("a version 1 file opens");
        assert_eq!(superblock.state().version, VERSION);
        assert_eq!(superblock.state().sequence, state.sequence + 1, "laid out again as the next");
        assert_eq!(superblock.state().groups, decoded.groups, "every slot kept, no members");
        drop(superblock);
        let size = sim.file_contents(Path::new("/s/superblock")).expect("file").len();
        assert_eq!(size, COPIES * copy_size, "in the current layout");
        let reopened = open_with(&sim, slots).expect("reopen");
        assert_eq!(reopened.state().groups, decoded.groups);
    }

    #[test]
    fn slot_table_is_bounded() {
        let sim = Sim::new(3, SimConfig::default());
        let (mut superblock, _) = open(&sim).expect("create");
        sim.block_on(superblock.write(groups(SLOTS as u64, 1))).expect("at the bound");
        let result = sim.block_on(superblock.write(groups(SLOTS as u64 + 1, 1)));
        assert!(matches!(result, Err(Error::LimitReached(_))));
    }
}
