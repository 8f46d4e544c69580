//! Local token counting with the upstream model's tokenizer and chat template, cached per prefix
//! chain hash so that each request only tokenizes the messages it adds.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ctxscope_formats::{CounterError, TokenCounter};
use ctxscope_store::{Endpoint, Hash, LocalTokens};
use serde_json::Value;

/// Bound on cached per-message counts; the cache is cleared when full (counts are cheap to redo).
const MAX_ENTRIES: usize = 1 << 20;

pub struct TokenCache {
    counter: Arc<TokenCounter>,
    /// Chain hash of messages 0..=i -> token count of message i's rendered segment.
    segments: HashMap<Hash, u32>,
    name: String,
}

impl TokenCache {
    pub fn open(path: &Path) -> Result<TokenCache, CounterError> {
        let counter = TokenCounter::open(path)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(TokenCache { counter: Arc::new(counter), segments: HashMap::new(), name })
    }

    /// Counts the prompt; `new_from` is the index of the first message in the turn's delta.
    pub fn count(&mut self, endpoint: Endpoint, messages: &[Value], chain: &[Hash], new_from: usize) -> Option<LocalTokens> {
        if endpoint == Endpoint::Completions {
            let prompt = messages.first()?.get("content")?.as_str()?;
            let n = self.counter.count_text(prompt) as u32;
            return Some(LocalTokens { prompt: n as u64, new_messages: vec![n], tokenizer: self.name.clone() });
        }
        if self.segments.len() > MAX_ENTRIES {
            self.segments.clear();
        }
        let mut counts = Vec::with_capacity(messages.len());
        for i in 0..messages.len() {
            let count = match self.segments.get(&chain[i]) {
                Some(c) => *c,
                None => match self.counter.segment(messages, i).ok()? {
                    Some(segment) => {
                        let c = self.counter.count_segment(&segment) as u32;
                        self.segments.insert(chain[i], c);
                        c
                    }
                    // A template whose renders are not prefixes of each other: count the whole prompt.
                    None => return self.whole(messages),
                },
            };
            counts.push(count);
        }
        let fixed = self.counter.generation_prompt_tokens() + self.counter.bos_tokens();
        let prompt = counts.iter().map(|c| *c as u64).sum::<u64>() + fixed as u64;
        Some(LocalTokens { prompt, new_messages: counts[new_from.min(counts.len())..].to_vec(), tokenizer: self.name.clone() })
    }

    fn whole(&self, messages: &[Value]) -> Option<LocalTokens> {
        let prompt = self.counter.count_prompt(messages).ok()? as u64;
        Some(LocalTokens { prompt, new_messages: Vec::new(), tokenizer: self.name.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxscope_store::{chain_next, message_hash, ZERO_HASH};
    use serde_json::json;

    fn model() -> std::path::PathBuf {
        let path = std::env::var_os("CTXSCOPE_MODEL")
            .map(Into::into)
            .unwrap_or_else(|| ctxscope_formats::default_model_path().expect("a home directory"));
        assert!(path.exists(), "model {} missing: run scripts/fetch-model.sh", path.display());
        path
    }

    fn chain(messages: &[Value]) -> Vec<Hash> {
        let mut h = ZERO_HASH;
        messages.iter().map(|m| { h = chain_next(&h, &message_hash(m).0); h }).collect()
    }

    #[test]
    fn incremental_counts_equal_a_full_count_and_only_new_messages_are_tokenized() {
        let mut cache = TokenCache::open(&model()).unwrap();
        let counter = cache.counter.clone();
        let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
        for turn in 0..5 {
            messages.push(json!({"role": "user", "content": format!("Question {turn}: what is {turn} squared?")}));
            let before = cache.segments.len();
            let local = cache.count(Endpoint::ChatCompletions, &messages, &chain(&messages), messages.len() - 1).unwrap();
            assert_eq!(local.prompt as usize, counter.count_prompt(&messages).unwrap(), "turn {turn}");
            // Only the new question was tokenized (the reply was counted when it was last in line).
            assert_eq!(cache.segments.len() - before, if turn == 0 { 2 } else { 1 });
            assert_eq!(local.new_messages.len(), 1);
            messages.push(json!({"role": "assistant", "content": format!("{}", turn * turn)}));
            let next_chain = chain(&messages);
            cache.count(Endpoint::ChatCompletions, &messages, &next_chain, messages.len() - 1).unwrap();
        }
    }
}
