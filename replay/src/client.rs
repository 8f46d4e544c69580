//! An OpenAI chat-completions client for one target (HTTP/1 over hyper, non-streaming, plain http):
//! greedy, seeded, with logprobs; engine targets carry their patch set and path in headers. Every
//! failure (connect, timeout, non-2xx, unreadable reply) becomes [`Outcome::Failed`]; a target that
//! rejects `logprobs` with a 400 is retried once without them, and remembered.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use serde_json::{json, Map, Value};

use crate::model::{Outcome, Reply, TargetKind, TargetSpec, TokenStep};
use crate::target::{check_url, TargetError};

pub use ctxscope_common::wire::{PATCHES_HEADER, PATH_HEADER};

/// Largest reply body read.
const MAX_REPLY_BYTES: usize = 16 << 20;
/// Longest error text kept from a non-JSON error body.
const MAX_ERROR_CHARS: usize = 500;

const LOGPROBS_UNKNOWN: u8 = 0;
const LOGPROBS_SUPPORTED: u8 = 1;
const LOGPROBS_UNSUPPORTED: u8 = 2;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    #[error("target `{target}` is this engine in-process, but no engine is running: give it url=http://HOST:PORT or start the engine")]
    NoEngine { target: String },
    #[error("target `{target}`: {source}")]
    Url { target: String, source: TargetError },
    #[error("target `{target}`: header `{name}` is not a valid HTTP header")]
    Header { target: String, name: String },
    #[error("target `{target}` is an engine started from a launch profile, and it is not running")]
    NotLaunched { target: String },
}

/// One request: the captured messages and parameters, and the replay's generation settings.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    pub messages: &'a [Value],
    /// The captured model name (the target's `model=` wins).
    pub model: Option<&'a str>,
    /// Captured parameters sent as they were (stop, penalties...).
    pub params: &'a Map<String, Value>,
    pub max_tokens: u64,
    pub seed: u64,
    /// Alternatives per token (0: chosen token's logprob only).
    pub top_logprobs: u32,
}

/// A client bound to one target.
pub struct TargetClient {
    name: String,
    uri: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    model: Option<String>,
    http: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    logprobs: AtomicU8,
}

/// Why one exchange failed.
struct Failure {
    error: String,
    status: Option<u16>,
}

impl TargetClient {
    /// `local_url` is the base URL of what this run started for the target: the in-process engine
    /// (engine targets without `url`) or the engine launched for a launch target.
    pub fn new(target: &TargetSpec, local_url: Option<&str>, timeout: Duration) -> Result<TargetClient, ClientError> {
        let url_error = |source| ClientError::Url { target: target.name.clone(), source };
        let base = match &target.kind {
            TargetKind::Url { url } => url.clone(),
            TargetKind::Engine { url: Some(url), .. } => url.clone(),
            TargetKind::Engine { url: None, .. } => {
                local_url.ok_or_else(|| ClientError::NoEngine { target: target.name.clone() })?.to_string()
            }
            TargetKind::Launch { .. } => local_url.ok_or_else(|| ClientError::NotLaunched { target: target.name.clone() })?.to_string(),
        };
        let base = check_url(&base).map_err(url_error)?;
        // User information in the URL goes as Basic auth, never in the URI (nor in logs).
        let (base, basic) = split_credentials(&base);
        let uri = chat_url(&base).parse::<Uri>().map_err(|e| url_error(TargetError::BadUrl { url: base, reason: e.to_string() }))?;
        let mut headers = request_headers(target)?;
        if let Some(basic) = basic.filter(|_| !headers.iter().any(|(n, _)| n == http::header::AUTHORIZATION)) {
            headers.push((http::header::AUTHORIZATION, basic));
        }
        Ok(TargetClient {
            name: target.name.clone(),
            uri,
            headers,
            model: target.model.clone(),
            http: ctxscope_http::client::client(timeout),
            timeout,
            logprobs: AtomicU8::new(LOGPROBS_UNKNOWN),
        })
    }

    /// Whether the target gave logprobs (None until it answered a request that asked for them).
    pub fn logprobs_supported(&self) -> Option<bool> {
        match self.logprobs.load(Ordering::Relaxed) {
            LOGPROBS_SUPPORTED => Some(true),
            LOGPROBS_UNSUPPORTED => Some(false),
            _ => None,
        }
    }

    /// Sends one request; never errors, failures are an outcome.
    pub async fn chat(&self, request: &ChatRequest<'_>) -> Outcome {
        let state = self.logprobs.load(Ordering::Relaxed);
        let with_logprobs = state != LOGPROBS_UNSUPPORTED;
        let first = self.exchange(request, with_logprobs).await;
        let result = match first {
            Err(failure) if with_logprobs && rejects_logprobs(&failure, state) => {
                let retry = self.exchange(request, false).await;
                if retry.is_ok() {
                    tracing::warn!(target_name = %self.name, error = %failure.error, "target rejects logprobs; replaying it without them");
                    self.logprobs.store(LOGPROBS_UNSUPPORTED, Ordering::Relaxed);
                }
                retry
            }
            Ok(reply) if with_logprobs => {
                let _ = self.logprobs.compare_exchange(LOGPROBS_UNKNOWN, LOGPROBS_SUPPORTED, Ordering::Relaxed, Ordering::Relaxed);
                Ok(reply)
            }
            other => other,
        };
        match result {
            Ok(reply) => Outcome::Ok(reply),
            Err(Failure { error, status }) => Outcome::Failed { error, status },
        }
    }

    async fn exchange(&self, request: &ChatRequest<'_>, logprobs: bool) -> Result<Reply, Failure> {
        let body = request_body(request, self.model.as_deref(), logprobs);
        let mut builder = Request::post(self.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, concat!("ctxscope-replay/", env!("CARGO_PKG_VERSION")));
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let http_request =
            builder.body(Full::new(Bytes::from(body.to_string()))).map_err(|e| Failure { error: e.to_string(), status: None })?;
        let started = Instant::now();
        let exchange = async {
            let response =
                self.http.request(http_request).await.map_err(|e| Failure { error: ctxscope_common::describe_error(&e), status: None })?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|e| Failure { error: format!("reading the reply: {e}"), status: Some(status.as_u16()) })?
                .to_bytes();
            Ok::<_, Failure>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Failure { error: format!("timed out after {:.1} s", self.timeout.as_secs_f64()), status: None })??;
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        if !status.is_success() {
            return Err(Failure { error: error_text(&bytes), status: Some(status.as_u16()) });
        }
        parse_reply(&bytes, wall_ms).map_err(|error| Failure { error, status: Some(status.as_u16()) })
    }
}

/// `http://user:pass@host/...` -> (`http://host/...`, `Basic base64(user:pass)`, marked sensitive).
fn split_credentials(url: &str) -> (String, Option<HeaderValue>) {
    let Some((scheme, rest)) = url.split_once("://") else { return (url.to_string(), None) };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some((userinfo, host)) = rest[..end].rsplit_once('@') else { return (url.to_string(), None) };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let plain = format!("{}:{}", percent_decode(user), percent_decode(password));
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut encoded = String::new();
    for chunk in plain.as_bytes().chunks(3) {
        let n = (chunk[0] as u32) << 16 | (*chunk.get(1).unwrap_or(&0) as u32) << 8 | *chunk.get(2).unwrap_or(&0) as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            encoded.push(if i <= chunk.len() { ALPHABET[(n >> shift) as usize & 63] as char } else { '=' });
        }
    }
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok();
    if let Some(value) = &mut value {
        value.set_sensitive(true);
    }
    (format!("{scheme}://{host}{}", &rest[end..]), value)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if let (b'%', Some(Some(h)), Some(Some(l))) = (bytes[i], bytes.get(i + 1).map(|b| hex(*b)), bytes.get(i + 2).map(|b| hex(*b))) {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `{base}/v1/chat/completions`, or `{base}/chat/completions` when the base already ends in `/v1`.
fn chat_url(base: &str) -> String {
    if base.ends_with("/v1") {
        format!("{base}/chat/completions")
    } else {
        format!("{base}/v1/chat/completions")
    }
}

/// The target's own headers, then the engine's patch set and path.
fn request_headers(target: &TargetSpec) -> Result<Vec<(HeaderName, HeaderValue)>, ClientError> {
    let mut pairs: Vec<(String, String)> = target.headers.clone();
    if let TargetKind::Engine { patches, path, .. } = &target.kind {
        pairs.push((PATCHES_HEADER.to_string(), patches.join(",")));
        if let Some(path) = path {
            pairs.push((PATH_HEADER.to_string(), path.clone()));
        }
    }
    pairs
        .into_iter()
        .map(|(name, value)| {
            let bad = || ClientError::Header { target: target.name.clone(), name: name.clone() };
            Ok((HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?, HeaderValue::from_str(&value).map_err(|_| bad())?))
        })
        .collect()
}

/// The JSON body: captured parameters first, then the replay's own (which win).
fn request_body(request: &ChatRequest<'_>, target_model: Option<&str>, logprobs: bool) -> Value {
    let mut body = request.params.clone();
    if let Some(model) = target_model.or(request.model) {
        body.insert("model".into(), json!(model));
    }
    body.insert("messages".into(), json!(request.messages));
    body.insert("temperature".into(), json!(0));
    body.insert("seed".into(), json!(request.seed));
    body.insert("max_tokens".into(), json!(request.max_tokens));
    body.insert("stream".into(), json!(false));
    if logprobs {
        body.insert("logprobs".into(), json!(true));
        if request.top_logprobs > 0 {
            body.insert("top_logprobs".into(), json!(request.top_logprobs));
        }
    }
    Value::Object(body)
}

/// A 400 is taken as "logprobs unsupported" when it says so, or while the target has not yet
/// answered a logprobs request (a target known to support them is not retried).
fn rejects_logprobs(failure: &Failure, state: u8) -> bool {
    failure.status == Some(400) && (state == LOGPROBS_UNKNOWN || failure.error.to_ascii_lowercase().contains("logprob"))
}

/// The engine's error message (`error.message`, `error`, `message`, `detail`), else the raw body.
fn error_text(body: &[u8]) -> String {
    let from_json = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        let error = v.get("error").unwrap_or(&Value::Null);
        [error.get("message"), Some(error), v.get("message"), v.get("detail")]
            .into_iter()
            .flatten()
            .find_map(|m| m.as_str().map(str::to_string))
    });
    from_json.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            "empty error body".to_string()
        } else {
            text.chars().take(MAX_ERROR_CHARS).collect()
        }
    })
}

/// Reads a non-streamed chat completion into a [`Reply`].
pub fn parse_reply(body: &[u8], wall_ms: f64) -> Result<Reply, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("the reply is not JSON: {e}"))?;
    let choice = value.get("choices").and_then(|c| c.get(0)).ok_or_else(|| format!("the reply has no choices: {}", error_text(body)))?;
    let text = choice.get("message").and_then(|m| m.get("content")).map(content_text).unwrap_or_default();
    let usage = value.get("usage").unwrap_or(&Value::Null);
    Ok(Reply {
        text,
        tokens: choice.get("logprobs").and_then(|l| l.get("content")).map(token_steps).unwrap_or_default(),
        prompt_tokens: usage.get("prompt_tokens").and_then(Value::as_u64),
        cached_tokens: usage.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens")).and_then(Value::as_u64),
        completion_tokens: usage.get("completion_tokens").and_then(Value::as_u64),
        finish_reason: choice.get("finish_reason").and_then(Value::as_str).map(str::to_string),
        wall_ms,
    })
}

/// Message content as text: a string, or the text parts of a list.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect(),
        _ => String::new(),
    }
}

/// `logprobs.content[]` -> steps; entries without a token or logprob are dropped.
fn token_steps(content: &Value) -> Vec<TokenStep> {
    let Some(items) = content.as_array() else { return Vec::new() };
    items
        .iter()
        .filter_map(|item| {
            let token = item.get("token")?.as_str()?.to_string();
            let logprob = item.get("logprob")?.as_f64()?;
            let top = item
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|alts| {
                    alts.iter().filter_map(|a| Some((a.get("token")?.as_str()?.to_string(), a.get("logprob")?.as_f64()?))).collect()
                })
                .unwrap_or_default();
            Some(TokenStep { token, logprob, top })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_text_logprobs_usage_and_finish() {
        let body = json!({
            "choices": [{"message": {"role": "assistant", "content": "Hi there"}, "finish_reason": "length",
                "logprobs": {"content": [
                    {"token": "Hi", "logprob": -0.1, "top_logprobs": [{"token": "Hi", "logprob": -0.1}, {"token": "Hello", "logprob": -2.4}]},
                    {"token": " there", "logprob": -0.3, "top_logprobs": []}
                ]}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}
        });
        let reply = parse_reply(body.to_string().as_bytes(), 5.0).unwrap();
        assert_eq!(reply.text, "Hi there");
        assert_eq!(reply.tokens.len(), 2);
        assert_eq!(reply.tokens[0].top, vec![("Hi".to_string(), -0.1), ("Hello".to_string(), -2.4)]);
        assert_eq!((reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens), (Some(12), Some(2), Some(8)));
        assert_eq!(reply.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn replies_without_logprobs_or_choices() {
        let reply =
            parse_reply(br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#, 0.0).unwrap();
        assert_eq!(reply.text, "ab");
        assert!(reply.tokens.is_empty());
        assert!(parse_reply(br#"{"error":{"message":"boom"}}"#, 0.0).unwrap_err().contains("boom"));
        assert!(parse_reply(b"<html>", 0.0).unwrap_err().contains("not JSON"));
    }

    #[test]
    fn error_text_keeps_the_engine_message() {
        assert_eq!(error_text(br#"{"error":{"message":"context too long","code":400}}"#), "context too long");
        assert_eq!(error_text(br#"{"error":"no such model"}"#), "no such model");
        assert_eq!(error_text(br#"{"detail":"bad"}"#), "bad");
        assert_eq!(error_text(b"  plain  "), "plain");
    }

    #[test]
    fn body_is_greedy_seeded_and_keeps_captured_params() {
        let params: Map<String, Value> =
            [("stop".to_string(), json!(["\n"])), ("temperature".to_string(), json!(0.9))].into_iter().collect();
        let messages = [json!({"role": "user", "content": "hi"})];
        let request =
            ChatRequest { messages: &messages, model: Some("captured"), params: &params, max_tokens: 16, seed: 7, top_logprobs: 5 };
        let body = request_body(&request, None, true);
        assert_eq!(body["temperature"], 0);
        assert_eq!((body["seed"].clone(), body["max_tokens"].clone()), (json!(7), json!(16)));
        assert_eq!((body["logprobs"].clone(), body["top_logprobs"].clone()), (json!(true), json!(5)));
        assert_eq!(body["stop"], json!(["\n"]));
        assert_eq!(body["model"], "captured");
        let body = request_body(&request, Some("mine"), false);
        assert_eq!(body["model"], "mine");
        assert!(body.get("logprobs").is_none() && body.get("top_logprobs").is_none());
    }

    #[test]
    fn engine_targets_send_patches_even_when_empty() {
        let golden = TargetSpec::parse("engine").unwrap();
        let headers = request_headers(&golden).unwrap();
        assert_eq!(headers, vec![(HeaderName::from_static(PATCHES_HEADER), HeaderValue::from_static(""))]);
        let patched = TargetSpec::parse("engine:patches=a,b,path=fast,header=x-k:v").unwrap();
        let names: Vec<(String, String)> =
            request_headers(&patched).unwrap().iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string())).collect();
        assert_eq!(names, [("x-k", "v"), (PATCHES_HEADER, "a,b"), (PATH_HEADER, "fast")].map(|(a, b)| (a.to_string(), b.to_string())));
        let url = TargetSpec::parse("url=http://h:1").unwrap();
        assert!(request_headers(&url).unwrap().is_empty());
    }

    #[test]
    fn url_credentials_become_basic_auth_outside_the_uri() {
        let (base, basic) = split_credentials("http://bob:p%40ss@h:1/v1");
        assert_eq!(base, "http://h:1/v1");
        // base64("bob:p@ss")
        assert_eq!(basic.unwrap(), "Basic Ym9iOnBAc3M=");
        assert_eq!(split_credentials("http://h:1"), ("http://h:1".to_string(), None));
        let target = TargetSpec::parse("url=http://bob:secret@h:1,model=m").unwrap();
        let client = TargetClient::new(&target, None, Duration::from_secs(1)).unwrap();
        assert!(!client.uri.to_string().contains("secret"));
        assert!(client.headers.iter().any(|(n, v)| n == http::header::AUTHORIZATION && v == "Basic Ym9iOnNlY3JldA=="));
    }

    #[test]
    fn urls_and_the_in_process_engine() {
        assert_eq!(chat_url("http://h:1"), "http://h:1/v1/chat/completions");
        assert_eq!(chat_url("http://h:1/v1"), "http://h:1/v1/chat/completions");
        assert_eq!(chat_url("http://h:1/openai"), "http://h:1/openai/v1/chat/completions");
        let golden = TargetSpec::parse("engine").unwrap();
        let timeout = Duration::from_secs(1);
        assert!(matches!(TargetClient::new(&golden, None, timeout), Err(ClientError::NoEngine { .. })));
        assert!(TargetClient::new(&golden, Some("http://127.0.0.1:9"), timeout).is_ok());
        assert!(matches!(TargetClient::new(&golden, Some("https://x"), timeout), Err(ClientError::Url { .. })));
    }

    #[tokio::test]
    async fn a_dead_target_is_a_failed_outcome() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let target = TargetSpec::parse(&format!("http://{addr}")).unwrap();
        let client = TargetClient::new(&target, None, Duration::from_secs(2)).unwrap();
        let params = Map::new();
        let messages = [json!({"role": "user", "content": "hi"})];
        let request = ChatRequest { messages: &messages, model: None, params: &params, max_tokens: 4, seed: 0, top_logprobs: 0 };
        match client.chat(&request).await {
            Outcome::Failed { error, status: None } => assert!(error.to_lowercase().contains("connect"), "{error}"),
            other => panic!("expected a connection failure, got {other:?}"),
        }
    }
}
