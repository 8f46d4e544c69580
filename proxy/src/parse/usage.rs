//! Engine-reported usage in every form we know, normalised into one [`Usage`]:
//! OpenAI `usage` (with `prompt_tokens_details.cached_tokens`, or DeepSeek's `prompt_cache_hit_tokens`),
//! llama.cpp `timings` (`prompt_n` evaluated + `cache_n` reused), Ollama `prompt_eval_count`/`eval_count`,
//! and Anthropic `input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens`.

use ctxscope_store::Usage;
use serde_json::Value;

fn num(value: &Value, key: &str) -> Option<u64> {
    value.get(key).and_then(Value::as_u64)
}

fn entry<'a>(acc: &'a mut Option<Usage>, source: &str) -> &'a mut Usage {
    let usage = acc.get_or_insert_with(Usage::default);
    if !usage.sources.iter().any(|s| s == source) {
        usage.sources.push(source.to_string());
    }
    usage
}

/// Folds whatever usage `object` (a response, or one stream chunk) carries into `acc`.
/// OpenAI-form fields win over llama.cpp timings when both are present.
pub fn absorb(object: &Value, acc: &mut Option<Usage>) {
    if let Some(usage) = object.get("usage").filter(|u| u.is_object()) {
        if usage.get("input_tokens").is_some() || usage.get("output_tokens").is_some() {
            anthropic(usage, acc);
        } else if usage.get("prompt_tokens").is_some() || usage.get("completion_tokens").is_some() {
            let u = entry(acc, "openai");
            u.prompt_tokens = num(usage, "prompt_tokens").or(u.prompt_tokens);
            u.completion_tokens = num(usage, "completion_tokens").or(u.completion_tokens);
            let cached = usage
                .get("prompt_tokens_details")
                .and_then(|d| num(d, "cached_tokens"))
                .or_else(|| num(usage, "prompt_cache_hit_tokens"))
                .or_else(|| num(usage, "cached_tokens"));
            u.cached_tokens = cached.or(u.cached_tokens);
        }
    }
    if let Some(timings) = object.get("timings").filter(|t| t.is_object()) {
        let (prompt_n, cache_n) = (num(timings, "prompt_n"), num(timings, "cache_n"));
        if prompt_n.is_some() || cache_n.is_some() {
            let u = entry(acc, "llama.cpp_timings");
            if u.prompt_tokens.is_none() {
                u.prompt_tokens = Some(prompt_n.unwrap_or(0) + cache_n.unwrap_or(0));
            }
            if u.cached_tokens.is_none() {
                u.cached_tokens = cache_n;
            }
            if u.completion_tokens.is_none() {
                u.completion_tokens = num(timings, "predicted_n");
            }
        }
    }
    if object.get("prompt_eval_count").is_some() || object.get("eval_count").is_some() {
        let u = entry(acc, "ollama");
        u.prompt_tokens = num(object, "prompt_eval_count").or(u.prompt_tokens);
        u.completion_tokens = num(object, "eval_count").or(u.completion_tokens);
    }
}

/// Anthropic splits the prompt into uncached input, cache reads and cache writes.
pub fn anthropic(usage: &Value, acc: &mut Option<Usage>) {
    let u = entry(acc, "anthropic");
    let input = num(usage, "input_tokens");
    let read = num(usage, "cache_read_input_tokens");
    let created = num(usage, "cache_creation_input_tokens");
    if input.is_some() || read.is_some() || created.is_some() {
        let total = input.unwrap_or(0) + read.unwrap_or(0) + created.unwrap_or(0);
        // message_delta repeats usage with only output_tokens set; do not let it zero the prompt.
        if total > 0 || u.prompt_tokens.is_none() {
            u.prompt_tokens = Some(total);
            u.cached_tokens = Some(read.unwrap_or(0));
        }
    }
    u.completion_tokens = num(usage, "output_tokens").or(u.completion_tokens);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn usage(v: Value) -> Usage {
        let mut acc = None;
        absorb(&v, &mut acc);
        acc.expect("usage found")
    }

    #[test]
    fn openai_with_cached_details() {
        let u = usage(json!({"usage": {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}}));
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.cached_tokens), (Some(100), Some(5), Some(64)));
        assert_eq!(u.sources, vec!["openai"]);
    }

    #[test]
    fn llama_cpp_timings_fill_what_usage_lacks() {
        let u = usage(
            json!({"usage": {"prompt_tokens": 120, "completion_tokens": 8}, "timings": {"prompt_n": 20, "cache_n": 100, "predicted_n": 8}}),
        );
        assert_eq!((u.prompt_tokens, u.cached_tokens), (Some(120), Some(100)));
        let t = usage(json!({"timings": {"prompt_n": 20, "cache_n": 100, "predicted_n": 8}}));
        assert_eq!((t.prompt_tokens, t.cached_tokens, t.completion_tokens), (Some(120), Some(100), Some(8)));
    }

    #[test]
    fn ollama_native_counts() {
        let u = usage(json!({"done": true, "prompt_eval_count": 2048, "eval_count": 12}));
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.cached_tokens), (Some(2048), Some(12), None));
    }

    #[test]
    fn anthropic_prompt_includes_cache_reads_and_writes() {
        let u = usage(
            json!({"usage": {"input_tokens": 10, "cache_read_input_tokens": 500, "cache_creation_input_tokens": 30, "output_tokens": 7}}),
        );
        assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), (Some(540), Some(500), Some(7)));
    }

    #[test]
    fn deepseek_cache_hit_tokens() {
        let u = usage(json!({"usage": {"prompt_tokens": 90, "completion_tokens": 1, "prompt_cache_hit_tokens": 64}}));
        assert_eq!(u.cached_tokens, Some(64));
    }

    #[test]
    fn null_usage_is_ignored() {
        let mut acc = None;
        absorb(&json!({"usage": null, "choices": []}), &mut acc);
        assert!(acc.is_none());
    }
}
