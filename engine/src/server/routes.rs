//! Request routing: picks the handler by method and path, reads the body (bounded), resolves the
//! computation path from `x-ctxscope-path` (echoed on the response) and the default patch set from
//! `x-ctxscope-patches` (a generation echoes the set it applied), and turns every [`ApiError`]
//! into its OpenAI-shaped response.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::body::{self, Body};
use super::completions;
use super::error::ApiError;
use super::info;
use super::request::Endpoint;
use super::state::State;
use crate::forward::Path;
use crate::patch::PatchSet;

use ctxscope_common::wire::{PATCHES_HEADER, PATH_HEADER};

const ROUTES: [&str; 10] = [
    "/health",
    "/v1/models",
    "/props",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/api/chat",
    "/tokenize",
    "/detokenize",
    "/apply-template",
];

/// The service function of every connection.
pub async fn handle(state: Arc<State>, request: http::Request<Incoming>) -> Result<http::Response<Body>, Infallible> {
    let path =
        match request.headers().get(PATH_HEADER) {
            None => Ok(state.config.default_path),
            Some(value) => value.to_str().ok().and_then(Path::parse).ok_or_else(|| {
                ApiError::param("x-ctxscope-path", format!("header {PATH_HEADER} must be `golden` or `fast`, got {value:?}"))
            }),
        };
    let patches = match request.headers().get(PATCHES_HEADER) {
        None => Ok(state.config.default_patches.clone()),
        Some(value) => match value.to_str() {
            Ok(text) => PatchSet::parse(text)
                .and_then(|set| set.check_applies(state.engine.model.arch()).map(|()| set))
                .map_err(|e| ApiError::param("x-ctxscope-patches", e.to_string())),
            Err(_) => Err(ApiError::param("x-ctxscope-patches", format!("header {PATCHES_HEADER} must be ASCII"))),
        },
    };
    let mut response = match (path, patches) {
        (Err(e), _) | (_, Err(e)) => body::error(&e),
        (Ok(path), Ok(patches)) => {
            let mut response = route(state, request, path, patches).await.unwrap_or_else(|e| body::error(&e));
            response.headers_mut().insert(PATH_HEADER, HeaderValue::from_static(path.as_str()));
            response
        }
    };
    response.headers_mut().insert(http::header::SERVER, HeaderValue::from_static("ctxscope-engine"));
    Ok(response)
}

async fn route(
    state: Arc<State>,
    request: http::Request<Incoming>,
    path: Path,
    patches: PatchSet,
) -> Result<http::Response<Body>, ApiError> {
    let method = request.method().clone();
    let uri_path = request.uri().path().to_string();
    let ok = |value: serde_json::Value| body::json(StatusCode::OK, &value);
    match (&method, uri_path.as_str()) {
        (&Method::GET, "/health") => Ok(ok(info::health())),
        (&Method::GET, "/v1/models") => Ok(ok(info::models(&state))),
        (&Method::GET, "/props") => Ok(ok(info::props(&state))),
        (&Method::POST, "/v1/chat/completions") => {
            let body = read_body(&state, request).await?;
            completions::generate(state, Endpoint::Chat, &body, path, patches).await
        }
        (&Method::POST, "/v1/completions") => {
            let body = read_body(&state, request).await?;
            completions::generate(state, Endpoint::Completion, &body, path, patches).await
        }
        (&Method::POST, "/v1/responses") => {
            let body = read_body(&state, request).await?;
            super::responses::create(state, &body, path, patches).await
        }
        (&Method::POST, "/api/chat") => {
            let body = read_body(&state, request).await?;
            super::ollama::chat(state, &body, path, patches).await
        }
        (&Method::POST, "/tokenize") => {
            let body = read_body(&state, request).await?;
            info::tokenize(&state, &body).map(ok)
        }
        (&Method::POST, "/apply-template") => {
            let body = read_body(&state, request).await?;
            info::apply_template(&state, &body).map(ok)
        }
        (&Method::POST, "/detokenize") => {
            let body = read_body(&state, request).await?;
            info::detokenize(&state, &body).map(ok)
        }
        (_, p) if p.starts_with("/v1/responses/") => {
            stored_response(&state, &method, &p["/v1/responses/".len()..], request.uri().query()).map(ok)
        }
        (_, p) if ROUTES.contains(&p) => Err(ApiError::MethodNotAllowed { method: method.to_string(), path: uri_path }),
        _ => Err(ApiError::NotFound { method: method.to_string(), path: uri_path }),
    }
}

/// `GET`/`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.
fn stored_response(state: &State, method: &Method, rest: &str, query: Option<&str>) -> Result<serde_json::Value, ApiError> {
    let not_allowed = || ApiError::MethodNotAllowed { method: method.to_string(), path: format!("/v1/responses/{rest}") };
    match (method, rest.split_once('/')) {
        (&Method::GET, None) => super::responses::retrieve(state, rest),
        (&Method::DELETE, None) => super::responses::delete(state, rest),
        (&Method::GET, Some((id, "input_items"))) => super::responses::input_items(state, id, query),
        (_, None) | (_, Some((_, "input_items"))) => Err(not_allowed()),
        _ => Err(ApiError::NotFound { method: method.to_string(), path: format!("/v1/responses/{rest}") }),
    }
}

async fn read_body(state: &State, request: http::Request<Incoming>) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::TooLarge { limit }),
        Err(e) => Err(ApiError::Body(e.to_string())),
    }
}
