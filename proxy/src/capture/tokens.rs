//! Local token counting with the upstream model's tokenizer and chat template, cached per prefix
//! chain hash so that each request only tokenizes the messages it adds.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ctxscope_formats::template::ChatFormatChoice;
use ctxscope_formats::{CounterError, TokenCounter};
use ctxscope_store::{Endpoint, Hash, LocalTokens};
use serde_json::Value;

/// Bound on the cache's memory, ids and entries (about 120 bytes beside the ids of each); the cache
/// is cleared when full (tokens are cheap to redo). It was 16 M tokens: up to 160 MB held.
const MAX_CACHED_BYTES: usize = 32 << 20;

/// What an entry costs beside its ids: the key, the `Arc`'s header and pointer, the table's slack.
const ENTRY_BYTES: usize = 112;

/// The rendering a request may spend on splitting its uncounted messages, in messages rendered:
/// segment i costs two renders of messages 0..=i, so splitting is quadratic in the uncounted run
/// (20,000 new messages took minutes). Past this the prompt is counted whole, in one render.
const MAX_SPLIT_WORK: usize = 4_000_000;

/// A counted prompt: the stored counts and the token ids the detectors compare across prompts.
pub struct Counted {
    pub local: LocalTokens,
    /// The whole prompt's token ids (BOS, message segments, generation prompt).
    pub ids: Vec<u32>,
    /// Where message i's segment ends in `ids` (empty when the prompt could not be split per message).
    pub segment_ends: Vec<usize>,
}

pub struct TokenCache {
    counter: Arc<TokenCounter>,
    /// Chain hash of messages 0..=i -> token ids of message i's rendered segment.
    segments: HashMap<Hash, Arc<[u32]>>,
    cached_bytes: usize,
    /// Ids of the generation prompt the template appends (`<|im_start|>assistant\n`), for formats
    /// that do not give it per conversation.
    generation: Vec<u32>,
    name: String,
}

impl TokenCache {
    pub fn open(path: &Path) -> Result<TokenCache, CounterError> {
        Self::open_with(path, ChatFormatChoice::Auto)
    }

    /// [`TokenCache::open`] with the chat format chosen (`--chat-format`).
    pub fn open_with(path: &Path, format: ChatFormatChoice) -> Result<TokenCache, CounterError> {
        let counter = TokenCounter::open_with(path, format)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let generation = generation_ids(&counter);
        Ok(TokenCache { counter: Arc::new(counter), segments: HashMap::new(), cached_bytes: 0, generation, name })
    }

    /// Token ids of free text (a reply), without BOS or special-token parsing.
    pub fn encode_text(&self, text: &str) -> Vec<u32> {
        self.counter.tokenizer().encode(text, false)
    }

    /// Tokens that tool definitions add to a prompt that starts with `messages` (the template's
    /// render with them less without; 0 for a template that does not render tools).
    pub fn tools_tokens(&self, messages: &[Value], tools: &Value) -> Option<u64> {
        self.counter.tools_tokens(messages, tools).ok().map(|n| n as u64)
    }

    /// Counts the prompt; `new_from` is the index of the first message in the turn's delta.
    pub fn count(&mut self, endpoint: Endpoint, messages: &[Value], chain: &[Hash], new_from: usize) -> Option<Counted> {
        let bos: Vec<u32> = self.counter.tokenizer().bos().filter(|_| self.counter.bos_tokens() > 0).into_iter().collect();
        if endpoint == Endpoint::Completions {
            let prompt = messages.first()?.get("content")?.as_str()?;
            let mut ids = bos;
            ids.extend(self.counter.tokenizer().encode(prompt, true));
            let n = ids.len() as u32;
            let segment_ends = vec![ids.len()];
            return Some(Counted {
                local: LocalTokens { prompt: n as u64, new_messages: vec![n], tokenizer: self.name.clone() },
                ids,
                segment_ends,
            });
        }
        if self.cached_bytes > MAX_CACHED_BYTES {
            self.segments = HashMap::new();
            self.cached_bytes = 0;
        }
        // Too many uncounted messages for their split's renders: the whole prompt once instead,
        // exact in total, without the per-message counts.
        let uncounted = chain.iter().take(messages.len()).filter(|link| !self.segments.contains_key(*link)).count();
        if uncounted.saturating_mul(2 * messages.len()) > MAX_SPLIT_WORK {
            return self.whole(messages);
        }
        let mut ids = bos;
        let mut counts = Vec::with_capacity(messages.len());
        let mut segment_ends = Vec::with_capacity(messages.len());
        for (i, link) in chain.iter().enumerate().take(messages.len()) {
            let segment = match self.segments.get(link) {
                Some(s) => s.clone(),
                None => match self.counter.segment(messages, i).ok()? {
                    Some(text) => {
                        let s: Arc<[u32]> = self.counter.tokenizer().encode(&text, true).into();
                        self.cached_bytes += 4 * s.len() + ENTRY_BYTES;
                        self.segments.insert(*link, s.clone());
                        s
                    }
                    // A template whose renders are not prefixes of each other: count the whole prompt.
                    None => return self.whole(messages),
                },
            };
            // A template that writes BOS itself (Llama 3's `{{ bos_token }}`) gets it once: engines
            // strip the rendered one when they add their own (llama.cpp does).
            if i == 0 && !ids.is_empty() && segment.first() == ids.first() {
                ids.clear();
            }
            counts.push(segment.len() as u32);
            ids.extend_from_slice(&segment);
            segment_ends.push(ids.len());
        }
        // Built-in formats know this conversation's generation prompt (after DeepSeek V3.2 tool
        // results it differs from the one after a user message).
        match self.counter.generation_prompt(messages).ok()? {
            Some(text) => ids.extend(self.counter.tokenizer().encode(&text, true)),
            None => ids.extend_from_slice(&self.generation),
        }
        let local = LocalTokens {
            prompt: ids.len() as u64,
            new_messages: counts[new_from.min(counts.len())..].to_vec(),
            tokenizer: self.name.clone(),
        };
        Some(Counted { local, ids, segment_ends })
    }

    fn whole(&self, messages: &[Value]) -> Option<Counted> {
        let text = self.counter.render(messages, true).ok()?;
        let mut ids = self.counter.tokenizer().encode(&text, true);
        let bos = self.counter.tokenizer().bos();
        if self.counter.bos_tokens() > 0 && ids.first().copied() != bos {
            ids.splice(0..0, bos);
        }
        Some(Counted {
            local: LocalTokens { prompt: ids.len() as u64, new_messages: Vec::new(), tokenizer: self.name.clone() },
            ids,
            segment_ends: Vec::new(),
        })
    }
}

/// The generation prompt's ids: the render with it minus the render without it, on a probe message.
fn generation_ids(counter: &TokenCounter) -> Vec<u32> {
    let probe = [serde_json::json!({"role": "user", "content": "x"})];
    match (counter.render(&probe, true), counter.render(&probe, false)) {
        (Ok(with), Ok(without)) => with.strip_prefix(without.as_str()).map(|g| counter.tokenizer().encode(g, true)).unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxscope_store::{chain_next, message_hash, ZERO_HASH};
    use serde_json::json;

    fn model() -> std::path::PathBuf {
        ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))
    }

    fn chain(messages: &[Value]) -> Vec<Hash> {
        let mut h = ZERO_HASH;
        messages
            .iter()
            .map(|m| {
                h = chain_next(&h, &message_hash(m).0);
                h
            })
            .collect()
    }

    #[test]
    fn incremental_counts_equal_a_full_count_and_only_new_messages_are_tokenized() {
        let mut cache = TokenCache::open(&model()).unwrap();
        let counter = cache.counter.clone();
        let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
        for turn in 0..5 {
            messages.push(json!({"role": "user", "content": format!("Question {turn}: what is {turn} squared?")}));
            let before = cache.segments.len();
            let counted = cache.count(Endpoint::ChatCompletions, &messages, &chain(&messages), messages.len() - 1).unwrap();
            let local = counted.local;
            assert_eq!(local.prompt as usize, counter.count_prompt(&messages).unwrap(), "turn {turn}");
            // The assembled ids are the whole render's tokenization.
            let text = counter.render(&messages, true).unwrap();
            let whole = counter.tokenizer().encode(&text, true);
            assert_eq!(counted.ids[counted.ids.len() - whole.len()..], whole[..], "turn {turn}");
            // Only the new question was tokenized (the reply was counted when it was last in line).
            assert_eq!(cache.segments.len() - before, if turn == 0 { 2 } else { 1 });
            assert_eq!(local.new_messages.len(), 1);
            messages.push(json!({"role": "assistant", "content": format!("{}", turn * turn)}));
            let next_chain = chain(&messages);
            cache.count(Endpoint::ChatCompletions, &messages, &next_chain, messages.len() - 1).unwrap();
        }
    }

    #[test]
    fn many_uncounted_messages_are_counted_whole_not_split() {
        let mut cache = TokenCache::open(&model()).unwrap();
        let counter = cache.counter.clone();
        let n = (MAX_SPLIT_WORK as f64 / 2.0).sqrt() as usize + 10;
        let messages: Vec<Value> =
            (0..n).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message {i}")})).collect();
        let counted = cache.count(Endpoint::ChatCompletions, &messages, &chain(&messages), 0).unwrap();
        assert_eq!(counted.local.prompt as usize, counter.count_prompt(&messages).unwrap());
        assert!(counted.local.new_messages.is_empty() && counted.segment_ends.is_empty(), "no per-message split");
        assert!(cache.segments.is_empty(), "nothing rendered per message");
        // Fewer are split per message, and cached.
        let few = &messages[..64];
        let counted = cache.count(Endpoint::ChatCompletions, few, &chain(few), 0).unwrap();
        assert_eq!(counted.local.new_messages.len(), 64);
        assert_eq!(cache.segments.len(), 64);
    }
}
