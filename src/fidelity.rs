//! `ctxscope fidelity`: a context-fidelity sweep. Generates conversations with planted facts (see
//! `ctxscope_replay::fidelity`), starts this engine in-process when a target needs it, asks every
//! target, and prints recall per target x length x depth x turn count beside golden's, as a table,
//! JSON or an HTML chart; `--save` keeps the generated conversations with their probes.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{write_file, CliError, LengthsError};

use ctxscope_replay::fidelity::{self, report, SweepOptions};
use ctxscope_replay::{Endpoints, TargetKind, TargetSpec};

use ctxscope_replay::job::Suspects;

use crate::serve::{EngineSettings, InProcessEngine};

/// Flags of `ctxscope fidelity`.
#[derive(clap::Args)]
pub struct FidelityArgs {
    /// A target, as for `ctxscope replay` (`engine:patches=kv_fp8`, `url=http://HOST:PORT`). Repeatable.
    #[arg(long = "target", value_name = "SPEC")]
    pub targets: Vec<String>,
    /// The reference target [default: engine; with --profile: the profile without toggles].
    #[arg(long)]
    pub golden: Option<String>,
    /// Conversation sizes in tokens, comma-separated (`512,1k,2k`).
    #[arg(long, default_value = "512,1k,2k")]
    pub lengths: String,
    /// User/assistant exchanges per conversation, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub turns: Vec<u32>,
    /// Where facts are planted, 0 (first turn) to 1 (last turn), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,1")]
    pub depths: Vec<f64>,
    /// Seed of the generated conversations (and of the requests).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Generated tokens per answer.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u64,
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// The in-process engine's model (a known name, a GGUF file or a checkpoint directory).
    #[arg(long, default_value = crate::models::DEFAULT_MODEL)]
    pub model: String,
    /// The in-process engine's context length (default: the model's).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Bisect by fidelity instead: the smallest subset of these patches (comma-separated) whose sweep
    /// loses more than --threshold of golden's recall (ddmin, as `ctxscope bisect`); with --profile,
    /// give no patches: the suspects are --toggles.
    #[arg(long, value_name = "PATCHES", num_args = 0..=1, default_missing_value = "")]
    pub bisect: Option<String>,
    /// With --bisect: a launch profile (TOML) whose --toggles are bisected on the engine it starts.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// With --bisect --profile: the profile's toggles to bisect over, comma-separated.
    #[arg(long, value_name = "LIST")]
    pub toggles: Option<String>,
    /// Where engines started from launch profiles keep their stdout/stderr.
    #[arg(long, value_name = "DIR", default_value = "ctxscope-launches")]
    pub launch_logs: PathBuf,
    /// Share of golden's recall a subset must lose to count as diverging (with --bisect).
    #[arg(long, default_value_t = 0.2)]
    pub threshold: f64,
    #[arg(long)]
    pub json: bool,
    /// Also write the report as one HTML file with a recall chart.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Write each generated conversation into DIR as `ctxscope export` JSONL (`ctxscope import` it, then
    /// `ctxscope replay ID --probes FILE`) with its probes beside it (`*.probes.json`, `after_turn`
    /// counted from 0 as `ctxscope show` prints turns).
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,
}

impl FidelityArgs {
    /// The flags as `ctxscope fidelity` alone would set them (every default).
    pub fn defaults() -> Result<FidelityArgs, CliError> {
        #[derive(clap::Parser)]
        struct Bare {
            #[command(flatten)]
            args: FidelityArgs,
        }
        <Bare as clap::Parser>::try_parse_from(["fidelity"]).map(|b| b.args).map_err(|e| CliError::Defaults(e.to_string()))
    }
}

/// `512`, `1k`, `2K`, `1.5k` -> tokens.
pub fn parse_lengths(text: &str) -> Result<Vec<usize>, LengthsError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (number, scale) = match item.strip_suffix(['k', 'K']) {
                Some(n) => (n, 1024.0),
                None => (item, 1.0),
            };
            match number.parse::<f64>() {
                Ok(n) if n > 0.0 && n.is_finite() => Ok((n * scale).round() as usize),
                _ => Err(LengthsError(item.to_string())),
            }
        })
        .collect()
}

pub async fn run(args: FidelityArgs) -> Result<(), CliError> {
    let suspects = match &args.bisect {
        Some(patches) => {
            let patches = Some(patches.as_str()).filter(|p| !p.trim().is_empty());
            Some(Suspects::from_flags(patches, args.profile.as_deref(), args.toggles.as_deref())?)
        }
        None if args.profile.is_some() || args.toggles.is_some() => {
            return Err(CliError::Usage("--profile and --toggles go with --bisect (for one configuration, use --target launch=FILE)"))
        }
        None => None,
    };
    let default_golden = suspects.as_ref().map_or_else(|| "engine".to_string(), Suspects::default_golden);
    let golden = args.golden.clone().unwrap_or(default_golden);
    let golden = TargetSpec::parse(&golden).map_err(|source| CliError::Target { flag: "--golden", source })?;
    let targets = args
        .targets
        .iter()
        .map(|t| TargetSpec::parse(t).map_err(|source| CliError::Target { flag: "--target", source }))
        .collect::<Result<Vec<_>, _>>()?;
    if args.depths.iter().any(|d| !(0.0..=1.0).contains(d)) {
        return Err(CliError::Flag { flag: "--depths", value: format!("{:?}", args.depths), expected: "between 0 and 1" });
    }
    let options = SweepOptions {
        seed: args.seed,
        lengths: parse_lengths(&args.lengths)?,
        turns: args.turns.clone(),
        depths: args.depths.clone(),
        max_tokens: args.max_tokens,
        timeout: Duration::from_secs(args.timeout_s),
    };
    let needs_engine = std::iter::once(&golden).chain(&targets).any(|t| matches!(&t.kind, TargetKind::Engine { url: None, .. }));
    let engine = if needs_engine {
        let settings = EngineSettings {
            model: args.model.clone(),
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            ctx: args.ctx,
            path: ctxscope_engine::Path::Golden,
            patches: ctxscope_engine::PatchSet::default(),
            max_batch: 16,
            device: ctxscope_engine::BackendKind::Cpu,
            responses_store: None,
        };
        eprintln!("starting the engine in-process ({})", settings.model);
        Some(InProcessEngine::start(&settings).await?)
    } else {
        None
    };
    let progress = |cell: &fidelity::Cell| {
        eprintln!(
            "{:<24} length {:>6} turns {:>3} depth {:.2}: recall {:.2} (golden {:.2})",
            cell.target, cell.length, cell.turns, cell.depth, cell.recall, cell.golden
        );
    };
    let mut endpoints = Endpoints::engine(engine.as_ref().map(|e| e.url.clone()));
    endpoints.launch_dir = Some(args.launch_logs.clone());
    let _interrupt = kill_launches_on_ctrl_c();
    if let Some(suspects) = &suspects {
        let template = suspects.template();
        let result = fidelity::bisect::bisect(&golden, &template, suspects.names(), &endpoints, &options, args.threshold).await;
        if let Some(engine) = engine {
            engine.stop().await;
        }
        let (golden_report, found) = result?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"golden": golden_report, "bisect": found}))?);
        } else {
            for step in &found.steps {
                let mark = if step.diverges { "diverges" } else { "ok" };
                println!(
                    "{:<40} recall lost {:.2}  {mark}{}",
                    step.patches.join("+"),
                    step.score,
                    if step.reused { " (reused)" } else { "" }
                );
            }
            let culprit = if found.culprit.is_empty() { "none".to_string() } else { found.culprit.join("+") };
            println!("culprit: {culprit} ({} sweeps run, {} to test each patch alone)", found.replays_run, found.naive_replays);
            print!("{}", report::launches(&golden_report.launches));
        }
        return Ok(());
    }
    let result = fidelity::sweep(&golden, &targets, &endpoints, &options, &progress).await;
    if let Some(engine) = engine {
        engine.stop().await;
    }
    let report = result?;
    if let Some(dir) = &args.save {
        save(dir, &report.conversations)?;
    }
    if let Some(path) = &args.html {
        write_file(path, report::html(&report))?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        print!("{}", report::json(&report));
    } else {
        print!("{}", report::table(&report));
    }
    Ok(())
}

/// A fidelity sweep has no graceful stop: Ctrl-C kills every launched engine and exits.
fn kill_launches_on_ctrl_c() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted: stopping launched engines and exiting");
            ctxscope_replay::launch::kill_all();
            std::process::exit(130);
        }
    })
}

/// Writes every conversation as export JSONL and its probes beside it.
fn save(dir: &std::path::Path, conversations: &[fidelity::SweepConversation]) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|source| CliError::Io { what: "create", path: dir.to_path_buf(), source })?;
    for conv in conversations {
        let stem = format!("fidelity-s{}-l{}-t{}-d{}", conv.seed, conv.length, conv.turns, conv.depth);
        write_file(&dir.join(format!("{stem}.jsonl")), fidelity::export::export_jsonl(conv))?;
        let probes = serde_json::to_string_pretty(&fidelity::export::replay_probes(conv))?;
        write_file(&dir.join(format!("{stem}.probes.json")), probes)?;
    }
    eprintln!(
        "wrote {} conversations to {} (ctxscope import FILE.jsonl; ctxscope replay ID --probes FILE.probes.json)",
        conversations.len(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn lengths_take_k_suffixes() {
        assert_eq!(super::parse_lengths("512,1k,2K,1.5k").unwrap(), vec![512, 1024, 2048, 1536]);
        assert!(super::parse_lengths("12q").is_err());
    }
}
