//! What the store's unit tests share: reopening a store the test itself just closed.

use crate::StoreError;

/// Opens a store again once sled has let go of its lock: its background threads release the
/// directory lock a moment after the last handle is dropped, so a reopen right after a drop can
/// fail with "could not acquire lock" (more often on a busy machine).
pub(crate) fn unlocked<T>(open: impl Fn() -> Result<T, StoreError>) -> T {
    for _ in 0..500 {
        match open() {
            Err(e) if e.to_string().contains("could not acquire lock") || matches!(e, StoreError::Locked { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
    panic!("the store's lock was never released")
}
