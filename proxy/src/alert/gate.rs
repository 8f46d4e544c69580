//! The webhook's gate: a cause is posted at most once per window, and a token bucket bounds how many
//! findings per minute get through at all, so a broken engine cannot flood the receiver.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The dedupe map is pruned of expired causes once it holds at least this many.
const MIN_PRUNE: usize = 256;

/// Why a finding was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Deduplicated,
    RateLimited,
}

/// Deduplication by cause, then a token bucket over everything that is not a duplicate.
pub struct Gate {
    window: Duration,
    /// Cause -> when it was last let through.
    seen: HashMap<String, Instant>,
    prune_at: usize,
    bucket: TokenBucket,
}

impl Gate {
    pub fn new(window: Duration, per_minute: u32, now: Instant) -> Gate {
        Gate { window, seen: HashMap::new(), prune_at: MIN_PRUNE, bucket: TokenBucket::new(per_minute, now) }
    }

    /// Lets a finding through, or says why not. A rate-limited cause is not remembered, so its next
    /// occurrence can still be posted.
    pub fn admit(&mut self, cause: &str, now: Instant) -> Result<(), Refused> {
        if self.seen.get(cause).is_some_and(|&at| now.saturating_duration_since(at) < self.window) {
            return Err(Refused::Deduplicated);
        }
        if !self.bucket.take(now) {
            return Err(Refused::RateLimited);
        }
        self.remember(cause, now);
        Ok(())
    }

    /// Records a cause; the map holds at most what the rate limit lets through in one window.
    fn remember(&mut self, cause: &str, now: Instant) {
        if self.seen.len() >= self.prune_at {
            let window = self.window;
            self.seen.retain(|_, at| now.saturating_duration_since(*at) < window);
            self.prune_at = (self.seen.len() * 2).max(MIN_PRUNE);
        }
        self.seen.insert(cause.to_string(), now);
    }
}

/// `capacity` tokens at most, refilled continuously at `capacity` per minute.
struct TokenBucket {
    capacity: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(per_minute: u32, now: Instant) -> TokenBucket {
        let capacity = f64::from(per_minute);
        TokenBucket { capacity, per_second: capacity / 60.0, tokens: capacity, last: now }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.last = self.last.max(now);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_dedupes_a_cause_within_the_window_only() {
        let t0 = Instant::now();
        let mut gate = Gate::new(Duration::from_secs(600), 1000, t0);
        assert_eq!(gate.admit("a", t0), Ok(()));
        assert_eq!(gate.admit("a", t0 + Duration::from_secs(599)), Err(Refused::Deduplicated));
        assert_eq!(gate.admit("b", t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(gate.admit("a", t0 + Duration::from_secs(600)), Ok(()));
    }

    #[test]
    fn bucket_allows_a_burst_then_refills_per_minute() {
        let t0 = Instant::now();
        let mut gate = Gate::new(Duration::ZERO, 3, t0);
        let admitted = (0..10).filter(|i| gate.admit(&i.to_string(), t0).is_ok()).count();
        assert_eq!(admitted, 3);
        assert_eq!(gate.admit("late", t0 + Duration::from_secs(19)), Err(Refused::RateLimited));
        assert_eq!(gate.admit("late", t0 + Duration::from_secs(20)), Ok(()));
    }
}
