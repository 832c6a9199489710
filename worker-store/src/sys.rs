//! The worker store's only `unsafe` code: one allocator tunable.
#![allow(unsafe_code)]

/// Makes the allocator return large freed blocks to the system at once:
/// every block of `threshold` bytes or more is mmapped, so freeing it unmaps it.
///
/// glibc's malloc raises its mmap threshold to the size of each mmapped
/// block freed (up to 32 MiB), after which blocks of that size come from its
/// heaps, and freeing them keeps the memory in the process: after a burst of
/// large incomplete requests that the worker store closed for its budget,
/// the agent would keep their memory. A fixed threshold turns that
/// adjustment off. (musl's malloc always unmaps large blocks.) Idempotent.
pub(crate) fn unmap_large_frees(threshold: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        let threshold = nix::libc::c_int::try_from(threshold).unwrap_or(nix::libc::c_int::MAX);
        // SAFETY: mallopt only changes a malloc tunable; it is thread-safe.
        ONCE.call_once(|| unsafe {
            nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, threshold);
        });
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = threshold;
}
