//! The body type that flows through the proxy, and the JSON error responses the proxy itself makes
//! (502 for a dead upstream, 413 for an oversized request); everything else is the upstream's.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// Request and response bodies inside the proxy.
pub type ProxyBody = UnsyncBoxBody<Bytes, BodyError>;

/// What a body stream may end with: the connection's error, or a request body read too slowly
/// ([`ctxscope_http::timed::BodyTimeout`]).
pub use ctxscope_http::timed::BodyError;

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// An error produced by ctxscope itself, in the OpenAI error shape so clients show the message.
pub fn json_error(status: StatusCode, kind: &str, message: &str, upstream: Option<&str>) -> Response<ProxyBody> {
    let mut error = serde_json::json!({"message": message, "type": kind, "code": status.as_u16()});
    if let Some(up) = upstream {
        error["upstream"] = serde_json::Value::String(up.to_string());
    }
    let body = serde_json::json!({ "error": error }).to_string();
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response.headers_mut().insert("x-ctxscope-error", header::HeaderValue::from_static("1"));
    response
}
