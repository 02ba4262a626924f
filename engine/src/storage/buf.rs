//! [`AlignedBuf`]: an owned, zero-initialised buffer whose start is aligned for direct I/O.
//!
//! It owns its allocation exclusively (so I/O can take it by value and give it back) and turns
//! into a [`Bytes`] without copying, so that reads hand out slices of the buffer the disk filled.
//! It must never reallocate: its address is what the kernel writes into.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::BLOCK_SIZE_BYTES;

/// An owned, aligned, fixed-capacity byte buffer. `len <= capacity`; bytes past `len` are
/// initialised (zero or old contents) but not part of the value.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively, like a `Vec<u8>`; nothing else points
// into it, so moving it to another thread is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`; mutation needs `&mut self`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `capacity_bytes` zeroed bytes aligned to `alignment_bytes` (a power of two).
    /// The capacity is rounded up to a multiple of the alignment so that a full buffer is always
    /// a valid direct-I/O length.
    ///
    /// # Panics
    /// If the alignment is not a power of two or the size overflows; both are programming errors.
    #[must_use]
    pub fn zeroed(capacity_bytes: usize, alignment_bytes: usize) -> Self {
        assert!(alignment_bytes.is_power_of_two(), "alignment {alignment_bytes}");
        let size = capacity_bytes.max(1).next_multiple_of(alignment_bytes);
        let layout = Layout::from_size_align(size, alignment_bytes).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        Self { ptr, len: 0, layout }
    }

    /// The number of bytes in the value.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the value is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocated size in bytes (a multiple of the alignment).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The alignment of the buffer's start, in bytes.
    #[must_use]
    pub fn alignment(&self) -> usize {
        self.layout.align()
    }

    /// Sets the value's length. The bytes up to `len` are whatever the buffer holds.
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "len {len} > capacity {}", self.capacity());
        self.len = len;
    }

    /// Appends `data` after the value.
    ///
    /// # Panics
    /// If it does not fit; callers size buffers before filling them.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let end = self.len + data.len();
        assert!(end <= self.capacity(), "append past capacity");
        self.spare_mut()[..data.len()].copy_from_slice(data);
        self.len = end;
    }

    /// Zeroes the whole allocation and empties the value.
    pub fn clear_zeroed(&mut self) {
        self.full_mut().fill(0);
        self.len = 0;
    }

    /// The value.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is `capacity()` initialised bytes and `len <= capacity()`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The value, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes past the value, up to the capacity.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.full_mut()[len..]
    }

    /// The whole allocation, mutably, regardless of the value's length.
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `capacity()` initialised bytes, exclusively ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity()) }
    }

    /// A raw pointer to the start, for backends that hand the buffer to the kernel.
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// A raw mutable pointer to the start, for backends that let the kernel fill the buffer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Turns the value into [`Bytes`] without copying; slices of it keep the allocation alive.
    #[must_use]
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(Frozen(self))
    }
}

/// Zeros for `[from_bytes, to_bytes)` (block-aligned) in direct-I/O pieces of at most
/// `piece_bytes`: each piece's position and bytes, all views of one zeroed buffer, so a file
/// region of any size is zeroed from `piece_bytes` of memory. The caller decides how many pieces
/// are in flight at once.
pub fn zero_pieces(
    from_bytes: u64,
    to_bytes: u64,
    piece_bytes: usize,
) -> impl Iterator<Item = (u64, Bytes)> {
    let block = BLOCK_SIZE_BYTES as u64;
    assert!(from_bytes.is_multiple_of(block) && to_bytes.is_multiple_of(block));
    assert!(piece_bytes.is_multiple_of(BLOCK_SIZE_BYTES) && piece_bytes > 0);
    let piece = (to_bytes - from_bytes).min(piece_bytes as u64) as usize;
    let mut zeros = AlignedBuf::zeroed(piece, BLOCK_SIZE_BYTES);
    zeros.set_len(piece);
    let zeros = zeros.freeze();
    (from_bytes..to_bytes).step_by(piece.max(1)).map(move |position| {
        let len = (to_bytes - position).min(piece as u64) as usize;
        (position, zeros.slice(..len))
    })
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("alignment", &self.alignment())
            .finish()
    }
}

/// The owner behind a frozen buffer: immutable from now on, so `Bytes` may alias it.
struct Frozen(AlignedBuf);

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// A few large buffers kept for reuse: a buffer frozen through the shelf comes back to it when
/// the last view of it drops. Fresh memory costs its first touch (page faults and zeroing,
/// slow on these machines), which a buffer written once per cycle would otherwise pay every
/// cycle. At most `kept_max` buffers wait on the shelf; more are freed.
#[derive(Clone, Debug)]
pub struct BufferShelf {
    kept: Arc<Mutex<Vec<AlignedBuf>>>,
    kept_max: usize,
}

impl BufferShelf {
    /// An empty shelf that keeps at most `kept_max` buffers.
    #[must_use]
    pub fn new(kept_max: usize) -> Self {
        Self { kept: Arc::default(), kept_max }
    }

    /// An empty buffer of at least `capacity_bytes`, aligned to `alignment_bytes`: a kept one
    /// (its bytes are old contents, which the caller overwrites or zeroes), else a new zeroed
    /// one rounded up to a power of two, so that the sizes kept settle.
    #[must_use]
    pub fn take(&self, capacity_bytes: usize, alignment_bytes: usize) -> AlignedBuf {
        self.take_or_new(capacity_bytes, alignment_bytes, capacity_bytes.next_power_of_two())
    }

    /// As [`BufferShelf::take`], but a new buffer is exactly `capacity_bytes` (rounded up to
    /// the alignment): for a reader whose every buffer is the same size but one, which should
    /// not read twice the bytes it asked for.
    #[must_use]
    pub fn take_exact(&self, capacity_bytes: usize, alignment_bytes: usize) -> AlignedBuf {
        self.take_or_new(capacity_bytes, alignment_bytes, capacity_bytes)
    }

    fn take_or_new(
        &self,
        capacity_bytes: usize,
        alignment_bytes: usize,
        new_capacity_bytes: usize,
    ) -> AlignedBuf {
        let mut kept = self.kept.lock().expect("shelf lock");
        let fits = kept
            .iter()
            .position(|buf| buf.capacity() >= capacity_bytes && buf.alignment() == alignment_bytes);
        match fits {
            Some(index) => {
                let mut buf = kept.swap_remove(index);
                buf.len = 0;
                buf
            }
            None => AlignedBuf::zeroed(new_capacity_bytes, alignment_bytes),
        }
    }

    /// Turns `buf` into [`Bytes`] without copying, as [`AlignedBuf::freeze`] does; the buffer
    /// returns to the shelf once the last view of it drops.
    #[must_use]
    pub fn freeze(&self, buf: AlignedBuf) -> Bytes {
        Bytes::from_owner(Shelved { buf: Some(buf), shelf: self.clone() })
    }

    /// Buffers waiting on the shelf.
    #[must_use]
    pub fn kept(&self) -> usize {
        self.kept.lock().expect("shelf lock").len()
    }
}

/// The owner behind a buffer frozen through a [`BufferShelf`].
struct Shelved {
    buf: Option<AlignedBuf>,
    shelf: BufferShelf,
}

impl AsRef<[u8]> for Shelved {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], AlignedBuf::as_slice)
    }
}

impl Drop for Shelved {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let mut kept = self.shelf.kept.lock().expect("shelf lock");
        if kept.len() < self.shelf.kept_max {
            kept.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pieces_cover_the_range_with_views_of_one_buffer() {
        let block = BLOCK_SIZE_BYTES as u64;
        let pieces: Vec<(u64, Bytes)> =
            zero_pieces(block, 6 * block, 2 * BLOCK_SIZE_BYTES).collect();
        let spans: Vec<(u64, usize)> = pieces.iter().map(|(at, b)| (*at, b.len())).collect();
        let piece = 2 * BLOCK_SIZE_BYTES;
        assert_eq!(spans, [(block, piece), (3 * block, piece), (5 * block, BLOCK_SIZE_BYTES)]);
        assert!(pieces.iter().all(|(_, bytes)| bytes.iter().all(|&byte| byte == 0)));
        assert_eq!(pieces[0].1.as_ptr(), pieces[2].1.as_ptr(), "one buffer");
        assert_eq!(zero_pieces(block, block, piece).count(), 0);
    }

    #[test]
    fn capacity_is_rounded_to_alignment_and_start_is_aligned() {
        let buf = AlignedBuf::zeroed(5000, 4096);
        assert_eq!(buf.capacity(), 8192);
        assert_eq!(buf.as_ptr() as usize % 4096, 0);
        assert!(buf.is_empty());
    }

    #[test]
    fn freeze_keeps_the_bytes_without_copying() {
        let mut buf = AlignedBuf::zeroed(4096, 4096);
        buf.extend_from_slice(b"hello");
        let start = buf.as_ptr();
        let frozen = buf.freeze();
        assert_eq!(&frozen[..], b"hello");
        assert_eq!(frozen.as_ptr(), start);
        let tail = frozen.slice(1..3);
        drop(frozen);
        assert_eq!(&tail[..], b"el");
    }

    #[test]
    fn a_shelved_buffer_comes_back_once_its_last_view_drops() {
        let shelf = BufferShelf::new(1);
        let mut buf = shelf.take(5000, 4096);
        assert_eq!(buf.capacity(), 8192, "rounded up to a power of two");
        buf.extend_from_slice(b"cycle one");
        let start = buf.as_ptr();
        let frozen = shelf.freeze(buf);
        let view = frozen.slice(0..5);
        drop(frozen);
        assert_eq!(shelf.kept(), 0, "a view still reads it");
        assert_eq!(&view[..], b"cycle");
        drop(view);
        assert_eq!(shelf.kept(), 1);
        let again = shelf.take(8192, 4096);
        assert_eq!(again.as_ptr(), start, "the same memory, not a new allocation");
        assert!(again.is_empty());
        assert_eq!(shelf.take(8192, 4096).as_ptr() as usize % 4096, 0, "a new one when none waits");
        // Past `kept_max`, buffers handed back are freed.
        let (one, two) = (shelf.take(4096, 4096), shelf.take(4096, 4096));
        drop((shelf.freeze(one), shelf.freeze(two)));
        assert_eq!(shelf.kept(), 1);
        assert!(shelf.take(1 << 20, 4096).capacity() >= 1 << 20, "too small ones are not used");
    }

    #[test]
    #[should_panic(expected = "append past capacity")]
    fn extend_past_capacity_is_refused() {
        let mut buf = AlignedBuf::zeroed(512, 512);
        buf.extend_from_slice(&[1; 513]);
    }
}
