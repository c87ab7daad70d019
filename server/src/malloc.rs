//! The glibc allocator's tuning for a server on a 1 GB box, which each binary sets before its
//! threads start.

/// Two glibc defaults that let freed memory stay resident on a 1 GB box:
/// - every thread that allocates under contention gets its own arena (up to 8 per core), and
///   freed memory stays in them. Two arenas serve a server whose hot loop allocates nothing.
/// - blocks of 128 KiB or more are mapped of their own and unmapped when freed, but the first
///   such block freed raises that threshold to its size (up to 32 MiB). From then on a 2 MiB
///   request body, or a sampler's per-vocabulary buffers, comes from an arena, and freed it
///   stays there up to the trim threshold, which rises with it: some MiB per arena after a burst
///   of large requests, held from the page cache that the model's weights live in. A fixed
///   threshold (setting it turns the raising off) gives that memory back at once, for the price
///   of mapping a few large blocks per request.
///
/// Must run before threads start.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only adjusts allocator tuning; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}
