//! The capture middleware: for the LLM endpoints it understands, tees request and response bodies
//! into an [`Exchange`] and hands it to the capture queue when the response ends; everything else
//! passes through untouched. It never waits on capture and never changes a byte, except with
//! `--findings-header`: then a non-streamed response is held until its capture finishes (bounded) and
//! carries `x-ctxscope-findings` naming the findings its turn raised.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use ctxscope_store::Endpoint;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::exchange::{Captured, Exchange, Outcome};
use super::guard::ExchangeGuard;
use super::queue::CaptureSender;
use super::tee::{RequestCopy, Tee};
use crate::body::{json_error, ProxyBody};
use crate::forward::UpstreamFailure;
use crate::metrics as m;

/// Header that names a conversation explicitly.
pub const CONVERSATION_HEADER: &str = "x-ctxscope-conversation";

/// Response header listing the kinds of finding the turn raised (with `--findings-header`).
pub const FINDINGS_HEADER: &str = "x-ctxscope-findings";

/// Settings the middleware needs on every request.
#[derive(Debug, Clone)]
pub struct CaptureSettings {
    pub session_header: Option<http::HeaderName>,
    pub max_capture_bytes: usize,
    pub max_request_bytes: u64,
    /// Hold non-streamed responses until their capture is done (at most this long) and add
    /// `x-ctxscope-findings`; `None` (the default) never waits.
    pub findings_header: Option<std::time::Duration>,
}

/// Builds [`Capture`] services around an inner service.
#[derive(Clone)]
pub struct CaptureLayer {
    settings: Arc<CaptureSettings>,
    sender: CaptureSender,
}

impl CaptureLayer {
    pub fn new(settings: CaptureSettings, sender: CaptureSender) -> CaptureLayer {
        CaptureLayer { settings: Arc::new(settings), sender }
    }
}

impl<S> tower::Layer<S> for CaptureLayer {
    type Service = Capture<S>;

    fn layer(&self, inner: S) -> Capture<S> {
        Capture { inner, settings: self.settings.clone(), sender: self.sender.clone() }
    }
}

#[derive(Clone)]
pub struct Capture<S> {
    inner: S,
    settings: Arc<CaptureSettings>,
    sender: CaptureSender,
}

/// Which captured endpoint a request is, by method and path suffix (so base paths like /engine/v1 work).
pub fn classify(method: &Method, path: &str) -> Option<Endpoint> {
    if method != Method::POST {
        return None;
    }
    let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
    if path.ends_with("/chat/completions") {
        Some(Endpoint::ChatCompletions)
    } else if path.ends_with("/completions") {
        Some(Endpoint::Completions)
    } else if path.ends_with("/v1/messages") {
        Some(Endpoint::AnthropicMessages)
    } else if path.ends_with("/api/chat") {
        Some(Endpoint::OllamaChat)
    } else if path.ends_with("/v1/responses") {
        Some(Endpoint::Responses)
    } else {
        None
    }
}

impl<S> tower::Service<Request<ProxyBody>> for Capture<S>
where
    S: tower::Service<Request<ProxyBody>, Response = Response<ProxyBody>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ProxyBody>) -> Self::Future {
        let started = Instant::now();
        let endpoint = classify(request.method(), request.uri().path());
        let settings = self.settings.clone();
        let sender = self.sender.clone();
        // Take the service that was driven to readiness; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let label = endpoint.map_or("other", Endpoint::as_str);
            if let Some(too_big) = oversized(&request, settings.max_request_bytes) {
                let response = json_error(StatusCode::PAYLOAD_TOO_LARGE, "ctxscope_request_too_large", &too_big, None);
                m::requests(label, response.status());
                return Ok(response);
            }
            let Some(endpoint) = endpoint else {
                let response = inner.call(request).await?;
                m::requests(label, response.status());
                return Ok(response);
            };
            let (parts, body) = request.into_parts();
            let copy = Arc::new(Mutex::new(Captured::default()));
            let body = Tee::new(body, RequestCopy { copy: copy.clone(), limit: settings.max_capture_bytes }).boxed_unsync();
            let mut exchange = Exchange::new(endpoint, parts.method.as_str(), parts.uri.path(), copy);
            exchange.started = started;
            exchange.conversation_name = conversation_name(&parts.headers, settings.session_header.as_ref());
            exchange.authorization = parts.headers.get(header::AUTHORIZATION).cloned().map(|mut v| {
                v.set_sensitive(true);
                v
            });
            // Dropped with this future if the client goes away before the upstream answers.
            let mut guard = ExchangeGuard::new(exchange, sender, settings.max_capture_bytes);
            let before_upstream = started.elapsed();
            let response = inner.call(Request::from_parts(parts, body)).await?;
            let upstream_done = Instant::now();
            let (parts, body) = response.into_parts();
            if let Some(ex) = guard.get() {
                ex.status = Some(parts.status.as_u16());
                ex.headers_us = Some(ex.started.elapsed().as_micros() as u64);
                ex.response_content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
                if let Some(UpstreamFailure(detail)) = parts.extensions.get::<UpstreamFailure>() {
                    ex.outcome = Outcome::UpstreamUnreachable(detail.clone());
                }
            }
            m::requests(label, parts.status);
            if let (Some(wait), false) = (settings.findings_header, is_stream(&parts.headers)) {
                return Ok(with_findings(parts, body, guard, wait).await);
            }
            let response = Response::from_parts(parts, Tee::new(body, guard).boxed_unsync());
            m::overhead(before_upstream + upstream_done.elapsed());
            Ok(response)
        })
    }
}

/// Streamed responses (SSE, NDJSON) pass at once: their headers leave before the turn is known.
fn is_stream(headers: &http::HeaderMap) -> bool {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    content_type.starts_with("text/event-stream") || content_type.contains("ndjson")
}

/// Reads the whole response through the tee (which hands the exchange to capture), waits up to `wait`
/// for the findings it raised, and answers the same bytes with `x-ctxscope-findings` when there are any.
async fn with_findings(
    mut parts: http::response::Parts,
    body: ProxyBody,
    mut guard: ExchangeGuard,
    wait: std::time::Duration,
) -> Response<ProxyBody> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Some(ex) = guard.get() {
        ex.findings_reply = Some(tx);
    }
    let bytes = match Tee::new(body, guard).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let message = format!("ctxscope: upstream response failed mid-body: {e}");
            return json_error(StatusCode::BAD_GATEWAY, "ctxscope_upstream_failed", &message, None);
        }
    };
    if let Ok(Ok(kinds)) = tokio::time::timeout(wait, rx).await {
        if let Ok(value) = header::HeaderValue::from_str(&kinds.join(",")) {
            if !kinds.is_empty() {
                parts.headers.insert(FINDINGS_HEADER, value);
            }
        }
    }
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(bytes.len()));
    Response::from_parts(parts, crate::body::full(bytes))
}

fn oversized(request: &Request<ProxyBody>, max: u64) -> Option<String> {
    let length = request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.parse::<u64>().ok()?;
    (max > 0 && length > max)
        .then(|| format!("ctxscope: request body of {length} bytes exceeds the proxy's limit of {max} bytes (--max-request-bytes)"))
}

fn conversation_name(headers: &http::HeaderMap, session: Option<&http::HeaderName>) -> Option<String> {
    let explicit = headers.get(CONVERSATION_HEADER);
    let session = session.and_then(|name| headers.get(name));
    explicit.or(session).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_llm_endpoints_by_suffix() {
        assert_eq!(classify(&Method::POST, "/v1/chat/completions"), Some(Endpoint::ChatCompletions));
        assert_eq!(classify(&Method::POST, "/engine/v1/completions?x=1"), Some(Endpoint::Completions));
        assert_eq!(classify(&Method::POST, "/v1/messages"), Some(Endpoint::AnthropicMessages));
        assert_eq!(classify(&Method::POST, "/api/chat"), Some(Endpoint::OllamaChat));
        assert_eq!(classify(&Method::POST, "/v1/responses"), Some(Endpoint::Responses));
        assert_eq!(classify(&Method::POST, "/v1/responses/resp_1/cancel"), None);
        assert_eq!(classify(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(classify(&Method::POST, "/v1/embeddings"), None);
    }

    #[test]
    fn explicit_header_wins_over_session_header() {
        let mut h = http::HeaderMap::new();
        h.insert("x-session", "s1".parse().unwrap());
        let session = http::HeaderName::from_static("x-session");
        assert_eq!(conversation_name(&h, Some(&session)).as_deref(), Some("s1"));
        h.insert(CONVERSATION_HEADER, "c9".parse().unwrap());
        assert_eq!(conversation_name(&h, Some(&session)).as_deref(), Some("c9"));
        assert_eq!(conversation_name(&http::HeaderMap::new(), None), None);
    }
}
