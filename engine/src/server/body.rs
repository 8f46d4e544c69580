//! The response body type the server speaks (one boxed body for JSON and SSE alike) and the small
//! constructors for JSON and error responses.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

use super::error::ApiError;

/// Every response body.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response with `status`.
pub fn json(status: http::StatusCode, value: &serde_json::Value) -> http::Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut response = http::Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// The OpenAI-shaped error response.
pub fn error(error: &ApiError) -> http::Response<Body> {
    if error.status().is_server_error() {
        tracing::warn!(%error, "request failed");
    } else {
        tracing::debug!(%error, "request refused");
    }
    json(error.status(), &error.body())
}
