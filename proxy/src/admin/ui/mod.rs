//! The web UI on the admin port: `/ui/` serves a single page (embedded HTML, JS and CSS, no build
//! step, nothing fetched from elsewhere) and its JSON endpoints under `/ui/api/`; the access check
//! (`--admin-token`) guards the whole admin port. Hooked into `admin::handle` by [`intercept`].

pub mod api;
pub mod assets;
pub mod auth;
pub mod diff;
pub mod launch;
pub mod live;
mod query;

use std::sync::Arc;

use crate::admin::AdminBody;
use http::{Method, Request, Response, StatusCode};

use crate::admin::AdminState;
use crate::body::{json_error, ProxyBody};

/// Answers UI routes and refused requests; hands every other request back to the admin router.
pub async fn intercept(state: &Arc<AdminState>, request: Request<AdminBody>) -> Result<Response<ProxyBody>, Request<AdminBody>> {
    let path = request.uri().path().to_string();
    if path == "/ui/login" {
        return Ok(auth::login(state, request).await);
    }
    let open = path == "/healthz" || path == "/metrics";
    if !open && !auth::allowed(state.token.as_deref(), request.headers()) {
        return Ok(auth::refuse(&path));
    }
    if path != "/ui" && !path.starts_with("/ui/") {
        return Err(request);
    }
    if path == "/ui/api/replays/start" && request.method() == Method::POST {
        return Ok(match read_limited(request, launch::MAX_START_BYTES).await {
            Ok(body) => launch::start(state, &body),
            Err(message) => json_error(StatusCode::BAD_REQUEST, "invalid_request_error", &message, None),
        });
    }
    Ok(route(state, &request, &path).await)
}

/// A request body of at most `limit` bytes, or why not.
async fn read_limited(request: Request<AdminBody>, limit: usize) -> Result<bytes::Bytes, String> {
    use http_body_util::{BodyExt, Limited};
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(format!("the request body is larger than {limit} bytes")),
        Err(e) => Err(format!("cannot read the request body: {e}")),
    }
}

async fn route(state: &Arc<AdminState>, request: &Request<AdminBody>, path: &str) -> Response<ProxyBody> {
    if request.method() != Method::GET {
        return json_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "the UI answers GET only", None);
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).skip(1).collect();
    let query = request.uri().query().unwrap_or("").to_string();
    match segments.as_slice() {
        [] | ["index.html"] => assets::page(),
        [file] => assets::file(file),
        ["api", "conversations"] => api::conversations(state, &query).await,
        ["api", "finding-counts"] => api::finding_counts(state).await,
        ["api", "turns", id, "diff"] => api::turn_diff(state, id).await,
        ["api", "live"] => live::stream(state, &query).await,
        ["api", "replays", "running"] => {
            let body = serde_json::json!({
                "runs": state.launcher.runs(),
                "engine_targets": state.launcher.can_run_engine(),
                "profiles": state.launcher.profile_views(),
            });
            crate::admin::json_response(StatusCode::OK, body.to_string())
        }
        ["replays", id, "report"] => api::replay_report(state, id).await,
        _ => json_error(StatusCode::NOT_FOUND, "not_found", &format!("no UI route {path}"), None),
    }
}
