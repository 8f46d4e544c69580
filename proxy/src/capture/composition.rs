//! The prompt's composition, computed per turn from the live request: its tokens by part (system,
//! tool definitions, tool results, user, assistant, reasoning, images, summaries, other) so that a
//! turn's budget against the context limit shows what fills it.
//!
//! Three ways to count, best first (the composition's `method`; docs/capture.md, "Composition and
//! budget"):
//! - `tokenizer`: the local tokenizer's per-message segments (role markers included); a message's
//!   reasoning counts its own tokens when its segment has room for them beside its text's own
//!   tokens, else none (the template dropped it, as most do for earlier turns); tool definitions
//!   are the template's
//!   render with them less without; BOS goes with the first message, the generation prompt to
//!   `other`. Exact, but for images.
//! - `upstream`, `engine_usage` (and `tokenizer` when the prompt was counted whole): a count of the
//!   whole prompt, split over the parts by their bytes (largest remainders, so the parts sum to the
//!   count). Estimated.
//! - `bytes`: no count at all: about [`BYTES_PER_TOKEN`] bytes a token. Estimated.
//!
//! Images and other media parts count [`IMAGE_TOKENS`] each ([`LOW_DETAIL_IMAGE_TOKENS`] for
//! `detail: "low"`): no API reports them per image. What a message brings is cached by its hash, so
//! a message is read once however many turns resend it.

use std::collections::HashMap;

use ctxscope_store::{Composition, Hash, Parts};
use serde_json::Value;

use super::tokens::TokenCache;
use crate::detect::anatomy::{self, Kind};
use crate::parse::message::Message;

/// Tokens an image (or other media part) counts: OpenAI's cost of a 1024 x 1024 image at high
/// detail (85 + 4 tiles of 170).
pub const IMAGE_TOKENS: u64 = 765;
/// An image sent with `detail: "low"`: OpenAI's fixed cost.
pub const LOW_DETAIL_IMAGE_TOKENS: u64 = 85;
/// Bytes a token when nothing counts (English text in BPE vocabularies).
pub const BYTES_PER_TOKEN: u64 = 4;

/// Message shapes kept; the cache is cleared when full (a shape is cheap to redo).
const MAX_SHAPES: usize = 16_384;
/// Tool definition sets kept.
const MAX_TOOLS: usize = 64;

/// The part a message's text goes to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Part {
    System,
    ToolResults,
    User,
    Assistant,
    Summary,
    #[default]
    Other,
}

/// What one message brings, from its JSON alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    pub part: Part,
    /// Bytes of its text (content, tool calls, tool results), reasoning and media aside.
    pub text_bytes: u64,
    pub reasoning_bytes: u64,
    /// Its images and other media parts, at the estimate each.
    pub media_tokens: u64,
    /// With a local tokenizer, for a message with reasoning: its text's own tokens and its
    /// reasoning's own tokens.
    pub own_tokens: Option<(u64, u64)>,
}

impl Shape {
    pub fn of(message: &Value) -> Shape {
        let part = match anatomy::kind(message) {
            _ if crate::detect::markers::harness_of(message).is_some() => Part::Summary,
            Kind::System | Kind::SystemReminder => Part::System,
            Kind::User => Part::User,
            Kind::Assistant => Part::Assistant,
            Kind::ToolResult => Part::ToolResults,
            Kind::Summary => Part::Summary,
            // A completions prompt is the user's text.
            Kind::Other if message.get("role").and_then(Value::as_str) == Some("prompt") => Part::User,
            Kind::Other => Part::Other,
        };
        Shape {
            part,
            text_bytes: text(message).len() as u64,
            reasoning_bytes: anatomy::reasoning_text(message).len() as u64,
            media_tokens: media_tokens(message),
            own_tokens: None,
        }
    }
}

/// A message's text as a template would render it, reasoning and media aside: string content, text
/// parts, tool results' content, tool calls and tool uses (name and arguments), and an opaque
/// Responses item as its JSON.
pub fn text(message: &Value) -> String {
    let mut out = String::new();
    if message.get("role").and_then(Value::as_str) == Some(crate::parse::responses::OPAQUE_ROLE) {
        return message.get("item").map(Value::to_string).unwrap_or_default();
    }
    match message.get("content") {
        Some(Value::String(s)) => out.push_str(s),
        Some(Value::Array(parts)) => parts.iter().for_each(|p| part_text(p, &mut out)),
        _ => {}
    }
    for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let f = call.get("function").unwrap_or(call);
        for key in ["name", "arguments"] {
            match f.get(key) {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None => {}
                Some(other) => out.push_str(&other.to_string()),
            }
        }
    }
    out
}

fn part_text(part: &Value, out: &mut String) {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    if anatomy::is_media(part) || matches!(kind, "thinking" | "redacted_thinking") {
        return;
    }
    match (part, kind) {
        (Value::String(s), _) => out.push_str(s),
        (_, "tool_use") => {
            out.push_str(part.get("name").and_then(Value::as_str).unwrap_or(""));
            out.push_str(&part.get("input").map(Value::to_string).unwrap_or_default());
        }
        (_, "tool_result") => match part.get("content") {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(inner)) => inner.iter().for_each(|p| part_text(p, out)),
            _ => {}
        },
        _ => match part.get("text").and_then(Value::as_str) {
            Some(text) => out.push_str(text),
            None => out.push_str(&part.to_string()),
        },
    }
}

/// The estimate of a message's media parts (tool results' nested parts included).
fn media_tokens(message: &Value) -> u64 {
    let cost = |p: &Value| {
        let detail = p.get("detail").or_else(|| p.pointer("/image_url/detail")).and_then(Value::as_str);
        if detail == Some("low") {
            LOW_DETAIL_IMAGE_TOKENS
        } else {
            IMAGE_TOKENS
        }
    };
    let parts = message.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let nested = parts.iter().filter_map(|p| p.get("content").and_then(Value::as_array)).flatten();
    parts.iter().chain(nested).filter(|p| anatomy::is_media(p)).map(cost).sum()
}

/// What counted the prompt.
#[derive(Debug, Clone, Copy)]
pub enum Count<'a> {
    /// The local tokenizer: each message's segment and the whole prompt (messages only; tool
    /// definitions are measured apart).
    Segments { segments: &'a [u64], prompt: u64 },
    /// A count of the whole prompt; `with_tools`: it includes the tool definitions.
    Whole { prompt: u64, method: &'static str, with_tools: bool },
    /// No count.
    None,
}

/// The composition of a prompt of messages shaped `shapes` with tool definitions of `tools_bytes`
/// bytes (`tools_tokens`: their tokens, when the local tokenizer measured them), as `count` counted
/// it. The parts sum to `total`; the limit is the caller's to add.
pub fn compose(shapes: &[Shape], tools_bytes: u64, tools_tokens: Option<u64>, count: Count<'_>) -> Composition {
    let mut parts = Parts::default();
    let media: u64 = shapes.iter().map(|s| s.media_tokens).sum();
    let bytes_estimate = |bytes: u64| bytes.div_ceil(BYTES_PER_TOKEN);
    let (method, estimated) = match count {
        Count::Segments { segments, prompt } if segments.len() == shapes.len() => {
            for (shape, &segment) in shapes.iter().zip(segments) {
                // The template kept the reasoning when the segment holds room for it beside the text
                // (role markers give it slack); otherwise it dropped it (most drop earlier turns').
                let kept = |(text, reasoning): (u64, u64)| if segment.saturating_sub(text) >= reasoning { reasoning } else { 0 };
                let reasoning = shape.own_tokens.map_or(0, kept);
                *slot(&mut parts, shape.part) += segment - reasoning;
                parts.reasoning += reasoning;
            }
            parts.other += prompt.saturating_sub(segments.iter().sum());
            parts.tools = tools_tokens.unwrap_or_else(|| bytes_estimate(tools_bytes));
            parts.images = media;
            ("tokenizer", media > 0 || (tools_tokens.is_none() && tools_bytes > 0))
        }
        Count::Segments { prompt, .. } => {
            return compose(shapes, tools_bytes, tools_tokens, Count::Whole { prompt, method: "tokenizer", with_tools: false })
        }
        Count::Whole { prompt, method, with_tools } => {
            // Images are reserved inside the count; the rest is split by bytes.
            parts.images = media.min(prompt);
            let mut weights: Vec<(Target, u64)> = Vec::with_capacity(2 * shapes.len() + 1);
            for shape in shapes {
                weights.push((Target::Part(shape.part), shape.text_bytes));
                weights.push((Target::Reasoning, shape.reasoning_bytes));
            }
            if with_tools {
                weights.push((Target::Tools, tools_bytes));
            } else {
                parts.tools = tools_tokens.unwrap_or_else(|| bytes_estimate(tools_bytes));
            }
            let rest = prompt - parts.images;
            if weights.iter().all(|w| w.1 == 0) {
                parts.other += rest;
            }
            let shares = apportion(rest, &weights.iter().map(|w| w.1).collect::<Vec<_>>());
            for ((target, _), share) in weights.iter().zip(shares) {
                match target {
                    Target::Part(part) => *slot(&mut parts, *part) += share,
                    Target::Reasoning => parts.reasoning += share,
                    Target::Tools => parts.tools += share,
                }
            }
            (method, true)
        }
        Count::None => {
            let mut bytes = Parts::default();
            for shape in shapes {
                *slot(&mut bytes, shape.part) += shape.text_bytes;
                bytes.reasoning += shape.reasoning_bytes;
            }
            bytes.tools = tools_bytes;
            for (part, value) in [
                (&mut parts.system, bytes.system),
                (&mut parts.tool_results, bytes.tool_results),
                (&mut parts.user, bytes.user),
                (&mut parts.assistant, bytes.assistant),
                (&mut parts.summary, bytes.summary),
                (&mut parts.other, bytes.other),
                (&mut parts.reasoning, bytes.reasoning),
                (&mut parts.tools, bytes.tools),
            ] {
                *part = bytes_estimate(value);
            }
            parts.images = media;
            ("bytes", true)
        }
    };
    Composition { total: parts.sum(), method: method.to_string(), estimated, parts, limit: None }
}

/// Where a share of a whole count goes.
#[derive(Debug, Clone, Copy)]
enum Target {
    Part(Part),
    Reasoning,
    Tools,
}

fn slot(parts: &mut Parts, part: Part) -> &mut u64 {
    match part {
        Part::System => &mut parts.system,
        Part::ToolResults => &mut parts.tool_results,
        Part::User => &mut parts.user,
        Part::Assistant => &mut parts.assistant,
        Part::Summary => &mut parts.summary,
        Part::Other => &mut parts.other,
    }
}

/// `total` split in proportion to `weights`, the rounding left to the largest remainders: the
/// shares sum to `total` (all 0 when every weight is 0: nothing to split by).
pub fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|w| *w as u128).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<(u64, u128)> = weights
        .iter()
        .map(|w| {
            let scaled = total as u128 * *w as u128;
            ((scaled / sum) as u64, scaled % sum)
        })
        .collect();
    let mut shares: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let left = total - shares.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| exact[*b].1.cmp(&exact[*a].1).then(a.cmp(b)));
    for i in order.into_iter().take(left as usize) {
        shares[i] += 1;
    }
    shares
}

/// A turn's request, as the composer reads it.
pub struct Request<'a> {
    pub messages: &'a [Message],
    /// Each message's hash (the cache key of its shape).
    pub hashes: &'a [Hash],
    /// The hash of the request's tool definitions, when it has some.
    pub tools_hash: Option<&'a str>,
    /// The request body, read for its `tools` the first time a set of definitions is seen.
    pub body: &'a [u8],
}

/// Message shapes and tool definitions' sizes, cached across turns (bounded).
#[derive(Default)]
pub struct Composer {
    shapes: HashMap<Hash, Shape>,
    /// Tools hash -> bytes of their JSON and, with a local tokenizer, their tokens.
    tools: HashMap<String, (u64, Option<u64>)>,
}

impl Composer {
    /// The composition of `request` as `count` counted it (`tokens`: the local tokenizer, which
    /// also measures reasoning and tool definitions).
    pub fn compose(&mut self, request: &Request<'_>, tokens: Option<&TokenCache>, count: Count<'_>) -> Composition {
        // Bounded at every insertion, not once per turn: one request of 100,000 messages otherwise
        // left 100,000 shapes (about 10 MiB) held until the next turn.
        let shapes: Vec<Shape> = request
            .messages
            .iter()
            .zip(request.hashes)
            .map(|(message, hash)| match self.shapes.get(hash) {
                Some(shape) => *shape,
                None => {
                    let shape = shape_with(message.value(), tokens);
                    if self.shapes.len() >= MAX_SHAPES {
                        self.shapes = HashMap::new();
                    }
                    self.shapes.insert(*hash, shape);
                    shape
                }
            })
            .collect();
        let (tools_bytes, tools_tokens) = match request.tools_hash {
            None => (0, None),
            Some(hash) => match self.tools.get(hash) {
                Some(known) => *known,
                None => {
                    let tools = tools_of(request.body);
                    let bytes = tools.as_ref().map_or(0, |t| t.to_string().len() as u64);
                    let first: Vec<Value> = request.messages.first().map(|m| m.value().clone()).into_iter().collect();
                    let counted = tokens.zip(tools.as_ref()).and_then(|(t, tools)| t.tools_tokens(&first, tools));
                    if self.tools.len() >= MAX_TOOLS {
                        self.tools.clear();
                    }
                    self.tools.insert(hash.to_string(), (bytes, counted));
                    (bytes, counted)
                }
            },
        };
        compose(&shapes, tools_bytes, tools_tokens, count)
    }
}

/// A message's shape, with its own token counts when a tokenizer is there and it carries reasoning.
fn shape_with(message: &Value, tokens: Option<&TokenCache>) -> Shape {
    let mut shape = Shape::of(message);
    if let (Some(tokens), true) = (tokens, shape.reasoning_bytes > 0) {
        let own = |text: &str| tokens.encode_text(text).len() as u64;
        shape.own_tokens = Some((own(&text(message)), own(&anatomy::reasoning_text(message))));
    }
    shape
}

/// The request's `tools` (any API names them so), without building the rest of the body.
fn tools_of(body: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct OnlyTools {
        #[serde(default)]
        tools: Option<Value>,
    }
    serde_json::from_slice::<OnlyTools>(body).ok()?.tools.filter(|t| !t.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shapes(messages: &[Value]) -> Vec<Shape> {
        messages.iter().map(Shape::of).collect()
    }

    #[test]
    fn chat_parts_by_kind_with_reasoning_tool_results_and_images() {
        let messages = [
            json!({"role": "system", "content": "You are terse."}),
            json!({"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}),
            json!({"role": "assistant", "content": "", "reasoning_content": "Let me think hard.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{\"x\":1}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "a cat, sitting"}),
            json!({"role": "user", "content": "<system-reminder>be brief</system-reminder>"}),
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}]}),
        ];
        let s = shapes(&messages);
        let kinds: Vec<Part> = s.iter().map(|s| s.part).collect();
        assert_eq!(kinds, [Part::System, Part::User, Part::Assistant, Part::ToolResults, Part::System, Part::User]);
        assert_eq!(s[1].text_bytes, "what is this?".len() as u64, "the image's URL is not text");
        assert_eq!(s[1].media_tokens, IMAGE_TOKENS);
        assert_eq!(s[5].media_tokens, LOW_DETAIL_IMAGE_TOKENS);
        assert_eq!((s[2].text_bytes, s[2].reasoning_bytes), ("look{\"x\":1}".len() as u64, "Let me think hard.".len() as u64));

        // No count: bytes / 4, each part rounded up; images at the estimate.
        let c = compose(&s, 400, None, Count::None);
        assert_eq!((c.method.as_str(), c.estimated), ("bytes", true));
        let system_bytes = ("You are terse.".len() + "<system-reminder>be brief</system-reminder>".len()) as u64;
        assert_eq!(c.parts.system, system_bytes.div_ceil(4));
        assert_eq!(c.parts.tools, 100);
        assert_eq!(c.parts.reasoning, 5);
        assert_eq!(c.parts.tool_results, 4);
        assert_eq!(c.parts.images, IMAGE_TOKENS + LOW_DETAIL_IMAGE_TOKENS);
        assert_eq!(c.total, c.parts.sum());
        assert!(c.limit.is_none());

        // A whole count, tools included: images reserved, the rest split by bytes, summing exactly.
        let c = compose(&s, 400, None, Count::Whole { prompt: 1000, method: "upstream", with_tools: true });
        assert_eq!((c.total, c.method.as_str(), c.estimated), (1000, "upstream", true));
        assert_eq!(c.parts.sum(), 1000);
        assert_eq!(c.parts.images, IMAGE_TOKENS + LOW_DETAIL_IMAGE_TOKENS);
        let text: u64 = s.iter().map(|s| s.text_bytes + s.reasoning_bytes).sum::<u64>() + 400;
        let rest = 1000 - c.parts.images;
        assert!(c.parts.tools.abs_diff(rest * 400 / text) <= 1, "tools by bytes: {:?}", c.parts);
        assert!(c.parts.reasoning.abs_diff(rest * 18 / text) <= 1, "{:?}", c.parts);
        assert_eq!(c.parts.other, 0);
        // ... and without the tools in the count (a Responses turn counted as chat): tools on top.
        let c = compose(&s, 400, None, Count::Whole { prompt: 1000, method: "upstream", with_tools: false });
        assert_eq!((c.parts.tools, c.total), (100, 1100));
        // A count smaller than the images' estimate: the images take all of it.
        let c = compose(&s, 0, None, Count::Whole { prompt: 300, method: "engine_usage", with_tools: true });
        assert_eq!((c.parts.images, c.total), (300, 300));
    }

    #[test]
    fn segments_are_exact_and_reasoning_is_what_the_template_kept() {
        let messages = [
            json!({"role": "system", "content": "rules"}),
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "hello", "reasoning_content": "the user greets me"}),
            json!({"role": "assistant", "content": "again", "reasoning_content": "dropped by the template"}),
            json!({"role": "user", "content": "bye"}),
        ];
        let mut s = shapes(&messages);
        // Own counts: text 2 and reasoning 5 tokens; the first segment kept the reasoning (2 + 5 +
        // 4 markers), the second did not (2 + 4 markers: no room for it).
        s[2].own_tokens = Some((2, 5));
        s[3].own_tokens = Some((2, 5));
        let segments = [10, 6, 11, 6, 7];
        let c = compose(&s, 0, None, Count::Segments { segments: &segments, prompt: 43 });
        assert_eq!((c.method.as_str(), c.estimated), ("tokenizer", false));
        assert_eq!(c.parts.system, 10);
        assert_eq!(c.parts.user, 13);
        assert_eq!(c.parts.reasoning, 5);
        assert_eq!(c.parts.assistant, 6 + 6);
        assert_eq!(c.parts.other, 3, "the generation prompt");
        assert_eq!(c.total, 43);
        // Tool definitions measured by the template are added to the count (it renders messages only).
        let c = compose(&s, 999, Some(120), Count::Segments { segments: &segments, prompt: 43 });
        assert_eq!((c.parts.tools, c.total, c.estimated), (120, 163, false));
        // Unmeasured tools, or an image, make it an estimate.
        assert!(compose(&s, 999, None, Count::Segments { segments: &segments, prompt: 43 }).estimated);
        // No per-message split (a long uncounted run): the whole count split by bytes.
        let c = compose(&s, 0, None, Count::Segments { segments: &[], prompt: 43 });
        assert_eq!((c.method.as_str(), c.estimated, c.total), ("tokenizer", true, 43));
    }

    #[test]
    fn anthropic_messages_shape() {
        // As parsed: the system prompt leads; thinking and tool_use blocks; a tool_result with an image.
        let messages = [
            json!({"role": "system", "content": [{"type": "text", "text": "Be careful."}]}),
            json!({"role": "user", "content": "List the files."}),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call ls.", "signature": "sig"},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "."}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "a.rs b.rs"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
        ];
        let s = shapes(&messages);
        assert_eq!(s.iter().map(|s| s.part).collect::<Vec<_>>(), [Part::System, Part::User, Part::Assistant, Part::ToolResults]);
        assert_eq!(s[2].text_bytes, "ls{\"dir\":\".\"}".len() as u64, "tool use, not the thinking");
        assert_eq!(s[2].reasoning_bytes, "I should call ls.".len() as u64);
        assert_eq!((s[3].text_bytes, s[3].media_tokens), ("a.rs b.rs".len() as u64, IMAGE_TOKENS));
        let c = compose(&s, 0, None, Count::Whole { prompt: 2000, method: "engine_usage", with_tools: true });
        assert_eq!(c.total, 2000);
        assert!(c.parts.system > 0 && c.parts.reasoning > 0 && c.parts.tool_results > 0 && c.parts.images == IMAGE_TOKENS);
        assert_eq!(c.parts.sum(), 2000);
    }

    #[test]
    fn responses_shape() {
        // As the Responses parser maps input items: instructions as a system message, a function call
        // with its reasoning items on an assistant message, its output as a tool message, an opaque
        // compaction item, an input image.
        let messages = [
            json!({"role": "system", "content": "instructions here"}),
            json!({"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "data:x"}]}),
            json!({"role": "assistant", "content": null, "reasoning_items": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]}],
                   "tool_calls": [{"id": "f1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "f1", "content": "3 matches"}),
            json!({"role": crate::parse::responses::OPAQUE_ROLE, "item": {"type": "compaction", "encrypted_content": "zzz"}}),
        ];
        let s = shapes(&messages);
        assert_eq!(
            s.iter().map(|s| s.part).collect::<Vec<_>>(),
            [Part::System, Part::User, Part::Assistant, Part::ToolResults, Part::Summary]
        );
        assert!(s[2].reasoning_bytes > 0 && s[1].media_tokens == IMAGE_TOKENS && s[4].text_bytes > 0);
        let c = compose(&s, 80, None, Count::None);
        assert_eq!(c.parts.tools, 20);
        assert!(c.parts.summary > 0 && c.parts.reasoning > 0);
        assert_eq!(c.total, c.parts.sum());
    }

    #[test]
    fn the_local_tokenizer_counts_each_part() {
        let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
        let mut cache = TokenCache::open(&model).unwrap();
        let values = [
            json!({"role": "system", "content": "You are terse and exact."}),
            json!({"role": "user", "content": "Read the file."}),
            json!({"role": "assistant", "content": "Done.", "reasoning_content": "The user wants the file read, so I read it."}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "fn main() {}"}),
            json!({"role": "user", "content": "Thanks."}),
        ];
        let messages: Vec<Message> = values.iter().cloned().map(Message::new).collect();
        let hashes: Vec<Hash> = values.iter().map(|v| ctxscope_store::message_hash(v).0).collect();
        let chain: Vec<Hash> = hashes
            .iter()
            .scan(ctxscope_store::ZERO_HASH, |h, m| {
                *h = ctxscope_store::chain_next(h, m);
                Some(*h)
            })
            .collect();
        let counted = cache.count(ctxscope_store::Endpoint::ChatCompletions, &values, &chain, 0).unwrap();
        let ends = &counted.segment_ends;
        let segments: Vec<u64> = (0..ends.len()).map(|i| (ends[i] - if i == 0 { 0 } else { ends[i - 1] }) as u64).collect();
        let request = Request { messages: &messages, hashes: &hashes, tools_hash: None, body: b"{}" };
        let c = Composer::default().compose(&request, Some(&cache), Count::Segments { segments: &segments, prompt: counted.local.prompt });
        assert_eq!((c.method.as_str(), c.estimated, c.total), ("tokenizer", false, counted.local.prompt));
        assert_eq!(c.parts.system, segments[0], "the system message's segment (BOS with it)");
        assert_eq!(c.parts.user, segments[1] + segments[4]);
        assert_eq!(c.parts.tool_results, segments[3]);
        assert_eq!(c.parts.assistant + c.parts.reasoning, segments[2]);
        assert_eq!(c.parts.other, counted.local.prompt - *ends.last().unwrap() as u64, "the generation prompt");
        // SmolLM2's template renders no reasoning_content: the segment has no room for it.
        let [text, reasoning] = ["Done.", "The user wants the file read, so I read it."].map(|t| cache.encode_text(t).len() as u64);
        assert!(segments[2] - text < reasoning, "{segments:?}: the template kept the reasoning after all");
        assert_eq!((c.parts.reasoning, c.parts.assistant), (0, segments[2]));
    }

    #[test]
    fn apportion_sums_to_the_total() {
        assert_eq!(apportion(10, &[1, 1, 1]), [4, 3, 3]);
        assert_eq!(apportion(7, &[0, 5, 0]), [0, 7, 0]);
        assert_eq!(apportion(5, &[0, 0]), [0, 0]);
        let shares = apportion(1_000_003, &[3, 999, 17, 250_000, 1]);
        assert_eq!(shares.iter().sum::<u64>(), 1_000_003);
        assert!(apportion(3, &[]).is_empty());
    }

    #[test]
    fn the_shape_cache_stays_bounded_within_one_request() {
        let values: Vec<Value> = (0..MAX_SHAPES + 10).map(|i| json!({"role": "user", "content": format!("message {i}")})).collect();
        let messages: Vec<Message> = values.iter().cloned().map(Message::new).collect();
        let hashes: Vec<Hash> = values.iter().map(|v| ctxscope_store::message_hash(v).0).collect();
        let request = Request { messages: &messages, hashes: &hashes, tools_hash: None, body: b"{}" };
        let mut composer = Composer::default();
        let c = composer.compose(&request, None, Count::None);
        assert_eq!(c.total, c.parts.sum());
        assert!(composer.shapes.len() <= MAX_SHAPES, "{} shapes held after one request", composer.shapes.len());
    }

    #[test]
    fn composer_reads_tools_once_and_caches_shapes() {
        let body = br#"{"model":"m","tools":[{"type":"function","function":{"name":"ls","parameters":{}}}],"messages":[{"role":"user","content":"hi"}]}"#;
        let messages = [Message::new(json!({"role": "user", "content": "hi"}))];
        let hashes = [ctxscope_store::message_hash(&messages[0]).0];
        let request = Request { messages: &messages, hashes: &hashes, tools_hash: Some("h"), body };
        let mut composer = Composer::default();
        let c = composer.compose(&request, None, Count::None);
        let tools_bytes = r#"[{"function":{"name":"ls","parameters":{}},"type":"function"}]"#.len() as u64;
        assert_eq!((c.parts.tools, c.parts.user), (tools_bytes.div_ceil(4), 1));
        // The same hash again: not read from the body (an empty one here).
        let again = Request { body: b"{}", ..request };
        assert_eq!(composer.compose(&again, None, Count::None).parts.tools, tools_bytes.div_ceil(4));
        assert_eq!(composer.shapes.len(), 1);
    }
}
