//! The scheduler: one thread that owns the model's compute, admits requests (prefix-cache lookup),
//! and runs continuous batching: every step feeds each active sequence either its next prefill chunk
//! or its last sampled token, all in one forward pass per computation path, then samples.
//! Results go back over per-request channels; a closed channel cancels the sequence.
//!
//! The forward pass runs on a [`Backend`] built on the scheduler thread itself (a GPU backend is bound
//! to its thread). A failed step ends the requests in it with an error; the others carry on.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::mpsc::UnboundedSender;

use crate::backend::{Backend, BackendError, Output, SequenceKv, Step, Want};
use crate::cpu::CpuBackend;
use crate::forward::Path;
use crate::kv::PrefixCache;
use crate::model::Model;
use crate::patch::{PatchSet, WEAK_HASH_BLOCK};
use crate::sample::{Sampled, Sampler, SamplingParams};
use crate::tuning::DeviceTuning;

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
    /// How the CUDA backend runs (read once at the edge: [`DeviceTuning::from_env`]).
    pub device: DeviceTuning,
}

impl EngineOptions {
    pub fn for_model(model: &Model) -> EngineOptions {
        EngineOptions {
            ctx: model.config.ctx_len,
            max_batch: 16,
            step_tokens: 512,
            prefix_cache_tokens: 32_768,
            device: DeviceTuning::default(),
        }
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
    /// The backend's name (`cpu`, `cuda:0`, ...).
    pub backend: String,
}

impl EngineHandle {
    pub fn submit(&self, request: GenerateRequest) -> Result<(), EngineError> {
        self.tx.send(request).map_err(|_| EngineError::Stopped)
    }
}

/// Starts the scheduler thread on the CPU backend; it runs until every handle is dropped.
pub fn start(model: Arc<Model>, options: EngineOptions) -> (EngineHandle, JoinHandle<()>) {
    let cpu_model = model.clone();
    start_backend(model, options, move || Ok(CpuBackend::new(cpu_model))).expect("starting the engine thread (CPU)")
}

/// Starts the scheduler thread, builds its backend there with `make` and returns once it is built:
/// a backend that cannot start (no GPU, out of memory) is this call's error. The thread runs until
/// every handle is dropped.
pub fn start_backend<B, F>(model: Arc<Model>, options: EngineOptions, make: F) -> Result<(EngineHandle, JoinHandle<()>), BackendError>
where
    B: Backend + 'static,
    F: FnOnce() -> Result<B, BackendError> + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<String, BackendError>>();
    let worker_model = model.clone();
    let worker_options = options.clone();
    let thread = std::thread::Builder::new()
        .name("ctxscope-engine".into())
        .spawn(move || match make() {
            Ok(backend) => {
                let _ = ready_tx.send(Ok(backend.name()));
                Scheduler::new(backend, worker_model, worker_options, rx).run();
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| BackendError::new("engine", format!("cannot start the engine thread: {e}")))?;
    let backend = match ready_rx.recv() {
        Ok(ready) => ready?,
        Err(_) => return Err(BackendError::new("engine", "the engine thread stopped while its backend was starting")),
    };
    Ok((EngineHandle { tx, model, options, backend }, thread))
}

struct Sequence<K> {
    request: GenerateRequest,
    kv: K,
    /// Tokens not yet fed: the rest of the prompt, or the last sampled token.
    pending: Vec<u32>,
    /// Every token whose KV is computed or pending, in order.
    tokens: Vec<u32>,
    generated: usize,
    sampler: Sampler,
    namespace: String,
}

impl<K> Sequence<K> {
    /// What this sequence needs from a step: the greedy token alone suffices unless it samples or
    /// reports top alternatives; a backend that samples draws with this request's next uniform.
    fn want(&mut self, backend_samples: bool) -> Want {
        let s = &self.request.sampling;
        let top = s.logprobs && s.top_logprobs > 0;
        if s.temperature <= 0.0 && !top {
            Want::Greedy
        } else if backend_samples && !top {
            Want::Sample { temperature: s.temperature, top_p: s.top_p, uniform: self.sampler.uniform() as f32 }
        } else {
            Want::Logits
        }
    }
}

struct Scheduler<B: Backend> {
    backend: B,
    model: Arc<Model>,
    options: EngineOptions,
    rx: Receiver<GenerateRequest>,
    waiting: VecDeque<GenerateRequest>,
    active: Vec<Sequence<B::Kv>>,
    prefix: PrefixCache<B::Kv>,
}

impl<B: Backend> Scheduler<B> {
    fn new(backend: B, model: Arc<Model>, options: EngineOptions, rx: Receiver<GenerateRequest>) -> Scheduler<B> {
        let prefix = PrefixCache::new(options.prefix_cache_tokens);
        Scheduler { backend, model, options, rx, waiting: VecDeque::new(), active: Vec::new(), prefix }
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
            let (kv, cached) = match self.start_kv(&namespace, &request) {
                Ok(found) => found,
                Err(e) => {
                    let _ = request.events.send(Event::Error(e.to_string()));
                    continue;
                }
            };
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

    /// The cache a new sequence starts from: the longest reusable prefix, else an empty one.
    fn start_kv(&mut self, namespace: &str, request: &GenerateRequest) -> Result<(B::Kv, usize), BackendError> {
        let patches = &request.patches;
        let found = if patches.prefix_cache_off {
            None
        } else if patches.prefix_cache_weak_hash {
            self.prefix.lookup_weak(namespace, &request.prompt, WEAK_HASH_BLOCK)?
        } else {
            self.prefix.lookup(namespace, &request.prompt)?
        };
        match found {
            Some(found) => Ok(found),
            None => Ok((self.backend.new_kv()?, 0)),
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
        // A prefill chunk that leaves prompt pending has its output ignored: the cheapest will do.
        let samples = self.backend.samples();
        let wants: Vec<Want> = plan
            .iter()
            .map(|&(i, take)| if take < self.active[i].pending.len() { Want::Greedy } else { self.active[i].want(samples) })
            .collect();
        let continues = self.continues(path, patches, &plan);
        let outputs = {
            let mut planned = plan.iter().zip(&wants).peekable();
            let mut steps: Vec<Step<'_, B::Kv>> = Vec::with_capacity(plan.len());
            for (i, seq) in self.active.iter_mut().enumerate() {
                if let Some((&(_, take), &want)) = planned.next_if(|((p, _), _)| *p == i) {
                    steps.push(Step { tokens: &seq.pending[..take], kv: &mut seq.kv, want });
                }
            }
            self.backend.expect_continuation(continues);
            self.backend.forward(path, patches, &mut steps).and_then(|outputs| {
                if outputs.len() == steps.len() {
                    Ok(outputs)
                } else {
                    let message = format!("returned {} outputs for {} sequences", outputs.len(), steps.len());
                    Err(BackendError::new("engine", message))
                }
            })
        };
        let outputs = match outputs {
            Ok(outputs) => outputs,
            Err(e) => {
                // Every sequence of the failed step ends; their KV may be half-written, so it is
                // dropped rather than offered to the prefix cache.
                for (i, _) in plan.into_iter().rev() {
                    let seq = self.active.remove(i);
                    let _ = seq.request.events.send(Event::Error(e.to_string()));
                }
                return;
            }
        };
        // Sequences that end here, ascending, and whether their KV is worth keeping.
        let mut ended: Vec<(usize, bool)> = Vec::new();
        for (((i, take), want), output) in plan.into_iter().zip(wants).zip(outputs) {
            let seq = &mut self.active[i];
            seq.pending.drain(..take);
            if !seq.pending.is_empty() {
                continue;
            }
            let sampled = match (output, want) {
                (Output::Logits(logits), _) => seq.sampler.sample(&logits),
                (Output::Token { token, logprob }, Want::Greedy | Want::Sample { .. }) => Sampled { token, logprob, top: Vec::new() },
                (Output::Token { .. }, Want::Logits) => {
                    let e = BackendError::new("engine", format!("{} returned a token where the request needs logits", self.backend.name()));
                    let _ = seq.request.events.send(Event::Error(e.to_string()));
                    ended.push((i, false));
                    continue;
                }
            };
            if let Some(finish) = Self::emit(&self.model, &self.options, seq, sampled) {
                let _ = seq.request.events.send(Event::Done { finish, completion_tokens: seq.generated });
                ended.push((i, true));
            }
        }
        for (i, keep) in ended.into_iter().rev() {
            let seq = self.active.remove(i);
            if keep {
                self.retire(seq);
            }
        }
    }

    /// Whether the step after this one will likely be its continuation ([`Backend::expect_continuation`]):
    /// nothing waits to be admitted, every active sequence is in this (path, patches) group and in the
    /// plan, each finishes its pending input here, and none reaches its token or context limit with it
    /// (a stop token or a new request can still end the run: a hint, not a promise).
    fn continues(&self, path: Path, patches: &PatchSet, plan: &[(usize, usize)]) -> bool {
        self.waiting.is_empty()
            && plan.len() == self.active.len()
            && self.active.iter().all(|s| s.request.path == path && s.request.patches == *patches)
            && plan.iter().all(|&(i, take)| {
                let s = &self.active[i];
                take == s.pending.len() && s.generated + 1 < s.request.max_tokens && s.kv.len() + take + 1 < self.options.ctx
            })
    }

    /// Records the next token; returns why the sequence ends, if it does.
    fn emit(model: &Model, options: &EngineOptions, seq: &mut Sequence<B::Kv>, sampled: Sampled) -> Option<Finish> {
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
    fn retire(&mut self, seq: Sequence<B::Kv>) {
        if seq.request.patches.prefix_cache_off {
            return;
        }
        let computed = seq.kv.len();
        let mut tokens = seq.tokens;
        tokens.truncate(computed);
        self.prefix.insert(&seq.namespace, tokens, seq.kv);
    }
}
