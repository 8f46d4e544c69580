//! The store's one reading of the wall clock.

/// Now, in Unix milliseconds (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
