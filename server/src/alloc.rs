//! Counts heap allocations per thread, so a shard can report how many its thread made (the
//! `Status` figure the allocation test reads: zero allocations per message on the produce path).
//!
//! It owns the global allocator wrapper and malloc's tunables, nothing else; it must never
//! allocate, lock or touch shared memory on the allocation path (a thread-local counter only).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Allocations at least this large come straight from `mmap` (glibc's largest setting): above
/// any request body the default frame limit allows, so bodies are served from the heap.
const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;

/// Free memory at the top of a heap is returned to the kernel only beyond this much.
const TRIM_THRESHOLD_BYTES: i32 = 256 << 20;

/// Makes glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.
/// Request bodies (up to megabytes) are allocated and freed per request; by default each large
/// one is an `mmap` of its own, or freed memory is trimmed away, and the next request faults
/// fresh zeroed pages in — measured at ≈ 15% of a shard's CPU under a 1 MB-batch produce load
/// (docs/benchmarks.md). Call once at start-up, before any other thread exists; each thread's
/// heap may then hold up to `TRIM_THRESHOLD_BYTES` of free memory.
pub fn keep_freed_memory() {
    // SAFETY: `mallopt` only changes malloc's tunables, and no other thread is allocating yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}

/// The system allocator, counting allocations on the calling thread.
pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: a thread being torn down still allocates; it is simply not counted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counter
// is a thread-local `Cell` with a const initializer, which neither allocates nor locks.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` and `layout` come from this allocator, which is `System` underneath.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` come from this allocator, which is `System` underneath.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations (and reallocations) made so far by the calling thread.
pub fn allocations_on_this_thread() -> u64 {
    ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
}
