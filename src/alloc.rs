//! The global allocator, mimalloc, and its one setting: memory freed after a large request goes back
//! to the operating system at once. mimalloc otherwise purges a freed page only on the owning thread's
//! next trip through the allocator after a delay; the capture worker and the connection threads
//! then sit idle holding it (4 requests of 20,000 messages: 180 MiB resident 5 s after the traffic,
//! 100 MiB with immediate purging, idle 57 MiB; see BENCHMARKS.md, "Memory and store size").

/// mimalloc: a captured turn (tokenizer, parsing, store) allocates many small strings; see
/// BENCHMARKS.md, "Detection cost".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`: 15 in the mimalloc headers (v2 and v3) that `libmimalloc-sys` builds;
/// its Rust bindings do not name it. The test below checks that the setting takes.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Purge freed memory immediately (before any thread but this one runs).
pub fn release_freed_memory_at_once() {
    // SAFETY: mi_option_set stores an integer in mimalloc's option table; any value is valid for
    // purge_delay (0: purge at once), and it is called once from main before other threads start.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
}

/// The purge delay now in force, in milliseconds.
#[cfg(test)]
fn purge_delay() -> std::ffi::c_long {
    // SAFETY: reading an option has no preconditions.
    unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn freed_memory_is_purged_at_once() {
        super::release_freed_memory_at_once();
        assert_eq!(super::purge_delay(), 0);
    }
}
