//! Unit tests of chat-template rendering: the ChatML fallback, content-part flattening, the
//! Hugging Face Jinja extras (trim/lstrip blocks, `.strip()`, loop controls, `raise_exception`,
//! `tojson`) and the shapes of `tokenizer_config.json` `chat_template`.

use serde_json::json;

use super::*;

fn opts(add_generation_prompt: bool) -> RenderOptions<'static> {
    RenderOptions { add_generation_prompt, bos_token: "<s>", eos_token: "</s>", tools: None }
}

#[test]
fn chatml_fallback_renders_and_says_it_is_a_fallback() {
    let t = ChatTemplate::chatml_fallback();
    assert!(t.is_fallback());
    let msgs = [json!({"role": "user", "content": "hi"})];
    assert_eq!(t.render(&msgs, &opts(false)).unwrap(), "<|im_start|>user\nhi<|im_end|>\n");
    assert_eq!(t.render(&msgs, &opts(true)).unwrap(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert!(!ChatTemplate::new("x").unwrap().is_fallback());
}

#[test]
fn content_parts_are_joined_and_null_content_is_empty() {
    let t = ChatTemplate::new("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}").unwrap();
    let msgs = [
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}),
    ];
    assert_eq!(t.render(&msgs, &opts(false)).unwrap(), "[user:a\nb][assistant:]");
    let bad = [json!({"content": "no role"})];
    assert!(matches!(t.render(&bad, &opts(false)), Err(TemplateError::InvalidMessage { index: 0, .. })));
    let bad = [json!({"role": "user", "content": 3})];
    assert!(matches!(t.render(&bad, &opts(false)), Err(TemplateError::InvalidMessage { .. })));
}

#[test]
fn supports_what_hf_templates_use() {
    let src = "{% for m in messages %}\n  {% if loop.index0 == 1 %}{% continue %}{% endif %}\n{{ bos_token }}{{ m.content.strip() | upper }}{{ m | tojson }}|\n{% endfor %}";
    let t = ChatTemplate::new(src).unwrap();
    let msgs = [json!({"role": "user", "content": "  x "}), json!({"role": "user", "content": "skip"})];
    // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one.
    assert_eq!(t.render(&msgs, &opts(false)).unwrap(), "<s>X{\"content\": \"  x \", \"role\": \"user\"}|\n");

    let t = ChatTemplate::new("{% if messages | length > 1 %}{{ raise_exception('only one message') }}{% endif %}ok").unwrap();
    assert_eq!(t.render(&msgs[..1], &opts(false)).unwrap(), "ok");
    let err = t.render(&msgs, &opts(false)).unwrap_err();
    assert!(err.to_string().contains("only one message"), "{err}");

    let t = ChatTemplate::new("{{ tools | tojson }}{{ strftime_now('%Y') | length }}").unwrap();
    let tools = json!([{"type": "function"}]);
    let o = RenderOptions { tools: Some(&tools), ..opts(false) };
    assert_eq!(t.render(&[], &o).unwrap(), "[{\"type\": \"function\"}]4");

    assert!(matches!(ChatTemplate::new("{% for %}"), Err(TemplateError::Syntax(_))));
}

#[test]
fn reads_tokenizer_config_shapes() {
    assert!(ChatTemplate::from_tokenizer_config(&json!({})).unwrap().is_none());
    let t = ChatTemplate::from_tokenizer_config(&json!({"chat_template": "A"})).unwrap().unwrap();
    assert_eq!(t.source(), "A");
    let list = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
    assert_eq!(ChatTemplate::from_tokenizer_config(&list).unwrap().unwrap().source(), "D");
    assert!(ChatTemplate::from_tokenizer_config(&json!({"chat_template": 5})).is_err());
}
