//! What the store's unit tests share: reopening a store the test itself just closed.

use crate::StoreError;

/// Opens a store again once sled has let go of its lock (`ctxscope_testkit::sled_lock`), also
/// waiting out the store's own `Locked` (a read-only open while the lock file is still held).
pub(crate) fn unlocked<T>(open: impl Fn() -> Result<T, StoreError>) -> T {
    ctxscope_testkit::sled_lock::when_unlocked_or(open, |e| matches!(e, StoreError::Locked { .. }))
        .expect("the store opens once its lock is released")
}
