//! `ctxscope replay`, `ctxscope bisect` and `ctxscope replays`: load a captured conversation, start
//! this engine in-process when a target needs it, run the replay library with a progress bar and a
//! Ctrl-C that keeps what finished, store the run, and print the table, JSON or HTML.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ctxscope_replay::job::{Job, Suspects, Work};
use ctxscope_replay::{report, Endpoints, Metric, Plan, ProbeSpec, ReplayOptions, ReplayReport, StderrProgress, TargetSpec};

use crate::error::write_file;
use crate::error::CliError;
use crate::inspect::{self, Records};
use crate::serve::{EngineSettings, InProcessEngine};

/// What every replay command shares: the run's shape and where its output goes.
pub struct RunSettings {
    pub source: Box<dyn Records>,
    /// `--golden` as given (None: the command's default).
    pub golden: Option<String>,
    /// Where launched engines' logs go.
    pub launch_logs: PathBuf,
    pub probes: Option<PathBuf>,
    pub options: ReplayOptions,
    pub engine: EngineSettings,
    pub json: bool,
    pub html: Option<PathBuf>,
}

/// `ctxscope replay CONV --target SPEC ...`.
pub async fn replay(conversation: u64, targets: &[String], resume: Option<u64>, run: RunSettings) -> Result<(), CliError> {
    let previous = match resume {
        Some(id) => Some(stored_report(&*run.source, id).await?),
        None => None,
    };
    let mut plan = plan(conversation, &run).await?;
    plan.targets = targets
        .iter()
        .map(|t| TargetSpec::parse(t).map_err(|source| CliError::Target { flag: "--target", source }))
        .collect::<Result<_, _>>()?;
    plan.id = resume.unwrap_or_else(new_id);
    run_job(Job { plan, work: Work::Replay { resume: previous.map(Box::new) } }, &run).await
}

/// `ctxscope bisect CONV --patches LIST` or `--profile FILE --toggles LIST`.
pub async fn bisect(conversation: u64, suspects: Suspects, metric: Metric, threshold: f64, mut run: RunSettings) -> Result<(), CliError> {
    run.golden = Some(run.golden.take().unwrap_or_else(|| suspects.default_golden()));
    let mut plan = plan(conversation, &run).await?;
    plan.id = new_id();
    run_job(Job::bisect(plan, suspects, metric, threshold), &run).await
}

/// Checks the job, starts this engine in-process when a target needs it, runs the job with a
/// progress bar and Ctrl-C handling, then stores and prints the report.
async fn run_job(job: Job, run: &RunSettings) -> Result<(), CliError> {
    job.check(None)?;
    let engine = if job.needs_engine() {
        eprintln!("starting the engine in-process ({})", run.engine.model);
        Some(InProcessEngine::start(&run.engine).await?)
    } else {
        None
    };
    let mut endpoints = Endpoints::engine(engine.as_ref().map(|e| e.url.clone()));
    endpoints.launch_dir = Some(run.launch_logs.clone());
    let (cancel, watch) = cancel_on_ctrl_c();
    let result = job.run(&endpoints, &StderrProgress::new(), watch).await;
    cancel.abort();
    if let Some(engine) = engine {
        engine.stop().await;
    }
    finish(result?, run).await
}

/// `ctxscope replays [ID]`: the stored runs, or one run's report.
pub async fn replays(source: &dyn Records, id: Option<u64>, json: bool, html: Option<&Path>) -> Result<(), CliError> {
    let Some(id) = id else {
        let list = source.replays().await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&list)?);
        } else {
            print!("{}", crate::render::replays(&list));
        }
        return Ok(());
    };
    let report = stored_report(source, id).await?;
    output(&report, json, html)
}

async fn plan(conversation: u64, run: &RunSettings) -> Result<Plan, CliError> {
    let detail = inspect::detail(&*run.source, conversation).await?;
    // Captured without text: refused before any engine starts; masked: said before it replays.
    ctxscope_replay::run::check_text(&detail)?;
    if let Some(note) = ctxscope_replay::conversation::masked_note(&detail) {
        eprintln!("warning: {note}");
    }
    let golden =
        TargetSpec::parse(run.golden.as_deref().unwrap_or("engine")).map_err(|source| CliError::Target { flag: "--golden", source })?;
    let mut plan = Plan::new(detail, golden);
    plan.options = run.options.clone();
    if let Some(path) = &run.probes {
        plan.probes = if path.as_os_str() == "auto" {
            let proposed = ctxscope_replay::auto_probes::propose(&ctxscope_replay::Conversation::from_detail(&plan.conversation));
            for p in &proposed {
                eprintln!("probe (auto): after turn {}: {:?} expects {:?}", p.after_turn, p.question, p.expected);
            }
            if proposed.is_empty() {
                eprintln!("note: --probes auto found no stated fact (\"my X is Y\") in the user messages");
            }
            proposed
        } else {
            read_probes(path)?
        };
    }
    let masked = ctxscope_replay::conversation::masked_note(&plan.conversation);
    for note in ctxscope_replay::Conversation::from_detail(&plan.conversation).notes.into_iter().filter(|n| Some(n) != masked.as_ref()) {
        eprintln!("note: {note}");
    }
    Ok(plan)
}

/// A JSON list of `{"after_turn": N, "question": "...", "expected": "..."}`.
fn read_probes(path: &Path) -> Result<Vec<ProbeSpec>, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Io { what: "read --probes", path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|source| CliError::Probes { path: path.to_path_buf(), source })
}

/// A watch that turns true on Ctrl-C (the replay stops launching, finishes what is in flight, stops
/// what it launched); a second Ctrl-C kills every launched engine and exits at once.
pub fn cancel_on_ctrl_c() -> (tokio::task::JoinHandle<()>, tokio::sync::watch::Receiver<bool>) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted: finishing the requests in flight, stopping launched engines, keeping what finished");
            let _ = tx.send(true);
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted again: killing launched engines and exiting");
            ctxscope_replay::launch::kill_all();
            std::process::exit(130);
        }
    });
    (task, rx)
}

/// Stores the run, then prints it.
async fn finish(report: ReplayReport, run: &RunSettings) -> Result<(), CliError> {
    let entry = report::entry(&report)?;
    match run.source.put_replay(&entry).await {
        Ok(()) => eprintln!("stored as replay {} ({})", report.id, entry.summary),
        Err(e) => eprintln!("warning: the replay could not be stored: {e}"),
    }
    output(&report, run.json, run.html.as_deref())
}

fn output(report: &ReplayReport, json: bool, html: Option<&Path>) -> Result<(), CliError> {
    if let Some(path) = html {
        write_file(path, report::html(report))?;
        eprintln!("wrote {}", path.display());
    }
    if json {
        print!("{}", report::json(report));
    } else {
        print!("{}", report::table(report));
    }
    Ok(())
}

async fn stored_report(source: &dyn Records, id: u64) -> Result<ReplayReport, CliError> {
    let entry = source.replay(id).await?;
    serde_json::from_value(entry.report).map_err(|source| CliError::StoredReport { id, source })
}

/// Replay ids are Unix milliseconds: unique per machine, ordered by time.
fn new_id() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

/// Flags of `ctxscope replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Conversation id (see `ctxscope conversations`; import an export first with `ctxscope import`).
    pub conversation: u64,
    /// A target: `engine:patches=rmsnorm_bf16,kv_fp8[,path=fast][,url=http://...][,name=N]`,
    /// `url=http://HOST:PORT[,model=NAME][,header=K:V][,name=N]` or
    /// `launch=FILE.toml[,toggles=a+b][,name=N]` (an engine started from a launch profile). Repeatable.
    #[arg(long = "target", value_name = "SPEC")]
    pub targets: Vec<String>,
    /// Continue a stored run (same id): finished turns are kept, the rest are run.
    #[arg(long, value_name = "REPLAY")]
    pub resume: Option<u64>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Flags of `ctxscope bisect`.
#[derive(clap::Args)]
pub struct BisectArgs {
    /// The captured conversation to replay (not with --metric fidelity, which generates its own).
    pub conversation: Option<u64>,
    /// The patch set to bisect, comma-separated (e.g. rmsnorm_bf16,rope_bf16,ctx_shift=256,kv_fp8).
    #[arg(long)]
    pub patches: Option<String>,
    /// A launch profile (TOML): bisect over its --toggles on the engine it starts, one configuration
    /// per launch; golden is the profile with no toggles unless --golden says otherwise.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// The profile's toggles to bisect over, comma-separated.
    #[arg(long, value_name = "LIST")]
    pub toggles: Option<String>,
    /// What counts as diverging: agreement (1 - mean token agreement with golden), probes (fraction of
    /// probes failed), exact (fraction of turns not exact), first_diff (fraction of turns that flip
    /// where golden was not nearly tied), kl (mean top-k KL from golden in nats), or fidelity (share
    /// of golden's recall lost on a `ctxscope fidelity` sweep, no conversation needed).
    #[arg(long, default_value = "agreement")]
    pub metric: BisectMetric,
    /// A subset diverges when its metric exceeds this (0..1; nats for kl).
    #[arg(long, default_value_t = 0.2)]
    pub threshold: f64,
    /// With --metric fidelity: the sweep's conversation sizes (as `ctxscope fidelity --lengths`);
    /// there `--turns` gives the exchanges per generated conversation.
    #[arg(long)]
    pub lengths: Option<String>,
    /// With --metric fidelity: where facts are planted, 0 to 1 (as `ctxscope fidelity --depths`).
    #[arg(long, value_delimiter = ',')]
    pub depths: Option<Vec<f64>>,
    /// With --metric fidelity: the sweep's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// `--metric` of `ctxscope bisect`: a replay metric over one captured conversation, or fidelity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BisectMetric {
    Replay(Metric),
    Fidelity,
}

impl std::str::FromStr for BisectMetric {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim() == "fidelity" {
            return Ok(BisectMetric::Fidelity);
        }
        text.parse().map(BisectMetric::Replay).map_err(|e: ctxscope_replay::MetricError| format!("{e}, or fidelity"))
    }
}

impl BisectArgs {
    /// Runs the bisection the metric asks for.
    pub async fn run(self) -> Result<(), CliError> {
        match (self.metric, self.conversation) {
            (BisectMetric::Replay(metric), Some(conversation)) => {
                if self.lengths.is_some() || self.depths.is_some() || self.seed.is_some() {
                    return Err(CliError::Usage("--lengths, --depths and --seed belong to --metric fidelity"));
                }
                let suspects = Suspects::from_flags(self.patches.as_deref(), self.profile.as_deref(), self.toggles.as_deref())?;
                bisect(conversation, suspects, metric, self.threshold, self.run.settings()).await
            }
            (BisectMetric::Replay(_), None) => {
                Err(CliError::Usage("bisect needs a captured conversation id (see `ctxscope conversations`), or --metric fidelity"))
            }
            (BisectMetric::Fidelity, Some(_)) => {
                Err(CliError::Usage("--metric fidelity generates its own conversations: drop the conversation id (or use --metric probes)"))
            }
            (BisectMetric::Fidelity, None) => crate::fidelity::run(self.fidelity_args()?).await,
        }
    }

    /// `ctxscope fidelity --bisect` with these flags, the sweep's own defaults where none was given.
    fn fidelity_args(self) -> Result<crate::fidelity::FidelityArgs, CliError> {
        let mut args = crate::fidelity::FidelityArgs::defaults()?;
        let run = self.run;
        if run.probes.is_some() {
            return Err(CliError::Usage("--probes does not apply to --metric fidelity: the sweep plants and asks its own"));
        }
        args.bisect = Some(self.patches.unwrap_or_default());
        args.profile = self.profile;
        args.toggles = self.toggles;
        args.launch_logs = run.launch_logs;
        args.threshold = self.threshold;
        args.golden = run.golden;
        args.model = run.model;
        args.ctx = run.ctx;
        args.json = run.json;
        args.html = run.html;
        if let Some(lengths) = self.lengths {
            args.lengths = lengths;
        }
        if let Some(depths) = self.depths {
            args.depths = depths;
        }
        if let Some(seed) = self.seed {
            args.seed = seed;
        }
        if let Some(turns) = run.turns {
            args.turns = turns;
        }
        if let Some(max_tokens) = run.max_tokens {
            args.max_tokens = max_tokens;
        }
        if let Some(timeout_s) = run.timeout_s {
            args.timeout_s = timeout_s;
        }
        Ok(args)
    }
}

/// Flags every replay run shares.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The reference target [default: engine; with --profile: the profile without toggles].
    #[arg(long)]
    pub golden: Option<String>,
    /// Where engines started from launch profiles keep their stdout/stderr (a folder per run).
    #[arg(long, value_name = "DIR", default_value = "ctxscope-launches")]
    pub launch_logs: PathBuf,
    /// Recall probes: a JSON list of {"after_turn": N, "question": "...", "expected": "..."}, turns
    /// counted from 0 as `ctxscope show` prints them; or `auto`: probes proposed from facts the user
    /// stated ("my X is Y"), asked after the last turn.
    #[arg(long, value_name = "FILE|auto")]
    pub probes: Option<PathBuf>,
    /// Generated tokens per turn (the captured max_tokens when smaller) [default: 64].
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Requests in flight per target.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Per-request timeout in seconds [default: 120].
    #[arg(long)]
    pub timeout_s: Option<u64>,
    /// Only these turns (comma-separated indexes from 0).
    #[arg(long, value_delimiter = ',')]
    pub turns: Option<Vec<u32>>,
    /// Model of the in-process engine (a known name or a GGUF path).
    #[arg(long, default_value = crate::models::DEFAULT_MODEL)]
    pub model: String,
    /// Context length of the in-process engine (default: the model's).
    #[arg(long)]
    pub ctx: Option<usize>,
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub source: crate::SourceArgs,
}

impl RunArgs {
    pub fn settings(self) -> RunSettings {
        let options = ReplayOptions {
            max_tokens: self.max_tokens.unwrap_or(64),
            concurrency: self.concurrency,
            timeout: Duration::from_secs(self.timeout_s.unwrap_or(120)),
            turns: self.turns,
            ..ReplayOptions::default()
        };
        let engine = EngineSettings {
            model: self.model,
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            ctx: self.ctx,
            path: ctxscope_engine::Path::Golden,
            patches: ctxscope_engine::PatchSet::default(),
            max_batch: 16,
            device: ctxscope_engine::BackendKind::Cpu,
            responses_store: None,
        };
        RunSettings {
            source: self.source.open(),
            golden: self.golden,
            launch_logs: self.launch_logs,
            probes: self.probes,
            options,
            engine,
            json: self.json,
            html: self.html,
        }
    }
}
