//! Keeping the watcher's footprint at the size of its index.
//!
//! The watcher's first list (and every re-list after a 410) decodes every ConfigMap and Secret of
//! the cluster, page by page, and keeps only their digests. With glibc's defaults most of what
//! those pages took stays with the process afterwards:
//!
//! - glibc serves large blocks (a page's response body, its decoded values) from their own
//!   mappings only until the first such block is freed; from then on its threshold rises, up to
//!   32 MiB, and those blocks come from the heap, between the small digests that outlive them.
//!   A heap only shrinks where whole pages are free, so the freed space stays resident.
//!   [`tune_allocator`] fixes the threshold instead, so large blocks always go back when freed.
//! - what is left free on the heap after a list is handed back by [`release_free_heap`].
//!
//! Measured in `benches/watcher_memory.rs` (BENCHMARKS.md section 5).

/// Blocks of this size and larger get their own mapping, returned to the system when freed.
pub const MMAP_THRESHOLD: usize = 64 * 1024;

/// Sets the allocator up for long-lived processes that pass large transient blocks through:
/// call once, before other threads start. A no-op where the C library is not glibc.
#[allow(unsafe_code)] // a C call: see its SAFETY comment
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // <malloc.h>: setting M_MMAP_THRESHOLD also turns its dynamic adjustment off.
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt has no preconditions; called before other threads allocate.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD as i32);
        }
    }
}

/// Returns free heap pages to the operating system. A no-op where the C library is not glibc.
#[allow(unsafe_code)] // a C call: see its SAFETY comment
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim has no preconditions; it takes the arena locks itself.
        unsafe {
            malloc_trim(0);
        }
    }
}
