//! Handing the allocator's free memory back to the kernel after a load or a burst.
//!
//! Loading a model or a tokenizer allocates far more than it keeps: each weight tensor is copied
//! on its way to the layer that holds it, and a `tokenizer.json` of a few MB is parsed through
//! intermediate JSON values. glibc keeps what is freed: once a large block has been freed its
//! mmap threshold rises (up to 32 MiB), so later blocks of that size come from the heap and stay
//! in the process's RSS as free holes. Measured with tools/bench/memory.py (BENCHMARKS.md,
//! "(d) Memory"): 32 to 36 MiB of a CPU worker's idle RSS after loading a d=768 22-layer or a
//! d=1024 2-layer checkpoint, and 15.6 MiB of the agent's main process after loading a 50280-token
//! tokenizer. Elsewhere than glibc this does nothing.
//!
//! A worker also keeps the allocator to one arena ([`one_arena`]). glibc gives each thread that
//! allocates while another holds the lock an arena of its own, up to 8 per core. The CPU model's
//! rayon threads each allocate and free a call's large buffers, so every arena kept its own freed
//! blocks resident. With one arena, the blocks one thread frees serve the next allocation of any
//! thread. Measured (BENCHMARKS.md, "One malloc arena in the worker"): a d=1024 2-layer worker
//! under load with 512-token rows held model + 40.0-40.3 MiB, and with one arena model +
//! 35.6-38.4; rows per second did not move.

/// Returns every free page of the heap to the kernel (`malloc_trim(0)`): a few ms at most,
/// called once after a load, and by `serve` once the service goes idle after a burst of
/// questions (large requests free far more than they keep, as loading does), never per request.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer; it only returns glibc's own free pages to the
    // kernel, and is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Caps glibc at one malloc arena for the rest of this process (`mallopt(M_ARENA_MAX, 1)`): the
/// worker calls it first, before its thread pool starts (module doc). Elsewhere than glibc this
/// does nothing.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and changes only glibc's own tuning: M_ARENA_MAX caps
    // how many arenas it creates from now on. It is thread-safe.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
