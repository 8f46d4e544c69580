//! Inspection commands (`conversations`, `show`, `findings`, `export`, `import`), written once over
//! [`Records`]: a running proxy's admin API ([`AdminApi`]) or the store directory opened directly
//! ([`LocalStore`]), chosen once from the command line ([`open`]).

mod admin;
mod records;

use std::io::Write;
use std::path::{Path, PathBuf};

use ctxscope_store::{ConversationDetail, FindingFilter};

pub use admin::AdminApi;
pub use records::{InspectError, LocalStore, Records};

use crate::render;

/// The source the flags name: the admin API when `--admin URL` is given, else the store directory.
pub fn open(admin: Option<String>, token: Option<String>, data: PathBuf) -> Box<dyn Records> {
    match admin {
        Some(url) => Box::new(AdminApi { url, token }),
        None => Box::new(LocalStore { dir: data }),
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<(), InspectError> {
    let text = serde_json::to_string_pretty(value)?;
    println!("{text}");
    Ok(())
}

pub async fn conversations(source: &dyn Records, json: bool) -> Result<(), InspectError> {
    let list = source.conversations().await?;
    if json {
        print_json(&list)?;
        return unacknowledged(source).await;
    }
    print!("{}", render::conversations(&list));
    unacknowledged(source).await
}

/// An error naming the losses no one has acknowledged (after the listing was printed), so that a
/// store that lost records never lists its survivors with a clean exit.
async fn unacknowledged(source: &dyn Records) -> Result<(), InspectError> {
    let losses = source.losses().await?;
    if losses.is_empty() {
        return Ok(());
    }
    let summary: Vec<String> = losses.iter().map(|l| format!("loss {}: {}", l.id, l.detail)).collect();
    Err(InspectError::Losses(summary.join("; ")))
}

/// `ctxscope store losses`: the losses not acknowledged (all of them with `all`).
pub async fn losses(source: &dyn Records, json: bool) -> Result<(), InspectError> {
    let list = source.losses().await?;
    if json {
        return print_json(&list);
    }
    if list.is_empty() {
        println!("no losses waiting to be acknowledged");
    }
    for loss in &list {
        let conversations: Vec<String> = loss.conversations.iter().map(u64::to_string).collect();
        let which = if conversations.is_empty() { String::new() } else { format!(" (conversations {})", conversations.join(", ")) };
        println!("loss {}: {} turn(s){which}: {}", loss.id, loss.turns, loss.detail);
    }
    Ok(())
}

/// `ctxscope store ack [ID...]`: acknowledges losses (none named: all of them).
pub async fn acknowledge(source: &dyn Records, ids: &[u64]) -> Result<(), InspectError> {
    let changed = source.acknowledge_losses(ids).await?;
    println!("acknowledged {changed} loss(es)");
    Ok(())
}

/// One conversation with its turns and messages.
pub async fn detail(source: &dyn Records, id: u64) -> Result<ConversationDetail, InspectError> {
    source.detail(id).await
}

pub async fn show(source: &dyn Records, id: u64, json: bool) -> Result<(), InspectError> {
    let detail = source.detail(id).await?;
    if json {
        // The conversation as stored, with its context report (what the model could see at each turn).
        let mut value = serde_json::to_value(&detail)?;
        value["context_report"] = serde_json::to_value(ctxscope_proxy::detect::context_report::context_report(&detail))?;
        print_json(&value)?;
        return unacknowledged(source).await;
    }
    print!("{}", render::conversation(&detail));
    unacknowledged(source).await
}

pub async fn findings(source: &dyn Records, filter: &FindingFilter, json: bool) -> Result<(), InspectError> {
    let list = source.findings(filter).await?;
    if json {
        return print_json(&list);
    }
    print!("{}", render::findings(&list));
    Ok(())
}

pub async fn export(source: &dyn Records, id: u64) -> Result<(), InspectError> {
    let bytes = source.export(id).await?;
    // The header line names the capture level; below full, say so where a person reads it too.
    let header = bytes.split(|&b| b == b'\n').next().and_then(|line| serde_json::from_slice::<serde_json::Value>(line).ok());
    match header.as_ref().and_then(|h| h.get("capture")).and_then(serde_json::Value::as_str) {
        Some("redacted") => eprintln!("conversation {id} was captured with --capture redacted: its text is masked ([redacted:KIND])"),
        Some("hashes") => eprintln!("conversation {id} was captured with --capture hashes: the export holds no message or reply text"),
        _ => {}
    }
    std::io::stdout().write_all(&bytes).map_err(InspectError::Stdout)
}

pub async fn import(source: &dyn Records, file: &Path) -> Result<(), InspectError> {
    let id = source.import(file).await?;
    println!("imported as conversation {id}");
    Ok(())
}
