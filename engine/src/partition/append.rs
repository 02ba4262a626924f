//! Appends: a prepare that continues the chain is checked and copied once into the write
//! buffer and the ring, rolling the segment when it outgrows its size or age; prepares that
//! arrive ahead of a gap are held until it closes.
//!
//! Appending is a memory operation: it must never do I/O, and nothing changes when it fails.

use bytes::Bytes;

use super::log::{Location, PartitionLog, SegmentMeta};
use crate::chunk::written_extent_end;
use crate::error::{Error, Result};
use crate::record::prepare_of;
use crate::ring::{RingFull, StoredPrepare};
use crate::storage::{BLOCK_SIZE_BYTES, Storage};
use crate::superblock::Durability;
use crate::wire::{HEADER_SIZE, Header};

impl<S: Storage> PartitionLog<S> {
    /// Appends a prepare (header and body) that continues the chain: checks its header
    /// checksum, body length, group, op, parent and offset, copies it once into the write
    /// buffer and the ring, and rolls the segment when it would outgrow its size or age. The
    /// body's checksum is the caller's to vouch for (see `check_append`). Durable only after the
    /// shard's flush cycle reports it. Nothing changes when it fails.
    pub fn append(&mut self, header: &Header, body: &[u8]) -> Result<()> {
        self.check_serving()?;
        let encoded = header.encode();
        self.check_append(&encoded, header, body)?;
        let size = header.size as usize;
        let prepare = *prepare_of(header);
        let roll = self.segments.last().is_none_or(|active| {
            !active.is_empty()
                && (active.end_bytes + size as u64 > self.config.segment_size_bytes
                    || (self.config.segment_age_ms_max > 0
                        && prepare.append_time_ms.saturating_sub(active.first_append_ms)
                            >= self.config.segment_age_ms_max as i64))
        });
        // On a full disk only what fits the space already made ready is taken: it is sure to
        // be written. A roll needs new space: the spare segment's.
        let fits = if roll {
            // The new segment would take the spare's space, if any is ready.
            !self.spare_in_flight
                && self
                    .spare_ready_end_bytes
                    .is_some_and(|end| written_extent_end(size as u64) <= end)
        } else {
            self.fits_ready_space(size)
        };
        if self.storage_full && !fits {
            return Err(Error::StorageFull);
        }
        let (group, cache) = (self.group, &self.shared.cache);
        let evicted = |prepare| cache.borrow_mut().insert(group, prepare, true);
        self.ring.reserve(size, self.written.op, evicted).map_err(|RingFull| {
            Error::LimitReached(format!(
                "group {}: prepare ring full of unwritten prepares",
                self.group
            ))
        })?;
        if roll {
            self.roll(prepare.base_offset, prepare.op, size)?;
        } else {
            self.ensure_chunk_room(size)?;
        }
        let chunk = self.chunks.back_mut().expect("ensured");
        let position = chunk.file_end_bytes();
        let record = chunk.append(&[&encoded, body]);
        self.ring.push(StoredPrepare { header: *header, record });
        let active = self.segments.last_mut().expect("a segment exists after roll");
        debug_assert_eq!(active.end_bytes, position);
        active.observe(header, position, self.shared.index_interval_bytes);
        self.head = Location {
            op: prepare.op,
            checksum: header.checksum_header,
            next_offset: prepare.end_offset(),
            segment_base_offset: active.base_offset,
            position_bytes: position,
            end_bytes: active.end_bytes,
        };
        self.next = self.next.after(header);
        self.appended_bytes += size as u64;
        Ok(())
    }

    /// Holds a prepare received from the primary ahead of its predecessors (a gap before it),
    /// in memory under a bound, until they arrive. A duplicate or stale op is ignored.
    pub fn hold(&mut self, header: &Header, body: &[u8]) -> Result<()> {
        self.check_serving()?;
        let prepare = *header.as_prepare().ok_or_else(|| Error::Invalid("not a prepare".into()))?;
        if prepare.op <= self.next.op || self.held.contains_key(&prepare.op) {
            return Ok(());
        }
        if self.held.len() >= self.shared.held_prepares_max {
            return Err(Error::LimitReached(format!(
                "group {}: {} out-of-order prepares already held",
                self.group,
                self.held.len()
            )));
        }
        header.verify_body(body).map_err(|e| Error::Invalid(e.to_string()))?;
        self.held.insert(prepare.op, (*header, Bytes::copy_from_slice(body)));
        Ok(())
    }

    /// The held prepare that continues the chain now, if any (taken out of the hold); held
    /// prepares the chain has passed are dropped.
    pub fn take_held_next(&mut self) -> Option<(Header, Bytes)> {
        let next_op = self.next.op;
        self.held.retain(|&op, _| op >= next_op);
        self.held.remove(&next_op)
    }

    /// Puts back a prepare taken by [`PartitionLog::take_held_next`] that could not be appended
    /// yet (backpressure).
    pub fn return_held(&mut self, header: Header, body: Bytes) {
        let op = prepare_of(&header).op;
        self.held.insert(op, (header, body));
    }

    /// Whether a record of `size_bytes` appended now lands in the active segment's space that is
    /// already ready, padded tail block included.
    fn fits_ready_space(&self, size_bytes: usize) -> bool {
        self.segments.last().is_some_and(|active| {
            written_extent_end(active.end_bytes + size_bytes as u64) <= self.ready_end_of(active)
        })
    }

    fn check_append(
        &self,
        encoded: &[u8; HEADER_SIZE],
        header: &Header,
        body: &[u8],
    ) -> Result<()> {
        let size = header.size as usize;
        if size > self.config.record_size_bytes_max as usize {
            return Err(Error::Invalid(format!(
                "record of {size} bytes exceeds record_size_bytes_max {}",
                self.config.record_size_bytes_max as usize
            )));
        }
        // Decode the very bytes that will be stored: what passes here passes recovery. The body's
        // checksum is the caller's to vouch for — it built the header over this body, or verified
        // the body on receipt — so the body is not read a second time (debug builds do).
        let decoded = Header::decode(encoded).map_err(|e| Error::Invalid(e.to_string()))?;
        if body.len() != header.body_size() {
            return Err(Error::Invalid(format!(
                "body of {} bytes, the header says {}",
                body.len(),
                header.body_size()
            )));
        }
        debug_assert!(header.verify_body(body).is_ok(), "an unverified body reached append");
        let prepare = decoded.as_prepare().ok_or_else(|| Error::Invalid("not a prepare".into()))?;
        if decoded.cluster != self.shared.cluster || prepare.group != self.group {
            return Err(Error::Invalid("prepare of another cluster or group".into()));
        }
        if prepare.op != self.next.op
            || prepare.parent != self.next.parent
            || prepare.base_offset != self.next.offset
        {
            return Err(Error::Invalid(format!(
                "prepare op {} (parent {:#x}, offset {}) does not continue the chain at op {} \
                 (parent {:#x}, offset {})",
                prepare.op,
                prepare.parent,
                prepare.base_offset,
                self.next.op,
                self.next.parent,
                self.next.offset
            )));
        }
        if self.fence.kills(prepare.op, decoded.view) {
            return Err(Error::Invalid(format!(
                "prepare op {} of view {} is behind the truncation fence",
                prepare.op, decoded.view
            )));
        }
        Ok(())
    }

    fn roll(&mut self, base_offset: u64, first_op: u64, size: usize) -> Result<()> {
        let wanted = self.next_chunk_bytes(size);
        let chunk = self
            .shared
            .pool
            .borrow_mut()
            .take(wanted, size, base_offset, 0, &[])
            .ok_or_else(write_buffer_full)?;
        if let Some(active) = self.segments.last_mut() {
            active.sealed = true;
        }
        let mut meta = SegmentMeta::new(base_offset, first_op);
        if !self.spare_in_flight
            && let Some(ready_end_bytes) = self.spare_ready_end_bytes.take()
        {
            // The new segment takes the spare's space (the job creating it renames the spare).
            meta.from_spare = true;
            meta.ready_end_bytes = ready_end_bytes;
            meta.written_through_bytes = std::mem::take(&mut self.spare_written_end_bytes);
            self.spare_claimed = true;
        }
        self.segments.push(meta);
        self.chunks.push_back(chunk);
        self.tail_prefix.clear();
        Ok(())
    }

    /// The size of the next chunk, which must hold a record of `size` bytes after a partial
    /// block: twice the current chunk while that one still has bytes to write (the group fills
    /// chunks faster than a flush cycle empties them), else the smallest class, so a group that
    /// writes a trickle holds a small chunk and a busy one large ones (pool classes round up;
    /// a chunk many appends fill is a whole huge page from half of one on,
    /// [`crate::chunk::ChunkPool::filled_chunk_bytes`]).
    /// A `persisted` group's chunk also holds [`CHUNK_CYCLES`] cycles of its pace, up to its
    /// segment write batch: its writes wait for a batch, and they would otherwise come due
    /// whenever a small chunk filled, a chunk at a time.
    pub(super) fn next_chunk_bytes(&self, size: usize) -> usize {
        let busy = self.chunks.back().filter(|chunk| chunk.has_unwritten());
        let grown = busy.map_or(0, |chunk| 2 * chunk.size_bytes());
        let paced = if self.config.durability == Durability::Persisted {
            let bytes = self.appended_bytes_per_cycle.saturating_mul(CHUNK_CYCLES);
            usize::try_from(bytes.min(self.segment_write_batch_bytes())).unwrap_or(usize::MAX)
        } else {
            0
        };
        let pool = self.shared.pool.borrow();
        let (smallest, largest) = (pool.chunk_size_min_bytes(), pool.chunk_size_bytes());
        let filled = pool.filled_chunk_bytes(grown.max(paced).min(largest));
        (size + BLOCK_SIZE_BYTES).max(filled).max(smallest)
    }

    /// Makes sure the chunk receiving appends has room for `size` more bytes.
    fn ensure_chunk_room(&mut self, size: usize) -> Result<()> {
        if self.chunks.back().is_some_and(|chunk| chunk.spare() >= size) {
            return Ok(());
        }
        let active = self.segments.last().expect("a segment exists");
        let end = active.end_bytes;
        let block = BLOCK_SIZE_BYTES as u64;
        let block_start = end - end % block;
        let prefix: Vec<u8> = match self.chunks.back() {
            Some(chunk) if chunk.segment_base_offset == active.base_offset => {
                let start = (block_start - chunk.file_base_bytes) as usize;
                chunk.view(start, (end - block_start) as usize).to_vec()
            }
            _ => self.tail_prefix.clone(),
        };
        debug_assert_eq!(prefix.len() as u64, end - block_start);
        let wanted = self.next_chunk_bytes(size);
        let mut pool = self.shared.pool.borrow_mut();
        if size + BLOCK_SIZE_BYTES > pool.chunk_size_bytes() {
            return Err(Error::Invalid(format!(
                "record of {size} bytes exceeds the write-buffer chunk"
            )));
        }
        let chunk = pool
            .take(wanted, prefix.len() + size, active.base_offset, block_start, &prefix)
            .ok_or_else(write_buffer_full)?;
        if self.chunks.back().is_some_and(|previous| !previous.has_unwritten()) {
            let previous = self.chunks.pop_back().expect("checked");
            pool.give_back(previous);
        }
        self.chunks.push_back(chunk);
        Ok(())
    }
}

/// How many flush cycles of a `persisted` group's appends its write-buffer chunk holds (up to
/// its segment write batch): a group appending 16 KiB per cycle gets 1 MiB chunks, one
/// appending a few hundred bytes keeps the smallest (docs/benchmarks.md, "Segment writes in
/// batches, spread over the cycles").
pub(super) const CHUNK_CYCLES: u64 = 64;

fn write_buffer_full() -> Error {
    Error::LimitReached(WRITE_BUFFER_FULL.into())
}

/// The reason of the `LimitReached` an append gets when the shard's write-buffer pool is at its
/// bound: the shard then asks idle rings to let go of handed-back chunks and tries once more.
pub const WRITE_BUFFER_FULL: &str = "write buffer: every chunk is in use";
