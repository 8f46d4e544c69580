//! ctxscope's capture proxy: a transparent HTTP proxy in front of an OpenAI- or Anthropic-compatible
//! engine that streams every byte through unchanged and, off the hot path, records each LLM exchange
//! into the sled store as a threaded, token-counted turn. Metrics and a JSON API live on the admin port.
//!
//! The stack, outermost first: box the body -> [`capture::layer::Capture`] (tee) -> [`forward::Forward`].

pub mod admin;
pub mod alert;
pub mod body;
pub mod capture;
pub mod config;
pub mod credentials;
pub mod detect;
pub mod fingerprint;
pub mod forward;
pub mod health;
pub mod metrics;
pub mod otlp;
pub mod parse;
pub mod privacy;
pub mod responses_state;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;

use ctxscope_http::timed::TimedBody;
use ctxscope_store::{Store, StoreOptions};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;

use capture::layer::{CaptureLayer, CaptureSettings};
use capture::pipeline::Pipeline;
use capture::queue::{self, CaptureSender, Worker};
use capture::tokens::TokenCache;
use capture::upstream_count::{CountSettings, UpstreamCounter};
pub use config::{ConfigError, ProxyConfig, Upstream};

/// Errors that stop the proxy from starting.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot load tokenizer {path}: {source}")]
    Tokenizer { path: std::path::PathBuf, source: ctxscope_formats::CounterError },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Runs the proxy on `proxy` and the admin API on `admin` until `shutdown` resolves.
pub async fn run(config: ProxyConfig, proxy: TcpListener, admin: TcpListener, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let config = config.validate()?;
    let nofile = ctxscope_http::raise_nofile();
    let proxy_limits = ctxscope_http::ConnLimits::proxy(config.header_timeout, config.max_connections, nofile);
    let admin_limits = ctxscope_http::ConnLimits::admin(config.header_timeout, nofile);
    let handle = metrics::install();
    detect::register_series();
    let webhook = match &config.alert_webhook {
        Some(c) => Some(alert::webhook::WebhookSink::start(c.clone(), tokio::runtime::Handle::current()).map_err(ConfigError::from)?),
        None => None,
    };
    let local = match config.count_with {
        config::CountWith::Upstream => {
            if let Some(path) = &config.tokenizer {
                tracing::warn!(tokenizer = %path.display(), "--count-with upstream: --tokenizer is not used for counting");
            }
            None
        }
        config::CountWith::Local | config::CountWith::Auto => config.tokenizer.as_ref(),
        config::CountWith::None => None,
    };
    let tokens = match local {
        Some(path) => {
            let path = path.clone();
            let format = config.chat_format;
            let loaded =
                tokio::task::spawn_blocking(move || TokenCache::open_with(&path, format).map_err(|source| Box::new((path, source))))
                    .await
                    .expect("tokenizer loading does not panic");
            Some(loaded.map_err(|failed| {
                let (path, source) = *failed;
                RunError::Tokenizer { path, source }
            })?)
        }
        None => None,
    };
    let (store, capture_status) = open_store(&config);
    let mut sinks: Vec<Box<dyn alert::AlertSink>> = webhook.iter().map(|w| Box::new(w.clone()) as Box<dyn alert::AlertSink>).collect();
    let otlp = match &config.otlp {
        Some(c) => {
            match (c.content, config.capture) {
                (true, ctxscope_store::CaptureLevel::Hashes) => tracing::warn!(
                    "--otlp-content with --capture hashes: no message content is exported (spans carry hashes, counts and timings only)"
                ),
                (true, ctxscope_store::CaptureLevel::Redacted) => {
                    tracing::info!("--otlp-content with --capture redacted: exported content is masked as it is stored")
                }
                _ => {}
            }
            let instance = otlp::default_instance_id(proxy.local_addr().map_or(0, |a| a.port()));
            let exporter =
                otlp::OtlpExporter::start(c, &config.upstream, instance, &tokio::runtime::Handle::current()).map_err(ConfigError::from)?;
            sinks.push(Box::new(exporter.sink()));
            Some(exporter)
        }
        None => None,
    };
    let counts_upstream = tokens.is_none() && config.count_with != config::CountWith::None;
    let upstream_counter = counts_upstream.then(|| UpstreamCounter::new(config.upstream.clone(), CountSettings::default()));
    let fingerprints = match (&store, config.fingerprint_every) {
        (Some(store), Some(every)) => {
            let settings = fingerprint::FingerprintSettings { every, engine_pid: config.engine_pid, ..Default::default() };
            Some(fingerprint::spawn(config.upstream.clone(), store.clone(), settings))
        }
        _ => None,
    };
    let health = Arc::new(health::CaptureHealth::new(capture_status.clone()));
    if let Some(store) = &store {
        match store.damage() {
            Ok(Some(damage)) => health.damaged(damage),
            Ok(None) => {}
            Err(error) => health.damaged(format!("cannot check the store: {error}")),
        }
    }
    let (sender, worker) = start_capture(&config, store.clone(), tokens, upstream_counter, sinks, fingerprints, health.clone());

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let state_layer = responses_state::ResponsesStateLayer::new(config.responses_state, store.clone());
    let admin_state = Arc::new(admin::AdminState {
        metrics: handle,
        store,
        capture: capture_status,
        health,
        upstream: config.upstream.display.clone(),
        token: config.admin_token.clone(),
        live: admin::ui::live::Live::new(stop_rx.clone()),
        launcher: admin::ui::launch::Launcher::new(
            config.replay_engine.clone(),
            config.launch_profiles.clone(),
            config.launch_logs.clone(),
        ),
    });
    let settings = CaptureSettings {
        session_header: config.session_header.as_deref().and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
        max_capture_bytes: config.max_capture_bytes,
        max_request_bytes: config.max_request_bytes,
        findings_header: config.findings_header.then_some(std::time::Duration::from_secs(5)),
    };
    // Box the incoming body, tee LLM exchanges into capture, expand Responses chains (with
    // --responses-state), forward to the upstream.
    let forward = forward::Forward::new(config.upstream.clone(), config.connect_timeout);
    let body_limits = config.body_limits;
    let proxy_service = ServiceBuilder::new()
        .map_request(move |request: http::Request<Incoming>| request.map(|b| TimedBody::new(b, body_limits).boxed_unsync()))
        .service(stack(settings, sender, state_layer, forward));
    let admin_service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        admin::handle(admin_state.clone(), request.map(|b| TimedBody::new(b, body_limits)))
    });

    tracing::info!(proxy = ?proxy.local_addr().ok(), admin = ?admin.local_addr().ok(), upstream = %config.upstream.display, max_connections = proxy_limits.max_connections, open_files = nofile, "ctxscope proxy serving");
    let proxy_task = tokio::spawn(ctxscope_http::serve(
        proxy,
        TowerToHyperService::new(proxy_service),
        stop_rx.clone(),
        config.shutdown_grace,
        proxy_limits,
    ));
    let admin_task = tokio::spawn(ctxscope_http::serve(admin, admin_service, stop_rx, config.shutdown_grace, admin_limits));
    shutdown.await;
    tracing::info!("shutting down: finishing in-flight exchanges");
    let _ = stop_tx.send(true);
    let _ = proxy_task.await;
    let _ = admin_task.await;
    if let Some(worker) = worker {
        let grace = config.shutdown_grace;
        let drained = tokio::task::spawn_blocking(move || worker.join(grace)).await.unwrap_or(false);
        if !drained {
            tracing::warn!("capture queue not drained within the grace period");
        }
    }
    if let Some(webhook) = &webhook {
        if !webhook.flush(config.shutdown_grace).await {
            tracing::warn!("alert webhook queue not drained within the grace period");
        }
    }
    if let Some(otlp) = otlp {
        otlp.shutdown(config.shutdown_grace).await;
    }
    Ok(())
}

/// The proxy's request path over `upstream`: each LLM exchange teed into `capture` (and refused when
/// it announces more than the limit), then Responses chains expanded with `state`. [`run`] puts it
/// over [`forward::Forward`]; tests can put it over any service, with no socket.
pub fn stack<S>(
    settings: CaptureSettings,
    capture: CaptureSender,
    state: responses_state::ResponsesStateLayer,
    upstream: S,
) -> capture::layer::Capture<responses_state::ResponsesState<S>>
where
    S: tower::Service<http::Request<body::ProxyBody>, Response = http::Response<body::ProxyBody>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    use tower::Layer;
    CaptureLayer::new(settings, capture).layer(state.layer(upstream))
}

/// Opens the store, or explains why capture is off; the proxy serves either way.
fn open_store(config: &ProxyConfig) -> (Option<Store>, String) {
    let Some(dir) = &config.data_dir else { return (None, "off".into()) };
    if let Err(error) = std::fs::create_dir_all(dir) {
        tracing::error!(dir = %dir.display(), %error, "cannot create data directory; capture unavailable, traffic still flows");
        return (None, format!("unavailable: cannot create {}: {error}", dir.display()));
    }
    let options = StoreOptions { flush_every_ms: config.flush_every_ms, cache_bytes: config.store_cache_bytes };
    let opened = match Store::open(dir, &options) {
        // sled cannot open its own files: a new sled there, filled from the record journal (the
        // damaged files are kept aside, and the start logged).
        Err(ctxscope_store::StoreError::Corrupt { detail, .. }) => {
            tracing::error!(%detail, "capture store damaged past sled's recovery; rebuilding it from the record journal");
            Store::rebuild(dir, &options).map(|(store, _)| store)
        }
        opened => opened,
    };
    match opened {
        Ok(store) => (Some(store), "on".into()),
        Err(error) => {
            tracing::error!(%error, "capture store unavailable; traffic still flows uncaptured");
            (None, format!("unavailable: {error}"))
        }
    }
}

fn start_capture(
    config: &ProxyConfig,
    store: Option<Store>,
    tokens: Option<TokenCache>,
    upstream_counter: Option<UpstreamCounter>,
    sinks: Vec<Box<dyn alert::AlertSink>>,
    fingerprints: Option<fingerprint::Fingerprints>,
    health: Arc<health::CaptureHealth>,
) -> (CaptureSender, Option<Worker>) {
    match (store, &config.data_dir) {
        (Some(store), _) => {
            let mut pipeline = Pipeline::new(store, config.upstream.display.clone(), tokens, config.retention.clone())
                .with_detect_config(config.detect.clone())
                .with_capture(config.capture)
                .with_health(health);
            for sink in sinks {
                pipeline = pipeline.with_sink(sink);
            }
            if let Some(counter) = upstream_counter {
                pipeline = pipeline.with_upstream_counter(counter);
            }
            if let Some(fingerprints) = fingerprints {
                pipeline = pipeline.with_fingerprints(fingerprints);
            }
            if let Some(tokens) = config.context_limit {
                pipeline = pipeline.with_context_limit(tokens);
            }
            let (sender, worker) = queue::spawn(pipeline, config.queue_capacity, config.retention_every);
            (sender, Some(worker))
        }
        (None, Some(_)) => (CaptureSender::unavailable(metrics::DropReason::StoreUnavailable), None),
        (None, None) => (CaptureSender::off(), None),
    }
}
