//! Which reasoning each model family's chat format needs sent back ([`ReasoningRule`]), as data
//! (`reasoning.json` beside this file): the proxy uses it to tell a harness that drops reasoning
//! the model must see (a DeepSeek tool-call loop) from one that drops what the template drops anyway.

use std::sync::LazyLock;

use serde::Deserialize;

/// Which assistant messages must keep their reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Those after the last user instruction (the current tool-call loop).
    ToolLoop,
    /// Every one.
    All,
    /// None: the template drops all reasoning.
    None,
}

/// One family's rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningRule {
    pub family: String,
    /// Substrings of the request's model name (lowercase) that select the rule.
    #[serde(default)]
    pub models: Vec<String>,
    /// APIs (`chat_completions`, `anthropic_messages`, `responses`, ...) that select the rule when no model name did.
    #[serde(default)]
    pub apis: Vec<String>,
    pub keep: Keep,
    /// The family's own documentation of the rule, in brief.
    pub why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rules {
    #[serde(rename = "_doc")]
    _doc: String,
    rules: Vec<ReasoningRule>,
    default: ReasoningRule,
}

static RULES: LazyLock<Rules> =
    LazyLock::new(|| serde_json::from_str(include_str!("reasoning.json")).expect("the built-in reasoning rules parse (a test checks)"));

/// The rule for a request: the first whose model substring the model name contains, else the first
/// whose API matches, else the default.
pub fn reasoning_rule(model: Option<&str>, api: &str) -> &'static ReasoningRule {
    let model = model.unwrap_or("").to_lowercase();
    let rules = &RULES.rules;
    rules
        .iter()
        .find(|r| r.models.iter().any(|m| model.contains(m.as_str())))
        .or_else(|| rules.iter().find(|r| r.apis.iter().any(|a| a == api)))
        .unwrap_or(&RULES.default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_pick_by_model_then_api() {
        assert_eq!(reasoning_rule(Some("deepseek-ai/DeepSeek-V4-Flash"), "chat").family, "deepseek");
        assert_eq!(reasoning_rule(Some("Qwen/Qwen3-32B"), "chat").keep, Keep::ToolLoop);
        assert_eq!(reasoning_rule(Some("MiniMax-M2"), "chat").keep, Keep::All);
        assert_eq!(reasoning_rule(Some("local-model"), "anthropic_messages").family, "anthropic");
        assert_eq!(reasoning_rule(None, "responses").family, "openai_responses");
        assert_eq!(reasoning_rule(Some("SmolLM2"), "chat_completions").family, "default");
    }
}
