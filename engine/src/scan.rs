//! Sequential reads of records from a file through a window buffer: recovery, reads from disk,
//! index rebuilds and the checker all walk files this way.
//!
//! The scanner only fetches bytes; deciding whether they are a valid record is `record`'s job.
//! Every length it acts on is bounded (by the caller's record bound and the file size) before
//! anything is read or allocated.

use std::io;

use bytes::Bytes;

use crate::storage::{BLOCK_SIZE_BYTES, BufferShelf, StorageFile};
use crate::wire::HEADER_SIZE;

/// Byte offset of the `size` field in the wire header (see `wire`).
const OFF_SIZE: usize = 16;

/// Reads a file in aligned windows and hands out record-sized slices of them.
pub struct Scanner<'f, F> {
    file: &'f F,
    file_size_bytes: u64,
    window_bytes: usize,
    window: Bytes,
    window_start: u64,
    /// Windows end here (rounded up to a block) unless the bytes asked for reach further.
    read_end_bytes: u64,
    /// The window's buffer comes back here once no slice of it is held, for the next window:
    /// a fresh aligned buffer per window left a long scan's memory behind (glibc's aligned
    /// allocations did not reuse the freed ones; a 1 GiB journal kept about 1 GiB resident).
    shelf: BufferShelf,
}

impl<'f, F: StorageFile> Scanner<'f, F> {
    /// A scanner over `file`, reading `window_bytes` (at least) at a time.
    pub async fn new(file: &'f F, window_bytes: usize) -> io::Result<Scanner<'f, F>> {
        Self::with_shelf(file, window_bytes, BufferShelf::new(1)).await
    }

    /// A scanner whose windows come from, and go back to, `shelf`: scans one after the other
    /// that keep no slice share one buffer.
    pub async fn with_shelf(
        file: &'f F,
        window_bytes: usize,
        shelf: BufferShelf,
    ) -> io::Result<Scanner<'f, F>> {
        let file_size_bytes = file.size_bytes().await?;
        Ok(Scanner {
            file,
            file_size_bytes,
            window_bytes,
            window: Bytes::new(),
            window_start: 0,
            read_end_bytes: u64::MAX,
            shelf,
        })
    }

    /// Windows stop at `end_bytes` (a log's written end): past it lie zeros or a recycled
    /// file's old bytes, and records cached from a window hold all of it, so a window that
    /// reached past the tail held memory the batch cache never counted.
    pub fn read_no_further_than(&mut self, end_bytes: u64) {
        self.read_end_bytes = end_bytes;
    }

    /// The file's size when the scanner was made: nothing past it is read.
    pub fn file_size_bytes(&self) -> u64 {
        self.file_size_bytes
    }

    /// The bytes of the record that would start at `position`: the header's declared size if it
    /// is plausible (at least a header, at most `record_size_bytes_max`), else just the header
    /// region, so the caller's checks report what is wrong. Short (possibly empty) at end of file.
    pub async fn record_at(
        &mut self,
        position: u64,
        record_size_bytes_max: usize,
    ) -> io::Result<Bytes> {
        let head = self.bytes_at(position, HEADER_SIZE).await?;
        if head.len() < HEADER_SIZE {
            return Ok(head);
        }
        let declared =
            u32::from_le_bytes(head[OFF_SIZE..OFF_SIZE + 4].try_into().expect("4 bytes")) as usize;
        if declared < HEADER_SIZE || declared > record_size_bytes_max {
            return Ok(head);
        }
        self.bytes_at(position, declared).await
    }

    /// Up to `len` bytes at `position` (fewer only at end of file).
    pub async fn bytes_at(&mut self, position: u64, len: usize) -> io::Result<Bytes> {
        let end = (position + len as u64).min(self.file_size_bytes);
        if position >= end {
            return Ok(Bytes::new());
        }
        let window_end = self.window_start + self.window.len() as u64;
        if position < self.window_start || end > window_end {
            self.fill(position, (end - position) as usize).await?;
        }
        let start = (position - self.window_start) as usize;
        Ok(self.window.slice(start..start + (end - position) as usize))
    }

    async fn fill(&mut self, position: u64, needed: usize) -> io::Result<()> {
        let block = BLOCK_SIZE_BYTES as u64;
        let start = position - position % block;
        let span = (position - start) as usize + needed;
        let read_end = self.read_end_bytes.checked_next_multiple_of(block).unwrap_or(u64::MAX);
        let window = (self.window_bytes as u64).min(read_end.saturating_sub(start)) as usize;
        let capacity = span.max(window).next_multiple_of(BLOCK_SIZE_BYTES);
        // Let go of the old window first: unless a caller still holds a slice of it, its
        // buffer is the one taken back.
        self.window = Bytes::new();
        let buffer = self.shelf.take_exact(capacity, BLOCK_SIZE_BYTES);
        let (result, buffer) = self.file.read_at(buffer, start).await;
        result?;
        self.window = self.shelf.freeze(buffer);
        self.window_start = start;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::storage::sim::{Sim, SimConfig};
    use crate::storage::{OpenMode, Storage};

    /// A window stops at the read end (rounded up to a block) unless the bytes asked for reach
    /// past it; without one it is the whole window.
    #[test]
    fn windows_stop_at_the_read_end_unless_the_bytes_asked_for_go_further() {
        let sim = Sim::new(1, SimConfig::default());
        let storage = sim.storage();
        let path = Path::new("/f");
        let file = sim.block_on(storage.open(path, OpenMode::CreateReadWrite, true)).unwrap();
        let data: Vec<u8> = (0..1u32 << 20).map(|i| i as u8).collect();
        sim.block_on(file.write_at(Bytes::from(data.clone()), 0)).unwrap();
        sim.block_on(async {
            let mut scanner = Scanner::new(&file, 256 << 10).await.unwrap();
            assert_eq!(scanner.bytes_at(100, 10).await.unwrap(), data[100..110]);
            assert_eq!(scanner.window.len(), 256 << 10, "no read end: a whole window");

            let mut scanner = Scanner::new(&file, 256 << 10).await.unwrap();
            scanner.read_no_further_than(12_388);
            assert_eq!(scanner.bytes_at(100, 10).await.unwrap(), data[100..110]);
            assert_eq!(scanner.window.len(), 16 << 10, "up to the block holding the end");
            // Asked for more than the end: read.
            assert_eq!(scanner.bytes_at(12_000, 9_000).await.unwrap(), data[12_000..21_000]);
            assert_eq!(scanner.window_start, 8 << 10);
            assert_eq!(scanner.window.len(), 16 << 10);
        });
    }
}
