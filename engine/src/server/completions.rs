//! `POST /v1/chat/completions` and `POST /v1/completions`: validate, submit to the scheduler, wait
//! until the sequence is admitted, then either collect the whole reply or hand the event stream to an
//! SSE body. Dropping the event receiver (a stop string matched, the client went away) cancels the
//! sequence in the scheduler.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::body::{self, Body};
use super::error::ApiError;
use super::generation::{FinishReason, Generation, Output};
use super::request::{self, Endpoint};
use super::response::Meta;
use super::state::State;
use super::stream::SseBody;
use crate::forward::Path;
use crate::patch::PatchSet;
use crate::scheduler::GenerateRequest;

use ctxscope_common::wire::PATCHES_HEADER;

/// Handles one generation request; the response names the patch set applied in `x-ctxscope-patches`.
pub async fn generate(
    state: Arc<State>,
    endpoint: Endpoint,
    body: &[u8],
    path: Path,
    patches: PatchSet,
) -> Result<http::Response<Body>, ApiError> {
    let object = request::json_object(body)?;
    let arch = state.engine.model.arch();
    let patches = request::body_patches(&object, arch)?.unwrap_or(patches);
    // Header and body sets were checked as they were parsed; this catches a `--patches` default.
    patches.check_applies(arch).map_err(|e| ApiError::param("x-ctxscope-patches", format!("the engine's --patches default: {e}")))?;
    let mut response = run(state, endpoint, &object, path, &patches).await?;
    let echo = http::HeaderValue::from_str(&patches.canonical()).map_err(|e| ApiError::Engine(e.to_string()))?;
    response.headers_mut().insert(PATCHES_HEADER, echo);
    Ok(response)
}

async fn run(
    state: Arc<State>,
    endpoint: Endpoint,
    object: &serde_json::Map<String, serde_json::Value>,
    path: Path,
    patches: &PatchSet,
) -> Result<http::Response<Body>, ApiError> {
    let model = state.engine.model.clone();
    let ctx = state.engine.options.ctx;
    // A context fault that cuts the prompt below the context accepts any length, as the engine it
    // imitates does; the completion budget is then what the kept prompt leaves.
    let cuts = patches.ctx_shift.or(patches.auto_truncate).is_some_and(|n| n < ctx);
    let check_ctx = if cuts { usize::MAX } else { ctx };
    let mut job = match endpoint {
        Endpoint::Chat => request::chat(object, &model, check_ctx)?,
        Endpoint::Completion => request::completion(object, &model, check_ctx)?,
    };
    if cuts {
        let kept = patches.rewrite_prompt(&job.prompt).map_or(job.prompt.len(), |p| p.len());
        job.max_tokens = job.max_tokens.min(ctx.saturating_sub(kept).max(1));
    }
    let in_flight = state.admit().map_err(|(in_flight, limit)| ApiError::Busy { in_flight, limit })?;
    let (tx, mut events) = mpsc::unbounded_channel();
    let logprobs = job.sampling.logprobs;
    let submitted = GenerateRequest {
        prompt: job.prompt,
        max_tokens: job.max_tokens,
        sampling: job.sampling,
        path,
        patches: patches.clone(),
        events: tx,
    };
    state.engine.submit(submitted).map_err(|e| ApiError::Engine(e.to_string()))?;
    let meta = Meta::new(endpoint, &model.id, logprobs);
    let mut generation = Generation::new(job.stops, logprobs);

    // Answer only once the scheduler has admitted (or refused) the sequence, so a refusal is an HTTP error.
    let first = match events.recv().await {
        Some(event) => generation.on_event(&model, event),
        None => generation.on_closed(),
    };
    if let Some(Output::Failed(message)) = first.iter().find(|o| matches!(o, Output::Failed(_))) {
        return Err(ApiError::Engine(message.clone()));
    }

    if job.stream {
        let sse = SseBody::new(events, model, generation, meta, job.include_usage, in_flight, first);
        let mut response = http::Response::new(Body::new(sse));
        let headers = response.headers_mut();
        headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
        headers.insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
        return Ok(response);
    }

    let (mut text, mut tokens, mut finish) = (String::new(), Vec::new(), FinishReason::Stop);
    let mut outputs = first;
    loop {
        for output in outputs {
            match output {
                Output::Started => {}
                Output::Delta { text: delta, logprobs } => {
                    text.push_str(&delta);
                    tokens.extend(logprobs);
                }
                Output::Finished(reason) => finish = reason,
                Output::Failed(message) => return Err(ApiError::Engine(message)),
            }
        }
        if generation.is_finished() {
            break;
        }
        outputs = match events.recv().await {
            Some(event) => generation.on_event(&model, event),
            None => generation.on_closed(),
        };
    }
    drop(events);
    drop(in_flight);
    Ok(body::json(http::StatusCode::OK, &meta.full(&text, &tokens, finish, &generation.usage)))
}
