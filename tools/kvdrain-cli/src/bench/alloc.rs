//! A counting global allocator for the benchmarks' "0 allocations" check.
//!
//! The `kvdrain` binary installs [`CountingAlloc`] as its `#[global_allocator]` (a library
//! must not, or every test binary linking it would inherit it). It counts `alloc`,
//! `alloc_zeroed` and `realloc` calls on every thread, then defers to [`System`].
//! [`counting`] tells whether it is installed, so a harness run from a test binary
//! reports `null` instead of a vacuous 0.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts allocations, then defers to [`System`].
#[derive(Debug)]
pub struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations counted so far (all threads).
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Whether [`CountingAlloc`] is this process's global allocator.
pub fn counting() -> bool {
    let before = allocations();
    drop(black_box(Box::new(black_box(0u64))));
    allocations() != before
}
