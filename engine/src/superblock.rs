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

use crate::error::{Error, Result};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};

/// Copies written per version.
pub const COPIES: usize = 4;
/// The superblock's file name inside a shard directory.
pub const FILE_NAME: &str = "superblock";
/// Format version of the superblock copy layout.
pub const VERSION: u8 = 1;

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
const OFF_HEADER_RESERVED: usize = OFF_VERSION + 1;
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
const SLOT_RESERVED: usize = SLOT_FENCE_VIEW + 4;
/// Bytes of one group slot.
pub const SLOT_SIZE_BYTES: usize = 96;
const _: () = assert!(SLOT_RESERVED <= SLOT_SIZE_BYTES);
const _: () = assert!(SLOT_CHECKPOINT_OP.is_multiple_of(8) && SLOT_FENCE_OP.is_multiple_of(8));

/// The durability mode of a group, chosen at creation (DESIGN.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledged once written (single node) or once a quorum has it: the partition log is the
    /// write-ahead log.
    #[default]
    Replicated,
    /// Acknowledged once durable: prepares also go to the shard journal, synced every cycle.
    Persisted,
}

impl Durability {
    fn to_byte(self) -> u8 {
        match self {
            Durability::Replicated => 1,
            Durability::Persisted => 2,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Durability::Replicated),
            2 => Some(Durability::Persisted),
            _ => None,
        }
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

/// A durable truncation: every record of this group above `op` written in a view below `view` is
/// dead, wherever it still lies (segment tail, journal). Written before anything is appended in
/// the new view, so a crash cannot resurrect a truncated op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Fence {
    /// Ops above this one from older views are dead.
    pub op: u64,
    /// The view the truncation belongs to (0: no fence).
    pub view: u32,
}

impl Fence {
    /// Whether a record with this op and view was cut off by the fence.
    #[must_use]
    pub fn kills(&self, op: u64, view: u32) -> bool {
        self.view != 0 && op > self.op && view < self.view
    }
}

/// The durable control state of one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GroupSlot {
    /// The group id.
    pub group: u64,
    /// How the group's appends become durable.
    pub durability: Durability,
    /// Highest view the replica has seen (persisted before it votes).
    pub view: u32,
    /// Highest view in which the replica's log was accepted by a primary.
    pub log_view: u32,
    /// Where recovery starts.
    pub checkpoint: Checkpoint,
    /// The newest truncation.
    pub fence: Fence,
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
    /// Whose directory this is.
    pub identity: Identity,
    /// Version sequence number (1 for the first).
    pub sequence: u64,
    /// Checksum of this version.
    pub checksum: u32,
    /// Checksum of the previous version (0 for the first).
    pub parent: u32,
    /// Per-group control state, keyed by group id.
    pub groups: BTreeMap<u64, GroupSlot>,
}

/// The open superblock of one shard.
pub struct Superblock<F> {
    file: F,
    path: PathBuf,
    copy_size_bytes: usize,
    slots_max: usize,
    state: SuperblockState,
    writes: u64,
    buffer: Option<AlignedBuf>,
}

impl<F: StorageFile> Superblock<F> {
    /// Opens the superblock in `dir`, creating it when the directory holds none. Reports every
    /// copy's status; rewrites stale and invalid copies before returning.
    ///
    /// Fails with [`Error::Mismatch`] when the directory belongs to another identity, and with
    /// [`Error::Corruption`] when no copy is valid.
    pub async fn open<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        identity: Identity,
        slots_max: usize,
    ) -> Result<(Self, Vec<CopyStatus>)> {
        let path = dir.join(FILE_NAME);
        let copy_size_bytes = copy_size_bytes(slots_max);
        let exists = storage.exists(&path).await.map_err(|e| Error::io("probing superblock", e))?;
        let file = storage
            .open(&path, OpenMode::CreateReadWrite, true)
            .await
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let mut superblock = Superblock {
            file,
            path,
            copy_size_bytes,
            slots_max,
            state: SuperblockState {
                identity,
                sequence: 0,
                checksum: 0,
                parent: 0,
                groups: BTreeMap::new(),
            },
            writes: 0,
            buffer: None,
        };
        if !exists {
            superblock.write(BTreeMap::new()).await?;
            storage.sync_dir(dir).await.map_err(|e| Error::io("syncing shard directory", e))?;
            let status = (0..COPIES)
                .map(|_| CopyStatus::Current { sequence: superblock.state.sequence })
                .collect();
            return Ok((superblock, status));
        }

        let copies = read_copies(&superblock.file, copy_size_bytes).await?;
        let decoded: Vec<_> = copies.iter().map(|bytes| decode_copy(bytes, slots_max)).collect();
        let newest = decoded
            .iter()
            .filter_map(|copy| copy.as_ref().ok())
            .max_by_key(|state| state.sequence)
            .cloned();
        let Some(newest) = newest else {
            let reasons: Vec<String> =
                decoded.iter().filter_map(|copy| copy.as_ref().err().cloned()).collect();
            return Err(Error::Corruption(crate::Corruption {
                file: superblock.path.clone(),
                position_bytes: 0,
                offset: None,
                op: None,
                reason: format!("no valid superblock copy: {}", reasons.join("; ")),
            }));
        };
        if newest.identity != identity {
            return Err(Error::Mismatch(format!(
                "{} belongs to {:?}, this server is {:?} (a changed shard count needs an offline \
                 reshard)",
                superblock.path.display(),
                newest.identity,
                identity
            )));
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
        superblock.state = newest;
        if status.iter().any(|s| !matches!(s, CopyStatus::Current { .. })) {
            // Rewrite the same version into every copy: nothing new becomes visible, and the next
            // crash again finds COPIES intact copies.
            let encoded = encode_version(&superblock.state, copy_size_bytes);
            superblock.write_copies(encoded).await?;
        }
        Ok((superblock, status))
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
        if groups.len() > self.slots_max {
            return Err(Error::LimitReached(format!(
                "superblock holds at most {} groups, asked for {}",
                self.slots_max,
                groups.len()
            )));
        }
        let mut next = SuperblockState {
            identity: self.state.identity,
            sequence: self.state.sequence + 1,
            checksum: 0,
            parent: self.state.checksum,
            groups,
        };
        let mut encoded = encode_version(&next, self.copy_size_bytes);
        next.checksum = u32::from_le_bytes(encoded[..4].try_into().expect("4 bytes"));
        encoded.truncate(used_size_bytes(next.groups.len()));
        self.write_copies(encoded).await?;
        self.state = next;
        self.writes += 1;
        Ok(())
    }

    async fn write_copies(&mut self, encoded: Vec<u8>) -> Result<()> {
        let used = used_size_bytes(self.state.groups.len()).max(encoded.len());
        let mut buffer = match self.buffer.take() {
            Some(buffer) if buffer.capacity() >= self.copy_size_bytes => buffer,
            _ => AlignedBuf::zeroed(self.copy_size_bytes, BLOCK_SIZE_BYTES),
        };
        buffer.clear_zeroed();
        buffer.extend_from_slice(&encoded);
        buffer.set_len(used.next_multiple_of(BLOCK_SIZE_BYTES).min(self.copy_size_bytes));
        let frozen = buffer.freeze();
        for copy in 0..COPIES {
            let offset = (copy * self.copy_size_bytes) as u64;
            self.file
                .write_at(frozen.clone(), offset)
                .await
                .map_err(|e| Error::io(format!("writing superblock copy {copy}"), e))?;
            self.file
                .sync_data()
                .await
                .map_err(|e| Error::io(format!("syncing superblock copy {copy}"), e))?;
        }
        Ok(())
    }
}

/// The size of one copy's region in the file: header and every slot, block-aligned.
#[must_use]
pub fn copy_size_bytes(slots_max: usize) -> usize {
    (HEADER_SIZE_BYTES + slots_max * SLOT_SIZE_BYTES).next_multiple_of(BLOCK_SIZE_BYTES)
}

fn used_size_bytes(slot_count: usize) -> usize {
    HEADER_SIZE_BYTES + slot_count * SLOT_SIZE_BYTES
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

fn encode_version(state: &SuperblockState, copy_size_bytes: usize) -> Vec<u8> {
    let used = used_size_bytes(state.groups.len());
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
    for (index, slot) in state.groups.values().enumerate() {
        let start = HEADER_SIZE_BYTES + index * SLOT_SIZE_BYTES;
        encode_slot(&mut bytes[start..start + SLOT_SIZE_BYTES], slot);
    }
    let checksum = crc32c::crc32c(&bytes[OFF_PARENT..]);
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
    bytes[SLOT_DURABILITY] = slot.durability.to_byte();
    put(bytes, SLOT_FENCE_OP, &slot.fence.op.to_le_bytes());
    put(bytes, SLOT_FENCE_VIEW, &slot.fence.view.to_le_bytes());
}

/// Decodes one copy's bytes: checks the checksum before trusting any field, then the version,
/// the slot count bound and every slot. Errors are human-readable reasons (the copy is invalid).
pub fn decode_copy(bytes: &[u8], slots_max: usize) -> Result<SuperblockState, String> {
    if bytes.len() < HEADER_SIZE_BYTES {
        return Err(format!("copy is {} bytes, shorter than its header", bytes.len()));
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let slot_count = u32_at(OFF_SLOT_COUNT) as usize;
    if slot_count > slots_max {
        return Err(format!("slot count {slot_count} exceeds the bound {slots_max}"));
    }
    let used = used_size_bytes(slot_count);
    if used > bytes.len() {
        return Err(format!("slot count {slot_count} does not fit the copy"));
    }
    let stored = u32_at(OFF_CHECKSUM);
    let computed = crc32c::crc32c(&bytes[OFF_PARENT..used]);
    if stored != computed {
        return Err(format!(
            "checksum {stored:#010x} != computed {computed:#010x} (torn or corrupt)"
        ));
    }
    if bytes[OFF_VERSION] != VERSION {
        return Err(format!("unsupported superblock version {}", bytes[OFF_VERSION]));
    }
    let mut groups = BTreeMap::new();
    for index in 0..slot_count {
        let start = HEADER_SIZE_BYTES + index * SLOT_SIZE_BYTES;
        let slot = &bytes[start..start + SLOT_SIZE_BYTES];
        let s32 = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
        let s64 = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
        let durability = Durability::from_byte(slot[SLOT_DURABILITY])
            .ok_or_else(|| format!("slot {index}: unknown durability {}", slot[SLOT_DURABILITY]))?;
        let group = GroupSlot {
            group: s64(SLOT_GROUP),
            durability,
            view: s32(SLOT_VIEW),
            log_view: s32(SLOT_LOG_VIEW),
            checkpoint: Checkpoint {
                op: s64(SLOT_CHECKPOINT_OP),
                checksum: s32(SLOT_CHECKPOINT_CHECKSUM),
                next_offset: s64(SLOT_CHECKPOINT_NEXT_OFFSET),
                segment_base_offset: s64(SLOT_CHECKPOINT_SEGMENT),
                position_bytes: s64(SLOT_CHECKPOINT_POSITION),
            },
            fence: Fence { op: s64(SLOT_FENCE_OP), view: s32(SLOT_FENCE_VIEW) },
        };
        if groups.insert(group.group, group).is_some() {
            return Err(format!("slot {index}: group {} appears twice", group.group));
        }
    }
    Ok(SuperblockState {
        identity: Identity {
            cluster: u64_at(OFF_CLUSTER),
            node: u64_at(OFF_NODE),
            shard: u32_at(OFF_SHARD),
            shard_count: u32_at(OFF_SHARD_COUNT),
        },
        sequence: u64_at(OFF_SEQUENCE),
        checksum: stored,
        parent: u32_at(OFF_PARENT),
        groups,
    })
}
