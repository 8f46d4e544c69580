//! The capture pipeline, run on the worker thread for each exchange:
//! parse -> hash -> thread -> count tokens -> commit -> metrics -> detect -> raise. Everything a turn
//! writes is collected into one `TurnDraft` and committed as one store transaction; findings follow,
//! so a finding never names a turn that is not written. Any failure drops the capture of that one
//! exchange (counted by reason); the traffic it describes has long since been served.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ctxscope_store::{
    chain_next, extend_chain, message_hash, to_hex, CaptureLevel, ContextLimit, ConversationRecord, Endpoint, FindingRecord, Hash, IdSpace,
    ResponsesInfo, RetentionPolicy, Store, StoreError, Timing, TurnDraft, TurnRecord, ZERO_HASH,
};

use super::composition::{Composer, Count};
use super::exchange::{Exchange, Outcome};
use super::hashes::MessageHashes;
use super::known::KnownRequests;
use super::queue::Sink;
use super::responses::{self, Chained};
use super::sink::AlertSink;
use super::thread::{self, Decision};
use super::tokens::{Counted, TokenCache};
use super::upstream_count::{Prompt, UpstreamCounter};
use crate::detect::{DetectConfig, Detectors, Draft, Observation};
use crate::metrics::{self as m, DropReason};
use crate::parse::{self, message, ParseError, ParsedResponse};

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("request body over the capture limit")]
    TooLarge,
    #[error("upstream unreachable before the request body was sent")]
    NothingSent,
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CaptureError {
    fn reason(&self) -> DropReason {
        match self {
            CaptureError::TooLarge => DropReason::BodyTooLarge,
            CaptureError::NothingSent => DropReason::Parse,
            CaptureError::Parse(_) => DropReason::Parse,
            CaptureError::Store(_) => DropReason::StoreWrite,
        }
    }
}

/// Turns exchanges into stored turns.
pub struct Pipeline {
    store: Store,
    upstream: String,
    tokens: Option<TokenCache>,
    /// Counts through the upstream's endpoints when there is no local tokenizer (`--count-with`).
    upstream_counter: Option<UpstreamCounter>,
    retention: RetentionPolicy,
    warnings: Throttle,
    hashes: MessageHashes,
    known: KnownRequests,
    detectors: Detectors,
    sinks: Vec<Box<dyn AlertSink>>,
    /// The upstream's engine fingerprint, stamped on every turn (and re-checked when it was unreachable).
    fingerprints: Option<crate::fingerprint::Fingerprints>,
    /// Told of every store write's outcome (`/healthz` says `degraded` while they fail).
    health: Option<std::sync::Arc<crate::health::CaptureHealth>>,
    /// When the store last recorded its high-water marks (`Store::checkpoint`).
    checkpointed: Instant,
    /// Latest replies of recent conversations (threading a compaction that kept only the system prompt).
    recent_replies: thread::RecentReplies,
    /// Set after sled failed to write: when to try reopening it next, and the wait after that.
    reopen: Option<(Instant, Duration)>,
    /// How much of each turn's text is stored (`--capture`; `privacy`).
    capture: CaptureLevel,
    /// Each turn's prompt by part (message shapes cached across turns).
    composer: Composer,
    /// `--context-limit`: the limit every turn is measured against, whatever the engine says.
    context_limit: Option<u64>,
    /// The limit last read from a fingerprint: its hash, the model asked for, the answer.
    fingerprint_limit: Option<(String, Option<String>, Option<ContextLimit>)>,
    /// `ctxscope_context_pressure{upstream}`, registered on the first turn with a limit.
    pressure: Option<metrics::Gauge>,
}

/// The first wait before reopening a store whose writes failed, and the longest (the wait doubles
/// between tries): capture resumes within about this long of space returning.
const REOPEN_FIRST: Duration = Duration::from_millis(100);
const REOPEN_LONGEST: Duration = Duration::from_secs(2);

/// At most one warning per interval; the rest are counted and reported with the next one.
struct Throttle {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    fn warn(&mut self, path: &str, error: &CaptureError) {
        let due = self.last.is_none_or(|t| t.elapsed() >= Self::EVERY);
        if due {
            tracing::warn!(path, %error, suppressed = self.suppressed, "capture dropped; traffic unaffected");
            self.last = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
    }
}

impl Pipeline {
    pub fn new(store: Store, upstream: String, tokens: Option<TokenCache>, retention: RetentionPolicy) -> Pipeline {
        let detectors = Detectors::new(DetectConfig::default());
        let warnings = Throttle { last: None, suppressed: 0 };
        Pipeline {
            store,
            upstream,
            tokens,
            upstream_counter: None,
            retention,
            warnings,
            hashes: MessageHashes::default(),
            known: KnownRequests::default(),
            detectors,
            sinks: Vec::new(),
            fingerprints: None,
            health: None,
            checkpointed: Instant::now(),
            recent_replies: Default::default(),
            reopen: None,
            capture: CaptureLevel::Full,
            composer: Composer::default(),
            context_limit: None,
            fingerprint_limit: None,
            pressure: None,
        }
    }

    /// Measures every turn against a context limit of `tokens` (`--context-limit`), whatever the
    /// engine's fingerprint says.
    pub fn with_context_limit(mut self, tokens: u64) -> Pipeline {
        self.context_limit = Some(tokens).filter(|t| *t > 0);
        self
    }

    /// Counts prompts through the upstream (used when no local tokenizer is configured).
    pub fn with_upstream_counter(mut self, counter: UpstreamCounter) -> Pipeline {
        self.upstream_counter = Some(counter);
        self
    }

    /// Reports store write failures and recoveries to `health`.
    pub fn with_health(mut self, health: std::sync::Arc<crate::health::CaptureHealth>) -> Pipeline {
        self.health = Some(health);
        self
    }

    /// Stamps every turn with the upstream's current engine fingerprint.
    pub fn with_fingerprints(mut self, fingerprints: crate::fingerprint::Fingerprints) -> Pipeline {
        self.fingerprints = Some(fingerprints);
        self
    }

    /// Stores each turn's text at `level` (`--capture`): whole, masked, or not at all. Hashes,
    /// threading and detection are the same at every level (`privacy`).
    pub fn with_capture(mut self, level: CaptureLevel) -> Pipeline {
        self.capture = level;
        self
    }

    /// Runs the detectors with `config` instead of the defaults.
    pub fn with_detect_config(mut self, config: DetectConfig) -> Pipeline {
        self.detectors = Detectors::new(config);
        self
    }

    /// Also sends every new finding to `sink`.
    pub fn with_sink(mut self, sink: Box<dyn AlertSink>) -> Pipeline {
        self.sinks.push(sink);
        self
    }

    /// Captures one exchange; returns the stored turn.
    pub fn capture(&mut self, exchange: &Exchange) -> Result<TurnRecord, CaptureError> {
        self.capture_with_findings(exchange).map(|(turn, _)| turn)
    }

    /// Captures one exchange; returns the stored turn and the findings it raised.
    pub fn capture_with_findings(&mut self, exchange: &Exchange) -> Result<(TurnRecord, Vec<FindingRecord>), CaptureError> {
        let request_copy = exchange.request.lock().map(|c| (c.overflow, c.complete, c.total, c.to_vec())).unwrap_or_default();
        let (overflow, complete, request_bytes, body) = request_copy;
        if let (Outcome::UpstreamUnreachable(_), Some(fingerprints)) = (&exchange.outcome, &self.fingerprints) {
            fingerprints.recheck();
        }
        if overflow {
            return Err(CaptureError::TooLarge);
        }
        if let (Outcome::UpstreamUnreachable(_), true) = (&exchange.outcome, body.is_empty()) {
            // The upstream never read the body: nothing to record beyond the 502 already counted.
            return Err(CaptureError::NothingSent);
        }
        let body = bytes::Bytes::from(body);
        // The parse tree dies with the turn: its blocks are scratch (ctxscope_common::scratch).
        let mut parsed = ctxscope_common::scratch::scope(|| self.known.parse(exchange.endpoint, &body))?;
        let (mut hashes, mut chain) = (std::mem::take(&mut parsed.hashes), std::mem::take(&mut parsed.chain));
        let new_from = hashes.len();
        hashes.extend(parsed.request.messages[new_from..].iter().map(|m| self.hashes.hash(m)));
        extend_chain(&mut chain, &hashes[new_from..]);
        self.known.remember(&body, &parsed, &hashes, &chain);
        let mut request = parsed.request;
        let mut notes = Vec::new();
        if !complete {
            notes.push("request body did not finish".to_string());
        }
        // A Responses request stands on the chain its previous_response_id names.
        let chained = responses::expand(&self.store, &mut request, &mut notes)?;
        let response = self.response(exchange, request.stream, &mut notes);

        if let Some((at, stored)) = chained.as_ref().and_then(|c| c.spliced.as_ref()) {
            // A Responses chain's messages went in front of the request's own, with the hashes they
            // were stored under (of the messages as sent, whatever the capture level kept of them).
            hashes.splice(*at..*at, stored.iter().copied());
            chain.clear();
            extend_chain(&mut chain, &hashes);
        }
        // A chain known by its hashes only (captured with --capture hashes) is not counted: its
        // messages stand in the request as nulls.
        let textless = chained.as_ref().is_some_and(|c| c.textless);
        let threading = thread::Request {
            messages: &request.messages,
            hashes: &hashes,
            chain: &chain,
            model: request.model.as_deref(),
            endpoint: exchange.endpoint,
            recent: &self.recent_replies,
            capture: self.capture,
        };
        let decision = match &chained {
            Some(Chained { parent: Some(parent), .. }) => responses::decide(&self.store, parent, &chain)?,
            Some(Chained { info, .. }) if info.parent_unknown => responses::unknown_parent(),
            _ => thread::decide(&self.store, &threading, exchange.conversation_name.as_deref())?,
        };
        let base_len = decision.base.map_or(0, |b| b.len as usize).min(hashes.len());

        // Only the messages this turn adds are stored (the rest are in its base), under the hashes
        // of the messages as sent, as much of their text as the capture level keeps.
        let level = self.capture;
        let kept = |message: &serde_json::Value| match level {
            CaptureLevel::Hashes => Vec::new(),
            _ => crate::privacy::message_json(level, message_hash(message).1),
        };
        let mut new_messages: Vec<(Hash, Vec<u8>)> =
            request.messages[base_len..].iter().zip(&hashes[base_len..]).map(|(m, hash)| (*hash, kept(m))).collect();
        let ok = exchange.status.is_some_and(|s| (200..300).contains(&s));
        let reply = match (&response.reply_message, ok) {
            (Some(message), true) => {
                let hash = message_hash(message).0;
                new_messages.push((hash, kept(message)));
                Some(hash)
            }
            _ => None,
        };
        let head = chain.last().copied().unwrap_or(ZERO_HASH);
        let tail = reply.map(|r| chain_next(&head, &r));
        // Templates render JSON values: with a local tokenizer, every message is parsed (and copied
        // once); the upstream counter reads them only when it asks the upstream.
        let values = if self.tokens.is_some() && !textless { message::values(&request.messages) } else { Vec::new() };
        let mut counted = self.tokens.as_mut().filter(|_| !textless).and_then(|t| t.count(exchange.endpoint, &values, &chain, base_len));
        let mut local_tokens = counted.as_ref().map(|c| c.local.clone());
        if let (None, Some(counter), false) = (&self.tokens, self.upstream_counter.as_mut(), textless) {
            // Responses turns are counted as the chat they map to (their tools are not: another shape).
            let responses = exchange.endpoint == Endpoint::Responses;
            let tools_hash = request.tools.as_ref().filter(|_| !responses).map(|t| t.hash.as_str());
            let prompt = Prompt {
                endpoint: if responses { Endpoint::ChatCompletions } else { exchange.endpoint },
                model: request.model.as_deref(),
                messages: &request.messages,
                head,
                tools_hash,
                body: &body,
            };
            if let Some(count) = counter.count(&prompt, exchange.authorization.as_ref()) {
                // Ids where the endpoint gave them; no per-message split (the detectors then bound by the whole prompt).
                counted = count.ids.map(|ids| Counted { local: count.local.clone(), ids: ids.to_vec(), segment_ends: Vec::new() });
                local_tokens = Some(count.local);
            }
        }

        let mut composition =
            self.compose(exchange.endpoint, &request, &hashes, &body, counted.as_ref(), local_tokens.as_ref(), &response, ok);
        composition.limit = self.context_limit(request.model.as_deref());

        let (conversation_id, index) = match &decision.conversation {
            Some(c) => (c.id, c.turns),
            None => (self.store.next_id_in(IdSpace::Conversation)?, 0),
        };
        let turn_id = self.store.next_id_in(IdSpace::Turn)?;
        let error = describe_error(&exchange.outcome, &response);
        notes.extend(response.notes.iter().cloned());
        let turn = TurnRecord {
            id: turn_id,
            conversation: conversation_id,
            index,
            relation: decision.relation.clone(),
            time_unix_ms: exchange.time_unix_ms,
            upstream: self.upstream.clone(),
            endpoint: exchange.endpoint,
            method: exchange.method.clone(),
            path: exchange.path.clone(),
            model: request.model.clone(),
            status: exchange.status.unwrap_or(0),
            stream: request.stream,
            params: request.params.clone(),
            base: decision.base,
            new_messages: hashes[base_len..].to_vec(),
            message_count: hashes.len() as u32,
            head: to_hex(&head),
            reply: reply.as_ref().map(to_hex),
            tail: tail.as_ref().map(to_hex),
            local_tokens,
            usage: response.usage.clone(),
            composition: Some(composition),
            timing: Timing { headers_us: exchange.headers_us, ttfb_us: exchange.ttfb_us, total_us: exchange.total_us },
            chunks: if request.stream { response.events } else { exchange.frames },
            request_bytes,
            response_bytes: exchange.response.total,
            reply_text: response.reply_text.clone(),
            finish_reason: response.finish_reason.clone(),
            error,
            notes,
            tools: request.tools.clone(),
            responses: chained.map(|c| ResponsesInfo {
                response_id: response.response_id.clone(),
                dropped_items: response.dropped_items.clone(),
                ..c.info
            }),
            fingerprint: self.fingerprints.as_ref().and_then(|f| f.current()),
            capture: level,
        };
        let conversation = next_conversation(decision, &turn, exchange.conversation_name.clone());
        // What is stored (and journaled, alerted, exported) is the turn at its capture level; the
        // detectors read the turn as captured, its text in memory (`live`).
        let (live, stored) = match crate::privacy::stored_turn(level, &turn) {
            Some(stored) => (Some(turn), stored),
            None => (None, turn),
        };
        let draft = TurnDraft { messages: new_messages, chain, tail, turn: stored, conversation };
        self.store.commit_turn(&draft)?;
        if let (Some(first), true) = (hashes.first(), ok) {
            // In memory only, like every text the detectors read.
            let reply = live.as_ref().map_or(&draft.turn.reply_text, |t| &t.reply_text);
            self.recent_replies.push(draft.turn.conversation, *first, reply);
        }
        let TurnDraft { turn, .. } = draft;
        let live = live.as_ref().unwrap_or(&turn);
        record_metrics(&turn);
        if let Some(pressure) = turn.composition.as_ref().and_then(|c| c.pressure()) {
            let upstream = &self.upstream;
            self.pressure.get_or_insert_with(|| metrics::gauge!(m::CONTEXT_PRESSURE, "upstream" => upstream.clone())).set(pressure);
        }

        if !self.detectors.config().enabled {
            return Ok((turn, Vec::new()));
        }
        let started = Instant::now();
        let reply_ids = match (&self.tokens, &counted) {
            (Some(tokens), Some(_)) => Some(tokens.encode_text(&live.reply_text)),
            _ => None,
        };
        let observation = Observation {
            turn: live,
            messages: &request.messages,
            hashes: &hashes,
            prompt_ids: counted.as_ref().map(|c| c.ids.as_slice()),
            segment_ends: counted.as_ref().map(|c| c.segment_ends.as_slice()),
            reply_ids,
            error_object: response.error_object.as_ref(),
        };
        let mut raised = Vec::new();
        for draft in self.detectors.observe(&self.store, &observation)? {
            raised.extend(self.raise(&turn, draft)?);
        }
        metrics::histogram!(m::DETECT_SECONDS).record(started.elapsed().as_secs_f64());
        Ok((turn, raised))
    }

    /// Stores a finding unless its cause was raised before; counts it and hands it to the sinks.
    fn raise(&self, turn: &TurnRecord, draft: Draft) -> Result<Option<FindingRecord>, StoreError> {
        if self.store.has_cause(&draft.cause)? {
            return Ok(None);
        }
        let (mut summary, mut evidence) = (draft.summary, crate::detect::bound::evidence(draft.evidence));
        // Stored, alerted and exported at the turn's capture level: masked, or without quotes.
        crate::privacy::finding(turn.capture, &mut summary, &mut evidence);
        let finding = FindingRecord {
            id: self.store.next_id_in(IdSpace::Finding)?,
            kind: draft.kind,
            severity: draft.severity,
            time_unix_ms: turn.time_unix_ms,
            upstream: turn.upstream.clone(),
            model: turn.model.clone(),
            conversation: turn.conversation,
            turn: turn.id,
            turn_index: turn.index,
            summary,
            evidence,
            cause: draft.cause,
        };
        if !self.store.put_finding(&finding)? {
            return Ok(None);
        }
        metrics::counter!(m::FINDINGS_TOTAL, "kind" => finding.kind.as_str(), "severity" => finding.severity.as_str()).increment(1);
        tracing::warn!(kind = finding.kind.as_str(), conversation = finding.conversation, turn = finding.turn, summary = %finding.summary, "finding");
        for sink in &self.sinks {
            sink.send(&finding);
        }
        Ok(Some(finding))
    }

    /// The prompt's composition, counted the best way this turn allows: the local tokenizer's
    /// segments, else a whole-prompt count (the local one, the upstream's, the engine's usage), else
    /// bytes (see `composition`).
    #[allow(clippy::too_many_arguments)]
    fn compose(
        &mut self,
        endpoint: Endpoint,
        request: &parse::ParsedRequest,
        hashes: &[Hash],
        body: &[u8],
        counted: Option<&Counted>,
        local: Option<&ctxscope_store::LocalTokens>,
        response: &ParsedResponse,
        ok: bool,
    ) -> ctxscope_store::Composition {
        let segments: Vec<u64> = match counted {
            Some(c) if self.tokens.is_some() && c.segment_ends.len() == request.messages.len() => {
                c.segment_ends.iter().scan(0, |at, end| Some((*end - std::mem::replace(at, *end)) as u64)).collect()
            }
            _ => Vec::new(),
        };
        let engine = response.usage.as_ref().and_then(|u| u.prompt_tokens).filter(|_| ok);
        let count = match (counted, local, engine) {
            (Some(c), _, _) if self.tokens.is_some() => Count::Segments { segments: &segments, prompt: c.local.prompt },
            // The upstream counted Responses turns as chat, without their tools (another shape).
            (_, Some(l), _) => Count::Whole { prompt: l.prompt, method: "upstream", with_tools: endpoint != Endpoint::Responses },
            (_, None, Some(prompt)) => Count::Whole { prompt, method: "engine_usage", with_tools: true },
            _ => Count::None,
        };
        let input = super::composition::Request {
            messages: &request.messages,
            hashes,
            tools_hash: request.tools.as_ref().map(|t| t.hash.as_str()),
            body,
        };
        self.composer.compose(&input, self.tokens.as_ref(), count)
    }

    /// The context limit of this turn: `--context-limit`, else what the engine's current
    /// fingerprint says for `model` (read from the store when the fingerprint or model changes).
    fn context_limit(&mut self, model: Option<&str>) -> Option<ContextLimit> {
        if let Some(tokens) = self.context_limit {
            return Some(ContextLimit { tokens, source: "--context-limit".into() });
        }
        let hash = self.fingerprints.as_ref()?.current()?;
        if let Some((known, asked, limit)) = &self.fingerprint_limit {
            if *known == hash && asked.as_deref() == model {
                return limit.clone();
            }
        }
        let limit = self.store.fingerprint(&hash).ok().flatten().and_then(|print| print.context_limit(model));
        self.fingerprint_limit = Some((hash, model.map(str::to_string), limit.clone()));
        limit
    }

    fn response(&self, exchange: &Exchange, streaming: bool, notes: &mut Vec<String>) -> ParsedResponse {
        let Some(status) = exchange.status else { return ParsedResponse::default() };
        if exchange.response.overflow {
            notes.push(format!("response of {} bytes over the capture limit; not parsed", exchange.response.total));
            return ParsedResponse::default();
        }
        let body = exchange.response.to_vec();
        // Like the request's, the parse of a long stream's events is scratch.
        ctxscope_common::scratch::scope(|| {
            parse::response(exchange.endpoint, exchange.response_content_type.as_deref(), status, &body, streaming)
        })
    }
}

/// The conversation record after `turn`: the decided conversation moved on to it, or a new one.
/// (The store moves the conversation's indexes, ends and latest reply, when it commits the turn.)
fn next_conversation(decision: Decision, turn: &TurnRecord, name: Option<String>) -> ConversationRecord {
    let mut conversation = match decision.conversation {
        Some(mut c) => {
            c.last_reply = turn.reply.clone();
            c.turns += 1;
            c.updated_unix_ms = turn.time_unix_ms;
            c.last_turn = turn.id;
            c.last_head = turn.head.clone();
            c.last_message_count = turn.message_count;
            c.last_tail = turn.tail.clone();
            if turn.model.is_some() {
                c.model = turn.model.clone();
            }
            c.capture = c.capture.max(turn.capture);
            c
        }
        None => ConversationRecord {
            id: turn.conversation,
            name: None,
            created_unix_ms: turn.time_unix_ms,
            updated_unix_ms: turn.time_unix_ms,
            upstream: turn.upstream.clone(),
            model: turn.model.clone(),
            turns: 1,
            last_turn: turn.id,
            last_head: turn.head.clone(),
            last_message_count: turn.message_count,
            last_tail: turn.tail.clone(),
            branch_of: decision.branch_of,
            last_reply: turn.reply.clone(),
            capture: turn.capture,
        },
    };
    if conversation.name.is_none() {
        conversation.name = name;
    }
    conversation
}

fn describe_error(outcome: &Outcome, response: &ParsedResponse) -> Option<String> {
    match outcome {
        Outcome::Complete => response.error.clone(),
        Outcome::ClientGone => Some("client disconnected before the response finished; upstream request cancelled".into()),
        Outcome::UpstreamStreamError(e) => Some(format!("upstream response failed mid-stream: {e}")),
        Outcome::UpstreamUnreachable(e) => Some(format!("upstream unreachable: {e}")),
    }
}

fn record_metrics(turn: &TurnRecord) {
    metrics::counter!(m::TURNS_CAPTURED_TOTAL).increment(1);
    let usage = turn.usage.as_ref();
    let prompt = usage.and_then(|u| u.prompt_tokens).or(turn.local_tokens.as_ref().map(|l| l.prompt));
    if let Some(prompt) = prompt {
        metrics::histogram!(m::PROMPT_TOKENS).record(prompt as f64);
    }
    if let Some(cached) = usage.and_then(|u| u.cached_tokens) {
        metrics::histogram!(m::CACHED_TOKENS).record(cached as f64);
    }
    if let Some(ttfb) = turn.timing.ttfb_us {
        metrics::histogram!(m::TTFB_SECONDS).record(ttfb as f64 / 1e6);
    }
}

impl Pipeline {
    /// Schedules a reopen after an error that sled keeps until reopened ([`Pipeline::heal`]).
    fn reopen_after(&mut self, error: &StoreError) {
        if error.needs_reopen() && self.reopen.is_none() {
            self.reopen = Some((Instant::now() + REOPEN_FIRST, REOPEN_FIRST));
        }
    }

    /// After sled failed to write, reopens it once the wait is over (doubling the wait, up to
    /// [`REOPEN_LONGEST`], while it cannot be reopened: the disk still full). The exchanges that fail
    /// meanwhile are counted as dropped; none is stored in part.
    fn heal(&mut self) {
        let Some((at, wait)) = self.reopen else { return };
        if Instant::now() < at {
            return;
        }
        match self.store.reopen(Duration::from_millis(500)) {
            Ok(()) => {
                self.reopen = None;
                metrics::counter!(m::STORE_REOPENS_TOTAL).increment(1);
                tracing::info!("capture store reopened after write errors; capture resumes");
            }
            Err(error) => {
                let wait = (wait * 2).min(REOPEN_LONGEST);
                self.reopen = Some((Instant::now() + wait, wait));
                if let Some(health) = &self.health {
                    health.write_failed(&error);
                }
            }
        }
    }
}

impl Sink for Pipeline {
    fn process(&mut self, mut exchange: Exchange) {
        self.heal();
        let started = Instant::now();
        let reply = exchange.findings_reply.take();
        let raised = match self.capture_with_findings(&exchange) {
            Ok((turn, findings)) => {
                self.health.iter().for_each(|h| h.write_succeeded());
                self.sinks.iter().for_each(|sink| sink.turn(&exchange, &turn, &findings));
                findings
            }
            Err(CaptureError::NothingSent) => Vec::new(),
            Err(error) => {
                if let CaptureError::Store(store_error) = &error {
                    if let Some(health) = &self.health {
                        health.write_failed(store_error);
                    }
                    self.reopen_after(store_error);
                }
                m::dropped(error.reason());
                self.warnings.warn(&exchange.path, &error);
                Vec::new()
            }
        };
        if let Some(reply) = reply {
            let _ = reply.send(raised.iter().map(|f| f.kind.as_str()).collect());
        }
        metrics::histogram!(m::CAPTURE_SECONDS).record(started.elapsed().as_secs_f64());
        // Every 2 s of capture: flush and record what is durable, so that damage found on the next
        // open is noticed (see docs/capture.md).
        if self.checkpointed.elapsed() >= Duration::from_secs(2) {
            self.checkpointed = Instant::now();
            if let Err(error) = self.store.checkpoint() {
                tracing::warn!(%error, "store checkpoint failed");
                self.reopen_after(&error);
            }
        }
    }

    fn idle(&mut self) {
        self.heal();
    }

    fn upkeep(&mut self) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64;
        match self.store.apply_retention(&self.retention, now) {
            Ok(report) if report.conversations > 0 => tracing::info!(?report, "retention pass"),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "retention pass failed"),
        }
    }

    fn finish(&mut self) {
        if let Err(error) = self.store.checkpoint() {
            tracing::error!(%error, "final store flush failed");
        }
    }
}
