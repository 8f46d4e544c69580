//! Opening a sled database again right after this process closed it: sled's background threads
//! release the directory lock a moment after the last handle is dropped, so an open right after a
//! drop can fail with "could not acquire lock" (more often on a busy machine).

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long an open keeps retrying while the lock is held.
const PATIENCE: Duration = Duration::from_secs(10);

/// Calls `open` until it fails with something other than sled's lock error, or succeeds, for at
/// most 10 s; returns that outcome (or the last lock error).
pub fn when_unlocked<T, E: Display>(open: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    when_unlocked_or(open, |_| false)
}

/// As [`when_unlocked`], also retrying on the errors `locked` names (a wrapper's own "in use" error).
pub fn when_unlocked_or<T, E: Display>(mut open: impl FnMut() -> Result<T, E>, locked: impl Fn(&E) -> bool) -> Result<T, E> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match open() {
            Err(error) if (locked(&error) || error.to_string().contains("could not acquire lock")) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn retries_only_while_locked() {
        let calls = Cell::new(0);
        let got = when_unlocked(|| {
            calls.set(calls.get() + 1);
            if calls.get() < 3 {
                Err("IO error: could not acquire lock on \"db\"".to_string())
            } else {
                Ok(7)
            }
        });
        assert_eq!((got, calls.get()), (Ok(7), 3));
        calls.set(0);
        let other = when_unlocked(|| -> Result<(), String> {
            calls.set(calls.get() + 1);
            Err("corrupt".into())
        });
        assert_eq!((other, calls.get()), (Err("corrupt".into()), 1));
        calls.set(0);
        let named = when_unlocked_or(
            || {
                calls.set(calls.get() + 1);
                if calls.get() < 2 {
                    Err("in use".to_string())
                } else {
                    Ok(())
                }
            },
            |e| e == "in use",
        );
        assert_eq!((named, calls.get()), (Ok(()), 2));
    }
}
