//! The admin port: Prometheus `/metrics`, `/healthz`, and the JSON API that inspection commands use
//! while a proxy holds the store (`/api/conversations`, `/api/conversations/{id}`, `.../context`, `.../export`,
//! `POST /api/import`, `/api/findings`, `/api/replays`). Documented in docs/api.md.

pub mod import;
pub mod ui;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use ctxscope_store::{FindingFilter, FindingKind, ReplayEntry, Store, StoreError};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::body::{full, json_error, ProxyBody};

/// Largest replay body accepted.
const MAX_REPLAY_BYTES: usize = 512 << 20;

/// What the admin API serves from.
pub struct AdminState {
    pub metrics: PrometheusHandle,
    pub store: Option<Store>,
    /// "on", "off", or why capture is unavailable.
    pub capture: String,
    /// The same, `degraded` while store writes fail (what `/healthz` reports).
    pub health: Arc<crate::health::CaptureHealth>,
    pub upstream: String,
    /// `--admin-token`: required on every route but `/healthz` and `/metrics` when set (see `ui::auth`).
    pub token: Option<String>,
    /// The UI's live event streams.
    pub live: ui::live::Live,
    /// Replays started from the UI.
    pub launcher: ui::launch::Launcher,
}

/// A request body on the admin port: read under the same idle timeout and minimum rate as the
/// proxy's (`--body-timeout`, `--body-min-rate`).
pub type AdminBody = ctxscope_http::timed::TimedBody<Incoming>;

pub async fn handle(state: Arc<AdminState>, request: Request<AdminBody>) -> Result<Response<ProxyBody>, Infallible> {
    let request = match ui::intercept(&state, request).await {
        Ok(response) => return Ok(response),
        Err(request) => request,
    };
    let path = request.uri().path().trim_end_matches('/').to_string();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let response = match (request.method(), segments.as_slice()) {
        (&Method::GET, ["metrics"]) => text(state.metrics.render(), "text/plain; version=0.0.4"),
        (&Method::GET, ["healthz"]) => {
            let (capture, reason) = state.health.status();
            let mut body = json!({"status": "ok", "capture": capture, "upstream": state.upstream});
            if let Some(reason) = reason {
                body["reason"] = json!(reason);
            }
            // Losses stay in view until acknowledged (`ctxscope store ack`, POST /api/losses/ack).
            if let Some(store) = &state.store {
                // sled had lost records this start put back from the record journal.
                let (turns, findings) = store.restored_on_open();
                if turns + findings > 0 {
                    body["store_restored"] = json!({"turns": turns, "findings": findings});
                }
                match store.unacknowledged_losses() {
                    Ok(losses) if losses.is_empty() => {}
                    Ok(losses) => body["losses"] = serde_json::to_value(&losses).unwrap_or_default(),
                    Err(error) => body["losses_error"] = json!(error.to_string()),
                }
            }
            json_response(StatusCode::OK, body.to_string())
        }
        (&Method::GET, ["api", "conversations"]) => with_store(&state, |s| s.conversations().map(|c| to_json(&c))).await,
        (&Method::GET, ["api", "conversations", id]) => match id.parse::<u64>() {
            Ok(id) => with_store(&state, move |s| s.conversation_detail(id).map(|d| to_json(&d))).await,
            Err(_) => bad_id(id),
        },
        (&Method::GET, ["api", "conversations", id, "context"]) => match id.parse::<u64>() {
            Ok(id) => {
                with_store(&state, move |s| s.conversation_detail(id).map(|d| to_json(&crate::detect::context_report::context_report(&d))))
                    .await
            }
            Err(_) => bad_id(id),
        },
        (&Method::GET, ["api", "conversations", id, "export"]) => match id.parse::<u64>() {
            Ok(id) => {
                let result = with_store_raw(&state, move |s| {
                    let mut out = Vec::new();
                    s.export_conversation(id, &mut out).map(|_| out)
                })
                .await;
                match result {
                    Ok(bytes) => text(bytes, "application/x-ndjson"),
                    Err(response) => response,
                }
            }
            Err(_) => bad_id(id),
        },
        (&Method::GET, ["api", "responses", id]) => {
            let (id, missing) = (id.to_string(), StoreError::NotFound(format!("response {id}")));
            with_store(&state, move |s| s.turn_by_response_id(&id)?.ok_or(missing).map(|t| to_json(&t))).await
        }
        (&Method::POST, ["api", "import"]) => import::import(&state, request).await,
        (&Method::GET, ["api", "losses"]) => with_store(&state, |s| s.unacknowledged_losses().map(|l| to_json(&l))).await,
        (&Method::POST, ["api", "losses", "ack"]) => acknowledge_losses(&state, request).await,
        (&Method::GET, ["api", "replays"]) => with_store(&state, |s| s.replays().map(|r| to_json(&r))).await,
        (&Method::GET, ["api", "replays", id]) => match id.parse::<u64>() {
            Ok(id) => {
                let missing = move || StoreError::NotFound(format!("replay {id}"));
                with_store(&state, move |s| s.replay(id)?.ok_or_else(missing).map(|r| to_json(&r))).await
            }
            Err(_) => bad_id(id),
        },
        (&Method::POST, ["api", "replays"]) => put_replay(&state, request).await,
        (&Method::GET, ["api", "findings"]) => match finding_filter(request.uri().query().unwrap_or("")) {
            Ok(filter) => with_store(&state, move |s| s.findings(&filter).map(|f| to_json(&f))).await,
            Err(message) => json_error(StatusCode::BAD_REQUEST, "bad_query", &message, None),
        },
        _ => json_error(StatusCode::NOT_FOUND, "not_found", &format!("no admin route {} {path}", request.method()), None),
    };
    Ok(response)
}

/// Stores a replay run sent by `ctxscope replay --admin` (the store is this process's while it runs).
async fn put_replay(state: &Arc<AdminState>, request: Request<AdminBody>) -> Response<ProxyBody> {
    let announced = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|length| length > MAX_REPLAY_BYTES as u64) {
        return json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "bad_replay",
            &format!("replay body over the limit of {MAX_REPLAY_BYTES} bytes"),
            None,
        );
    }
    let body = match Limited::new(request.into_body(), MAX_REPLAY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return json_error(StatusCode::PAYLOAD_TOO_LARGE, "bad_replay", &format!("cannot read replay body: {e}"), None),
    };
    let entry: ReplayEntry = match serde_json::from_slice(&body) {
        Ok(entry) => entry,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, "bad_replay", &format!("not a replay entry: {e}"), None),
    };
    // A new run, or the run it resumes; never another run's id (409).
    let id = entry.id;
    match with_store_raw(state, move |s| s.insert_replay(&entry)).await {
        Ok(None) => json_response(StatusCode::OK, json!({"replay": id}).to_string()),
        Ok(Some(existing)) => {
            let message = format!(
                "replay {id} already holds another run (conversation {}, started {}); it is not replaced",
                existing.conversation, existing.started_unix_ms
            );
            json_error(StatusCode::CONFLICT, "replay_exists", &message, None)
        }
        Err(response) => response,
    }
}

/// `kind`, `conversation`, `since` (Unix ms) and `limit` from a query string.
pub fn finding_filter(query: &str) -> Result<FindingFilter, String> {
    let mut filter = FindingFilter::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let number = || value.parse::<u64>().map_err(|_| format!("{key}={value:?} is not a number"));
        match key {
            "kind" => {
                let kinds = || FindingKind::ALL.map(FindingKind::as_str).join(", ");
                filter.kind = Some(FindingKind::parse(value).ok_or_else(|| format!("unknown finding kind {value:?}; known: {}", kinds()))?);
            }
            "conversation" => filter.conversation = Some(number()?),
            "since" => filter.since_unix_ms = Some(number()?),
            "limit" => filter.limit = Some(number()? as usize),
            _ => return Err(format!("unknown query parameter {key:?}; use kind, conversation, since, limit")),
        }
    }
    Ok(filter)
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| json!({"error": {"message": e.to_string()}}).to_string())
}

pub(crate) async fn with_store<F>(state: &Arc<AdminState>, f: F) -> Response<ProxyBody>
where
    F: FnOnce(&Store) -> Result<String, StoreError> + Send + 'static,
{
    match with_store_raw(state, f).await {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(response) => response,
    }
}

/// Runs a store query on the blocking pool and maps store errors to HTTP errors.
pub(crate) async fn with_store_raw<T, F>(state: &Arc<AdminState>, f: F) -> Result<T, Response<ProxyBody>>
where
    T: Send + 'static,
    F: FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
{
    let Some(store) = state.store.clone() else {
        return Err(json_error(StatusCode::SERVICE_UNAVAILABLE, "capture_unavailable", &format!("capture store: {}", state.capture), None));
    };
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(StoreError::NotFound(what))) => Err(json_error(StatusCode::NOT_FOUND, "not_found", &format!("{what} not found"), None)),
        Ok(Err(e @ StoreError::Import { .. })) => Err(json_error(StatusCode::BAD_REQUEST, "bad_import", &e.to_string(), None)),
        Ok(Err(e @ StoreError::ImportLineTooLong { .. })) => {
            Err(json_error(StatusCode::PAYLOAD_TOO_LARGE, "bad_import", &e.to_string(), None))
        }
        Ok(Err(e)) => Err(json_error(StatusCode::INTERNAL_SERVER_ERROR, "store_error", &e.to_string(), None)),
        Err(e) => Err(json_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string(), None)),
    }
}

fn bad_id(id: &str) -> Response<ProxyBody> {
    json_error(StatusCode::BAD_REQUEST, "bad_id", &format!("{id:?} is not a conversation id"), None)
}

pub(crate) fn json_response(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut response = text(body, "application/json");
    *response.status_mut() = status;
    response
}

fn text(body: impl Into<Bytes>, content_type: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response
}

/// `POST /api/losses/ack` with `{"ids": [..]}` (empty or absent: all): `{"acknowledged": n}`.
async fn acknowledge_losses(state: &Arc<AdminState>, request: Request<AdminBody>) -> Response<ProxyBody> {
    let bytes = match Limited::new(request.into_body(), 64 << 10).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => return json_error(StatusCode::BAD_REQUEST, "bad_body", &error.to_string(), None),
    };
    let ids: Vec<u64> = if bytes.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        match serde_json::from_slice::<serde_json::Value>(&bytes).map(|v| serde_json::from_value::<Vec<u64>>(v["ids"].clone())) {
            Ok(Ok(ids)) => ids,
            _ => return json_error(StatusCode::BAD_REQUEST, "bad_body", "expected {\"ids\": [loss ids]} (or no body: all)", None),
        }
    };
    with_store(state, move |s| s.acknowledge_losses(&ids).map(|n| json!({ "acknowledged": n }).to_string())).await
}
