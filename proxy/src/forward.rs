//! The innermost service: rewrites a request for the upstream (URI, Host, hop-by-hop headers),
//! sends it with a pooled HTTP/1 client and streams the response back untouched. A connection
//! failure becomes a 502 JSON error naming the upstream, marked with [`UpstreamFailure`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

pub use ctxscope_common::describe_error;

use crate::body::{json_error, BodyError, ProxyBody};
use crate::upstream::Upstream;

/// Response extension set when the upstream could not be reached.
#[derive(Debug, Clone)]
pub struct UpstreamFailure(pub String);

/// Forwards to one upstream.
#[derive(Clone)]
pub struct Forward {
    client: Client<HttpConnector, ProxyBody>,
    upstream: Arc<Upstream>,
}

impl Forward {
    pub fn new(upstream: Upstream, connect_timeout: std::time::Duration) -> Forward {
        // Longer-lived pooled connections than other callers, and header case kept as sent.
        let client = ctxscope_http::client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .http1_preserve_header_case(true)
            .build(ctxscope_http::client::connector(connect_timeout));
        Forward { client, upstream: Arc::new(upstream) }
    }
}

impl tower::Service<Request<ProxyBody>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ProxyBody>) -> Self::Future {
        let client = self.client.clone();
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
            parts.uri = match upstream.uri_for(&path) {
                Ok(uri) => uri,
                Err(e) => {
                    return Ok(json_error(
                        StatusCode::BAD_REQUEST,
                        "ctxscope_bad_request",
                        &format!("ctxscope: cannot forward path {path:?}: {e}"),
                        None,
                    ))
                }
            };
            strip_hop_by_hop(&mut parts.headers);
            if let Ok(host) = header::HeaderValue::from_str(upstream.authority.as_str()) {
                parts.headers.insert(header::HOST, host);
            }
            upstream.authorize(&mut parts.headers);
            parts.version = http::Version::HTTP_11;
            match client.request(Request::from_parts(parts, body)).await {
                Ok(response) => {
                    let (mut parts, body) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    Ok(Response::from_parts(parts, body.map_err(BodyError::from).boxed_unsync()))
                }
                Err(error) if ctxscope_http::timed::BodyTimeout::find(&error).is_some() => {
                    let detail = describe_error(&error);
                    tracing::debug!(error = %detail, "request body too slow; upstream request dropped");
                    metrics::counter!(crate::metrics::SLOW_BODIES_TOTAL).increment(1);
                    let message =
                        format!("ctxscope: {}", ctxscope_http::timed::BodyTimeout::find(&error).map_or(detail, |t| t.to_string()));
                    let mut response = json_error(StatusCode::REQUEST_TIMEOUT, "ctxscope_slow_body", &message, None);
                    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
                    Ok(response)
                }
                Err(error) => {
                    let detail = describe_error(&error);
                    let message = format!("ctxscope: upstream {} failed: {detail}", upstream.display);
                    metrics::counter!(crate::metrics::UPSTREAM_ERRORS_TOTAL).increment(1);
                    tracing::warn!(upstream = %upstream.display, error = %detail, "upstream request failed");
                    let mut response =
                        json_error(StatusCode::BAD_GATEWAY, "ctxscope_upstream_unavailable", &message, Some(&upstream.display));
                    response.extensions_mut().insert(UpstreamFailure(detail));
                    Ok(response)
                }
            }
        })
    }
}

const HOP_BY_HOP: [&str; 8] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authenticate"];

/// Removes hop-by-hop headers, including those the Connection header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_named_ones_too() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-secret-hop".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("authorization", "Bearer k".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("authorization"));
    }
}
