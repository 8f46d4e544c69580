//! `ctxscope store check [--repair]`: every record's checksum and every index against its records,
//! printed as what is damaged and what is kept. Without `--repair` the directory is not modified (the
//! check reads a private copy); with it, the damage is removed in place. Exit status: 0 when the store
//! is whole (after the repair, with `--repair`), 1 when damage is found and left.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use ctxscope_store::{CheckReport, Fate, ProblemKind, Store, StoreError, StoreOptions};

#[derive(Args)]
pub struct CheckArgs {
    /// Remove damaged records and index entries naming what is gone; put back from the record
    /// journal every turn and finding sled lacks (a new sled when sled cannot open its files); cut
    /// conversations back to the turns that still resolve (noted on their last kept turn) and record
    /// what neither copy holds as a loss; rebuild damaged conversation records from their turns.
    /// Stop the proxy first.
    #[arg(long)]
    repair: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Store directory.
    #[arg(long, default_value = "./ctxscope-data")]
    data: PathBuf,
}

/// Why `store check` did not pass.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("no capture store at {} (pass --data DIR)", .0.display())]
    NoStore(PathBuf),
    #[error("{} is in use by a running ctxscope process (or cannot be opened: {source}); stop the process, then check", dir.display())]
    InUse { dir: PathBuf, source: StoreError },
    #[error("{}: {source}", dir.display())]
    Store { dir: PathBuf, source: StoreError },
    #[error("repair of {} failed: {source}", dir.display())]
    Repair { dir: PathBuf, source: StoreError },
    #[error("{}: damage left that repair cannot remove, or losses not yet acknowledged (see above; `ctxscope store ack --data DIR` once dealt with)", .0.display())]
    DamageLeft(PathBuf),
    #[error("{}: damage found; nothing was changed. `ctxscope store check --repair --data {}` removes it (stop the proxy first)", .0.display(), .0.display())]
    Damaged(PathBuf),
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
}

pub fn run(args: &CheckArgs) -> Result<(), CheckError> {
    let dir = &args.data;
    if !dir.join("db").exists() {
        return Err(CheckError::NoStore(dir.clone()));
    }
    let failed = |source| CheckError::Store { dir: dir.clone(), source };
    let (report, after) = if args.repair {
        let store = match Store::open_unrecovered(dir, &StoreOptions::default()) {
            // sled cannot open its own files: a new sled, filled from the record journal.
            Err(StoreError::Corrupt { detail, .. }) => {
                let (store, aside) =
                    Store::rebuild(dir, &StoreOptions::default()).map_err(|source| CheckError::Repair { dir: dir.clone(), source })?;
                println!(
                    "sled could not open its files ({detail}); rebuilt the store from its record journal, the damaged files kept in {}",
                    aside.display()
                );
                store
            }
            opened => opened.map_err(|e| refusal(dir, e))?,
        };
        let report = store.check().map_err(failed)?;
        if report.is_clean() {
            (report, None)
        } else {
            let report = store.repair(report).map_err(|source| CheckError::Repair { dir: dir.clone(), source })?;
            let after = store.check().map_err(failed)?;
            (report, Some(after))
        }
    } else {
        let store = Store::open_read_only_unrecovered(dir, &StoreOptions::default()).map_err(|e| refusal(dir, e))?;
        (store.check().map_err(failed)?, None)
    };
    if args.json {
        let value = serde_json::json!({"report": report, "after_repair": after});
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render(dir, &report));
        if let Some(after) = &after {
            let left: Vec<String> = after.problems.iter().map(|p| format!("{}/{}", p.tree, p.key)).collect();
            match left.is_empty() {
                true => println!("checked again after the repair: no damage"),
                false => println!("checked again after the repair: still damaged: {}", left.join(", ")),
            }
        }
    }
    match (report.is_clean(), &after) {
        (true, _) => Ok(()),
        (false, Some(after)) if after.is_clean() => Ok(()),
        (false, Some(_)) => Err(CheckError::DamageLeft(dir.clone())),
        (false, None) => Err(CheckError::Damaged(dir.clone())),
    }
}

/// Why a store could not be opened for checking, with what to do.
fn refusal(dir: &Path, error: StoreError) -> CheckError {
    match error {
        StoreError::Locked { .. } | StoreError::Open { .. } => CheckError::InUse { dir: dir.to_path_buf(), source: error },
        other => CheckError::Store { dir: dir.to_path_buf(), source: other },
    }
}

fn render(dir: &Path, report: &CheckReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "store {}", dir.display());
    let read: Vec<String> = report.records.iter().map(|(tree, n)| format!("{n} {tree}")).collect();
    let _ = writeln!(out, "read: {}", read.join(", "));
    if report.problems.is_empty() {
        let _ = writeln!(out, "no damage");
    } else {
        let _ = writeln!(out, "damage ({}):", report.problems.len());
        for p in &report.problems {
            let fix = if p.repairable { "" } else { " [repair cannot fix this]" };
            let place = if p.key.is_empty() { p.tree.clone() } else { format!("{}/{}", p.tree, p.key) };
            let _ = writeln!(out, "  {:<12}  {place}: {}{fix}", p.kind.as_str(), p.detail);
        }
    }
    let _ = writeln!(
        out,
        "kept: {} of {} conversations whole, {} of {} turns",
        report.conversations_whole, report.conversations_total, report.turns_kept, report.turns_total
    );
    for c in &report.conversations {
        let what = match c.fate {
            Fate::Cut => format!("cut back: {} turn(s) kept, {} removed", c.turns_kept, c.turns_removed),
            Fate::Rebuilt => format!("record rebuilt from its {} turn(s)", c.turns_kept),
            Fate::Lost => format!("lost: no turn of it is left ({} removed)", c.turns_removed),
        };
        let _ = writeln!(out, "  conversation {}: {what}", c.id);
    }
    let journal = &report.journal;
    let _ = writeln!(
        out,
        "journal: {} record(s) in {} segment(s), {} damaged byte(s)",
        journal.records, journal.segments, journal.damaged_bytes
    );
    if report.repaired {
        let _ = writeln!(
            out,
            "repaired: put back from the journal {} turn(s) and {} finding(s)",
            report.restored_turns, report.restored_findings
        );
        let _ = writeln!(
            out,
            "repaired: {} record(s) and index entries removed, {} written (moved conversations, their indexes and notes)",
            report.removed, report.written
        );
        if report.problems.iter().any(|p| p.kind == ProblemKind::Lost) {
            let _ = writeln!(out, "repaired: id counters raised past the lost ids (they are never handed out again)");
        }
    }
    out
}
