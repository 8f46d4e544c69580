//! Splitting a captured stream into events: Server-Sent Events (`event:`/`data:` fields, blank-line
//! separated, CRLF or LF) and newline-delimited JSON. A stream cut short yields what it had.

use serde_json::Value;

/// One SSE event with its `event:` name (if any) and its `data:` parsed as JSON (`None` for `[DONE]`
/// or non-JSON data).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Option<String>,
    pub data: Option<Value>,
    pub done: bool,
}

pub fn events(body: &[u8]) -> Vec<Event> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    let mut name: Option<String> = None;
    let mut data = String::new();
    let mut has_data = false;
    let flush = |name: &mut Option<String>, data: &mut String, has_data: &mut bool, out: &mut Vec<Event>| {
        if *has_data {
            let trimmed = data.trim();
            let done = trimmed == "[DONE]";
            let parsed = if done { None } else { serde_json::from_str(trimmed).ok() };
            out.push(Event { name: name.take(), data: parsed, done });
        }
        *name = None;
        data.clear();
        *has_data = false;
    };
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            flush(&mut name, &mut data, &mut has_data, &mut out);
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => name = Some(value.to_string()),
            "data" => {
                if has_data {
                    data.push('\n');
                }
                data.push_str(value);
                has_data = true;
            }
            _ => {}
        }
    }
    flush(&mut name, &mut data, &mut has_data, &mut out);
    out
}

/// Newline-delimited JSON values; lines that do not parse are skipped.
pub fn ndjson(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_named_events_crlf_comments_and_done() {
        let body = b": keepalive\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n";
        let ev = events(body);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].name.as_deref(), Some("message_start"));
        assert_eq!(ev[0].data.as_ref().unwrap()["a"], 1);
        assert!(ev[1].done);
    }

    #[test]
    fn truncated_stream_keeps_complete_events_and_the_partial_one_if_it_parses() {
        let ev = events(b"data: {\"x\":1}\n\ndata: {\"x\":");
        assert_eq!(ev.len(), 2);
        assert!(ev[1].data.is_none());
    }

    #[test]
    fn ndjson_skips_garbage() {
        assert_eq!(ndjson(b"{\"a\":1}\nnope\n{\"a\":2}\n").len(), 2);
    }
}
