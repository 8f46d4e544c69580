//! Live updates for the UI: a server-sent event stream of new turns and findings. Each stream polls
//! the store's newest ids once a second (a key lookup, no lock the capture worker waits on), sends at
//! most [`BATCH`] records per poll, and ends after [`MAX_STREAM`] or at shutdown (the browser's
//! EventSource reconnects). At most [`MAX_STREAMS`] streams are open at once.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::admin::AdminState;
use crate::body::{json_error, ProxyBody};

pub const MAX_STREAMS: usize = 16;
pub const BATCH: usize = 100;
pub const MAX_STREAM: Duration = Duration::from_secs(600);
const POLL: Duration = Duration::from_secs(1);

/// The open streams and the shutdown signal they stop on.
pub struct Live {
    open: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
}

impl Live {
    pub fn new(stop: watch::Receiver<bool>) -> Live {
        Live { open: Arc::new(AtomicUsize::new(0)), stop }
    }
}

/// `GET /ui/api/live?turn=N&finding=M`: events for turns and findings with larger ids (`turn`,
/// `finding`: the newest the page has; absent: from now).
pub async fn stream(state: &Arc<AdminState>, query: &str) -> Response<ProxyBody> {
    let Some(store) = state.store.clone() else {
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "capture_unavailable", &format!("capture store: {}", state.capture), None);
    };
    let mut since = (None, None);
    for (key, value) in super::query::pairs(query) {
        match key.as_str() {
            "turn" => since.0 = value.parse::<u64>().ok(),
            "finding" => since.1 = value.parse::<u64>().ok(),
            _ => {}
        }
    }
    let live = &state.live;
    if live.open.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
        live.open.fetch_sub(1, Ordering::SeqCst);
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            &format!("{MAX_STREAMS} live streams are open already"),
            None,
        );
    }
    let guard = OpenGuard(live.open.clone());
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let mut stop = live.stop.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let store2 = store.clone();
        let start = tokio::task::spawn_blocking(move || {
            Ok::<_, ctxscope_store::StoreError>((store2.latest_turn_id()?, store2.latest_finding_id()?))
        })
        .await;
        let (mut turn, mut finding) = match start {
            Ok(Ok((t, f))) => (since.0.or(t).unwrap_or(0), since.1.or(f).unwrap_or(0)),
            _ => return,
        };
        if tx.send(Bytes::from_static(b"retry: 2000\n\n")).await.is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + MAX_STREAM;
        while tokio::time::Instant::now() < deadline && !*stop.borrow() {
            let s = store.clone();
            let polled = tokio::task::spawn_blocking(move || {
                Ok::<_, ctxscope_store::StoreError>((s.turns_after(turn, BATCH)?, s.findings_after(finding, BATCH)?))
            })
            .await;
            let Ok(Ok((turns, findings))) = polled else {
                return;
            };
            let mut out = String::new();
            for t in &turns {
                turn = turn.max(t.id);
                let brief = json!({"id": t.id, "conversation": t.conversation, "index": t.index, "time_unix_ms": t.time_unix_ms,
                                   "model": t.model, "status": t.status, "finish_reason": t.finish_reason});
                out.push_str(&format!("event: turn\ndata: {brief}\n\n"));
            }
            for f in &findings {
                finding = finding.max(f.id);
                out.push_str(&format!("event: finding\ndata: {}\n\n", serde_json::to_string(f).unwrap_or_default()));
            }
            if out.is_empty() {
                out.push_str(": idle\n\n");
            }
            if tx.send(Bytes::from(out)).await.is_err() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = stop.changed() => return,
            }
        }
    });
    let mut response = Response::new(Channel(rx).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Counts a stream as open until dropped.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body fed by a channel; it ends when the sender goes.
struct Channel(mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = crate::body::BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}
