//! `--admin-token`: a bearer header or, after the login form, a cookie, required on every admin route
//! but `/healthz` and `/metrics`; and the rule that an admin port reachable from other hosts must have
//! a token.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::admin::AdminBody;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};

use crate::admin::AdminState;
use crate::body::{full, json_error, ProxyBody};

/// The cookie the login form sets.
pub const COOKIE: &str = "ctxscope_admin";

/// Why the admin port may not be opened as asked.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("refusing to serve the admin API and UI on {0}, which other hosts can reach, without --admin-token TOKEN (or listen on 127.0.0.1 / [::1])")]
    ExposedWithoutToken(SocketAddr),
    #[error("--admin-token must be at least 16 characters and printable ASCII without spaces, ';' or ','")]
    WeakToken,
}

/// Checks the admin address against the token before anything binds.
pub fn check_bind(addr: SocketAddr, token: Option<&str>) -> Result<(), BindError> {
    if let Some(token) = token {
        let printable = token.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b',');
        if token.len() < 16 || !printable {
            return Err(BindError::WeakToken);
        }
        return Ok(());
    }
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(BindError::ExposedWithoutToken(addr))
    }
}

/// Whether the request carries the token (always, when no token is configured).
pub fn allowed(token: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(token) = token else { return true };
    let bearer = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .any(|t| same(t.trim(), token));
    bearer || cookie(headers).is_some_and(|t| same(&t, token))
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        (name == COOKIE).then(|| value.to_string())
    })
}

/// Compares in time independent of where the strings differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A refused request: the UI's pages go to the login form, everything else is a JSON 401.
pub fn refuse(path: &str) -> Response<ProxyBody> {
    if path == "/ui" || path == "/ui/" || path == "/ui/index.html" {
        return redirect("/ui/login");
    }
    let mut response = json_error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this admin port needs its token: send `Authorization: Bearer TOKEN` or log in at /ui/login",
        None,
    );
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// GET: the form. POST (`token=...`, form-encoded): sets the cookie and goes to the UI, or shows the
/// form again.
pub async fn login(state: &Arc<AdminState>, request: Request<AdminBody>) -> Response<ProxyBody> {
    if request.method() != http::Method::POST {
        return form(StatusCode::OK, "");
    }
    let Ok(body) = Limited::new(request.into_body(), 4096).collect().await.map(|c| c.to_bytes()) else {
        return form(StatusCode::PAYLOAD_TOO_LARGE, "The form was too large.");
    };
    let sent = super::query::pairs(&String::from_utf8_lossy(&body)).into_iter().find(|(k, _)| k == "token").map(|(_, v)| v);
    match (&state.token, sent) {
        (Some(token), Some(sent)) if same(&sent, token) => {
            let mut response = redirect("/ui/");
            let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        (None, _) => redirect("/ui/"),
        _ => form(StatusCode::UNAUTHORIZED, "That token is not this admin port's."),
    }
}

fn redirect(to: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(""));
    *response.status_mut() = StatusCode::SEE_OTHER;
    response.headers_mut().insert(header::LOCATION, HeaderValue::from_static(to));
    response
}

fn form(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let page = format!(
        "<!doctype html><html><head><meta charset=utf-8><title>ctxscope: log in</title>\
         <link rel=stylesheet href=/ui/style.css></head><body class=login><form method=post action=/ui/login>\
         <h1>ctxscope</h1><p>This admin port is protected by <code>--admin-token</code>.</p>\
         <p class=error>{message}</p><input type=password name=token placeholder=token autofocus>\
         <button>Log in</button></form></body></html>"
    );
    let mut response = Response::new(full(page));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_addresses() {
        let local: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let public: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        assert!(check_bind(local, None).is_ok());
        assert!(matches!(check_bind(public, None), Err(BindError::ExposedWithoutToken(_))));
        assert!(matches!(check_bind(public, Some("short")), Err(BindError::WeakToken)));
        assert!(check_bind(public, Some("0123456789abcdef")).is_ok());
        let mut headers = HeaderMap::new();
        assert!(allowed(None, &headers));
        assert!(!allowed(Some("0123456789abcdef"), &headers));
        headers.insert(header::COOKIE, HeaderValue::from_static("a=b; ctxscope_admin=0123456789abcdef"));
        assert!(allowed(Some("0123456789abcdef"), &headers));
        headers.clear();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer 0123456789abcdeX"));
        assert!(!allowed(Some("0123456789abcdef"), &headers));
    }
}
