//! `--responses-state`: the proxy keeps Responses API conversation state for upstreams that keep
//! none. A `POST /v1/responses` naming `previous_response_id` is rewritten before it is forwarded:
//! the chain is expanded from the capture store into the full `input` (the upstream sees a stateless
//! request without `previous_response_id`); an id the store does not hold gets OpenAI's 404. It sits
//! between the capture tee (which records the request as the client sent it) and the forwarder;
//! every other request, and every request without the flag, passes untouched.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxscope_store::{Store, StoreError};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::body::{full, json_error, ProxyBody};
use crate::capture::responses::{parent_context, ParentContext};
use crate::parse::responses::messages_to_items;

/// How long a request waits for its parent response to reach the store (the capture worker stores
/// each exchange just after its response ends; a client that answers at once can be ahead of it).
const PARENT_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("Previous response with id '{0}' not found.")]
    NotFound(String),
    #[error("ctxscope --responses-state: the capture store is unavailable, so previous_response_id cannot be expanded")]
    NoStore,
    #[error("ctxscope --responses-state: reading the chain of {id} from the store failed: {source}")]
    Store { id: String, source: StoreError },
    #[error(
        "ctxscope --responses-state: the chain of {id} was captured with --capture {level}, so the store does not hold its text as sent; it is not sent upstream (send the whole input instead)"
    )]
    Withheld { id: String, level: ctxscope_store::CaptureLevel },
}

impl StateError {
    fn response(&self) -> Response<ProxyBody> {
        match self {
            StateError::NotFound(_) => {
                let body = json!({"error": {
                    "message": self.to_string(), "type": "invalid_request_error",
                    "param": "previous_response_id", "code": "previous_response_not_found",
                }});
                let mut response = Response::new(full(body.to_string()));
                *response.status_mut() = StatusCode::NOT_FOUND;
                response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
                response
            }
            StateError::NoStore | StateError::Store { .. } => {
                json_error(StatusCode::SERVICE_UNAVAILABLE, "ctxscope_responses_state", &self.to_string(), None)
            }
            StateError::Withheld { .. } => json_error(StatusCode::CONFLICT, "ctxscope_responses_state_withheld", &self.to_string(), None),
        }
    }
}

/// Builds [`ResponsesState`] services; `store` is `None` when capture is unavailable.
#[derive(Clone)]
pub struct ResponsesStateLayer {
    enabled: bool,
    store: Option<Store>,
}

impl ResponsesStateLayer {
    pub fn new(enabled: bool, store: Option<Store>) -> ResponsesStateLayer {
        ResponsesStateLayer { enabled, store }
    }
}

impl<S> tower::Layer<S> for ResponsesStateLayer {
    type Service = ResponsesState<S>;

    fn layer(&self, inner: S) -> ResponsesState<S> {
        ResponsesState { inner, enabled: self.enabled, store: self.store.clone() }
    }
}

#[derive(Clone)]
pub struct ResponsesState<S> {
    inner: S,
    enabled: bool,
    store: Option<Store>,
}

fn is_responses(method: &Method, path: &str) -> bool {
    method == Method::POST && path.trim_end_matches('/').ends_with("/v1/responses")
}

impl<S> tower::Service<Request<ProxyBody>> for ResponsesState<S>
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
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.enabled || !is_responses(request.method(), request.uri().path()) {
            return Box::pin(inner.call(request));
        }
        let store = self.store.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let message = format!("ctxscope: reading the request body failed: {e}");
                    return Ok(json_error(StatusCode::BAD_REQUEST, "ctxscope_bad_request", &message, None));
                }
            };
            let bytes = match expand_request(store, bytes).await {
                Ok(bytes) => bytes,
                Err(error) => return Ok(error.response()),
            };
            parts.headers.remove(header::TRANSFER_ENCODING);
            parts.headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(bytes.len()));
            inner.call(Request::from_parts(parts, full(bytes))).await
        })
    }
}

/// The request to forward: the same bytes unless it names `previous_response_id`, else the body with
/// the chain's items ahead of its own `input` and without `previous_response_id`.
async fn expand_request(store: Option<Store>, bytes: Bytes) -> Result<Bytes, StateError> {
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(bytes);
    };
    let Some(id) = object.get("previous_response_id").and_then(Value::as_str).map(str::to_string) else {
        return Ok(bytes);
    };
    let store = store.ok_or(StateError::NoStore)?;
    let lookup = id.clone();
    let context = tokio::task::spawn_blocking(move || wait_for_parent(&store, &lookup))
        .await
        .unwrap_or_else(|e| Err(StoreError::NotFound(format!("lookup task failed: {e}"))))
        .map_err(|source| StateError::Store { id: id.clone(), source })?
        .ok_or_else(|| StateError::NotFound(id.clone()))?;
    // Masked or absent text is never forwarded as if it were the conversation.
    if context.capture != ctxscope_store::CaptureLevel::Full {
        return Err(StateError::Withheld { id, level: context.capture });
    }
    let context = context.whole().map_err(|source| StateError::Store { id: id.clone(), source })?;
    let mut input = messages_to_items(&context);
    match object.remove("input") {
        Some(Value::String(text)) => input.push(json!({"type": "message", "role": "user", "content": text})),
        Some(Value::Array(items)) => input.extend(items),
        _ => {}
    }
    object.insert("input".into(), Value::Array(input));
    object.remove("previous_response_id");
    Ok(Bytes::from(serde_json::to_vec(&Value::Object(object)).unwrap_or_default()))
}

/// The parent's context, waiting up to [`PARENT_WAIT`] for the capture worker to store it.
fn wait_for_parent(store: &Store, id: &str) -> Result<Option<ParentContext>, StoreError> {
    let deadline = Instant::now() + PARENT_WAIT;
    loop {
        if let Some(context) = parent_context(store, id)? {
            return Ok(Some(context));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_post_responses_is_rewritten() {
        assert!(is_responses(&Method::POST, "/v1/responses"));
        assert!(is_responses(&Method::POST, "/engine/v1/responses/"));
        assert!(!is_responses(&Method::GET, "/v1/responses"));
        assert!(!is_responses(&Method::POST, "/v1/chat/completions"));
    }

    #[tokio::test]
    async fn bodies_without_previous_response_id_pass_byte_for_byte() {
        let body = Bytes::from_static(b"{ \"input\" : \"hi\",\"model\":\"m\" }");
        assert_eq!(expand_request(None, body.clone()).await.unwrap(), body);
        let not_json = Bytes::from_static(b"{nope");
        assert_eq!(expand_request(None, not_json.clone()).await.unwrap(), not_json);
    }

    #[tokio::test]
    async fn an_unknown_id_is_openai_s_404() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &ctxscope_store::StoreOptions::default()).unwrap();
        let body = Bytes::from_static(br#"{"input":"hi","previous_response_id":"resp_x"}"#);
        let error = expand_request(Some(store), body).await.unwrap_err();
        let response = error.response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["error"]["code"], "previous_response_not_found");
        assert_eq!(value["error"]["message"], "Previous response with id 'resp_x' not found.");
        assert!(matches!(expand_request(None, Bytes::from_static(br#"{"previous_response_id":"r"}"#)).await, Err(StateError::NoStore)));
    }
}
