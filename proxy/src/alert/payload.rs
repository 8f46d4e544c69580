//! What the webhook posts: one JSON document per finding, or an alert in the shape Alertmanager's
//! `POST /api/v2/alerts` accepts.

use ctxscope_store::FindingRecord;
use serde_json::{json, Value};

/// The payload shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFormat {
    /// `{"source": "ctxscope", "finding": {...}}`, one document per finding.
    Json,
    /// `[{"labels", "annotations", "startsAt"}]`, as Alertmanager's `POST /api/v2/alerts` accepts.
    Alertmanager,
}

/// The request body for one finding.
pub fn render(format: WebhookFormat, finding: &FindingRecord) -> Result<Vec<u8>, serde_json::Error> {
    let document = match format {
        WebhookFormat::Json => json!({"source": "ctxscope", "finding": serde_json::to_value(finding)?}),
        WebhookFormat::Alertmanager => alertmanager_alerts(finding),
    };
    serde_json::to_vec(&document)
}

/// One alert in the shape of Alertmanager's `POST /api/v2/alerts` (labels identify it; no `endsAt`,
/// so Alertmanager resolves it after its `resolve_timeout`).
fn alertmanager_alerts(finding: &FindingRecord) -> Value {
    json!([{
        "labels": {
            "alertname": format!("ctxscope_{}", finding.kind.as_str()),
            "kind": finding.kind.as_str(),
            "severity": finding.severity.as_str(),
            "upstream": finding.upstream,
            "conversation": finding.conversation.to_string(),
        },
        "annotations": {
            "summary": finding.summary,
            "description": finding.evidence.to_string(),
        },
        "startsAt": rfc3339_utc(finding.time_unix_ms),
    }])
}

/// `2025-11-29T13:05:07.123Z` for a Unix time in milliseconds.
fn rfc3339_utc(unix_ms: u64) -> String {
    ctxscope_common::civil::rfc3339(unix_ms / 1000, (unix_ms % 1000) as u32 * 1_000_000, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_from_unix_milliseconds() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc(1_764_421_507_123), "2025-11-29T13:05:07.123Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
