//! Proxy configuration: the raw form the CLI fills in, validated once into [`ProxyConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ctxscope_store::RetentionPolicy;

pub use crate::upstream::Upstream;

/// Validated configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub upstream: Upstream,
    /// Capture store directory; `None` runs without capture (pure pass-through plus metrics).
    pub data_dir: Option<PathBuf>,
    /// tokenizer.json, a directory holding one, or a GGUF file.
    pub tokenizer: Option<PathBuf>,
    /// How `tokenizer`'s model turns a conversation into prompt text (`--chat-format`): its Jinja
    /// template, a built-in encoder (DeepSeek V3.2/V4), ChatML, or detected.
    pub chat_format: ctxscope_formats::template::ChatFormatChoice,
    /// How prompts are counted: the local tokenizer, the upstream's own endpoints, or whichever is there.
    pub count_with: CountWith,
    /// Extra request header naming the conversation (besides `x-ctxscope-conversation`).
    pub session_header: Option<String>,
    /// Capture queue bound; exchanges beyond it are dropped (and counted), never waited for.
    pub queue_capacity: usize,
    /// Bodies larger than this are forwarded but not captured.
    pub max_capture_bytes: usize,
    /// Requests announcing a larger Content-Length are refused with 413. 0 disables.
    pub max_request_bytes: u64,
    pub connect_timeout: Duration,
    /// How long shutdown waits for in-flight exchanges before dropping them.
    pub shutdown_grace: Duration,
    pub retention: RetentionPolicy,
    pub retention_every: Duration,
    pub flush_every_ms: u64,
    /// sled's page cache, in bytes: what the store keeps in memory of the records it has read or written.
    pub store_cache_bytes: u64,
    /// Detector thresholds and phrase lists.
    pub detect: crate::detect::DetectConfig,
    /// Findings are also posted to this webhook when set.
    pub alert_webhook: Option<crate::alert::webhook::WebhookConfig>,
    /// Every captured turn is exported as an OTLP span (its findings as events and log records) when set.
    pub otlp: Option<crate::otlp::OtlpConfig>,
    /// Hold non-streamed responses until their capture is done (at most 5 s) and add
    /// `x-ctxscope-findings` when the turn raised findings.
    pub findings_header: bool,
    /// Answer Responses API `previous_response_id` from the capture store (`--responses-state`).
    pub responses_state: bool,
    /// How much of each turn's text is stored (`--capture full|redacted|hashes`; docs/capture.md,
    /// "Privacy levels"): also what is journaled, alerted and exported over OTLP.
    pub capture: ctxscope_store::CaptureLevel,
    /// `--admin-token`: the admin port's API and UI require it (bearer header or login cookie).
    pub admin_token: Option<String>,
    /// This process's engine (`serve`), for replays started from the UI with `engine:` targets.
    pub replay_engine: Option<String>,
    /// Launch profiles the UI may start (`--profile`); never a command typed into a browser.
    pub launch_profiles: Vec<PathBuf>,
    /// Where engines launched for UI runs keep their logs (`--launch-logs`).
    pub launch_logs: PathBuf,
    /// How often the upstream is asked what it is running (`--fingerprint-every`); `None`: never.
    pub fingerprint_every: Option<Duration>,
    /// The engine process to fingerprint when no process on this host listens on the upstream's port
    /// (`--engine-pid`); a process that does is read without it.
    pub engine_pid: Option<u32>,
    /// A client must send a complete request head within this long of connecting or of its previous
    /// response (`--header-timeout`); also how long an idle keep-alive connection stays open.
    pub header_timeout: Duration,
    /// How slowly a request body may arrive on the proxy listener (`--body-timeout`,
    /// `--body-min-rate`): past it the request is answered 408 and the upstream request dropped.
    pub body_limits: ctxscope_http::timed::BodyLimits,
    /// Proxy connections held at once (`--max-connections`); `None`: fitted to the open-file limit.
    pub max_connections: Option<usize>,
    /// `--context-limit`: the context limit turns are measured against (their composition's
    /// `limit`, `ctxscope_context_pressure`), in place of the one the engine's fingerprint gives.
    pub context_limit: Option<u64>,
}

/// `--count-with`: who counts a prompt's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountWith {
    /// The `--tokenizer` file and its chat template, in the proxy.
    Local,
    /// The upstream's own template and tokenize endpoints (llama.cpp, vLLM, SGLang, ctxscope engine).
    Upstream,
    /// Local when `--tokenizer` is given, else the upstream's endpoints when it has them, else none.
    #[default]
    Auto,
    /// No count at all: detectors use only the engine's own numbers (and say so in their evidence).
    None,
}

impl std::str::FromStr for CountWith {
    type Err = String;

    fn from_str(text: &str) -> Result<CountWith, String> {
        match text {
            "local" => Ok(CountWith::Local),
            "upstream" => Ok(CountWith::Upstream),
            "auto" => Ok(CountWith::Auto),
            "none" => Ok(CountWith::None),
            other => Err(format!("{other:?} is not a counting method; use local, upstream, auto or none")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Upstream(#[from] crate::upstream::UpstreamError),
    #[error("--session-header {0:?} is not a valid header name")]
    HeaderName(String),
    #[error("--tokenizer {0}: file not found")]
    Tokenizer(PathBuf),
    #[error("--count-with local needs --tokenizer (or use --count-with upstream or auto)")]
    CountWithoutTokenizer,
    #[error("--responses-state keeps conversation state in the capture store: it cannot be used with --no-capture")]
    StateWithoutStore,
    #[error(
        "--responses-state sends the upstream the stored text of a previous_response_id chain, and --capture {0} does not store it whole: use --capture full with --responses-state"
    )]
    StateWithoutText(ctxscope_store::CaptureLevel),
    #[error(transparent)]
    Webhook(#[from] crate::alert::webhook::WebhookError),
    #[error(transparent)]
    Otlp(#[from] crate::otlp::OtlpError),
}

impl ProxyConfig {
    /// Defaults for everything but the upstream.
    pub fn new(upstream: Upstream) -> ProxyConfig {
        ProxyConfig {
            upstream,
            data_dir: None,
            tokenizer: None,
            chat_format: ctxscope_formats::template::ChatFormatChoice::Auto,
            count_with: CountWith::Auto,
            session_header: None,
            queue_capacity: 4096,
            max_capture_bytes: 32 << 20,
            max_request_bytes: 256 << 20,
            connect_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            retention: RetentionPolicy::default(),
            retention_every: Duration::from_secs(600),
            flush_every_ms: 500,
            store_cache_bytes: ctxscope_store::StoreOptions::default().cache_bytes,
            detect: crate::detect::DetectConfig::default(),
            alert_webhook: None,
            otlp: None,
            findings_header: false,
            responses_state: false,
            capture: ctxscope_store::CaptureLevel::Full,
            admin_token: None,
            replay_engine: None,
            launch_profiles: Vec::new(),
            launch_logs: PathBuf::from("ctxscope-launches"),
            fingerprint_every: Some(Duration::from_secs(60)),
            engine_pid: None,
            header_timeout: Duration::from_secs(30),
            body_limits: ctxscope_http::timed::BodyLimits::default(),
            max_connections: None,
            context_limit: None,
        }
    }

    /// Checks what can be checked before serving.
    pub fn validate(self) -> Result<ProxyConfig, ConfigError> {
        if let Some(name) = &self.session_header {
            http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| ConfigError::HeaderName(name.clone()))?;
        }
        if let Some(webhook) = &self.alert_webhook {
            webhook.validate()?;
        }
        if let Some(otlp) = &self.otlp {
            otlp.validate()?;
        }
        if self.count_with == CountWith::Local && self.tokenizer.is_none() {
            return Err(ConfigError::CountWithoutTokenizer);
        }
        if self.responses_state && self.data_dir.is_none() {
            return Err(ConfigError::StateWithoutStore);
        }
        if self.responses_state && self.capture != ctxscope_store::CaptureLevel::Full {
            return Err(ConfigError::StateWithoutText(self.capture));
        }
        if let Some(path) = &self.tokenizer {
            if !path.exists() {
                return Err(ConfigError::Tokenizer(path.clone()));
            }
        }
        Ok(self)
    }
}

/// Where the proxy and its admin API listen.
#[derive(Debug, Clone, Copy)]
pub struct Listen {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
}
