//! The UI's JSON endpoints: the paginated conversation listing with its filters, finding counts per
//! kind, a turn's diff, and a stored replay's HTML report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ctxscope_store::{ConversationRecord, Cursor, FindingFilter, FindingKind, PageQuery, Severity, Store, StoreError};
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use crate::admin::{with_store, with_store_raw, AdminState};
use crate::body::{full, json_error, ProxyBody};

/// Largest page.
const MAX_LIMIT: usize = 200;
/// Conversations a text search examines per page (newest first); `next` continues past them.
pub const SEARCH_SCAN: usize = 500;

/// The listing's filters, parsed from the query string.
#[derive(Debug, Default)]
pub struct ListFilter {
    pub page: PageQuery,
    pub kind: Option<FindingKind>,
    pub severity: Option<Severity>,
    pub model: Option<String>,
    pub upstream: Option<String>,
    pub text: Option<String>,
}

/// `cursor`, `limit`, `kind`, `severity`, `model`, `upstream`, `since`, `until` (Unix ms), `q`.
pub fn list_filter(query: &str) -> Result<ListFilter, String> {
    let mut filter = ListFilter { page: PageQuery { limit: 50, ..PageQuery::default() }, ..ListFilter::default() };
    for (key, value) in super::query::pairs(query) {
        if value.is_empty() {
            continue;
        }
        let number = || value.parse::<u64>().map_err(|_| format!("{key}={value:?} is not a number"));
        match key.as_str() {
            "cursor" => filter.page.after = Some(Cursor::parse(&value).ok_or_else(|| format!("bad cursor {value:?}"))?),
            "limit" => filter.page.limit = (number()? as usize).clamp(1, MAX_LIMIT),
            "since" => filter.page.since_unix_ms = Some(number()?),
            "until" => filter.page.until_unix_ms = Some(number()?),
            "kind" => {
                let known = || FindingKind::ALL.map(FindingKind::as_str).join(", ");
                filter.kind =
                    Some(FindingKind::parse(&value).ok_or_else(|| format!("unknown finding kind {value:?}; known: {}", known()))?);
            }
            "severity" => {
                filter.severity = Some(
                    Severity::ALL
                        .into_iter()
                        .find(|s| s.as_str() == value)
                        .ok_or_else(|| format!("unknown severity {value:?}; known: info, warning, critical"))?,
                )
            }
            "model" => filter.model = Some(value),
            "upstream" => filter.upstream = Some(value),
            "q" => filter.text = Some(value.to_lowercase()),
            _ => {
                return Err(format!("unknown query parameter {key:?}; use cursor, limit, kind, severity, model, upstream, since, until, q"))
            }
        }
    }
    if filter.text.is_some() {
        filter.page.max_scan = SEARCH_SCAN;
    }
    Ok(filter)
}

/// One page of the listing, each conversation with its findings counted by kind.
pub fn conversation_page(store: &Store, filter: &ListFilter) -> Result<Value, StoreError> {
    let keep = |c: &ConversationRecord| -> Result<bool, StoreError> {
        if filter.model.as_ref().is_some_and(|m| c.model.as_ref() != Some(m)) || filter.upstream.as_ref().is_some_and(|u| &c.upstream != u)
        {
            return Ok(false);
        }
        match &filter.text {
            Some(text) => mentions(store, c, text),
            None => Ok(true),
        }
    };
    let page = if filter.kind.is_some() || filter.severity.is_some() {
        let findings = store.findings(&FindingFilter { kind: filter.kind, ..FindingFilter::default() })?;
        let ids: BTreeSet<u64> =
            findings.iter().filter(|f| !matches!(filter.severity, Some(s) if f.severity != s)).map(|f| f.conversation).collect();
        store.conversations_among(ids, &filter.page, keep)?
    } else {
        store.conversations_page(&filter.page, keep)?
    };
    let mut rows = Vec::new();
    for c in &page.conversations {
        let mut kinds = BTreeMap::new();
        for f in store.conversation_findings(c.id)? {
            *kinds.entry(f.kind.as_str()).or_insert(0u64) += 1;
        }
        let mut row = serde_json::to_value(c).unwrap_or(Value::Null);
        row["findings"] = json!(kinds);
        rows.push(row);
    }
    Ok(json!({"conversations": rows, "next": page.next.map(Cursor::to_text), "scanned": page.scanned}))
}

/// Whether the conversation's latest turn (its messages and reply) contains `text` (lowercase).
fn mentions(store: &Store, c: &ConversationRecord, text: &str) -> Result<bool, StoreError> {
    let Some(turn) = store.turn(c.last_turn)? else {
        return Ok(false);
    };
    if turn.reply_text.to_lowercase().contains(text) {
        return Ok(true);
    }
    for (_, message) in store.turn_message_values(&turn)? {
        let Some(message) = message else {
            continue;
        };
        if crate::detect::history::text(&message).to_lowercase().contains(text) {
            return Ok(true);
        }
    }
    Ok(false)
}

pub async fn conversations(state: &Arc<AdminState>, query: &str) -> Response<ProxyBody> {
    match list_filter(query) {
        Ok(filter) => with_store(state, move |s| conversation_page(s, &filter).map(|v| v.to_string())).await,
        Err(message) => json_error(StatusCode::BAD_REQUEST, "bad_query", &message, None),
    }
}

pub async fn finding_counts(state: &Arc<AdminState>) -> Response<ProxyBody> {
    with_store(state, |s| {
        let counts = s.finding_counts()?;
        let all: BTreeMap<&str, u64> = FindingKind::ALL.iter().map(|k| (k.as_str(), counts.get(k).copied().unwrap_or(0))).collect();
        Ok(json!(all).to_string())
    })
    .await
}

pub async fn turn_diff(state: &Arc<AdminState>, id: &str) -> Response<ProxyBody> {
    match id.parse::<u64>() {
        Ok(id) => with_store(state, move |s| super::diff::turn_diff(s, id).map(|v| v.to_string())).await,
        Err(_) => json_error(StatusCode::BAD_REQUEST, "bad_id", &format!("{id:?} is not a turn id"), None),
    }
}

/// The replay crate's self-contained HTML report of a stored run.
pub async fn replay_report(state: &Arc<AdminState>, id: &str) -> Response<ProxyBody> {
    let Ok(id) = id.parse::<u64>() else {
        return json_error(StatusCode::BAD_REQUEST, "bad_id", &format!("{id:?} is not a replay id"), None);
    };
    let entry = with_store_raw(state, move |s| s.replay(id)?.ok_or_else(|| StoreError::NotFound(format!("replay {id}")))).await;
    let entry = match entry {
        Ok(entry) => entry,
        Err(response) => return response,
    };
    match serde_json::from_value::<ctxscope_replay::ReplayReport>(entry.report) {
        Ok(report) => {
            let mut response = Response::new(full(ctxscope_replay::report::html(&report)));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
            response
        }
        Err(e) => {
            json_error(StatusCode::INTERNAL_SERVER_ERROR, "bad_report", &format!("replay {id}'s stored report is not readable: {e}"), None)
        }
    }
}
