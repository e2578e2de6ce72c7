//! Handing freed heap back to the operating system after a large list.
//!
//! The watcher's first list (and every re-list after a 410) decodes every ConfigMap and Secret of
//! the cluster, page by page, and keeps only their digests. glibc's malloc keeps most of what
//! those pages freed: freed chunks sit between the small, long-lived digest allocations, and a
//! heap only shrinks from its top. `malloc_trim` walks every arena and returns whole free pages,
//! which is what brings the steady footprint down to the index itself.

/// Returns free heap pages to the operating system. A no-op where the C library is not glibc.
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
