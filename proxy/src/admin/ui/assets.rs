//! The UI's files, compiled into the binary: one HTML page, one ES module, one stylesheet.

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, json_error, ProxyBody};

const INDEX: &str = include_str!("assets/index.html");
const APP: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

pub fn page() -> Response<ProxyBody> {
    respond(INDEX, "text/html; charset=utf-8")
}

/// `app.js` or `style.css`.
pub fn file(name: &str) -> Response<ProxyBody> {
    match name {
        "app.js" => respond(APP, "text/javascript; charset=utf-8"),
        "style.css" => respond(STYLE, "text/css; charset=utf-8"),
        _ => json_error(StatusCode::NOT_FOUND, "not_found", &format!("no UI file {name:?}"), None),
    }
}

fn respond(body: &'static str, content_type: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-src 'self'"),
    );
    response
}
