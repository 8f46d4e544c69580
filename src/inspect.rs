//! Inspection commands (`conversations`, `show`, `findings`, `export`, `import`), reading either through a running
//! proxy's admin API or by opening the store directory directly; both paths yield the same records.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use ctxscope_store::{ConversationDetail, ConversationRecord, FindingRecord, ReplayEntry, Store, StoreOptions};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::render;

/// Where records come from.
pub enum Source {
    Admin(String),
    Data(PathBuf),
}

pub async fn conversations(source: &Source, json: bool) -> Result<(), String> {
    let list: Vec<ConversationRecord> = match source {
        Source::Admin(url) => decode(&get(url, "/api/conversations").await?)?,
        Source::Data(dir) => open_read(dir)?.conversations().map_err(|e| e.to_string())?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?);
    } else {
        print!("{}", render::conversations(&list));
    }
    Ok(())
}

/// One conversation with its turns and messages.
pub async fn detail(source: &Source, id: u64) -> Result<ConversationDetail, String> {
    match source {
        Source::Admin(url) => decode(&get(url, &format!("/api/conversations/{id}")).await?),
        Source::Data(dir) => open_read(dir)?.conversation_detail(id).map_err(|e| e.to_string()),
    }
}

pub async fn show(source: &Source, id: u64, json: bool) -> Result<(), String> {
    let detail = detail(source, id).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&detail).map_err(|e| e.to_string())?);
    } else {
        print!("{}", render::conversation(&detail));
    }
    Ok(())
}

/// `query` is the admin API's query string (`kind=...&conversation=...&limit=...`).
pub async fn findings(source: &Source, query: &str, json: bool) -> Result<(), String> {
    let list: Vec<FindingRecord> = match source {
        Source::Admin(url) => decode(&get(url, &format!("/api/findings?{query}")).await?)?,
        Source::Data(dir) => {
            let filter = ctxscope_proxy::admin::finding_filter(query)?;
            open_read(dir)?.findings(&filter).map_err(|e| e.to_string())?
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?);
    } else {
        print!("{}", render::findings(&list));
    }
    Ok(())
}

pub async fn export(source: &Source, id: u64) -> Result<(), String> {
    let bytes = match source {
        Source::Admin(url) => get(url, &format!("/api/conversations/{id}/export")).await?.to_vec(),
        Source::Data(dir) => {
            let mut out = Vec::new();
            open_read(dir)?.export_conversation(id, &mut out).map_err(|e| e.to_string())?;
            out
        }
    };
    use std::io::Write;
    std::io::stdout().write_all(&bytes).map_err(|e| format!("cannot write to stdout: {e}"))
}

pub async fn import(source: &Source, file: &Path) -> Result<(), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let id = match source {
        Source::Admin(url) => {
            let body = post(url, "/api/import", bytes).await?;
            let value: serde_json::Value = decode(&body)?;
            value["conversation"].as_u64().ok_or("admin API gave no conversation id")?
        }
        Source::Data(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            open(dir)?.import_conversation(&mut bytes.as_slice()).map_err(|e| e.to_string())?
        }
    };
    println!("imported as conversation {id}");
    Ok(())
}

/// Stores a replay run (through the admin API while a proxy holds the store).
pub async fn put_replay(source: &Source, entry: &ReplayEntry) -> Result<(), String> {
    match source {
        Source::Admin(url) => post(url, "/api/replays", serde_json::to_vec(entry).map_err(|e| e.to_string())?).await.map(|_| ()),
        Source::Data(dir) => open(dir)?.put_replay(entry).map_err(|e| e.to_string()),
    }
}

/// A stored replay run with its report.
pub async fn replay_entry(source: &Source, id: u64) -> Result<ReplayEntry, String> {
    match source {
        Source::Admin(url) => decode(&get(url, &format!("/api/replays/{id}")).await?),
        Source::Data(dir) => open_read(dir)?.replay(id).map_err(|e| e.to_string())?.ok_or_else(|| format!("no replay {id}")),
    }
}

/// Stored replay runs, newest first.
pub async fn replay_entries(source: &Source) -> Result<Vec<ReplayEntry>, String> {
    match source {
        Source::Admin(url) => decode(&get(url, "/api/replays").await?),
        Source::Data(dir) => open_read(dir)?.replays().map_err(|e| e.to_string()),
    }
}

fn open(dir: &Path) -> Result<Store, String> {
    if !dir.exists() {
        return Err(format!("no capture store at {} (pass --data DIR, or --admin URL for a running proxy)", dir.display()));
    }
    Store::open(dir, &StoreOptions::default()).map_err(|e| e.to_string())
}

/// For commands that only read: a private copy, so that the directory is not modified (sled rewrites
/// what it opens).
fn open_read(dir: &Path) -> Result<ctxscope_store::ReadOnlyStore, String> {
    if !dir.exists() {
        return Err(format!("no capture store at {} (pass --data DIR, or --admin URL for a running proxy)", dir.display()));
    }
    let store = Store::open_read_only(dir, &StoreOptions::default()).map_err(|e| e.to_string())?;
    // Never silent: what is shown may be short of what was stored.
    match store.damage() {
        Ok(Some(damage)) => eprintln!("ctxscope: warning: {}: {damage}", dir.display()),
        Ok(None) => {}
        Err(error) => eprintln!("ctxscope: warning: {}: cannot check the store: {error}", dir.display()),
    }
    Ok(store)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("admin API answered something unexpected: {e}"))
}

async fn get(base: &str, path: &str) -> Result<Bytes, String> {
    request(base, path, http::Method::GET, Bytes::new()).await
}

async fn post(base: &str, path: &str, body: Vec<u8>) -> Result<Bytes, String> {
    request(base, path, http::Method::POST, Bytes::from(body)).await
}

async fn request(base: &str, path: &str, method: http::Method, body: Bytes) -> Result<Bytes, String> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: http::Uri = url.parse().map_err(|e| format!("bad --admin URL {base:?}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::builder().method(method).uri(uri).body(Full::new(body)).map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| format!("cannot reach admin API at {base}: {e}"))?;
    let status = response.status();
    let bytes = response.into_body().collect().await.map_err(|e| format!("admin API read failed: {e}"))?.to_bytes();
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        return Err(format!("admin API: {status}: {message}"));
    }
    Ok(bytes)
}
