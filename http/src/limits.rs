//! Connection limits for the proxy, admin and engine listeners: how long a client may take to send a
//! request head (which also bounds idle keep-alive connections), how many connections each listener
//! holds, the refusal sent beyond that, and raising the soft open-file limit at start.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Per-listener connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// A connection must deliver a complete request head within this long of opening, or of its
    /// previous response ending (so an idle keep-alive connection is closed after it too).
    pub header_timeout: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
}

/// File descriptors kept free for the store, the tokenizer, logs and the admin listener.
const RESERVED_FDS: u64 = 64;

/// Admin connections at most (UI tabs, scrapers, inspection commands).
const ADMIN_MAX: usize = 128;

impl ConnLimits {
    /// The proxy listener's limits: `max` when given, else as many as the open-file limit allows
    /// (each proxied connection may hold an upstream connection too), at most 10,000.
    pub fn proxy(header_timeout: Duration, max: Option<usize>, nofile: u64) -> ConnLimits {
        let fit = (nofile.saturating_sub(RESERVED_FDS + ADMIN_MAX as u64) / 2).max(16) as usize;
        ConnLimits { header_timeout, max_connections: max.unwrap_or(fit.min(10_000)) }
    }

    /// The admin listener's limits.
    pub fn admin(header_timeout: Duration, nofile: u64) -> ConnLimits {
        let fit = (nofile / 8).max(8) as usize;
        ConnLimits { header_timeout, max_connections: ADMIN_MAX.min(fit) }
    }

    /// The engine listener's limits: a connection holds one descriptor; at most 10,000.
    pub fn engine(header_timeout: Duration, nofile: u64) -> ConnLimits {
        let fit = nofile.saturating_sub(RESERVED_FDS).max(16) as usize;
        ConnLimits { header_timeout, max_connections: fit.min(10_000) }
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit where allowed; returns the soft limit in effect.
#[cfg(unix)]
pub fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every unix
    let soft = limit.rlim_cur as u64;
    soft
}

#[cfg(not(unix))]
pub fn raise_nofile() -> u64 {
    8192
}

const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n\
retry-after: 1\r\ncontent-length: 114\r\n\r\n\
{\"error\":{\"message\":\"too many open connections; retry shortly\",\"type\":\"overloaded\",\"code\":\"too_many_connections\"}}";

/// Answers a connection over the limit with a 503 and closes it, spending at most two seconds on it:
/// the request head is read first (up to 16 KiB, one second), so that clients see the answer.
pub async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while head.len() < 16 << 10 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(REFUSAL).await?;
        stream.shutdown().await
    })
    .await;
}

/// Accept-error backoff: 10 ms doubling to 1 s while accepting fails (EMFILE, ENFILE, ENOBUFS...),
/// with one log line per second at most.
#[derive(Debug, Default)]
pub struct Backoff {
    delay: Option<Duration>,
    failures: u64,
    logged: Option<std::time::Instant>,
}

impl Backoff {
    /// Records a failed accept; returns how long to wait before the next one.
    pub fn failed(&mut self, error: &std::io::Error) -> Duration {
        self.failures += 1;
        let delay = self.delay.map_or(Duration::from_millis(10), |d| (d * 2).min(Duration::from_secs(1)));
        self.delay = Some(delay);
        let due = match self.logged {
            None => true,
            Some(at) => at.elapsed() >= Duration::from_secs(1),
        };
        if due {
            tracing::warn!(%error, failures = self.failures, "accept failed; backing off, open connections keep being served");
            self.logged = Some(std::time::Instant::now());
        }
        delay
    }

    /// Records a successful accept.
    pub fn succeeded(&mut self) {
        self.delay = None;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_length_matches_its_body() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }

    #[test]
    fn limits_fit_the_open_file_limit() {
        let t = Duration::from_secs(1);
        assert_eq!(ConnLimits::proxy(t, None, 256).max_connections, 32);
        assert_eq!(ConnLimits::proxy(t, None, 1 << 20).max_connections, 10_000);
        assert_eq!(ConnLimits::proxy(t, Some(5), 256).max_connections, 5);
        assert_eq!(ConnLimits::admin(t, 256).max_connections, 32);
        assert_eq!(ConnLimits::engine(t, 256).max_connections, 192);
    }

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut b = Backoff::default();
        let e = std::io::Error::from_raw_os_error(24);
        assert_eq!(b.failed(&e), Duration::from_millis(10));
        assert_eq!(b.failed(&e), Duration::from_millis(20));
        for _ in 0..20 {
            b.failed(&e);
        }
        assert_eq!(b.failed(&e), Duration::from_secs(1));
        b.succeeded();
        assert_eq!(b.failed(&e), Duration::from_millis(10));
    }
}
