//! The partition write buffer: aligned chunks that prepares are copied into once, written to
//! the segment from, and served to readers from, as [`Bytes`] views — the one copy on the way in
//! (DESIGN.md §3).
//!
//! A chunk has a frozen prefix (`filled` bytes, never written again) and a spare suffix only its
//! single owner writes into. Views never cover the spare suffix, which is what makes handing out
//! `Bytes` sound while appends continue. A chunk maps to one segment file at a block-aligned
//! `file_base`, so its full blocks can be written straight from memory with direct I/O; the
//! partial tail block is written from a small copy, so no in-flight write ever reads bytes that
//! are still changing. The pool reuses a chunk once no view of it is left.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES};
use crate::wire::HEADER_SIZE;

/// How far the writes of segment data ending at `end_bytes` reach in the file: the tail block
/// padded with zeros, plus one more zeroed block when the padding leaves room for less than a
/// header. Once they complete, a header-sized region past the data reads as zeros whatever the
/// file held before — a recycled segment file holds a retired segment's records there — so
/// recovery finds the end of data where it is (DESIGN.md §3: zeros end the data).
#[must_use]
pub fn written_extent_end(end_bytes: u64) -> u64 {
    let block = BLOCK_SIZE_BYTES as u64;
    if end_bytes == 0 || cfg!(feature = "canary-no-tail-guard") {
        return end_bytes.next_multiple_of(block);
    }
    let padded = end_bytes.next_multiple_of(block);
    if padded - end_bytes < HEADER_SIZE as u64 { padded + block } else { padded }
}

/// Chunk memory no one uses: on a pool's free list, or on its way back to one. Freed when
/// dropped.
struct FreeMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a plain heap allocation with no thread affinity; whoever holds a `FreeMemory` is its
// only user.
unsafe impl Send for FreeMemory {}

impl Drop for FreeMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `FreeMemory::new` with this layout, freed exactly once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Chunks whose size is a multiple of this are aligned to it and advised to the kernel as
/// transparent huge pages (`MADV_HUGEPAGE`, which the default `madvise` mode honours): the
/// first touch of a new chunk then faults once per 2 MiB instead of once per 4 KiB page. That
/// first touch is what a pool still growing to its working set pays (the batch cache keeps
/// views of written chunks, so the pool grows to the ring budget plus the cache's share);
/// measured in docs/benchmarks.md, "Write chunks in huge pages".
const HUGE_PAGE_BYTES: usize = 2 << 20;

impl FreeMemory {
    fn new(size_bytes: usize) -> Self {
        let size = size_bytes.next_multiple_of(BLOCK_SIZE_BYTES);
        let huge = size.is_multiple_of(HUGE_PAGE_BYTES);
        let align = if huge { HUGE_PAGE_BYTES } else { BLOCK_SIZE_BYTES };
        let layout = Layout::from_size_align(size, align).expect("chunk layout");
        // SAFETY: non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else { handle_alloc_error(layout) };
        if huge {
            // SAFETY: the range is exactly this allocation, aligned to the huge page size; the
            // advice changes no contents. Refused advice (huge pages off) leaves small pages.
            unsafe { libc::madvise(raw.cast(), size, libc::MADV_HUGEPAGE) };
        }
        // Left uninitialised: only appends write it and views read only what they wrote (the
        // frozen prefix); a tail write's padding comes from a zeroed copy (`Chunk::unsubmitted`).
        Self { ptr, layout }
    }

    fn capacity(&self) -> usize {
        self.layout.size()
    }
}

/// Chunk memory on its way back to its pool, and whether the pool had been handed it back
/// ([`ChunkPool::give_back`]) before its last view went.
struct Returned {
    memory: FreeMemory,
    given_back: bool,
}

/// Where chunk memory goes when the last of its owner and views lets go: onto its pool's
/// return list, which the pool drains when it needs memory. Views may be dropped on any
/// thread, hence the lock (taken once per chunk, not per view). `None` once the pool is gone:
/// memory coming back then is freed.
struct Returns {
    list: Mutex<Option<Vec<Returned>>>,
}

impl Returns {
    fn lock(&self) -> MutexGuard<'_, Option<Vec<Returned>>> {
        // A panic elsewhere while the lock was held leaves the list whole: pushes and swaps
        // cannot stop halfway.
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The memory of one chunk. Shared (behind `Arc`) by its owner and every view of its frozen
/// prefix; written only by the owner, only past the prefix. When the last of them drops, the
/// memory goes back to its pool ([`Returns`]): the pool learns of each chunk it can reuse the
/// moment it can, without checking the chunks views still hold.
struct ChunkMemory {
    memory: ManuallyDrop<FreeMemory>,
    returns: Arc<Returns>,
    given_back: AtomicBool,
}

// SAFETY: the memory is a plain heap allocation. Views only read the frozen prefix, which is
// never written again; the owner writes only past it, from one thread at a time (the owner is
// not `Sync` and is moved, not shared, between threads).
unsafe impl Sync for ChunkMemory {}

impl Drop for ChunkMemory {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here; `self.memory` is not used again.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        let given_back = *self.given_back.get_mut();
        let mut list = self.returns.lock();
        match list.as_mut() {
            Some(list) => list.push(Returned { memory, given_back }),
            None => {
                drop(list);
                drop(memory);
            }
        }
    }
}

impl ChunkMemory {
    fn ptr(&self) -> *mut u8 {
        self.memory.ptr.as_ptr()
    }

    fn capacity(&self) -> usize {
        self.memory.capacity()
    }
}

/// A read-only window onto a chunk's frozen prefix: the owner behind a [`Bytes`] view.
struct FrozenView {
    memory: Arc<ChunkMemory>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for FrozenView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start + len <= filled <= capacity` was checked when the view was made, and
        // the frozen prefix is never written again while any view exists.
        unsafe { std::slice::from_raw_parts(self.memory.ptr().add(self.start), self.len) }
    }
}

/// One chunk of a partition's write buffer, mapped to a segment file region.
pub struct Chunk {
    memory: Arc<ChunkMemory>,
    /// Unique within the pool: flush jobs name chunks by it, since chunks come and go while a
    /// job is in flight.
    pub id: u64,
    /// Base offset (file name) of the segment this chunk's bytes belong to.
    pub segment_base_offset: u64,
    /// File position of the chunk's first byte (block-aligned).
    pub file_base_bytes: u64,
    filled: usize,
    /// Bytes of the chunk handed to flush jobs; the next job's write starts at the block
    /// holding this position.
    submitted: usize,
    /// Bytes of the chunk whose writes completed (`written <= submitted`).
    written: usize,
}

impl Chunk {
    /// Bytes in the frozen prefix.
    #[must_use]
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// The chunk's size: its filled and free bytes.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.memory.capacity()
    }

    /// Bytes still free.
    #[must_use]
    pub fn spare(&self) -> usize {
        self.memory.capacity() - self.filled
    }

    /// Whether the chunk holds bytes not yet written to its file.
    #[must_use]
    pub fn has_unwritten(&self) -> bool {
        self.written < self.filled
    }

    /// File position just past the frozen prefix.
    #[must_use]
    pub fn file_end_bytes(&self) -> u64 {
        self.file_base_bytes + self.filled as u64
    }

    /// Copies `parts` (concatenated) past the frozen prefix and freezes them; returns the view of
    /// the appended bytes.
    ///
    /// # Panics
    /// If they do not fit: the caller checks [`Chunk::spare`] first.
    pub fn append(&mut self, parts: &[&[u8]]) -> Bytes {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        assert!(len <= self.spare(), "chunk overflow");
        let start = self.filled;
        let mut at = start;
        for part in parts {
            // SAFETY: `[at, at + part.len())` lies in the spare suffix (checked above), which no
            // view covers and only this owner (`&mut self`) writes.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), self.memory.ptr().add(at), part.len());
            }
            at += part.len();
        }
        self.filled = at;
        self.view(start, len)
    }

    /// A view of `[start, start + len)` of the frozen prefix.
    ///
    /// # Panics
    /// If the range reaches past the frozen prefix.
    #[must_use]
    pub fn view(&self, start: usize, len: usize) -> Bytes {
        assert!(start + len <= self.filled, "view past the frozen prefix");
        Bytes::from_owner(FrozenView { memory: Arc::clone(&self.memory), start, len })
    }

    /// Whether the chunk holds bytes not yet handed to a flush job.
    #[must_use]
    pub fn has_unsubmitted(&self) -> bool {
        self.submitted < self.filled
    }

    /// The writes that bring the file up to date with the frozen prefix, past what earlier jobs
    /// were handed: the full blocks as a view of the chunk, and the tail — the partial block,
    /// zero-padded, and the zeroed guard block [`written_extent_end`] asks for — as a copy,
    /// unless `with_tail` is false because a successor chunk starts with that block. Returns
    /// `(file_position, bytes)` pairs; the caller issues them after [`Chunk::mark_submitted`],
    /// then calls [`Chunk::mark_written`]. The first write starts at the block holding the
    /// submitted end, which an earlier job's tail may cover: the caller orders the writes of
    /// those blocks (see [`Chunk::tail_bytes`]).
    #[must_use]
    pub fn unsubmitted(&self, with_tail: bool) -> Vec<(u64, Bytes)> {
        let block = BLOCK_SIZE_BYTES;
        let from = self.submitted - self.submitted % block;
        let full_end = self.filled - self.filled % block;
        let mut writes = Vec::with_capacity(2);
        if full_end > from {
            writes.push((self.file_base_bytes + from as u64, self.view(from, full_end - from)));
        }
        let tail_len = if with_tail { self.tail_bytes() } else { 0 };
        if tail_len > 0 {
            let mut tail = AlignedBuf::zeroed(tail_len, block);
            tail.extend_from_slice(&self.view(full_end, self.filled - full_end));
            tail.set_len(tail_len);
            writes.push((self.file_base_bytes + full_end as u64, tail.freeze()));
        }
        writes
    }

    /// Length of the tail write (from the last full block of the frozen prefix on): one or two
    /// blocks, or 0 for an empty chunk.
    #[must_use]
    pub fn tail_bytes(&self) -> usize {
        let end = self.file_end_bytes();
        let full_end = end - end % BLOCK_SIZE_BYTES as u64;
        if self.filled == 0 { 0 } else { (written_extent_end(end) - full_end) as usize }
    }

    /// Records that the first `up_to` bytes were handed to a flush job.
    pub fn mark_submitted(&mut self, up_to: usize) {
        debug_assert!(up_to <= self.filled);
        self.submitted = self.submitted.max(up_to);
    }

    /// Records that the writes of the first `up_to` bytes completed.
    pub fn mark_written(&mut self, up_to: usize) {
        debug_assert!(up_to <= self.submitted);
        self.written = self.written.max(up_to);
    }

    /// Forgets submissions whose writes did not complete (after a failed job): they are handed
    /// out again.
    pub fn reset_submitted(&mut self) {
        self.submitted = self.written;
    }
}

/// The smallest write-buffer chunk: a partition that writes a trickle holds one of these, not
/// a whole large chunk (capped by the configured chunk size, if that is smaller).
pub const CHUNK_SIZE_MIN_BYTES: usize = 64 << 10;

/// A shard's pool of chunk memory, in size classes from [`CHUNK_SIZE_MIN_BYTES`] doubling up to
/// the configured chunk size, bounded in bytes: chunks are allocated once and reused once no
/// view of them is left, so first-touch costs are paid once, not per append. A chunk handed
/// back while views remain (the ring's) still counts against the bound until they go; the shard
/// asks idle rings to let go when the pool runs dry ([`ChunkPool::has_pinned`]).
///
/// Memory comes back by itself when its last holder drops ([`Returns`]), so a take finds every
/// chunk no view holds, at no cost per chunk still held. A pool that checked its handed-back
/// chunks for views instead, a few per take, missed free ones behind held ones and kept
/// allocating until its bound: a first touch of 2 MiB stalled an append some 5 ms, every few
/// hundred appends (docs/benchmarks.md, "Chunk memory comes back when its last view goes").
pub struct ChunkPool {
    /// Every class's size, ascending; the last is the configured chunk size.
    class_sizes_bytes: Vec<usize>,
    /// Free memory per class.
    free: Vec<Vec<FreeMemory>>,
    /// Where memory comes back to, and the list it is drained into (kept, so that draining
    /// allocates nothing).
    returns: Arc<Returns>,
    draining: Vec<Returned>,
    /// Chunks handed back whose memory has not come back: views still hold them.
    given_back_held: usize,
    allocated: usize,
    allocated_bytes: usize,
    /// Bytes of new memory allocated since the pool was made (memory freed to make room for
    /// another class and allocated again counts again).
    allocated_bytes_total: u64,
    bytes_max: usize,
    taken: u64,
}

impl Drop for ChunkPool {
    fn drop(&mut self) {
        // Memory still held by views is freed when they go; what came back is freed now.
        let returned = self.returns.lock().take();
        drop(returned);
    }
}

impl ChunkPool {
    /// A pool whose largest chunks are `chunk_size_bytes`, holding at most `allocated_max` of
    /// those in memory (smaller chunks fill the same bytes).
    #[must_use]
    pub fn new(chunk_size_bytes: usize, allocated_max: usize) -> Self {
        let largest = chunk_size_bytes.next_multiple_of(BLOCK_SIZE_BYTES);
        let mut class_sizes_bytes = Vec::new();
        let mut size = CHUNK_SIZE_MIN_BYTES.min(largest);
        while size < largest {
            class_sizes_bytes.push(size);
            size *= 2;
        }
        class_sizes_bytes.push(largest);
        Self {
            free: (0..class_sizes_bytes.len()).map(|_| Vec::new()).collect(),
            class_sizes_bytes,
            returns: Arc::new(Returns { list: Mutex::new(Some(Vec::new())) }),
            draining: Vec::new(),
            given_back_held: 0,
            allocated: 0,
            allocated_bytes: 0,
            allocated_bytes_total: 0,
            bytes_max: largest.saturating_mul(allocated_max),
            taken: 0,
        }
    }

    /// The size of the largest chunks.
    #[must_use]
    pub fn chunk_size_bytes(&self) -> usize {
        *self.class_sizes_bytes.last().expect("at least one class")
    }

    /// The size of the smallest chunks.
    #[must_use]
    pub fn chunk_size_min_bytes(&self) -> usize {
        self.class_sizes_bytes[0]
    }

    /// Chunks allocated so far, of any size.
    #[must_use]
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// Bytes of chunk memory allocated so far (at most `chunk_size_bytes × allocated_max`).
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.allocated_bytes
    }

    /// Bytes of new memory allocated so far, whether or not still held: flat once the pool
    /// reached its working set.
    #[must_use]
    pub fn allocated_bytes_total(&self) -> u64 {
        self.allocated_bytes_total
    }

    /// Chunks handed out so far.
    #[must_use]
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// Whether some memory handed back is still held by views (a ring's), so that dropping
    /// those views would let the pool reuse it.
    pub fn has_pinned(&mut self) -> bool {
        self.drain_returns();
        self.given_back_held > 0
    }

    /// A chunk of `wanted_bytes` (the smallest class that holds it; `None` past the largest;
    /// [`ChunkPool::filled_chunk_bytes`] says what to want for a chunk many appends will fill),
    /// or free memory of the next class up, or of a smaller class that holds `needed_bytes`,
    /// before any new memory, for `segment_base_offset` starting at block-aligned
    /// `file_base_bytes`, with `prefix` (the partial block before the append point, already on
    /// file) copied to its start. `None` when the pool is at its bound and has no such memory
    /// free: the caller applies backpressure.
    pub fn take(
        &mut self,
        wanted_bytes: usize,
        needed_bytes: usize,
        segment_base_offset: u64,
        file_base_bytes: u64,
        prefix: &[u8],
    ) -> Option<Chunk> {
        assert!(file_base_bytes.is_multiple_of(BLOCK_SIZE_BYTES as u64));
        assert!(prefix.len() < BLOCK_SIZE_BYTES);
        assert!(needed_bytes <= wanted_bytes, "a chunk that holds less than it needs");
        let class = self.class_for(wanted_bytes)?;
        self.drain_returns();
        let memory = self.free[class]
            .pop()
            .or_else(|| self.free_larger(class))
            .or_else(|| self.free_smaller(class, needed_bytes))
            .or_else(|| self.allocate_within_bound(class))
            .or_else(|| self.allocate(class))?;
        self.taken += 1;
        let memory = Arc::new(ChunkMemory {
            memory: ManuallyDrop::new(memory),
            returns: Arc::clone(&self.returns),
            given_back: AtomicBool::new(false),
        });
        let mut chunk = Chunk {
            memory,
            id: self.taken,
            segment_base_offset,
            file_base_bytes,
            filled: 0,
            submitted: 0,
            written: 0,
        };
        chunk.append(&[prefix]);
        chunk.submitted = prefix.len();
        chunk.written = prefix.len();
        Some(chunk)
    }

    /// The size of the chunk [`ChunkPool::take`] hands out for `wanted_bytes` when it has its
    /// class to give (None past the largest class).
    #[must_use]
    pub fn size_for(&self, wanted_bytes: usize) -> Option<usize> {
        Some(self.class_sizes_bytes[self.class_for(wanted_bytes)?])
    }

    /// The smallest class that holds `wanted_bytes` (None past the largest).
    fn class_for(&self, wanted_bytes: usize) -> Option<usize> {
        self.class_sizes_bytes.iter().position(|&size| size >= wanted_bytes)
    }

    /// What to want for a chunk that many appends will fill, `bytes` of them: `bytes`, or a
    /// whole huge page when its class is at least half of one. Such a chunk sits in one huge
    /// page, so the kernel pins one page per direct write instead of one per 4 KiB block
    /// (docs/benchmarks.md, "Write chunks of busy groups in huge pages"), for at most twice the
    /// memory. Not for a chunk sized by one record: a group that gets a 1 MB batch now and
    /// then would fill half of such a page, the ring's and the cache's views of that one batch
    /// would pin the rest, and the pool would touch twice the new memory for the same data
    /// (docs/benchmarks.md, "Huge pages only for chunks that fill").
    #[must_use]
    pub fn filled_chunk_bytes(&self, bytes: usize) -> usize {
        let Some(size) = self.size_for(bytes) else { return bytes };
        if size < HUGE_PAGE_BYTES / 2 {
            return bytes;
        }
        self.size_for(HUGE_PAGE_BYTES).map_or(bytes, |huge| huge.max(bytes))
    }

    /// Hands a chunk back; its memory is reused once every view of it is dropped.
    pub fn give_back(&mut self, chunk: Chunk) {
        self.given_back_held += 1;
        chunk.memory.given_back.store(true, Ordering::Relaxed);
    }

    /// Moves the memory that came back since the last call to its class's free list.
    fn drain_returns(&mut self) {
        if let Some(list) = self.returns.lock().as_mut() {
            std::mem::swap(list, &mut self.draining);
        }
        for Returned { memory, given_back } in self.draining.drain(..) {
            if given_back {
                self.given_back_held -= 1;
            }
            let class = self
                .class_sizes_bytes
                .iter()
                .position(|&size| size == memory.capacity())
                .expect("pool memory comes in its classes");
            self.free[class].push(memory);
        }
    }

    /// Free memory of the class above `class` (at most twice the size wanted), before any new
    /// memory is touched for `class`. A busy group's wanted class follows its pace between two
    /// neighbours, so one class's memory sits free while the other's list is empty: growing the
    /// pool for it then touched new memory, a 5 ms stall per 2 MiB, a few times a second while
    /// 600 MiB of the next class lay free (docs/benchmarks.md, "Free chunks of the next class").
    fn free_larger(&mut self, class: usize) -> Option<FreeMemory> {
        self.free.get_mut(class + 1)?.pop()
    }

    /// New memory of `class`, if the bound has room for it as it is.
    fn allocate_within_bound(&mut self, class: usize) -> Option<FreeMemory> {
        let fits = self.allocated_bytes + self.class_sizes_bytes[class] <= self.bytes_max;
        if fits { self.allocate(class) } else { None }
    }

    /// Free memory of the largest class below `class` that still holds `needed_bytes`: the
    /// caller gets a smaller chunk than it wanted (it takes the next one sooner) instead of the
    /// pool touching new memory for this one, or, at the bound, freeing another class's.
    /// Groups want chunks of sizes that follow their pace, so at the bound the free lists often
    /// lack the class wanted; trading classes there touched 200–400 MiB/s of new memory in the
    /// 64-partition benchmark (docs/benchmarks.md, "Chunk memory at the pool's bound").
    fn free_smaller(&mut self, class: usize, needed_bytes: usize) -> Option<FreeMemory> {
        (0..class)
            .rev()
            .take_while(|&smaller| self.class_sizes_bytes[smaller] >= needed_bytes)
            .find_map(|smaller| self.free[smaller].pop())
    }

    /// New memory of `class` within the bound, freeing memory of other classes no one uses
    /// when that makes room.
    fn allocate(&mut self, class: usize) -> Option<FreeMemory> {
        let size = self.class_sizes_bytes[class];
        let mut other = 0;
        while self.allocated_bytes + size > self.bytes_max {
            while other < self.free.len() && (other == class || self.free[other].is_empty()) {
                other += 1;
            }
            let memory = self.free.get_mut(other)?.pop().expect("non-empty");
            self.allocated -= 1;
            self.allocated_bytes -= memory.capacity();
        }
        self.allocated += 1;
        self.allocated_bytes += size;
        self.allocated_bytes_total += size as u64;
        Some(FreeMemory::new(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_bytes_are_views_without_copy_and_tail_is_padded() {
        let mut pool = ChunkPool::new(16 * 1024, 2);
        let mut chunk = pool.take(16 * 1024, 16 * 1024, 0, 0, &[]).unwrap();
        let view = chunk.append(&[&[1; 5000], &[2; 100]]);
        assert_eq!(view.len(), 5100);
        assert_eq!(chunk.filled(), 5100);
        let writes = chunk.unsubmitted(true);
        assert_eq!(writes.len(), 2);
        assert_eq!((writes[0].0, writes[0].1.len()), (0, 4096));
        assert_eq!((writes[1].0, writes[1].1.len()), (4096, 4096));
        assert_eq!(&writes[1].1[..904], &[1; 904][..]);
        assert_eq!(&writes[1].1[904..1004], &[2; 100][..]);
        assert!(writes[1].1[1004..].iter().all(|&b| b == 0));
        assert_eq!(chunk.unsubmitted(false).len(), 1, "the successor writes the partial block");
        chunk.mark_submitted(chunk.filled());
        assert!(chunk.has_unwritten() && !chunk.has_unsubmitted());
        // Only the partial block is rewritten by the next job, even before this one completes.
        chunk.append(&[&[3; 10]]);
        let writes = chunk.unsubmitted(true);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].0, 4096);
        chunk.mark_written(5100);
        // A failed job's submissions are handed out again.
        chunk.mark_submitted(chunk.filled());
        chunk.reset_submitted();
        assert_eq!(chunk.unsubmitted(true)[0].0, 4096);
    }

    #[test]
    fn pool_reuses_memory_only_after_every_view_is_dropped() {
        let mut pool = ChunkPool::new(4096, 1);
        let mut chunk = pool.take(4096, 4096, 0, 0, &[]).unwrap();
        let view = chunk.append(&[b"abc"]);
        pool.give_back(chunk);
        assert!(pool.has_pinned());
        assert!(pool.take(4096, 4096, 0, 0, &[]).is_none(), "a view still holds the only chunk");
        drop(view);
        assert!(!pool.has_pinned());
        let chunk = pool.take(4096, 4096, 7, 8192, b"xy").unwrap();
        assert_eq!(chunk.filled(), 2);
        assert!(!chunk.has_unwritten());
        assert_eq!(pool.allocated(), 1);
    }

    /// Memory comes back when its last view goes, whichever chunk that is and in whatever
    /// order: a take below the bound finds it without checking the chunks still held, so the
    /// pool stays at the memory its holders need instead of growing to its bound.
    #[test]
    fn memory_comes_back_when_its_last_view_goes_in_any_order() {
        let count = 32;
        let mut pool = ChunkPool::new(4096, 4 * count);
        let mut views = Vec::new();
        for _ in 0..count {
            let mut chunk = pool.take(4096, 4096, 0, 0, &[]).unwrap();
            views.push(chunk.append(&[b"abc"]));
            pool.give_back(chunk);
        }
        // Only the newest chunk is let go: the next take finds it, behind 31 held ones.
        views.pop();
        let chunk = pool.take(4096, 4096, 0, 0, &[]).unwrap();
        assert_eq!(pool.allocated(), count);
        pool.give_back(chunk);
        // Views dropped from a thread that is not the pool's come back too.
        let middle = views.remove(count / 2);
        std::thread::spawn(move || drop(middle)).join().unwrap();
        for _ in 0..2 {
            let chunk = pool.take(4096, 4096, 0, 0, &[]).unwrap();
            drop(chunk);
        }
        assert_eq!(pool.allocated(), count, "reused, never allocated past the held ones");
        assert!(pool.has_pinned(), "30 chunks handed back are still held");
        views.clear();
        assert!(!pool.has_pinned());
    }

    /// A take whose class has no free memory takes the next class's, or a smaller one's that
    /// holds what it needs, before allocating; never a class further up, which would let a
    /// trickle pin far more than it wants.
    #[test]
    fn a_take_uses_the_next_class_up_before_allocating() {
        let mut pool = ChunkPool::new(4 * CHUNK_SIZE_MIN_BYTES, 8);
        let (small, middle, large) =
            (CHUNK_SIZE_MIN_BYTES, 2 * CHUNK_SIZE_MIN_BYTES, 4 * CHUNK_SIZE_MIN_BYTES);
        let taken = [
            pool.take(large, large, 0, 0, &[]).unwrap(),
            pool.take(middle, middle, 0, 0, &[]).unwrap(),
        ];
        drop(taken);
        assert_eq!(pool.allocated(), 2);
        let chunk = pool.take(middle, middle, 0, 0, &[]).unwrap();
        assert_eq!(chunk.size_bytes(), middle, "its own class first");
        let next = pool.take(middle, middle, 0, 0, &[]).unwrap();
        assert_eq!(next.size_bytes(), large, "the next class up, not new memory");
        assert_eq!(pool.allocated(), 2);
        drop((chunk, next));
        let trickle = pool.take(small, small, 0, 0, &[]).unwrap();
        assert_eq!(trickle.size_bytes(), middle);
        let another = pool.take(small, small, 0, 0, &[]).unwrap();
        assert_eq!(another.size_bytes(), small, "two classes up is new memory of its own class");
        assert_eq!(pool.allocated(), 3);
        drop((trickle, another));
        // Free memory of a smaller class that holds what the append needs comes before new
        // memory too, bound or not.
        let wanted = pool.take(large, middle, 0, 0, &[]).unwrap();
        let smaller = pool.take(large, middle, 0, 0, &[]).unwrap();
        assert_eq!((wanted.size_bytes(), smaller.size_bytes()), (large, middle));
        assert_eq!(pool.allocated(), 3);
        assert_eq!(pool.allocated_bytes_total(), (small + middle + large) as u64);
    }

    /// A chunk whose owner drops it without handing it back (a log dropped whole) comes back
    /// as well, and views that outlive their pool free their memory when they go.
    #[test]
    fn dropped_chunks_come_back_and_views_may_outlive_the_pool() {
        let mut pool = ChunkPool::new(4096, 1);
        let chunk = pool.take(4096, 4096, 0, 0, &[]).unwrap();
        drop(chunk);
        assert!(!pool.has_pinned(), "it was never handed back");
        let mut chunk = pool.take(4096, 4096, 0, 0, &[]).expect("the dropped chunk's memory");
        assert_eq!(pool.allocated(), 1);
        let view = chunk.append(&[b"kept"]);
        pool.give_back(chunk);
        drop(pool);
        assert_eq!(&view[..], b"kept");
        drop(view);
    }

    #[test]
    fn chunks_come_in_classes_within_a_byte_bound() {
        // Classes of 64, 128 and 256 KiB; room for two of the largest, 512 KiB in all.
        let mut pool = ChunkPool::new(256 << 10, 2);
        assert_eq!(pool.chunk_size_min_bytes(), 64 << 10);
        let small = pool.take(1000, 1000, 0, 0, &[]).unwrap();
        assert_eq!(small.spare(), 64 << 10, "the smallest class that holds it");
        let middle = pool.take((64 << 10) + 1, (64 << 10) + 1, 0, 0, &[]).unwrap();
        assert_eq!(middle.spare(), 128 << 10);
        assert!(
            pool.take((256 << 10) + 1, (256 << 10) + 1, 0, 0, &[]).is_none(),
            "past the largest class"
        );
        let large = pool.take(256 << 10, 256 << 10, 0, 0, &[]).unwrap();
        assert_eq!(pool.allocated_bytes(), 448 << 10);
        assert!(
            pool.take(256 << 10, 256 << 10, 0, 0, &[]).is_none(),
            "at the bound: 448 + 256 > 512 KiB"
        );
        // Free small memory makes room for a large chunk.
        pool.give_back(small);
        pool.give_back(middle);
        let second_large = pool.take(256 << 10, 256 << 10, 0, 0, &[]);
        assert!(second_large.is_some(), "the free 64 and 128 KiB chunks were released for it");
        assert_eq!(pool.allocated_bytes(), 512 << 10);
        drop((large, second_large));
    }

    #[test]
    fn a_chunk_that_fills_wants_a_whole_huge_page_from_half_of_one() {
        let pool = ChunkPool::new(8 << 20, 4);
        assert_eq!(pool.filled_chunk_bytes(512 << 10), 512 << 10, "below half a huge page");
        assert_eq!(pool.filled_chunk_bytes(1 << 20), HUGE_PAGE_BYTES, "half a huge page");
        assert_eq!(pool.filled_chunk_bytes(3 << 20), 3 << 20, "past a huge page: its own");
        // Where no class reaches a huge page, the want stays.
        assert_eq!(ChunkPool::new(1 << 20, 4).filled_chunk_bytes(1 << 20), 1 << 20);
    }

    /// A take is of the class of what is wanted: one record of half a huge page gets a chunk
    /// of its class, not a whole huge page it would fill half of.
    #[test]
    fn a_take_is_of_the_class_wanted() {
        let mut pool = ChunkPool::new(8 << 20, 4);
        let batch = pool.take(1 << 20, 1 << 20, 0, 0, &[]).unwrap();
        assert_eq!(batch.spare(), 1 << 20);
        assert_eq!(pool.size_for((1 << 20) - 1), Some(1 << 20));
        assert_eq!(pool.size_for((8 << 20) + 1), None);
        drop(batch);
    }

    /// At the bound, a take whose class has no free memory gets free memory of a smaller class
    /// that holds what it needs, rather than the pool freeing other memory and allocating new;
    /// when nothing smaller holds it, other classes' free memory is freed to make room.
    #[test]
    fn at_the_bound_a_smaller_free_chunk_that_holds_the_need_is_taken_before_new_memory() {
        // Classes of 64, 128 and 256 KiB; room for two of the largest, 512 KiB in all.
        let mut pool = ChunkPool::new(256 << 10, 2);
        let held = pool.take(256 << 10, 256 << 10, 0, 0, &[]).unwrap();
        let middle = pool.take(128 << 10, 128 << 10, 0, 0, &[]).unwrap();
        let small = pool.take(64 << 10, 64 << 10, 0, 0, &[]).unwrap();
        let spare = pool.take(64 << 10, 64 << 10, 0, 0, &[]).unwrap();
        assert_eq!(pool.allocated_bytes(), 512 << 10, "at the bound");
        pool.give_back(middle);
        pool.give_back(small);
        // Wants 256 KiB, needs 100 KiB: the free 128 KiB chunk holds it.
        let taken = pool.take(256 << 10, 100 << 10, 0, 0, &[]).unwrap();
        assert_eq!(taken.spare(), 128 << 10, "the largest smaller class that holds the need");
        assert_eq!((pool.allocated(), pool.allocated_bytes()), (4, 512 << 10), "nothing new");
        // Needs 200 KiB: no smaller chunk holds it, so the free 64 KiB and the spare make room.
        pool.give_back(spare);
        assert!(pool.take(256 << 10, 200 << 10, 0, 0, &[]).is_none(), "64 + 64 KiB free < 256");
        pool.give_back(taken);
        let large = pool.take(256 << 10, 200 << 10, 0, 0, &[]).unwrap();
        assert_eq!(large.spare(), 256 << 10);
        assert_eq!((pool.allocated(), pool.allocated_bytes()), (2, 512 << 10));
        drop((held, large));
    }
}
