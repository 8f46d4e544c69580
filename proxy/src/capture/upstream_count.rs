//! Prompt token counts from the upstream engine itself (`--count-with upstream`, or `auto` without
//! `--tokenizer`): its own chat template and tokenizer, through the endpoints it offers, so counts are
//! the engine's with no tokenizer file in the proxy.
//!
//! | engine | how a chat prompt is counted |
//! |---|---|
//! | llama.cpp `llama-server`, `ctxscope engine` | `POST /apply-template` `{"messages"}` -> `{"prompt"}`, then `POST /tokenize` `{"content", "add_special": true, "parse_special": true}` -> `{"tokens"}` |
//! | vLLM | `POST /tokenize` `{"model", "messages", "add_generation_prompt": true}` -> `{"count", "tokens"}` |
//! | SGLang | no chat form: only `/v1/completions` prompts, `POST /v1/tokenize` `{"model", "prompt"}` -> `{"count", "tokens"}` |
//!
//! Runs on the capture worker, never on the forwarding path: one count at a time (the worker is one
//! thread), every call of a turn under one short deadline, answers cached by prompt (the head chain
//! hash with the model and tools), and a failure leaves the turn uncounted. The engine is identified
//! once (`GET /v1/models`'s `owned_by`, else by trying its endpoints); a timeout, a refused connection or
//! a 5xx forgets it and backs off (1 s doubling to 5 min) before the next probe. The client's
//! `Authorization` header goes with each call; it is never kept.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxscope_store::{chain_next, message_hash, Endpoint, Hash, LocalTokens};
use http::{header, HeaderValue, Method};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use serde_json::{json, Value};

use crate::metrics as m;
use crate::parse::message::{self, Message};
use crate::upstream::Upstream;

/// Which engine's endpoints the upstream offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    LlamaCpp,
    Ctxscope,
    Vllm,
    Sglang,
}

impl Flavour {
    /// The method name stored in `local_tokens.tokenizer`.
    pub fn method(self) -> &'static str {
        match self {
            Flavour::LlamaCpp => "upstream:llama.cpp",
            Flavour::Ctxscope => "upstream:ctxscope",
            Flavour::Vllm => "upstream:vllm",
            Flavour::Sglang => "upstream:sglang",
        }
    }

    /// From `GET /v1/models`'s `owned_by`.
    fn from_owner(owner: &str) -> Option<Flavour> {
        match owner {
            "llamacpp" => Some(Flavour::LlamaCpp),
            "ctxscope" => Some(Flavour::Ctxscope),
            "vllm" => Some(Flavour::Vllm),
            "sglang" => Some(Flavour::Sglang),
            _ => None,
        }
    }
}

/// Why a prompt was not counted by the upstream (the `reason` label of the failure counter).
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    #[error("upstream count call {path} got no answer within {after:?}")]
    Timeout { path: &'static str, after: Duration },
    #[error("upstream count call {path} failed: {detail}")]
    Transport { path: &'static str, detail: String },
    #[error("upstream answered {path} with HTTP {status}: {body}")]
    Status { path: &'static str, status: u16, body: String },
    #[error("upstream answer to {path} is not the expected shape: {detail}")]
    Shape { path: &'static str, detail: String },
    #[error("the upstream offers no endpoint that counts this prompt: {0}")]
    Unsupported(String),
    #[error("upstream counting backs off after a failure for {0:?} more")]
    BackingOff(Duration),
}

impl CountError {
    pub fn reason(&self) -> &'static str {
        match self {
            CountError::Timeout { .. } => "timeout",
            CountError::Transport { .. } => "transport",
            CountError::Status { .. } => "status",
            CountError::Shape { .. } => "shape",
            CountError::Unsupported(_) => "unsupported",
            CountError::BackingOff(_) => "backoff",
        }
    }

    /// The upstream itself is unwell (not this one prompt): forget what it is and back off.
    fn upstream_down(&self) -> bool {
        match self {
            CountError::Timeout { .. } | CountError::Transport { .. } => true,
            CountError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// A prompt as the upstream counted it.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamCount {
    /// `tokenizer` names the method (`upstream:llama.cpp`, ...); `new_messages` is empty (the
    /// endpoints count whole prompts, not messages).
    pub local: LocalTokens,
    /// The prompt's token ids, when the endpoint gave them.
    pub ids: Option<Arc<[u32]>>,
}

/// Settings of the counting client.
#[derive(Debug, Clone)]
pub struct CountSettings {
    /// Deadline for all the calls one prompt needs.
    pub timeout: Duration,
    /// Cached prompts (answers kept, oldest dropped first).
    pub cache_entries: usize,
    /// Cached token ids in all.
    pub cache_tokens: usize,
}

impl Default for CountSettings {
    fn default() -> CountSettings {
        CountSettings { timeout: Duration::from_secs(5), cache_entries: 4096, cache_tokens: 8 << 20 }
    }
}

/// The largest answer read from a count endpoint (a 1M-token prompt's ids as JSON).
const MAX_ANSWER_BYTES: usize = 16 << 20;
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Counts prompts through the upstream; owned by the capture worker.
pub struct UpstreamCounter {
    upstream: Upstream,
    settings: CountSettings,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Made on first use, on the worker thread (never inside the proxy's own runtime).
    runtime: Option<tokio::runtime::Runtime>,
    flavour: Option<Flavour>,
    /// The model id `GET /v1/models` named (vLLM and SGLang want one in each call).
    served_model: Option<String>,
    failures: u32,
    retry_at: Option<Instant>,
    cache: HashMap<Hash, UpstreamCount>,
    order: VecDeque<Hash>,
    cached_tokens: usize,
    /// Count calls made (probes included), for tests and the docs' cost figures.
    pub calls: u64,
}

impl UpstreamCounter {
    pub fn new(upstream: Upstream, settings: CountSettings) -> UpstreamCounter {
        let client = ctxscope_http::client::client(settings.timeout);
        UpstreamCounter {
            upstream,
            settings,
            client,
            runtime: None,
            flavour: None,
            served_model: None,
            failures: 0,
            retry_at: None,
            cache: HashMap::new(),
            order: VecDeque::new(),
            cached_tokens: 0,
            calls: 0,
        }
    }

    /// The engine found by the last probe.
    pub fn flavour(&self) -> Option<Flavour> {
        self.flavour
    }

    /// Counts one prompt; a failure is counted in `ctxscope_upstream_count_failures_total{reason}`
    /// and leaves the turn uncounted.
    pub fn count(&mut self, prompt: &Prompt<'_>, authorization: Option<&HeaderValue>) -> Option<UpstreamCount> {
        let started = Instant::now();
        match self.try_count(prompt, authorization) {
            Ok(count) => {
                metrics::histogram!(m::UPSTREAM_COUNT_SECONDS).record(started.elapsed().as_secs_f64());
                Some(count)
            }
            Err(error) => {
                metrics::counter!(m::UPSTREAM_COUNT_FAILURES_TOTAL, "reason" => error.reason()).increment(1);
                tracing::debug!(%error, "upstream token count failed; turn left uncounted");
                None
            }
        }
    }

    /// Counts one prompt (cached answers first), probing the upstream when it is not known yet.
    pub fn try_count(&mut self, prompt: &Prompt<'_>, authorization: Option<&HeaderValue>) -> Result<UpstreamCount, CountError> {
        // Every chat-shaped endpoint (Anthropic messages, Ollama's chat, Responses input items) is
        // parsed into OpenAI-style messages, which the engines' chat templates take as they are.
        if let Some(cached) = self.flavour.and_then(|f| self.cache.get(&prompt.key(f))) {
            return Ok(cached.clone());
        }
        if let Some(at) = self.retry_at {
            let now = Instant::now();
            if now < at {
                return Err(CountError::BackingOff(at - now));
            }
        }
        let deadline = Instant::now() + self.settings.timeout;
        let result = match self.flavour {
            Some(f) => Ok(f),
            None => self.probe(authorization, deadline),
        }
        .and_then(|flavour| Ok((flavour, self.ask(flavour, prompt, authorization, deadline)?)));
        match result {
            Ok((flavour, count)) => {
                self.failures = 0;
                self.retry_at = None;
                self.remember(prompt.key(flavour), count.clone());
                Ok(count)
            }
            Err(error) => {
                if error.upstream_down() || self.flavour.is_none() {
                    self.flavour = None;
                    let backoff = BACKOFF_FIRST.saturating_mul(1 << self.failures.min(16)).min(BACKOFF_MAX);
                    self.failures += 1;
                    self.retry_at = Some(Instant::now() + backoff);
                }
                Err(error)
            }
        }
    }

    /// Finds which engine answers: `owned_by` in `GET /v1/models`, else whichever endpoint works.
    fn probe(&mut self, authorization: Option<&HeaderValue>, deadline: Instant) -> Result<Flavour, CountError> {
        let models = self.call(Method::GET, "/v1/models", None, authorization, deadline)?;
        let first = models.get("data").and_then(Value::as_array).and_then(|d| d.first());
        self.served_model = first.and_then(|m| m.get("id")).and_then(Value::as_str).map(str::to_string);
        let owner = first.and_then(|m| m.get("owned_by")).and_then(Value::as_str).unwrap_or("");
        let flavour = match Flavour::from_owner(owner) {
            Some(f) => f,
            None => {
                let probe = json!({"messages": [{"role": "user", "content": "hi"}]});
                let template = self.call(Method::POST, "/apply-template", Some(&probe), authorization, deadline);
                if template.is_ok_and(|v| v.get("prompt").is_some_and(Value::is_string)) {
                    Flavour::LlamaCpp
                } else {
                    let body = json!({"model": self.served_model, "messages": probe["messages"], "add_generation_prompt": true});
                    let tokenized = self.call(Method::POST, "/tokenize", Some(&body), authorization, deadline);
                    if tokenized.is_ok_and(|v| v.get("count").is_some()) {
                        Flavour::Vllm
                    } else {
                        return Err(CountError::Unsupported(format!(
                            "{} (owned_by {owner:?}) has neither /apply-template nor a chat /tokenize",
                            self.upstream.display
                        )));
                    }
                }
            }
        };
        tracing::info!(upstream = %self.upstream.display, method = flavour.method(), "prompts are counted by the upstream");
        self.flavour = Some(flavour);
        Ok(flavour)
    }

    fn ask(
        &mut self,
        flavour: Flavour,
        prompt: &Prompt<'_>,
        authorization: Option<&HeaderValue>,
        deadline: Instant,
    ) -> Result<UpstreamCount, CountError> {
        let model = prompt.model.map(str::to_string).or_else(|| self.served_model.clone());
        let chat = prompt.endpoint != Endpoint::Completions;
        let answer = match (flavour, chat) {
            (Flavour::LlamaCpp | Flavour::Ctxscope, true) => {
                let mut body = json!({"messages": message::values(prompt.messages)});
                if let Some(tools) = prompt.tools() {
                    body["tools"] = tools;
                }
                let rendered = self.call(Method::POST, "/apply-template", Some(&body), authorization, deadline)?;
                let text = rendered.get("prompt").and_then(Value::as_str).ok_or_else(|| shape("/apply-template", "no `prompt` string"))?;
                let body = json!({"content": text, "add_special": true, "parse_special": true});
                self.post("/tokenize", &body, authorization, deadline)?
            }
            (Flavour::LlamaCpp | Flavour::Ctxscope, _) => {
                let body = json!({"content": prompt.text()?, "add_special": true, "parse_special": true});
                self.post("/tokenize", &body, authorization, deadline)?
            }
            (Flavour::Vllm, true) => {
                let mut body = json!({"model": model, "messages": message::values(prompt.messages), "add_generation_prompt": true});
                if let Some(tools) = prompt.tools() {
                    body["tools"] = tools;
                }
                self.post("/tokenize", &body, authorization, deadline)?
            }
            (Flavour::Vllm, _) => {
                let body = json!({"model": model, "prompt": prompt.text()?});
                self.post("/tokenize", &body, authorization, deadline)?
            }
            (Flavour::Sglang, true) => {
                return Err(CountError::Unsupported("SGLang's /v1/tokenize takes text only; chat prompts need --tokenizer".into()))
            }
            (Flavour::Sglang, _) => {
                let body = json!({"model": model, "prompt": prompt.text()?, "add_special_tokens": true});
                ("/v1/tokenize", self.call(Method::POST, "/v1/tokenize", Some(&body), authorization, deadline)?)
            }
        };
        let (path, answer) = answer;
        let ids: Option<Arc<[u32]>> = match answer.get("tokens").and_then(Value::as_array) {
            Some(list) => Some(
                list.iter()
                    .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| shape(path, "`tokens` holds something other than token ids"))?
                    .into(),
            ),
            None => None,
        };
        let count = match (answer.get("count").and_then(Value::as_u64), &ids) {
            (Some(n), _) => n,
            (None, Some(ids)) => ids.len() as u64,
            (None, None) => return Err(shape(path, "neither `count` nor `tokens`")),
        };
        let local = LocalTokens { prompt: count, new_messages: Vec::new(), tokenizer: flavour.method().to_string() };
        Ok(UpstreamCount { local, ids })
    }

    /// One JSON call to the upstream under the turn's deadline.
    /// A POST to `path`, answered with the path beside the answer (for error messages).
    fn post(
        &mut self,
        path: &'static str,
        body: &Value,
        authorization: Option<&HeaderValue>,
        deadline: Instant,
    ) -> Result<(&'static str, Value), CountError> {
        Ok((path, self.call(Method::POST, path, Some(body), authorization, deadline)?))
    }

    fn call(
        &mut self,
        method: Method,
        path: &'static str,
        body: Option<&Value>,
        authorization: Option<&HeaderValue>,
        deadline: Instant,
    ) -> Result<Value, CountError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CountError::Timeout { path, after: self.settings.timeout });
        }
        let uri = self.upstream.uri_for(path).map_err(|e| CountError::Transport { path, detail: e.to_string() })?;
        let mut request = http::Request::builder().method(method).uri(uri).header(header::ACCEPT, "application/json");
        // The upstream URL's own credentials win over the client's key, as on forwarded requests.
        if let Some(auth) = self.upstream.credentials.as_ref().or(authorization) {
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        let bytes = match body {
            Some(b) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(b).unwrap_or_default())
            }
            None => Bytes::new(),
        };
        let request = request.body(Full::new(bytes)).map_err(|e| CountError::Transport { path, detail: e.to_string() })?;
        if self.runtime.is_none() {
            let built = tokio::runtime::Builder::new_current_thread().enable_all().build();
            self.runtime = Some(built.map_err(|e| CountError::Transport { path, detail: format!("cannot start a runtime: {e}") })?);
        }
        self.calls += 1;
        let client = self.client.clone();
        let runtime = self.runtime.as_ref().expect("made above");
        let exchange = async move {
            let response = client.request(request).await.map_err(|e| CountError::Transport { path, detail: e.to_string() })?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| CountError::Transport { path, detail: format!("reading the answer: {e}") })?
                .to_bytes();
            Ok::<_, CountError>((status, body))
        };
        let (status, body) = runtime
            .block_on(async { tokio::time::timeout(left, exchange).await })
            .map_err(|_| CountError::Timeout { path, after: self.settings.timeout })??;
        if !(200..300).contains(&status) {
            let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
            return Err(CountError::Status { path, status, body: text });
        }
        serde_json::from_slice(&body).map_err(|e| shape(path, &format!("not JSON: {e}")))
    }

    fn remember(&mut self, key: Hash, count: UpstreamCount) {
        let tokens = count.ids.as_ref().map_or(0, |ids| ids.len());
        if self.cache.insert(key, count).is_none() {
            self.order.push_back(key);
            self.cached_tokens += tokens;
        }
        while self.order.len() > self.settings.cache_entries || self.cached_tokens > self.settings.cache_tokens {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.cache.remove(&old) {
                self.cached_tokens -= gone.ids.as_ref().map_or(0, |ids| ids.len());
            }
        }
    }
}

fn shape(path: &'static str, detail: &str) -> CountError {
    CountError::Shape { path, detail: detail.to_string() }
}

/// What the counter needs of one captured request.
pub struct Prompt<'a> {
    pub endpoint: Endpoint,
    pub model: Option<&'a str>,
    /// The parsed messages (a completions prompt is one `{"role": "prompt"}` message); their JSON
    /// is read only when the upstream is asked (a cached count or a back-off reads none).
    pub messages: &'a [Message],
    /// The chain hash over the messages.
    pub head: Hash,
    /// The hash of the request's `tools` (they render into the prompt).
    pub tools_hash: Option<&'a str>,
    /// The request body as sent (read for `tools` on a cache miss).
    pub body: &'a [u8],
}

impl Prompt<'_> {
    /// The cache key: the messages' chain hash with everything else the count depends on.
    fn key(&self, flavour: Flavour) -> Hash {
        let context =
            json!({"method": flavour.method(), "endpoint": self.endpoint.as_str(), "model": self.model, "tools": self.tools_hash});
        chain_next(&self.head, &message_hash(&context).0)
    }

    fn tools(&self) -> Option<Value> {
        self.tools_hash?;
        serde_json::from_slice::<Value>(self.body).ok().and_then(|v| v.get("tools").cloned()).filter(|t| !t.is_null())
    }

    /// A completions prompt's text.
    fn text(&self) -> Result<&str, CountError> {
        self.messages
            .first()
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .ok_or_else(|| CountError::Unsupported("a completions prompt that is not one string".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::Mutex;

    /// What the double saw: (path, Authorization) per call.
    type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

    /// A llama.cpp-shaped double on a loopback socket: `/v1/models` says `owner`, `/apply-template`
    /// joins the contents, `/tokenize` gives one id per byte of the content. `fail` answers 500 to
    /// everything; `delay` holds every answer that long.
    struct Double {
        url: String,
        seen: Seen,
        fail: Arc<std::sync::atomic::AtomicBool>,
        _thread: std::thread::JoinHandle<()>,
    }

    fn double(owner: &'static str, delay: Duration) -> Double {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Seen = Arc::default();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen2, fail2) = (seen.clone(), fail.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let (seen, fail) = (seen2.clone(), fail2.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let (seen, fail) = (seen.clone(), fail.clone());
                            async move {
                                let path = request.uri().path().to_string();
                                let auth = request.headers().get(header::AUTHORIZATION).map(|v| v.to_str().unwrap().to_string());
                                seen.lock().unwrap().push((path.clone(), auth));
                                let body: Value =
                                    serde_json::from_slice(&request.into_body().collect().await.unwrap().to_bytes()).unwrap_or(Value::Null);
                                tokio::time::sleep(delay).await;
                                let (status, answer) = if fail.load(std::sync::atomic::Ordering::SeqCst) {
                                    (500, json!({"error": "down"}))
                                } else {
                                    match path.as_str() {
                                        "/v1/models" => (200, json!({"data": [{"id": "m", "owned_by": owner}]})),
                                        "/apply-template" => {
                                            let text: String = body["messages"]
                                                .as_array()
                                                .unwrap()
                                                .iter()
                                                .map(|m| format!("<{}>{}", m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                                                .collect();
                                            (200, json!({"prompt": format!("{text}<assistant>")}))
                                        }
                                        "/tokenize" => {
                                            let ids: Vec<u32> = body["content"].as_str().unwrap_or("").bytes().map(u32::from).collect();
                                            (200, json!({"tokens": ids}))
                                        }
                                        _ => (404, json!({"error": "no route"})),
                                    }
                                };
                                let response =
                                    http::Response::builder().status(status).body(Full::new(Bytes::from(answer.to_string()))).unwrap();
                                Ok::<_, Infallible>(response)
                            }
                        });
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                    });
                }
            });
        });
        Double { url, seen, fail, _thread: thread }
    }

    fn messages(turns: usize) -> Vec<Message> {
        let mut list = vec![json!({"role": "system", "content": "be terse"})];
        for i in 0..turns {
            list.push(json!({"role": "user", "content": format!("question {i}")}));
        }
        list.into_iter().map(Message::new).collect()
    }

    fn prompt<'a>(messages: &'a [Message], body: &'a [u8]) -> Prompt<'a> {
        let mut head = ctxscope_store::ZERO_HASH;
        for m in messages {
            head = chain_next(&head, &message_hash(m).0);
        }
        Prompt { endpoint: Endpoint::ChatCompletions, model: Some("m"), messages, head, tools_hash: None, body }
    }

    fn paths(seen: &Seen) -> Vec<String> {
        seen.lock().unwrap().iter().map(|(p, _)| p.clone()).collect()
    }

    #[test]
    fn counts_with_the_engines_template_and_tokenizer_and_names_the_method() {
        let up = double("llamacpp", Duration::ZERO);
        let mut counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), CountSettings::default());
        let list = messages(1);
        let auth = HeaderValue::from_static("Bearer sk-secret");
        let count = counter.try_count(&prompt(&list, b"{}"), Some(&auth)).unwrap();
        let text = "<system>be terse<user>question 0<assistant>";
        assert_eq!(count.local.prompt, text.len() as u64);
        assert_eq!(count.ids.as_deref().unwrap(), text.bytes().map(u32::from).collect::<Vec<_>>().as_slice());
        assert_eq!(count.local.tokenizer, "upstream:llama.cpp");
        assert_eq!(counter.flavour(), Some(Flavour::LlamaCpp));
        assert_eq!(paths(&up.seen), ["/v1/models", "/apply-template", "/tokenize"]);
        // The client's key went with every call.
        assert!(up.seen.lock().unwrap().iter().all(|(_, a)| a.as_deref() == Some("Bearer sk-secret")));
    }

    #[test]
    fn an_identical_prompt_is_answered_from_the_cache_and_a_new_one_costs_two_calls() {
        let up = double("ctxscope", Duration::ZERO);
        let mut counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), CountSettings::default());
        let first = messages(1);
        let a = counter.try_count(&prompt(&first, b"{}"), None).unwrap();
        let calls = counter.calls;
        let again = counter.try_count(&prompt(&first, b"{}"), None).unwrap();
        assert_eq!(a, again);
        assert_eq!(counter.calls, calls, "an identical prompt was counted again");
        let longer = messages(2);
        let b = counter.try_count(&prompt(&longer, b"{}"), None).unwrap();
        assert!(b.local.prompt > a.local.prompt);
        assert_eq!(counter.calls, calls + 2);
        assert_eq!(b.local.tokenizer, "upstream:ctxscope");
    }

    #[test]
    fn a_failing_upstream_leaves_the_prompt_uncounted_backs_off_and_is_probed_again() {
        let up = double("llamacpp", Duration::ZERO);
        let mut counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), CountSettings::default());
        let list = messages(1);
        counter.try_count(&prompt(&list, b"{}"), None).unwrap();
        up.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let other = messages(2);
        let error = counter.try_count(&prompt(&other, b"{}"), None).unwrap_err();
        assert!(matches!(error, CountError::Status { status: 500, .. }), "{error}");
        assert_eq!(counter.flavour(), None, "a 5xx forgets the engine");
        // Within the backoff nothing is sent.
        let calls = counter.calls;
        assert!(matches!(counter.try_count(&prompt(&other, b"{}"), None), Err(CountError::BackingOff(_))));
        assert_eq!(counter.calls, calls);
        // After it, the upstream is probed again and counts resume.
        up.fail.store(false, std::sync::atomic::Ordering::SeqCst);
        counter.retry_at = Some(Instant::now());
        let count = counter.try_count(&prompt(&other, b"{}"), None).unwrap();
        assert_eq!(count.local.tokenizer, "upstream:llama.cpp");
        assert_eq!(paths(&up.seen).iter().filter(|p| *p == "/v1/models").count(), 2);
    }

    /// A count answered from the cache, or not tried while backing off, reads no message's JSON:
    /// a long conversation's old messages stay unparsed (capture cost flat with turns).
    #[test]
    fn cached_and_backed_off_counts_leave_the_messages_unparsed() {
        let unparsed = |list: &[Message]| -> Vec<Message> {
            list.iter().map(|m| Message::known(Bytes::from(m.value().to_string()), message::Facts::of(m.value()))).collect()
        };
        let up = double("llamacpp", Duration::ZERO);
        let mut counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), CountSettings::default());
        let list = messages(3);
        counter.try_count(&prompt(&list, b"{}"), None).unwrap();
        // The head is computed from parsed copies; the counter gets the unparsed ones.
        let again = unparsed(&list);
        counter.try_count(&Prompt { messages: &again, ..prompt(&list, b"{}") }, None).unwrap();
        assert!(again.iter().all(|m| !m.is_parsed()), "a cached count parsed the messages");
        up.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        counter.try_count(&prompt(&messages(4), b"{}"), None).unwrap_err();
        let five = messages(5);
        let later = unparsed(&five);
        assert!(matches!(counter.try_count(&Prompt { messages: &later, ..prompt(&five, b"{}") }, None), Err(CountError::BackingOff(_))));
        assert!(later.iter().all(|m| !m.is_parsed()), "a backed-off count parsed the messages");
        // The count that is sent reads them.
        up.fail.store(false, std::sync::atomic::Ordering::SeqCst);
        counter.retry_at = Some(Instant::now());
        counter.try_count(&Prompt { messages: &later, ..prompt(&five, b"{}") }, None).unwrap();
        assert!(later.iter().all(Message::is_parsed));
    }

    #[test]
    fn a_slow_upstream_times_out_within_the_deadline() {
        let up = double("llamacpp", Duration::from_secs(3));
        let settings = CountSettings { timeout: Duration::from_millis(300), ..CountSettings::default() };
        let mut counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), settings);
        let started = Instant::now();
        let error = counter.try_count(&prompt(&messages(1), b"{}"), None).unwrap_err();
        assert!(matches!(error, CountError::Timeout { path: "/v1/models", .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    }

    /// A captured chat exchange as the tee would hand it over.
    fn exchange(messages: &[Message], authorization: Option<&str>) -> crate::capture::exchange::Exchange {
        use crate::capture::exchange::{Captured, Exchange};
        let captured = |value: Value| {
            let mut c = Captured::default();
            c.push(&Bytes::from(value.to_string()), usize::MAX);
            c.complete = true;
            c
        };
        let request = Arc::new(Mutex::new(captured(json!({"model": "m", "messages": message::values(messages)}))));
        let mut ex = Exchange::new(Endpoint::ChatCompletions, "POST", "/v1/chat/completions", request);
        ex.status = Some(200);
        ex.response_content_type = Some("application/json".into());
        let reply = json!({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 7, "completion_tokens": 1}});
        ex.response = captured(reply);
        ex.authorization = authorization.map(|a| HeaderValue::from_str(a).unwrap());
        ex
    }

    #[test]
    fn the_pipeline_stores_upstream_counts_and_stores_the_turn_uncounted_when_the_upstream_fails() {
        use crate::capture::pipeline::Pipeline;
        let up = double("llamacpp", Duration::ZERO);
        let dir = tempfile::tempdir().unwrap();
        let store = ctxscope_store::Store::open(dir.path(), &ctxscope_store::StoreOptions::default()).unwrap();
        let counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), CountSettings::default());
        let mut pipeline = Pipeline::new(store, up.url.clone(), None, Default::default()).with_upstream_counter(counter);
        let list = messages(1);
        let turn = pipeline.capture(&exchange(&list, Some("Bearer k1"))).unwrap();
        let counted = turn.local_tokens.expect("counted by the upstream");
        assert_eq!(counted.tokenizer, "upstream:llama.cpp");
        assert_eq!(counted.prompt, "<system>be terse<user>question 0<assistant>".len() as u64);
        assert!(up.seen.lock().unwrap().iter().all(|(_, a)| a.as_deref() == Some("Bearer k1")));
        // The engine fails: the turn is still captured, uncounted.
        up.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let turn = pipeline.capture(&exchange(&messages(2), None)).unwrap();
        assert_eq!(turn.local_tokens, None);
        assert_eq!(turn.usage.and_then(|u| u.prompt_tokens), Some(7));
    }

    #[test]
    fn count_with_parses_and_local_needs_a_tokenizer() {
        use crate::config::{ConfigError, CountWith, ProxyConfig};
        assert_eq!("upstream".parse::<CountWith>(), Ok(CountWith::Upstream));
        assert!("remote".parse::<CountWith>().is_err());
        let mut config = ProxyConfig::new(Upstream::parse("http://127.0.0.1:1").unwrap());
        assert_eq!(config.count_with, CountWith::Auto);
        config.count_with = CountWith::Local;
        assert!(matches!(config.validate(), Err(ConfigError::CountWithoutTokenizer)));
    }

    #[test]
    fn chat_shaped_endpoints_are_counted_as_chats_and_an_unknown_engine_is_found_by_its_endpoints() {
        let up = double("someone-else", Duration::ZERO);
        let mut counter = UpstreamCounter::new(Upstream::parse(&up.url).unwrap(), CountSettings::default());
        let list = messages(1);
        // Unknown owner: found by its /apply-template (the double has one).
        assert_eq!(counter.try_count(&prompt(&list, b"{}"), None).unwrap().local.tokenizer, "upstream:llama.cpp");
        // Anthropic's messages are parsed into chat messages: rendered by the engine's template too.
        let list = messages(2);
        let mut anthropic = prompt(&list, b"{\"a\":1}");
        anthropic.endpoint = Endpoint::AnthropicMessages;
        let before = paths(&up.seen).iter().filter(|p| p.as_str() == "/apply-template").count();
        counter.try_count(&anthropic, None).unwrap();
        let after = paths(&up.seen).iter().filter(|p| p.as_str() == "/apply-template").count();
        assert_eq!(after, before + 1, "{:?}", paths(&up.seen));
    }
}
