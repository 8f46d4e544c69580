//! Scratch scopes: a thread marks the allocations it makes for a short-lived structure (a request's
//! parse tree) so that an allocator that knows the mark can put them apart from long-lived data.
//! Nothing here allocates; without such an allocator a scope changes nothing.
//!
//! Why: parsing a request of 100,000 messages makes about 100 MB of small blocks that die together
//! at the end of the turn, while the same thread also makes the few small blocks that live on (a
//! memo entry, a store node). Interleaved in the same pages, each survivor keeps its page resident;
//! kept apart, the scratch pages empty completely and go back to the system.

use std::cell::Cell;
use std::sync::OnceLock;

/// What hands memory freed by finished scratch work back to the system: set by the binary that
/// owns the allocator ([`set_release`]); unset, [`release`] does nothing.
static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Registers the allocator's way of returning freed memory (once; later calls are ignored).
pub fn set_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Called by a worker going idle after a burst of work: the allocator hands back what the burst
/// freed, instead of keeping it for work that may not come.
pub fn release() {
    if let Some(release) = RELEASE.get() {
        release();
    }
}

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's allocations marked as scratch (nested scopes stay marked).
pub fn scope<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ACTIVE.set(self.0);
        }
    }
    let _restore = Restore(ACTIVE.replace(true));
    f()
}

/// Whether this thread is inside [`scope`]. For allocators: reads a thread-local cell, allocates
/// nothing.
#[inline]
pub fn active() -> bool {
    ACTIVE.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_mark_this_thread_only_and_restore_on_exit() {
        assert!(!active());
        let inner = scope(|| {
            let nested = scope(active);
            let other = std::thread::spawn(active).join().unwrap();
            (active(), nested, other)
        });
        assert_eq!(inner, (true, true, false));
        assert!(!active());
        let _ = std::panic::catch_unwind(|| scope(|| panic!("unwinds")));
        assert!(!active(), "restored after a panic");
    }
}
