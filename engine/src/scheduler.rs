//! The scheduler: one thread that owns the model's compute, admits requests (prefix-cache lookup),
//! and runs continuous batching: every step feeds each active sequence either its next prefill chunk
//! or its last sampled token, all in one forward pass per computation path, then samples.
//! Results go back over per-request channels; a closed channel cancels the sequence.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::mpsc::UnboundedSender;

use crate::forward::{forward_patched, Path, Segment};
use crate::kv::{KvCache, PrefixCache};
use crate::model::Model;
use crate::patch::{PatchSet, WEAK_HASH_BLOCK};
use crate::sample::{Sampled, Sampler, SamplingParams};

/// Limits of the scheduler.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Context length (positions per sequence); at most the model's.
    pub ctx: usize,
    /// Sequences computed together; more wait in line.
    pub max_batch: usize,
    /// Tokens fed per step across all sequences (bounds decode latency while others prefill).
    pub step_tokens: usize,
    /// Tokens of finished sequences kept for prefix reuse.
    pub prefix_cache_tokens: usize,
}

impl EngineOptions {
    pub fn for_model(model: &Model) -> EngineOptions {
        EngineOptions { ctx: model.config.ctx_len, max_batch: 16, step_tokens: 512, prefix_cache_tokens: 32_768 }
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token (EOS, `<|im_end|>`, ...).
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

/// What a request hears back, in order: `Started`, `Token`*, then `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Started { prompt_tokens: usize, cached_tokens: usize },
    Token(Sampled),
    Done { finish: Finish, completion_tokens: usize },
    Error(String),
}

/// One generation request.
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub path: Path,
    /// Patches this request runs under (the empty set: none).
    pub patches: PatchSet,
    pub events: UnboundedSender<Event>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the engine has stopped")]
    Stopped,
}

/// Submits requests to the scheduler thread; cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<GenerateRequest>,
    pub model: Arc<Model>,
    pub options: EngineOptions,
}

impl EngineHandle {
    pub fn submit(&self, request: GenerateRequest) -> Result<(), EngineError> {
        self.tx.send(request).map_err(|_| EngineError::Stopped)
    }
}

/// Starts the scheduler thread; it runs until every handle is dropped.
pub fn start(model: Arc<Model>, options: EngineOptions) -> (EngineHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let worker_model = model.clone();
    let worker_options = options.clone();
    let thread = std::thread::Builder::new()
        .name("ctxscope-engine".into())
        .spawn(move || Scheduler::new(worker_model, worker_options, rx).run())
        .expect("spawning the engine thread");
    (EngineHandle { tx, model, options }, thread)
}

struct Sequence {
    request: GenerateRequest,
    kv: KvCache,
    /// Tokens not yet fed: the rest of the prompt, or the last sampled token.
    pending: Vec<u32>,
    /// Every token whose KV is computed or pending, in order.
    tokens: Vec<u32>,
    generated: usize,
    sampler: Sampler,
    namespace: String,
}

struct Scheduler {
    model: Arc<Model>,
    options: EngineOptions,
    rx: Receiver<GenerateRequest>,
    waiting: VecDeque<GenerateRequest>,
    active: Vec<Sequence>,
    prefix: PrefixCache,
}

impl Scheduler {
    fn new(model: Arc<Model>, options: EngineOptions, rx: Receiver<GenerateRequest>) -> Scheduler {
        let prefix = PrefixCache::new(options.prefix_cache_tokens);
        Scheduler { model, options, rx, waiting: VecDeque::new(), active: Vec::new(), prefix }
    }

    fn run(mut self) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                match self.rx.recv() {
                    Ok(request) => self.waiting.push_back(request),
                    Err(_) => return,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(request) => self.waiting.push_back(request),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.active.is_empty() && self.waiting.is_empty() => return,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.admit();
            self.cancel_closed();
            // One forward pass per (path, patch set) in use; unpatched golden first, as before.
            let mut groups: Vec<(Path, PatchSet)> = vec![(Path::Golden, PatchSet::default()), (Path::Fast, PatchSet::default())];
            for seq in &self.active {
                let key = (seq.request.path, seq.request.patches.clone());
                if !groups.contains(&key) {
                    groups.push(key);
                }
            }
            for (path, patches) in groups {
                self.step(path, &patches);
            }
        }
    }

    fn admit(&mut self) {
        while self.active.len() < self.options.max_batch {
            let Some(mut request) = self.waiting.pop_front() else { break };
            if request.events.is_closed() {
                continue;
            }
            // Context faults: the model sees (and usage reports) the prompt the imitated engine keeps.
            if let Some(kept) = request.patches.rewrite_prompt(&request.prompt) {
                request.prompt = kept;
            }
            let limit = self.options.ctx;
            if request.prompt.is_empty() || request.prompt.len() >= limit {
                let message = if request.prompt.is_empty() {
                    "the prompt is empty".to_string()
                } else {
                    format!("the prompt has {} tokens; this engine's context is {limit} tokens", request.prompt.len())
                };
                let _ = request.events.send(Event::Error(message));
                continue;
            }
            let namespace = format!("{}|{}|{}", self.model.fingerprint, request.path.as_str(), request.patches.canonical());
            let c = &self.model.config;
            let patches = &request.patches;
            let found = if patches.prefix_cache_off {
                None
            } else if patches.prefix_cache_weak_hash {
                self.prefix.lookup_weak(&namespace, &request.prompt, WEAK_HASH_BLOCK)
            } else {
                self.prefix.lookup(&namespace, &request.prompt)
            };
            let (kv, cached) = found.unwrap_or_else(|| (KvCache::new(c.n_layers, c.kv_dim()), 0));
            let _ = request.events.send(Event::Started { prompt_tokens: request.prompt.len(), cached_tokens: cached });
            let sampler = Sampler::new(request.sampling.clone());
            self.active.push(Sequence {
                pending: request.prompt[cached..].to_vec(),
                tokens: request.prompt.clone(),
                kv,
                generated: 0,
                sampler,
                namespace,
                request,
            });
        }
    }

    fn cancel_closed(&mut self) {
        let (closed, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active).into_iter().partition(|s| s.request.events.is_closed());
        self.active = open;
        for seq in closed {
            self.retire(seq);
        }
    }

    /// Feeds this path's sequences once and samples those whose pending input is consumed.
    fn step(&mut self, path: Path, patches: &PatchSet) {
        let mut budget = self.options.step_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new();
        for (i, seq) in self.active.iter().enumerate() {
            if seq.request.path != path || seq.request.patches != *patches || seq.pending.is_empty() || budget == 0 {
                continue;
            }
            let take = seq.pending.len().min(budget);
            budget -= take;
            plan.push((i, take));
        }
        if plan.is_empty() {
            return;
        }
        let mut chunks: Vec<Vec<u32>> = plan.iter().map(|(i, take)| self.active[*i].pending[..*take].to_vec()).collect();
        let logits = {
            let mut refs: Vec<&mut Sequence> = Vec::new();
            let mut rest: &mut [Sequence] = &mut self.active;
            let mut offset = 0;
            for (i, _) in &plan {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - offset);
                let (head, tail) = tail.split_first_mut().expect("planned index exists");
                refs.push(head);
                rest = tail;
                offset = i + 1;
            }
            let mut segments: Vec<Segment<'_>> =
                refs.into_iter().zip(chunks.iter_mut()).map(|(seq, tokens)| Segment { tokens, kv: &mut seq.kv }).collect();
            forward_patched(&self.model, path, patches, &mut segments)
        };
        let mut finished = Vec::new();
        for ((i, take), logits) in plan.into_iter().zip(logits) {
            let seq = &mut self.active[i];
            seq.pending.drain(..take);
            if !seq.pending.is_empty() {
                continue;
            }
            if let Some(finish) = Self::emit(&self.model, &self.options, seq, &logits) {
                let _ = seq.request.events.send(Event::Done { finish, completion_tokens: seq.generated });
                finished.push(i);
            }
        }
        for i in finished.into_iter().rev() {
            let seq = self.active.remove(i);
            self.retire(seq);
        }
    }

    /// Samples the next token; returns why the sequence ends, if it does.
    fn emit(model: &Model, options: &EngineOptions, seq: &mut Sequence, logits: &[f32]) -> Option<Finish> {
        let sampled = seq.sampler.sample(logits);
        let token = sampled.token;
        if model.stop_tokens.contains(&token) {
            return Some(Finish::Stop);
        }
        seq.generated += 1;
        if seq.request.events.send(Event::Token(sampled)).is_err() {
            return Some(Finish::Stop);
        }
        seq.tokens.push(token);
        if seq.generated >= seq.request.max_tokens || seq.kv.len() + 1 >= options.ctx {
            return Some(Finish::Length);
        }
        seq.pending.push(token);
        None
    }

    /// Offers a sequence's computed KV to the prefix cache.
    fn retire(&mut self, seq: Sequence) {
        if seq.request.patches.prefix_cache_off {
            return;
        }
        let computed = seq.kv.len();
        let mut tokens = seq.tokens;
        tokens.truncate(computed);
        self.prefix.insert(&seq.namespace, tokens, seq.kv);
    }
}
