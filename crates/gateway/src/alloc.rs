//! The allocator settings that keep long prompts cheap. The `kvgate` binary applies them
//! first thing in `main`; an embedder that proxies long prompts should do the same.

/// Keeps freed memory in glibc's arenas, up to 64 MiB each, instead of handing it back at
/// once. By default glibc maps blocks over 128 KiB on their own and trims an arena as soon
/// as its top is free, so each long prompt's buffers are fresh pages, faulted in and zeroed
/// per request: a fifth of the gateway's CPU at 256 KiB (`docs/benchmarks.md`). An
/// operator's own `GLIBC_TUNABLES` wins; elsewhere than glibc this does nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "mallopt is a C call; its arguments are constants"
)]
pub fn keep_freed_memory() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    // SAFETY: mallopt takes no pointers and only sets two allocator parameters; glibc
    // serialises it against allocations in other threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// Does nothing: the settings are glibc's.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() {}
