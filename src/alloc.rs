//! The global allocator, mimalloc, its two settings and a heap for scratch scopes. Memory freed
//! after a large request goes back to the operating system at once: mimalloc otherwise purges a
//! freed page only on the owning thread's next trip through the allocator after a delay; the capture worker and the connection
//! threads then sit idle holding it (4 requests of 20,000 messages: 180 MiB resident 5 s after the
//! traffic, 100 MiB with immediate purging). And its arenas are committed as they are used, not
//! all at once: on Linux (an overcommitting system) mimalloc commits a whole arena eagerly by
//! default, which put the idle proxy at 55 MiB resident instead of 15 (BENCHMARKS.md, "Memory and
//! store size").

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicPtr, Ordering};

use libmimalloc_sys::mi_heap_t;

/// mimalloc: a captured turn (tokenizer, parsing, store) allocates many small strings; see
/// BENCHMARKS.md, "Detection cost".
#[global_allocator]
static GLOBAL: Allocator = Allocator;

/// mimalloc, with the blocks a thread makes inside a [`ctxscope_common::scratch`] scope taken from
/// one heap of their own. A request's parse tree (about 100 MB of small blocks for 100,000 messages)
/// then fills pages that nothing long-lived shares and that empty completely when the turn ends.
/// Freeing and growing outside a scope work on any block, whichever heap it came from.
pub struct Allocator;

/// The scratch heap, made on first use (mimalloc v3 heaps serve every thread).
static SCRATCH: AtomicPtr<mi_heap_t> = AtomicPtr::new(std::ptr::null_mut());

/// The scratch heap when this thread is in a scratch scope.
#[inline]
fn scratch() -> Option<*mut mi_heap_t> {
    if !ctxscope_common::scratch::active() {
        return None;
    }
    let heap = SCRATCH.load(Ordering::Acquire);
    if !heap.is_null() {
        return Some(heap);
    }
    // SAFETY: mi_heap_new allocates its metadata inside mimalloc, not through this allocator.
    let made = unsafe { libmimalloc_sys::mi_heap_new() };
    if made.is_null() {
        return None;
    }
    match SCRATCH.compare_exchange(std::ptr::null_mut(), made, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(made),
        Err(theirs) => {
            // SAFETY: `made` is empty and was never published.
            unsafe { libmimalloc_sys::mi_heap_delete(made) };
            Some(theirs)
        }
    }
}

// SAFETY: every path returns a block from mimalloc of at least the layout's size and alignment, or
// null; mi_free and mi_realloc_aligned accept blocks of any mimalloc heap.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match scratch() {
            Some(heap) => libmimalloc_sys::mi_heap_malloc_aligned(heap, layout.size(), layout.align()).cast(),
            None => mimalloc::MiMalloc.alloc(layout),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match scratch() {
            Some(heap) => libmimalloc_sys::mi_heap_zalloc_aligned(heap, layout.size(), layout.align()).cast(),
            None => mimalloc::MiMalloc.alloc_zeroed(layout),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        mimalloc::MiMalloc.dealloc(ptr, layout)
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match scratch() {
            Some(heap) => libmimalloc_sys::mi_heap_realloc_aligned(heap, ptr.cast(), new_size, layout.align()).cast(),
            None => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
        }
    }
}

/// `mi_option_purge_delay`: 15 in the mimalloc headers (v2 and v3) that `libmimalloc-sys` builds;
/// its Rust bindings do not name it. The test below checks that the setting takes.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// `mi_option_arena_eager_commit`: 4 in the same headers (2 by default: eager where the system
/// overcommits).
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Runs [`release_freed_memory_at_once`] before the first allocation reserves mimalloc's first arena:
/// an ELF constructor ordered before the standard library's own (`.init_array.00099`). Setting the
/// options from `main` is too late for the arena the runtime's start-up allocations reserved.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array.00098"]
static SET_BEFORE_FIRST_ALLOCATION: extern "C" fn() = {
    extern "C" fn set() {
        release_freed_memory_at_once();
    }
    set
};

/// Purge freed memory immediately and commit arenas on demand (before any thread but this one runs).
pub fn release_freed_memory_at_once() {
    // SAFETY: mi_option_set stores an integer in mimalloc's option table; any value is valid for
    // purge_delay (0: purge at once) and arena_eager_commit (0: never eager); it is called before
    // main (the constructor above) and again from main, before other threads start.
    unsafe {
        libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
    }
}

/// Called by each async-runtime worker as it goes idle: has mimalloc take back what other threads
/// freed to this one. A worker receives a request's body and the capture thread frees it later;
/// mimalloc processes such frees only when the owning thread next allocates, so an idle worker kept
/// a large request's pages resident (48 requests of 100,000 messages: 46 MiB settled with one
/// worker, 49 with two, 66 with four; BENCHMARKS.md). At most once per 50 ms per thread, and not
/// forced: a cheap pass when the worker has nothing else to do.
pub fn collect_when_idle() {
    use std::time::{Duration, Instant};
    thread_local! {
        static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = Instant::now();
    if LAST.get().is_some_and(|last| now.duration_since(last) < Duration::from_millis(50)) {
        return;
    }
    LAST.set(Some(now));
    // SAFETY: mi_collect has no preconditions; it works on the calling thread's heap.
    unsafe { libmimalloc_sys::mi_collect(false) };
}

/// Hands back to the system what this thread's heap and the scratch heap hold free, at once (forced
/// collection). For [`ctxscope_common::scratch::release`]: a capture worker going idle after a burst.
pub fn release_now() {
    // SAFETY: mi_collect and mi_heap_collect have no preconditions beyond a live heap; the scratch
    // heap is never deleted once published.
    unsafe {
        libmimalloc_sys::mi_collect(true);
        let heap = SCRATCH.load(Ordering::Acquire);
        if !heap.is_null() {
            libmimalloc_sys::mi_heap_collect(heap, true);
        }
    }
    // The request bodies this burst freed belong to the runtime's workers, which take such frees
    // back only as they next allocate or park ([`collect_when_idle`]); a worker that went idle when
    // the traffic ended, long before capture caught up, would sleep on them. A task per worker
    // wakes each once, to run nothing and park again.
    if let Some(runtime) = RUNTIME.get() {
        for _ in 0..runtime.workers {
            runtime.handle.spawn(async {});
        }
    }
}

/// The async runtime whose workers [`release_now`] wakes.
struct Runtime {
    handle: tokio::runtime::Handle,
    workers: usize,
}

static RUNTIME: std::sync::OnceLock<Runtime> = std::sync::OnceLock::new();

/// Names the runtime (and its worker count) whose idle workers collect what other threads freed.
pub fn watch_runtime(handle: tokio::runtime::Handle, workers: usize) {
    let _ = RUNTIME.set(Runtime { handle, workers });
}

/// An option's value now in force.
#[cfg(test)]
fn option(option: libmimalloc_sys::mi_option_t) -> std::ffi::c_long {
    // SAFETY: reading an option has no preconditions.
    unsafe { libmimalloc_sys::mi_option_get(option) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn scratch_scopes_allocate_from_the_scratch_heap() {
        let inside = ctxscope_common::scratch::scope(|| Box::new([7u8; 100]));
        let outside = Box::new([7u8; 100]);
        let heap = super::SCRATCH.load(std::sync::atomic::Ordering::Acquire);
        assert!(!heap.is_null(), "made on first use");
        extern "C" {
            // mimalloc v3 (its Rust bindings name only v2's `mi_heap_contains_block`).
            fn mi_heap_contains(heap: *const libmimalloc_sys::mi_heap_t, p: *const std::ffi::c_void) -> bool;
        }
        // SAFETY: both pointers are live mimalloc blocks; the heap is never deleted.
        let contains = |p: *const u8| unsafe { mi_heap_contains(heap, p.cast()) };
        assert!(contains(inside.as_ptr()));
        assert!(!contains(outside.as_ptr()));
        // Grown outside its scope, a scratch block may move to the main heap; freed anywhere.
        let mut grown = ctxscope_common::scratch::scope(|| vec![1u32; 16]);
        grown.extend(0..10_000);
        assert_eq!(grown.len(), 10_016);
        drop(inside);
    }

    #[test]
    fn freed_memory_is_purged_at_once() {
        // Set before main by the constructor (Linux), and by the call from main elsewhere.
        if !cfg!(target_os = "linux") {
            super::release_freed_memory_at_once();
        }
        assert_eq!(super::option(super::PURGE_DELAY), 0);
        assert_eq!(super::option(super::ARENA_EAGER_COMMIT), 0);
    }
}
