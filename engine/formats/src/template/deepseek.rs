//! Built-in prompt encoders for DeepSeek V3.2 and V4, which ship no Jinja chat template: their
//! format is defined by Python encoding scripts (`encoding/encoding_dsv32.py` in the Hugging Face
//! repository deepseek-ai/DeepSeek-V3.2, `encoding/encoding_dsv4.py` in deepseek-ai/DeepSeek-V4-Flash).
//! This is a Rust rewrite of their `encode_messages` with the scripts' defaults (`drop_thinking`
//! on, BOS added, no reasoning-effort prefix, no context), checked byte for byte against them by
//! the fixtures in tests/fixtures/chat_formats/.
//!
//! Conventions where the scripts take something other than an OpenAI request:
//! - request-level `tools` become a system message of empty content holding them, inserted before
//!   the conversation (as vLLM does); a system message's own `tools` field is honoured too;
//! - `content` given as a list of parts is joined like the Jinja path does, null content is "";
//! - JSON is written as Python's `json.dumps(..., ensure_ascii=False)`; tool-call `arguments`
//!   strings keep their key order, other objects are in the (sorted) order serde_json holds them.
//!
//! "Without generation prompt" leaves out the text the script appends after the last message to
//! open the assistant's reply (`<｜Assistant｜><think>` or `</think>`; after V3.2 tool results
//! `\n\n<think>` or `\n\n</think>`); [`DeepSeekFormat::render_split`] returns both parts.

use std::fmt::Write;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value as Json};

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";
const LATEST_REMINDER: &str = "<｜latest_reminder｜>";
const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const DSML: &str = "｜DSML｜";

/// The V3.2 tool prompt; `{TOOLS}` is replaced by one JSON line per function.
const V32_TOOLS: &str = r#"## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<｜DSML｜function_calls>" block like the following as part of your reply to the user:
<｜DSML｜function_calls>
<｜DSML｜invoke name="$FUNCTION_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$FUNCTION_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜function_calls>

String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:

<｜DSML｜function_calls>
...
</｜DSML｜function_calls>

<function_results>
...
</function_results>

<think>...thinking about results</think>

Here are the functions available in JSONSchema format:
<functions>
{TOOLS}
</functions>
"#;

/// The V4 tool prompt; `{TOOLS}` is replaced by one JSON line per function.
const V4_TOOLS: &str = r#"## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{TOOLS}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"#;

const RESPONSE_FORMAT: &str = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/// V4 task tokens (`task` on a message: DeepSeek's internal quick-instruction tasks).
const V4_TASKS: [(&str, &str); 6] = [
    ("action", "<｜action｜>"),
    ("query", "<｜query｜>"),
    ("authority", "<｜authority｜>"),
    ("domain", "<｜domain｜>"),
    ("title", "<｜title｜>"),
    ("read_url", "<｜read_url｜>"),
];

/// Why a conversation cannot be encoded; the reference scripts refuse the same conversations
/// (with an assertion or an exception).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeepSeekError {
    #[error("message {index} is not valid: {reason}")]
    InvalidMessage { index: usize, reason: String },
    #[error("message {index} has role {role:?}, which {version} does not encode")]
    UnknownRole { index: usize, role: String, version: &'static str },
    #[error("message {index}: a developer message needs non-empty content")]
    EmptyDeveloper { index: usize },
    #[error("message {index}: a tool result without a preceding assistant tool call to answer")]
    OrphanToolResult { index: usize },
    #[error("message {index}: tool-call arguments are not a JSON object: {reason}")]
    BadArguments { index: usize, reason: String },
    #[error("message {index}: in thinking mode an assistant message after the last user message needs reasoning_content or tool_calls")]
    MissingReasoning { index: usize },
    #[error("DeepSeek V3.2's encoder drops developer messages before the last user message in thinking mode and then fails on the shortened conversation")]
    DroppedDeveloper,
    #[error("message {index}: unknown task {task:?}")]
    UnknownTask { index: usize, task: String },
}

/// Which DeepSeek encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeepSeekVersion {
    /// DeepSeek-V3.2 and V3.2-Exp (`encoding_dsv32.py`).
    V32,
    /// DeepSeek-V4 (`encoding_dsv4.py`).
    V4,
}

impl DeepSeekVersion {
    fn label(self) -> &'static str {
        match self {
            DeepSeekVersion::V32 => "DeepSeek V3.2",
            DeepSeekVersion::V4 => "DeepSeek V4",
        }
    }
}

/// A DeepSeek encoder: the version and whether thinking mode is on (`thinking_mode="thinking"`;
/// off is `"chat"`, the default of the OpenAI-compatible servers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeepSeekFormat {
    pub version: DeepSeekVersion,
    pub thinking: bool,
}

/// A render split where the generation prompt starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The conversation (with BOS).
    pub body: String,
    /// What the script appends after the last message to open the assistant's reply ("" when the
    /// last message is the assistant's or a system message).
    pub generation_prompt: String,
}

impl DeepSeekFormat {
    /// The format's `--chat-format` name.
    pub fn name(&self) -> &'static str {
        match (self.version, self.thinking) {
            (DeepSeekVersion::V32, false) => "deepseek-v3.2",
            (DeepSeekVersion::V32, true) => "deepseek-v3.2-thinking",
            (DeepSeekVersion::V4, false) => "deepseek-v4",
            (DeepSeekVersion::V4, true) => "deepseek-v4-thinking",
        }
    }

    /// Renders OpenAI-shaped messages (and request-level `tools`, a JSON array).
    pub fn render(&self, messages: &[Json], tools: Option<&Json>, add_generation_prompt: bool) -> Result<String, DeepSeekError> {
        let split = self.render_split(messages, tools)?;
        Ok(if add_generation_prompt { split.body + &split.generation_prompt } else { split.body })
    }

    /// The render without the generation prompt, and the generation prompt.
    pub fn render_split(&self, messages: &[Json], tools: Option<&Json>) -> Result<Split, DeepSeekError> {
        let prepared = prepare(messages)?;
        self.render_prepared(&prepared, tools)
    }

    /// Renders messages already normalised by [`prepare`].
    pub(crate) fn render_prepared(&self, messages: &[Json], tools: Option<&Json>) -> Result<Split, DeepSeekError> {
        let mut full: Vec<Json> = Vec::with_capacity(messages.len() + 1);
        if let Some(tools) = tools.filter(|t| truthy(t)) {
            let mut system = Map::new();
            system.insert("role".into(), Json::from("system"));
            system.insert("content".into(), Json::from(""));
            system.insert("tools".into(), tools.clone());
            full.push(Json::Object(system));
        }
        full.extend(messages.iter().cloned());
        let parts = match self.version {
            DeepSeekVersion::V32 => v32::encode(full, self.thinking)?,
            DeepSeekVersion::V4 => v4::encode(full, self.thinking)?,
        };
        let mut body = String::from(BOS);
        let mut generation_prompt = String::new();
        let n = parts.len();
        for (i, (text, opener)) in parts.into_iter().enumerate() {
            body.push_str(&text);
            if i + 1 == n {
                generation_prompt = opener;
            } else {
                body.push_str(&opener);
            }
        }
        Ok(Split { body, generation_prompt })
    }
}

/// Normalises messages: objects with a string `role`; `content` a string (parts joined by "\n",
/// null or missing as ""), except a V4 tool result's list of text blocks, which is kept.
pub(crate) fn prepare(messages: &[Json]) -> Result<Vec<Json>, DeepSeekError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let invalid = |reason: &str| DeepSeekError::InvalidMessage { index, reason: reason.into() };
            let Json::Object(fields) = m else {
                return Err(invalid("not a JSON object"));
            };
            let role = fields.get("role").and_then(Json::as_str).ok_or_else(|| invalid("no string \"role\""))?;
            let mut out = fields.clone();
            let content = match fields.get("content") {
                None | Some(Json::Null) => Json::from(""),
                Some(Json::String(s)) => Json::from(s.as_str()),
                Some(Json::Array(parts)) if role == "tool" => Json::Array(parts.clone()),
                Some(Json::Array(parts)) => Json::from(super::join_text_parts(parts)),
                Some(_) => return Err(invalid("content must be a string or a list of parts")),
            };
            out.insert("content".into(), content);
            Ok(Json::Object(out))
        })
        .collect()
}

/// Python truthiness of a JSON value (`if x:`).
fn truthy(v: &Json) -> bool {
    match v {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64() != Some(0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

fn role(m: &Json) -> &str {
    m.get("role").and_then(Json::as_str).unwrap_or_default()
}

fn text<'a>(m: &'a Json, key: &str) -> &'a str {
    m.get(key).and_then(Json::as_str).unwrap_or_default()
}

fn field<'a>(m: &'a Json, key: &str) -> Option<&'a Json> {
    m.get(key).filter(|v| truthy(v))
}

fn last_user_index(messages: &[Json]) -> Option<usize> {
    messages.iter().rposition(|m| matches!(role(m), "user" | "developer"))
}

/// Index > the last user's (Python compares with -1 when there is none).
fn after(index: usize, last_user: Option<usize>) -> bool {
    last_user.is_none_or(|u| index > u)
}

fn at_or_after(index: usize, last_user: Option<usize>) -> bool {
    last_user.is_none_or(|u| index >= u)
}

/// The system-prompt additions of a message: tools, then response_format.
fn tools_and_format(m: &Json, tools_template: &str) -> String {
    let mut out = String::new();
    if let Some(Json::Array(tools)) = field(m, "tools") {
        let schemas: Vec<String> = tools.iter().map(|t| py_json(&PyJson::from(t.get("function").unwrap_or(&Json::Null)))).collect();
        out.push_str("\n\n");
        out.push_str(&tools_template.replace("{TOOLS}", &schemas.join("\n")));
    }
    if let Some(rf) = field(m, "response_format") {
        out.push_str("\n\n");
        out.push_str(RESPONSE_FORMAT);
        out.push_str(&py_json(&PyJson::from(rf)));
    }
    out
}

/// The DSML block of an assistant's tool calls ("" without calls), `block` naming its element.
fn tool_calls_dsml(m: &Json, index: usize, block: &str, lenient: bool) -> Result<String, DeepSeekError> {
    let Some(Json::Array(calls)) = field(m, "tool_calls") else {
        return Ok(String::new());
    };
    let mut invokes = Vec::with_capacity(calls.len());
    for call in calls {
        let function = call.get("function").unwrap_or(&Json::Null);
        let name = function.get("name").map(python_str).unwrap_or_else(|| "None".into());
        let args = arguments(function.get("arguments"), index, lenient)?;
        let params: Vec<String> = args
            .iter()
            .map(|(k, v)| {
                let (is_str, value) = match v {
                    PyJson::Str(s) => ("true", s.clone()),
                    other => ("false", py_json(other)),
                };
                format!("<{DSML}parameter name=\"{k}\" string=\"{is_str}\">{value}</{DSML}parameter>")
            })
            .collect();
        invokes.push(format!("<{DSML}invoke name=\"{name}\">\n{}\n</{DSML}invoke>", params.join("\n")));
    }
    Ok(format!("\n\n<{DSML}{block}>\n{}\n</{DSML}{block}>", invokes.join("\n")))
}

/// `json.loads(arguments).items()`, in the string's key order. `lenient` (V4) falls back to
/// `{"arguments": <the raw value>}` where `json.loads` fails, as the V4 script does.
fn arguments(raw: Option<&Json>, index: usize, lenient: bool) -> Result<Vec<(String, PyJson)>, DeepSeekError> {
    let bad = |reason: String| DeepSeekError::BadArguments { index, reason };
    let parsed = match raw {
        Some(Json::String(s)) => serde_json::from_str::<PyJson>(s).map_err(|e| e.to_string()),
        Some(other) => Err(format!("not a string but {other}")),
        None => Err("missing".to_string()),
    };
    match parsed {
        Ok(PyJson::Dict(items)) => Ok(items),
        Ok(other) => Err(bad(format!("{} is not an object", py_json(&other)))),
        Err(_) if lenient && raw.is_some() => Ok(vec![("arguments".into(), PyJson::from(raw.unwrap_or(&Json::Null)))]),
        Err(reason) => Err(bad(reason)),
    }
}

/// `str(value)` for the values a name can hold.
fn python_str(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Null => "None".into(),
        other => py_json(&PyJson::from(other)),
    }
}

mod v32 {
    //! `encoding_dsv32.py`: user messages carry the assistant header; tool results follow the
    //! assistant's turn inside `<function_results>`.

    use super::*;

    pub(super) fn encode(mut full: Vec<Json>, thinking: bool) -> Result<Vec<(String, String)>, DeepSeekError> {
        if thinking {
            let count = full.len();
            full = drop_thinking(full);
            if full.len() < count {
                return Err(DeepSeekError::DroppedDeveloper);
            }
        }
        (0..full.len()).map(|i| render_message(i, &full, thinking)).collect()
    }

    fn drop_thinking(messages: Vec<Json>) -> Vec<Json> {
        let last_user = last_user_index(&messages);
        let mut out = Vec::with_capacity(messages.len());
        for (idx, mut m) in messages.into_iter().enumerate() {
            let r = role(&m);
            if matches!(r, "user" | "system" | "tool") || at_or_after(idx, last_user) {
                out.push(m);
            } else if r == "assistant" {
                if let Json::Object(o) = &mut m {
                    o.remove("reasoning_content");
                }
                out.push(m);
            }
        }
        out
    }

    fn think(open: bool) -> &'static str {
        if open {
            THINK_START
        } else {
            THINK_END
        }
    }

    fn render_message(index: usize, messages: &[Json], thinking: bool) -> Result<(String, String), DeepSeekError> {
        let m = &messages[index];
        let last_user = last_user_index(messages);
        let content = text(m, "content");
        match role(m) {
            "system" => Ok((format!("{content}{}", tools_and_format(m, V32_TOOLS)), String::new())),
            "developer" => {
                if content.is_empty() {
                    return Err(DeepSeekError::EmptyDeveloper { index });
                }
                let body = format!("{USER}{}\n\n# The user's message is: {content}", tools_and_format(m, V32_TOOLS));
                let open = last_user == Some(index) && thinking;
                Ok((body, format!("{ASSISTANT}{}", think(open))))
            }
            "user" => {
                let open = last_user == Some(index) && thinking;
                Ok((format!("{USER}{content}"), format!("{ASSISTANT}{}", think(open))))
            }
            "tool" => {
                let assistant = messages[..index]
                    .iter()
                    .rposition(|m| role(m) != "tool")
                    .filter(|&i| role(&messages[i]) == "assistant")
                    .ok_or(DeepSeekError::OrphanToolResult { index })?;
                let order = index - assistant;
                let calls = match field(&messages[assistant], "tool_calls") {
                    Some(Json::Array(calls)) if calls.len() >= order => calls.len(),
                    _ => return Err(DeepSeekError::OrphanToolResult { index }),
                };
                let mut body = String::new();
                if order == 1 {
                    body.push_str("\n\n<function_results>");
                }
                let _ = write!(body, "\n<result>{content}</result>");
                let mut opener = String::new();
                if order == calls {
                    body.push_str("\n</function_results>");
                    let open = at_or_after(index, last_user) && thinking;
                    opener = format!("\n\n{}", think(open));
                }
                Ok((body, opener))
            }
            "assistant" => {
                let calls = tool_calls_dsml(m, index, "function_calls", false)?;
                let mut body = String::new();
                if thinking && after(index, last_user) {
                    let reasoning = text(m, "reasoning_content");
                    if reasoning.is_empty() && field(m, "tool_calls").is_none() {
                        return Err(DeepSeekError::MissingReasoning { index });
                    }
                    body.push_str(reasoning);
                    body.push_str(THINK_END);
                }
                body.push_str(content);
                body.push_str(&calls);
                body.push_str(EOS);
                Ok((body, String::new()))
            }
            other => Err(DeepSeekError::UnknownRole { index, role: other.into(), version: DeepSeekVersion::V32.label() }),
        }
    }
}

mod v4 {
    //! `encoding_dsv4.py`: tool results are merged into user messages as `<tool_result>` blocks;
    //! the assistant header follows a user message when the assistant (or a reminder) comes next.

    use super::*;

    pub(super) fn encode(full: Vec<Json>, thinking: bool) -> Result<Vec<(String, String)>, DeepSeekError> {
        let mut full = sort_tool_results(merge_tool_messages(full));
        let drop = !full.iter().any(|m| field(m, "tools").is_some());
        if thinking && drop {
            full = drop_thinking(full);
        }
        (0..full.len()).map(|i| render_message(i, &full, thinking, drop)).collect()
    }

    fn block(kind: &str, extra: impl IntoIterator<Item = (&'static str, Json)>) -> Json {
        let mut o = Map::new();
        o.insert("type".into(), Json::from(kind));
        o.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        Json::Object(o)
    }

    fn is_open_user(m: Option<&Json>) -> bool {
        m.is_some_and(|m| role(m) == "user" && m.get("content_blocks").is_some())
    }

    /// Tool messages become `tool_result` blocks of a user message; consecutive user and tool
    /// messages share one user message.
    fn merge_tool_messages(messages: Vec<Json>) -> Vec<Json> {
        let mut merged: Vec<Json> = Vec::with_capacity(messages.len());
        for m in messages {
            match role(&m) {
                "tool" => {
                    let result = block(
                        "tool_result",
                        [
                            ("tool_use_id", m.get("tool_call_id").cloned().unwrap_or(Json::from(""))),
                            ("content", m.get("content").cloned().unwrap_or(Json::from(""))),
                        ],
                    );
                    if is_open_user(merged.last()) {
                        push_block(merged.last_mut(), result);
                    } else {
                        let mut o = Map::new();
                        o.insert("role".into(), Json::from("user"));
                        o.insert("content_blocks".into(), Json::Array(vec![result]));
                        merged.push(Json::Object(o));
                    }
                }
                "user" => {
                    let content = m.get("content").cloned().unwrap_or(Json::from(""));
                    let text_block = block("text", [("text", content.clone())]);
                    let last_has_task = merged.last().is_some_and(|l| !l.get("task").unwrap_or(&Json::Null).is_null());
                    if is_open_user(merged.last()) && !last_has_task {
                        push_block(merged.last_mut(), text_block);
                    } else {
                        let mut o = Map::new();
                        o.insert("role".into(), Json::from("user"));
                        o.insert("content".into(), content);
                        o.insert("content_blocks".into(), Json::Array(vec![text_block]));
                        for key in ["task", "wo_eos", "mask"] {
                            if let Some(v) = m.get(key) {
                                o.insert(key.into(), v.clone());
                            }
                        }
                        merged.push(Json::Object(o));
                    }
                }
                _ => merged.push(m),
            }
        }
        merged
    }

    fn push_block(m: Option<&mut Json>, b: Json) {
        if let Some(Json::Array(blocks)) = m.and_then(|m| m.get_mut("content_blocks")) {
            blocks.push(b);
        }
    }

    /// Within a user message, tool results in the order of the preceding assistant's calls.
    fn sort_tool_results(mut messages: Vec<Json>) -> Vec<Json> {
        let mut order: Vec<(String, usize)> = Vec::new();
        for m in &mut messages {
            match role(m) {
                "assistant" => {
                    if let Some(Json::Array(calls)) = field(m, "tool_calls") {
                        order.clear();
                        for (i, c) in calls.iter().enumerate() {
                            let id = c
                                .get("id")
                                .filter(|v| truthy(v))
                                .or_else(|| c.get("function").and_then(|f| f.get("id")))
                                .and_then(Json::as_str)
                                .unwrap_or_default();
                            if !id.is_empty() {
                                match order.iter_mut().find(|(k, _)| k == id) {
                                    Some(slot) => slot.1 = i,
                                    None => order.push((id.to_string(), i)),
                                }
                            }
                        }
                    }
                }
                "user" => {
                    let Some(Json::Array(blocks)) = m.get_mut("content_blocks") else {
                        continue;
                    };
                    let is_result = |b: &Json| b.get("type").and_then(Json::as_str) == Some("tool_result");
                    let mut results: Vec<Json> = blocks.iter().filter(|b| is_result(b)).cloned().collect();
                    if results.len() < 2 || order.is_empty() {
                        continue;
                    }
                    let rank = |b: &Json| {
                        let id = b.get("tool_use_id").and_then(Json::as_str).unwrap_or_default();
                        order.iter().find(|(k, _)| k == id).map_or(0, |(_, i)| *i)
                    };
                    results.sort_by_key(rank);
                    let mut sorted = results.into_iter();
                    for b in blocks.iter_mut() {
                        if is_result(b) {
                            if let Some(next) = sorted.next() {
                                *b = next;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        messages
    }

    fn drop_thinking(messages: Vec<Json>) -> Vec<Json> {
        let last_user = last_user_index(&messages);
        let mut out = Vec::with_capacity(messages.len());
        for (idx, mut m) in messages.into_iter().enumerate() {
            let r = role(&m);
            let keep = matches!(r, "user" | "system" | "tool" | "latest_reminder" | "direct_search_results");
            if keep || at_or_after(idx, last_user) {
                out.push(m);
            } else if r == "assistant" {
                if let Json::Object(o) = &mut m {
                    o.remove("reasoning_content");
                }
                out.push(m);
            }
        }
        out
    }

    fn has_task(m: &Json) -> bool {
        m.get("task").is_some_and(|t| !t.is_null())
    }

    fn render_message(index: usize, messages: &[Json], thinking: bool, drop: bool) -> Result<(String, String), DeepSeekError> {
        let m = &messages[index];
        let last_user = last_user_index(messages);
        let content = text(m, "content");
        let mut body = String::new();
        match role(m) {
            "system" => {
                body.push_str(content);
                body.push_str(&tools_and_format(m, V4_TOOLS));
            }
            "developer" => {
                if content.is_empty() {
                    return Err(DeepSeekError::EmptyDeveloper { index });
                }
                body.push_str(USER);
                body.push_str(content);
                body.push_str(&tools_and_format(m, V4_TOOLS));
            }
            "user" => {
                body.push_str(USER);
                match field(m, "content_blocks") {
                    Some(Json::Array(blocks)) => {
                        let parts: Vec<String> = blocks.iter().map(render_block).collect();
                        body.push_str(&parts.join("\n\n"));
                    }
                    _ => body.push_str(content),
                }
            }
            "latest_reminder" => {
                body.push_str(LATEST_REMINDER);
                body.push_str(content);
            }
            "assistant" => {
                let calls = tool_calls_dsml(m, index, "tool_calls", true)?;
                let prev_has_task = index > 0 && has_task(&messages[index - 1]);
                if thinking && !prev_has_task && (!drop || after(index, last_user)) {
                    body.push_str(text(m, "reasoning_content"));
                    body.push_str(THINK_END);
                }
                body.push_str(content);
                body.push_str(&calls);
                if !m.get("wo_eos").is_some_and(truthy) {
                    body.push_str(EOS);
                }
            }
            other => return Err(DeepSeekError::UnknownRole { index, role: other.into(), version: DeepSeekVersion::V4.label() }),
        }
        let next_role = messages.get(index + 1).map(role);
        if next_role.is_some_and(|r| r != "assistant" && r != "latest_reminder") {
            return Ok((body, String::new()));
        }
        let mut opener = String::new();
        if has_task(m) {
            let task = python_str(m.get("task").unwrap_or(&Json::Null));
            let token = V4_TASKS
                .iter()
                .find(|(name, _)| *name == task)
                .map(|(_, t)| *t)
                .ok_or(DeepSeekError::UnknownTask { index, task: task.clone() })?;
            if task == "action" {
                opener.push_str(ASSISTANT);
                opener.push_str(if thinking { THINK_START } else { THINK_END });
            }
            opener.push_str(token);
        } else if matches!(role(m), "user" | "developer") {
            opener.push_str(ASSISTANT);
            let open = thinking && (!drop || at_or_after(index, last_user));
            opener.push_str(if open { THINK_START } else { THINK_END });
        }
        Ok((body, opener))
    }

    fn render_block(b: &Json) -> String {
        let kind = b.get("type").and_then(Json::as_str);
        match kind {
            Some("text") => text(b, "text").to_string(),
            Some("tool_result") => {
                let content = match b.get("content") {
                    Some(Json::Array(items)) => items
                        .iter()
                        .map(|i| match i.get("type").and_then(Json::as_str) {
                            Some("text") => text(i, "text").to_string(),
                            other => format!("[Unsupported {}]", other.unwrap_or("None")),
                        })
                        .collect::<Vec<_>>()
                        .join("\n\n"),
                    Some(Json::String(s)) => s.clone(),
                    Some(other) => python_str(other),
                    None => String::new(),
                };
                format!("<tool_result>{content}</tool_result>")
            }
            other => format!("[Unsupported {}]", other.unwrap_or("None")),
        }
    }
}

/// JSON as Python holds it after `json.loads`: objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PyJson {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<PyJson>),
    Dict(Vec<(String, PyJson)>),
}

impl From<&Json> for PyJson {
    fn from(v: &Json) -> Self {
        match v {
            Json::Null => PyJson::Null,
            Json::Bool(b) => PyJson::Bool(*b),
            Json::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => PyJson::Int(i.into()),
                (_, Some(u)) => PyJson::Int(u.into()),
                _ => PyJson::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(s) => PyJson::Str(s.clone()),
            Json::Array(a) => PyJson::List(a.iter().map(PyJson::from).collect()),
            Json::Object(o) => PyJson::Dict(o.iter().map(|(k, v)| (k.clone(), v.into())).collect()),
        }
    }
}

impl<'de> Deserialize<'de> for PyJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PyJson;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<PyJson, E> {
                Ok(PyJson::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<PyJson, E> {
                Ok(PyJson::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<PyJson, E> {
                Ok(PyJson::Int(i.into()))
            }
            fn visit_u64<E>(self, u: u64) -> Result<PyJson, E> {
                Ok(PyJson::Int(u.into()))
            }
            fn visit_f64<E>(self, f: f64) -> Result<PyJson, E> {
                Ok(PyJson::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<PyJson, E> {
                Ok(PyJson::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<PyJson, E> {
                Ok(PyJson::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PyJson, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(PyJson::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PyJson, A::Error> {
                // A repeated key keeps its first position and takes the last value, as in a dict.
                let mut items: Vec<(String, PyJson)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, PyJson>()? {
                    match items.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => slot.1 = v,
                        None => items.push((k, v)),
                    }
                }
                Ok(PyJson::Dict(items))
            }
        }
        d.deserialize_any(V)
    }
}

/// `json.dumps(value, ensure_ascii=False)`.
pub(crate) fn py_json(v: &PyJson) -> String {
    let mut out = String::new();
    write_py_json(v, &mut out);
    out
}

fn write_py_json(v: &PyJson, out: &mut String) {
    match v {
        PyJson::Null => out.push_str("null"),
        PyJson::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        PyJson::Int(i) => {
            let _ = write!(out, "{i}");
        }
        PyJson::Float(f) => out.push_str(&py_float(*f)),
        PyJson::Str(s) => super::pyfns::write_str(s, out),
        PyJson::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_json(item, out);
            }
            out.push(']');
        }
        PyJson::Dict(items) => {
            out.push('{');
            for (i, (k, item)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                super::pyfns::write_str(k, out);
                out.push_str(": ");
                write_py_json(item, out);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, in exponent form when the decimal
/// exponent is below -4 or at least 16 (`1e-05`, `1e+16`), else positional with at least one
/// decimal (`3.0`).
pub(crate) fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if f != 0.0 && !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let plain = format!("{f}");
    if plain.contains('.') {
        plain
    } else {
        plain + ".0"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat() -> DeepSeekFormat {
        DeepSeekFormat { version: DeepSeekVersion::V4, thinking: false }
    }

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (3.0, "3.0"),
            (2.5, "2.5"),
            (1e-7, "1e-07"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.5e300, "-1.5e+300"),
            (0.1, "0.1"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0, "0.0"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f), want, "{f}");
        }
    }

    #[test]
    fn arguments_keep_their_key_order_and_repeated_keys_keep_the_first_slot() {
        let v: PyJson = serde_json::from_str(r#"{"b": 1, "a": {"y": 2.0, "x": [true, null]}, "b": "z"}"#).unwrap();
        assert_eq!(py_json(&v), r#"{"b": "z", "a": {"y": 2.0, "x": [true, null]}}"#);
    }

    #[test]
    fn generation_prompt_is_what_follows_the_last_message() {
        let msgs = [json!({"role": "user", "content": "hi"})];
        let split = chat().render_split(&msgs, None).unwrap();
        assert_eq!(split.body, "<｜begin▁of▁sentence｜><｜User｜>hi");
        assert_eq!(split.generation_prompt, "<｜Assistant｜></think>");
        let v32 = DeepSeekFormat { version: DeepSeekVersion::V32, thinking: true };
        assert_eq!(v32.render_split(&msgs, None).unwrap().generation_prompt, "<｜Assistant｜><think>");
        let done = [msgs[0].clone(), json!({"role": "assistant", "content": "yo"})];
        assert_eq!(chat().render_split(&done, None).unwrap().generation_prompt, "");
    }

    #[test]
    fn refuses_what_the_scripts_refuse() {
        let orphan = [json!({"role": "user", "content": "x"}), json!({"role": "tool", "content": "r"})];
        let v32 = DeepSeekFormat { version: DeepSeekVersion::V32, thinking: false };
        assert_eq!(v32.render(&orphan, None, true), Err(DeepSeekError::OrphanToolResult { index: 1 }));
        let bad = [json!({"role": "narrator", "content": "x"})];
        assert!(matches!(chat().render(&bad, None, true), Err(DeepSeekError::UnknownRole { .. })));
        let args = [
            json!({"role": "user", "content": "x"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}),
        ];
        assert!(matches!(v32.render(&args, None, true), Err(DeepSeekError::BadArguments { index: 1, .. })));
        // V4 falls back to one "arguments" parameter holding the raw text.
        assert!(chat()
            .render(&args, None, true)
            .unwrap()
            .contains("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>"));
    }
}
