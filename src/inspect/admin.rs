//! The admin API of a running proxy as a [`Records`] source: the same records as the store, over
//! HTTP, with `--admin-token` sent as a bearer token when the proxy requires one.

use bytes::Bytes;
use ctxscope_store::{ConversationDetail, ConversationRecord, FindingFilter, FindingRecord, ReplayEntry};
use http_body_util::{BodyExt, Full};
use serde::de::DeserializeOwned;

use super::records::{InspectError, Pending, Records};

/// How long connecting to the admin API may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct AdminApi {
    pub url: String,
    /// Sent as `Authorization: Bearer TOKEN` (the proxy's `--admin-token`).
    pub token: Option<String>,
}

/// The admin API's query string for `filter` (`kind=...&conversation=...&since=...&limit=...`).
pub fn finding_query(filter: &FindingFilter) -> String {
    let mut query = Vec::new();
    query.extend(filter.kind.map(|k| format!("kind={}", k.as_str())));
    query.extend(filter.conversation.map(|c| format!("conversation={c}")));
    query.extend(filter.since_unix_ms.map(|s| format!("since={s}")));
    query.extend(filter.limit.map(|l| format!("limit={l}")));
    query.join("&")
}

impl AdminApi {
    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, InspectError> {
        decode(&self.request(path, http::Method::GET, Bytes::new()).await?)
    }

    async fn request(&self, path: &str, method: http::Method, body: Bytes) -> Result<Bytes, InspectError> {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let uri: http::Uri =
            url.parse().map_err(|e: http::uri::InvalidUri| InspectError::AdminUrl { url: self.url.clone(), reason: e.to_string() })?;
        let client = ctxscope_http::client::client::<Full<Bytes>>(CONNECT_TIMEOUT);
        let mut builder = http::Request::builder().method(method).uri(uri);
        if let Some(token) = &self.token {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = builder.body(Full::new(body)).map_err(|e| InspectError::AdminUrl { url: self.url.clone(), reason: e.to_string() })?;
        let unreachable = |reason: String| InspectError::Unreachable { url: self.url.clone(), reason };
        let response = client.request(request).await.map_err(|e| unreachable(e.to_string()))?;
        let status = response.status();
        let bytes = response.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?.to_bytes();
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            let hint = if status == http::StatusCode::UNAUTHORIZED && self.token.is_none() { " (pass --admin-token)" } else { "" };
            return Err(InspectError::Status { status, message: format!("{message}{hint}") });
        }
        Ok(bytes)
    }
}

fn decode<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, InspectError> {
    serde_json::from_slice(bytes).map_err(|e| InspectError::Unexpected(e.to_string()))
}

impl Records for AdminApi {
    fn conversations(&self) -> Pending<'_, Vec<ConversationRecord>> {
        Box::pin(self.get("/api/conversations"))
    }

    fn detail(&self, id: u64) -> Pending<'_, ConversationDetail> {
        Box::pin(async move { self.get(&format!("/api/conversations/{id}")).await })
    }

    fn findings<'a>(&'a self, filter: &'a FindingFilter) -> Pending<'a, Vec<FindingRecord>> {
        Box::pin(async move { self.get(&format!("/api/findings?{}", finding_query(filter))).await })
    }

    fn export(&self, id: u64) -> Pending<'_, Vec<u8>> {
        Box::pin(
            async move { Ok(self.request(&format!("/api/conversations/{id}/export"), http::Method::GET, Bytes::new()).await?.to_vec()) },
        )
    }

    fn import<'a>(&'a self, file: &'a std::path::Path) -> Pending<'a, u64> {
        Box::pin(async move {
            // One body; the proxy reads it line by line under its line limit.
            let jsonl = std::fs::read(file).map_err(|source| InspectError::Io { what: "read", path: file.to_path_buf(), source })?;
            let answer: serde_json::Value = decode(&self.request("/api/import", http::Method::POST, Bytes::from(jsonl)).await?)?;
            answer["conversation"].as_u64().ok_or_else(|| InspectError::Unexpected(format!("no conversation id in {answer}")))
        })
    }

    fn put_replay<'a>(&'a self, entry: &'a ReplayEntry) -> Pending<'a, ()> {
        Box::pin(async move {
            let body = serde_json::to_vec(entry)?;
            self.request("/api/replays", http::Method::POST, Bytes::from(body)).await.map(|_| ())
        })
    }

    fn replay(&self, id: u64) -> Pending<'_, ReplayEntry> {
        Box::pin(async move { self.get(&format!("/api/replays/{id}")).await })
    }

    fn replays(&self) -> Pending<'_, Vec<ReplayEntry>> {
        Box::pin(self.get("/api/replays"))
    }

    fn losses(&self) -> Pending<'_, Vec<ctxscope_store::Loss>> {
        Box::pin(self.get("/api/losses"))
    }

    fn acknowledge_losses<'a>(&'a self, ids: &'a [u64]) -> Pending<'a, usize> {
        Box::pin(async move {
            let body = serde_json::to_vec(&serde_json::json!({ "ids": ids }))?;
            let answer: serde_json::Value = decode(&self.request("/api/losses/ack", http::Method::POST, Bytes::from(body)).await?)?;
            answer["acknowledged"].as_u64().map(|n| n as usize).ok_or_else(|| InspectError::Unexpected(format!("no count in {answer}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxscope_store::FindingKind;

    #[test]
    fn a_finding_filter_becomes_the_admin_query_the_proxy_parses_back() {
        let filter =
            FindingFilter { kind: Some(FindingKind::EngineTruncation), conversation: Some(7), since_unix_ms: Some(5), limit: Some(3) };
        let query = finding_query(&filter);
        assert_eq!(query, "kind=engine_truncation&conversation=7&since=5&limit=3");
        let back = ctxscope_proxy::admin::finding_filter(&query).unwrap();
        assert_eq!(
            (back.kind, back.conversation, back.since_unix_ms, back.limit),
            (filter.kind, filter.conversation, filter.since_unix_ms, filter.limit)
        );
        assert_eq!(finding_query(&FindingFilter::default()), "");
    }
}
