//! Asks the upstream what it is: `GET /v1/models` first (its `owned_by` names most engines), then the
//! engine's own self-description: llama.cpp `GET /props`, this project's engine `GET /props`, vLLM
//! `GET /version`, SGLang `GET /server_info` (older releases: `/get_server_info`) and
//! `/get_model_info`, Ollama `GET /api/version`, `GET /api/ps` and `POST /api/show` per loaded model.
//! Every call is bounded in time and size; an endpoint that does not answer is skipped.

use std::time::Duration;

use bytes::Bytes;
use ctxscope_store::Fingerprint;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use serde_json::{json, Value};

use super::flatten::flatten;
use crate::upstream::Upstream;

/// Largest answer read from one endpoint.
const MAX_ANSWER: usize = 1 << 20;
/// Sent with every probe, so that upstream logs (and test doubles) can tell probes from traffic.
pub const USER_AGENT: &str = "ctxscope-fingerprint";
/// Loaded Ollama models described.
const OLLAMA_MODELS: usize = 4;

/// Why one probe call gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{method} {path}: no answer within {after:?}")]
    Timeout { method: Method, path: &'static str, after: Duration },
    #[error("{method} {path}: {detail}")]
    Transport { method: Method, path: &'static str, detail: String },
    #[error("{method} {path}: HTTP {status}")]
    Status { method: Method, path: &'static str, status: u16 },
    #[error("{method} {path}: the answer is not JSON ({detail})")]
    Shape { method: Method, path: &'static str, detail: String },
    #[error("the upstream answered none of the self-description endpoints (last: {0})")]
    Nothing(Box<ProbeError>),
    /// The upstream answered, but the process listening for it exited before it was read (a restart).
    #[error("the engine process {pid} exited during the probe")]
    Exited { pid: u32 },
}

impl ProbeError {
    /// The upstream is up but describes itself on none of the endpoints (each answered 4xx or not
    /// JSON), as opposed to not answering at all (down, loading, timing out).
    pub fn undescribed(&self) -> bool {
        match self {
            ProbeError::Nothing(last) => matches!(**last, ProbeError::Status { status: 400..=499, .. } | ProbeError::Shape { .. }),
            _ => false,
        }
    }
}

/// One upstream's HTTP client for probes.
pub struct Prober {
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: Upstream,
    timeout: Duration,
}

impl Prober {
    pub fn new(upstream: Upstream, timeout: Duration) -> Prober {
        let client = ctxscope_http::client::client(timeout);
        Prober { client, upstream, timeout }
    }

    async fn call(&self, method: Method, path: &'static str, body: Option<Value>) -> Result<Value, ProbeError> {
        let transport = |detail: String| ProbeError::Transport { method: method.clone(), path, detail };
        let uri = self.upstream.uri_for(path).map_err(|e| transport(e.to_string()))?;
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, USER_AGENT);
        if let Some(credentials) = &self.upstream.credentials {
            builder = builder.header(header::AUTHORIZATION, credentials.clone());
        }
        let bytes = match body {
            Some(body) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = builder.body(Full::new(bytes)).map_err(|e| transport(e.to_string()))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| transport(crate::forward::describe_error(&e)))?;
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                return Err(ProbeError::Status { method: method.clone(), path, status });
            }
            let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await.map_err(|e| transport(e.to_string()))?;
            serde_json::from_slice(&body.to_bytes()).map_err(|e| ProbeError::Shape { method: method.clone(), path, detail: e.to_string() })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ProbeError::Timeout { method, path, after: self.timeout }),
        }
    }

    /// Asks, and folds every answer into one fingerprint; fails only when nothing answered.
    pub async fn probe(&self) -> Result<Fingerprint, ProbeError> {
        let mut print = Fingerprint { engine: "unknown".into(), ..Fingerprint::default() };
        let mut last = None;
        let models = self.keep(&mut print, &mut last, "models", Method::GET, "/v1/models", None).await;
        let owner = models.as_ref().and_then(|m| m.pointer("/data/0/owned_by")).and_then(Value::as_str).unwrap_or("");
        let engine = match owner {
            "llamacpp" => "llama.cpp",
            "ctxscope" => "ctxscope",
            "vllm" => "vllm",
            "sglang" => "sglang",
            _ => "",
        };
        let engine = match engine {
            "" => self.identify(&mut print, &mut last).await,
            known => {
                self.describe(known, &mut print, &mut last).await;
                known
            }
        };
        print.engine = engine.to_string();
        if print.sources.is_empty() {
            return Err(ProbeError::Nothing(Box::new(last.unwrap_or(ProbeError::Status {
                method: Method::GET,
                path: "/v1/models",
                status: 0,
            }))));
        }
        Ok(print)
    }

    /// The engine's own endpoints, once it is known.
    async fn describe(&self, engine: &str, print: &mut Fingerprint, last: &mut Option<ProbeError>) {
        match engine {
            "llama.cpp" | "ctxscope" => {
                self.keep(print, last, "props", Method::GET, "/props", None).await;
            }
            "vllm" => {
                self.keep(print, last, "version", Method::GET, "/version", None).await;
            }
            "sglang" => {
                if self.keep(print, last, "server_info", Method::GET, "/server_info", None).await.is_none() {
                    self.keep(print, last, "server_info", Method::GET, "/get_server_info", None).await;
                }
                self.keep(print, last, "model_info", Method::GET, "/get_model_info", None).await;
            }
            "ollama" => self.ollama(print, last).await,
            _ => {}
        }
    }

    /// No `owned_by` to go by: try each engine's self-description in turn.
    async fn identify(&self, print: &mut Fingerprint, last: &mut Option<ProbeError>) -> &'static str {
        if let Some(props) = self.keep(print, last, "props", Method::GET, "/props", None).await {
            return if props.get("engine").and_then(Value::as_str) == Some("ctxscope") { "ctxscope" } else { "llama.cpp" };
        }
        if self.keep(print, last, "api_version", Method::GET, "/api/version", None).await.is_some() {
            self.ollama(print, last).await;
            return "ollama";
        }
        for path in ["/server_info", "/get_server_info"] {
            if self.keep(print, last, "server_info", Method::GET, path, None).await.is_some() {
                self.keep(print, last, "model_info", Method::GET, "/get_model_info", None).await;
                return "sglang";
            }
        }
        if self.keep(print, last, "version", Method::GET, "/version", None).await.is_some() {
            return "vllm";
        }
        "unknown"
    }

    async fn ollama(&self, print: &mut Fingerprint, last: &mut Option<ProbeError>) {
        let Some(ps) = self.keep(print, last, "ps", Method::GET, "/api/ps", None).await else {
            return;
        };
        let names: Vec<String> = ps
            .get("models")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("name").or_else(|| m.get("model")).and_then(Value::as_str).map(str::to_string))
            .take(OLLAMA_MODELS)
            .collect();
        for name in names {
            if let Ok(show) = self.call(Method::POST, "/api/show", Some(json!({"model": name}))).await {
                flatten(&format!("show.{name}"), &show, &mut print.fields);
                print.sources.push(format!("POST /api/show {name}"));
            }
        }
    }

    /// Calls one endpoint; an answer is flattened under `prefix` and returned, a failure remembered.
    async fn keep(
        &self,
        print: &mut Fingerprint,
        last: &mut Option<ProbeError>,
        prefix: &str,
        method: Method,
        path: &'static str,
        body: Option<Value>,
    ) -> Option<Value> {
        match self.call(method.clone(), path, body).await {
            Ok(answer) => {
                flatten(prefix, &answer, &mut print.fields);
                print.sources.push(format!("{method} {path}"));
                Some(answer)
            }
            Err(error) => {
                tracing::debug!(%error, "fingerprint probe");
                *last = Some(error);
                None
            }
        }
    }
}
