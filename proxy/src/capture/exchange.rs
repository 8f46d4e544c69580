//! What the hot path hands to the capture pipeline: one request/response exchange as raw bytes and
//! timings. The [`ExchangeGuard`] sends it exactly once, when the response ends or is dropped.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use ctxscope_store::Endpoint;

/// A body copy: frames shared by reference count with the forwarded body, up to a byte limit.
#[derive(Debug, Default)]
pub struct Captured {
    pub chunks: Vec<Bytes>,
    pub len: usize,
    /// Bytes seen in all, including those beyond the limit.
    pub total: u64,
    /// More than the limit arrived: the copy is incomplete and will not be parsed.
    pub overflow: bool,
    /// The body reached its end.
    pub complete: bool,
}

impl Captured {
    pub fn push(&mut self, frame: &Bytes, limit: usize) {
        self.total += frame.len() as u64;
        if self.overflow {
            return;
        }
        if self.len + frame.len() > limit {
            self.overflow = true;
            self.chunks.clear();
            self.len = 0;
            return;
        }
        self.len += frame.len();
        self.chunks.push(frame.clone());
    }

    /// The copy as one contiguous buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            out.extend_from_slice(chunk);
        }
        out
    }
}

/// How the exchange ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Complete,
    /// The client went away before the response finished; the upstream request was cancelled.
    ClientGone,
    /// The upstream's response body failed mid-stream.
    UpstreamStreamError(String),
    /// The upstream could not be reached; the client got a 502.
    UpstreamUnreachable(String),
}

/// One exchange, as captured.
#[derive(Debug)]
pub struct Exchange {
    pub started: Instant,
    pub time_unix_ms: u64,
    pub method: String,
    pub path: String,
    pub endpoint: Endpoint,
    /// Conversation named by header.
    pub conversation_name: Option<String>,
    pub request: Arc<Mutex<Captured>>,
    pub status: Option<u16>,
    pub response_content_type: Option<String>,
    pub response: Captured,
    pub headers_us: Option<u64>,
    pub ttfb_us: Option<u64>,
    pub total_us: u64,
    pub frames: u32,
    pub outcome: Outcome,
    /// The client's `Authorization` header, held in memory only so that upstream token counts
    /// (`--count-with upstream`) authenticate as the client did; never stored.
    pub authorization: Option<http::HeaderValue>,
    /// Where to send the kinds of the findings this exchange raised (`--findings-header`).
    pub findings_reply: Option<tokio::sync::oneshot::Sender<Vec<&'static str>>>,
}

impl Exchange {
    /// An exchange that has just arrived: nothing heard from the upstream yet.
    pub fn new(endpoint: Endpoint, method: &str, path: &str, request: Arc<Mutex<Captured>>) -> Exchange {
        Exchange {
            started: Instant::now(),
            time_unix_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            method: method.to_string(),
            path: path.to_string(),
            endpoint,
            conversation_name: None,
            request,
            status: None,
            response_content_type: None,
            response: Captured::default(),
            headers_us: None,
            ttfb_us: None,
            total_us: 0,
            frames: 0,
            outcome: Outcome::Complete,
            authorization: None,
            findings_reply: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_copy_stops_at_the_limit_but_counts_everything() {
        let mut c = Captured::default();
        c.push(&Bytes::from_static(b"hello "), 10);
        assert_eq!(c.to_vec(), b"hello ");
        c.push(&Bytes::from_static(b"world"), 10);
        assert!(c.overflow);
        assert_eq!(c.total, 11);
        assert!(c.to_vec().is_empty());
    }
}
