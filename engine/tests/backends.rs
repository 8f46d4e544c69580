//! The same scheduler tests on every backend: each body is written once, generic over [`Backend`], and
//! instantiated for the CPU and (with the `cuda` feature, when a GPU is there) for the CUDA backend.
//! The bodies hold for any model, random weights included (`CTXSCOPE_MODEL` may name one): they compare
//! the engine with itself (prefix reuse against a cold run, batched against alone, the greedy output
//! against full logits) and check that backend failures end only the requests they touch.

mod common;

use ctxscope_engine::backend::{Backend, BackendError, Output, Step};
use ctxscope_engine::sample::{Sampled, SamplingParams};
use ctxscope_engine::scheduler::{self, EngineHandle, EngineOptions, Event, Finish, GenerateRequest};
use ctxscope_engine::{CpuBackend, Model, PatchSet, Path};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::UnboundedReceiver;

/// Instantiates each body for each backend: `cpu::NAME`, and `cuda::NAME` with the feature.
macro_rules! on_every_backend {
    ($($body:ident),* $(,)?) => {
        mod cpu {
            $(#[test]
            fn $body() {
                super::$body(super::cpu_backend());
            })*
        }

        #[cfg(feature = "cuda")]
        mod cuda {
            $(#[test]
            fn $body() {
                if let Some(make) = super::cuda_backend() {
                    super::$body(make);
                }
            })*
        }
    };
}

on_every_backend!(
    prefix_reuse_matches_a_cold_run,
    batching_matches_single_runs,
    greedy_and_logits_wants_agree,
    seeded_sampling_repeats_and_a_tiny_top_p_is_greedy,
    a_failed_step_ends_only_its_requests,
    a_failed_admission_ends_only_its_request,
    a_backend_that_cannot_start_is_the_start_error,
    continuation_hints_follow_the_schedule,
);

/// Engine limits for every test; a backend is built with these (bodies change only the prefix cache,
/// which is the scheduler's, not the backend's).
fn options(model: &Model) -> EngineOptions {
    let device = ctxscope_engine::tuning::DeviceTuning::from_env();
    EngineOptions { ctx: model.config.ctx_len.min(512), max_batch: 8, device, ..EngineOptions::for_model(model) }
}

fn cpu_backend() -> impl Fn() -> Result<CpuBackend, BackendError> + Send + Clone + 'static {
    let model = common::shared_model();
    move || Ok(CpuBackend::new(model.clone()))
}

/// The CUDA backend on GPU 0; `None` (the test skips, saying so) only when this machine has no GPU.
#[cfg(feature = "cuda")]
fn cuda_backend() -> Option<impl Fn() -> Result<ctxscope_engine::device::DeviceBackend, BackendError> + Send + Clone + 'static> {
    let model = common::shared_model();
    let options = options(&model);
    let make = move || ctxscope_engine::device::DeviceBackend::new(model.clone(), 0, &options);
    match make() {
        Ok(_) => Some(make),
        Err(e) if !gpu_present() => {
            eprintln!("skipping the CUDA backend: no GPU on this machine ({e})");
            None
        }
        Err(e) => panic!("this machine has a GPU but the CUDA backend did not start: {e}"),
    }
}

#[cfg(feature = "cuda")]
fn gpu_present() -> bool {
    std::path::Path::new("/dev/nvidia0").exists()
        || std::process::Command::new("nvidia-smi").arg("-L").output().is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
}

/// A running engine that, dropped, stops its thread and waits for it, so that its backend (GPU
/// memory, cuBLAS, the context's modules) is torn down before the test — and, after the last test,
/// the process — ends: a detached engine thread still freeing device memory while the process exits
/// races the CUDA driver's own teardown.
struct Engine {
    handle: Option<EngineHandle>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::ops::Deref for Engine {
    type Target = EngineHandle;

    fn deref(&self) -> &EngineHandle {
        self.handle.as_ref().expect("the engine runs until dropped")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The scheduler stops once its last handle is gone.
        drop(self.handle.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn start<B, F>(make: F, options: EngineOptions) -> Engine
where
    B: Backend + 'static,
    F: FnOnce() -> Result<B, BackendError> + Send + 'static,
{
    let (handle, thread) =
        scheduler::start_backend(common::shared_model(), options, make).unwrap_or_else(|e| panic!("the engine starts: {e}"));
    Engine { handle: Some(handle), thread: Some(thread) }
}

fn tokens(text: &str) -> Vec<u32> {
    let tokens = common::shared_model().tokenizer.encode(text, false);
    assert!(!tokens.is_empty(), "{text:?} encodes to no tokens");
    tokens
}

fn greedy() -> SamplingParams {
    SamplingParams::default()
}

/// What one request heard back.
#[derive(Debug)]
struct Heard {
    started: bool,
    cached: usize,
    sampled: Vec<Sampled>,
    finish: Option<Finish>,
    error: Option<String>,
}

impl Heard {
    fn ids(&self) -> Vec<u32> {
        self.sampled.iter().map(|s| s.token).collect()
    }

    /// Fails the test unless the request finished normally.
    fn done(self) -> Heard {
        assert!(self.started && self.finish.is_some() && self.error.is_none(), "{self:?}");
        self
    }
}

fn submit(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
    patches: PatchSet,
) -> UnboundedReceiver<Event> {
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let request = GenerateRequest { prompt, max_tokens, sampling, path: Path::Golden, patches, events };
    engine.submit(request).expect("the engine is running");
    rx
}

fn hear(mut rx: UnboundedReceiver<Event>) -> Heard {
    let mut heard = Heard { started: false, cached: 0, sampled: Vec::new(), finish: None, error: None };
    loop {
        match rx.blocking_recv().expect("the engine answers before closing the channel") {
            Event::Started { cached_tokens, .. } => (heard.started, heard.cached) = (true, cached_tokens),
            Event::Token(s) => heard.sampled.push(s),
            Event::Done { finish, .. } => heard.finish = Some(finish),
            Event::Error(message) => heard.error = Some(message),
        }
        if heard.finish.is_some() || heard.error.is_some() {
            return heard;
        }
    }
}

fn generate(engine: &EngineHandle, prompt: Vec<u32>, max_tokens: usize, sampling: SamplingParams, patches: PatchSet) -> Heard {
    hear(submit(engine, prompt, max_tokens, sampling, patches))
}

/// (a) A request extending an earlier one's prompt starts from its KV and generates what a cold run
/// of the same prompt (prefix cache off) generates.
fn prefix_reuse_matches_a_cold_run<B: Backend + 'static>(make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static) {
    let model = common::shared_model();
    let engine = start(make, options(&model));
    let first = tokens("Once upon a time, in a small village by the sea,");
    let mut second = first.clone();
    second.extend(tokens(" there lived an old fisherman and his"));
    generate(&engine, first.clone(), 4, greedy(), PatchSet::default()).done();
    let warm = generate(&engine, second.clone(), 6, greedy(), PatchSet::default()).done();
    assert!(warm.cached >= first.len(), "{} tokens reused; the first prompt has {}", warm.cached, first.len());
    let off = PatchSet::parse("prefix_cache_off").expect("a known patch");
    let cold = generate(&engine, second, 6, greedy(), off).done();
    assert_eq!(cold.cached, 0);
    assert_eq!(warm.ids(), cold.ids(), "prefix reuse changed the greedy tokens");
}

/// (b) Four greedy requests computed together give the tokens each gives alone.
fn batching_matches_single_runs<B: Backend + 'static>(make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static) {
    let model = common::shared_model();
    // No prefix reuse: every run computes its whole prompt, alone or batched.
    let engine = start(make, EngineOptions { prefix_cache_tokens: 0, ..options(&model) });
    let prompts: Vec<Vec<u32>> = [
        "The capital of France is",
        "List three prime numbers:",
        "def add(a, b):\n    return",
        "Water boils at a temperature of one hundred degrees",
    ]
    .iter()
    .map(|text| tokens(text))
    .collect();
    let alone: Vec<Vec<u32>> =
        prompts.iter().map(|p| generate(&engine, p.clone(), 5, greedy(), PatchSet::default()).done().ids()).collect();
    let pending: Vec<_> = prompts.iter().map(|p| submit(&engine, p.clone(), 5, greedy(), PatchSet::default())).collect();
    let together: Vec<Vec<u32>> = pending.into_iter().map(|rx| hear(rx).done().ids()).collect();
    assert_eq!(together, alone, "batching changed the greedy tokens");
}

/// (c) A request that needs logits (top alternatives) and a plain greedy one, which a backend may
/// answer with the greedy token alone, choose the same tokens with the same log-probabilities.
fn greedy_and_logits_wants_agree<B: Backend + 'static>(make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static) {
    let model = common::shared_model();
    let engine = start(make, EngineOptions { prefix_cache_tokens: 0, ..options(&model) });
    let prompt = tokens("Roses are red, violets are");
    let plain = generate(&engine, prompt.clone(), 6, greedy(), PatchSet::default()).done();
    let rich_params = SamplingParams { logprobs: true, top_logprobs: 3, ..greedy() };
    let rich = generate(&engine, prompt, 6, rich_params, PatchSet::default()).done();
    assert_eq!(plain.ids(), rich.ids());
    for (p, r) in plain.sampled.iter().zip(&rich.sampled) {
        assert!((p.logprob - r.logprob).abs() < 1e-3, "token {}: logprob {} (greedy) vs {} (logits)", p.token, p.logprob, r.logprob);
        assert!(p.logprob <= 0.0 && p.logprob.is_finite(), "{p:?}");
        assert_eq!(r.top.len(), 3, "{r:?}");
        // Greedy: the chosen token is (tied for) the most likely.
        assert!((r.top[0].1 - r.logprob).abs() < 1e-6, "{r:?}");
    }
}

/// Sampling (on the device where the backend samples, else on the host): the same seed draws the same
/// tokens twice; a top_p so small that only the most likely token is kept draws the greedy tokens; the
/// reported log-probabilities are those of the drawn tokens (finite, <= 0).
fn seeded_sampling_repeats_and_a_tiny_top_p_is_greedy<B: Backend + 'static>(
    make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static,
) {
    let model = common::shared_model();
    let engine = start(make, EngineOptions { prefix_cache_tokens: 0, ..options(&model) });
    let prompt = tokens("The weather today is");
    let warm = SamplingParams { temperature: 0.9, top_p: 0.95, seed: 7, ..greedy() };
    let first = generate(&engine, prompt.clone(), 8, warm.clone(), PatchSet::default()).done();
    let again = generate(&engine, prompt.clone(), 8, warm, PatchSet::default()).done();
    assert_eq!(first.ids(), again.ids(), "the same seed drew different tokens");
    assert!(first.sampled.iter().all(|s| s.logprob <= 0.0 && s.logprob.is_finite()), "{first:?}");
    let plain = generate(&engine, prompt.clone(), 8, greedy(), PatchSet::default()).done();
    let narrow = SamplingParams { temperature: 1.0, top_p: 1e-6, seed: 3, ..greedy() };
    let narrowed = generate(&engine, prompt, 8, narrow, PatchSet::default()).done();
    assert_eq!(narrowed.ids(), plain.ids(), "top_p 1e-6 kept more than the most likely token");
    for (n, p) in narrowed.sampled.iter().zip(&plain.sampled) {
        assert!((n.logprob - p.logprob).abs() < 1e-3, "{n:?} vs {p:?}");
    }
}

/// A backend that defers to the one it wraps (continuation hints included) but fails on demand: the
/// first forward pass of two or more sequences (after computing it, so their KV is written), and the
/// `new_kv` call number `fail_new_kv` (from 0); given a `hints` log, it records each forward's hint.
struct Faulty<B> {
    inner: B,
    fail_batched: bool,
    fail_new_kv: Option<usize>,
    new_kv_calls: usize,
    /// The last hint given, cleared by each forward (so a forward without one logs false).
    hint: bool,
    hints: Option<Arc<Mutex<Vec<Hinted>>>>,
}

impl<B> Faulty<B> {
    fn wrap(inner: B) -> Faulty<B> {
        Faulty { inner, fail_batched: false, fail_new_kv: None, new_kv_calls: 0, hint: false, hints: None }
    }
}

/// What a backend was told before a forward ([`Backend::expect_continuation`]) and what it was asked.
#[derive(Debug, Clone)]
struct Hinted {
    likely: bool,
    path: Path,
    steps: usize,
}

fn injected(what: &str) -> BackendError {
    BackendError::new("faulty", format!("injected {what} failure"))
}

impl<B: Backend> Backend for Faulty<B> {
    type Kv = B::Kv;

    fn name(&self) -> String {
        format!("faulty {}", self.inner.name())
    }

    fn samples(&self) -> bool {
        self.inner.samples()
    }

    fn new_kv(&mut self) -> Result<B::Kv, BackendError> {
        let call = self.new_kv_calls;
        self.new_kv_calls += 1;
        if self.fail_new_kv == Some(call) {
            return Err(injected("new_kv"));
        }
        self.inner.new_kv()
    }

    fn expect_continuation(&mut self, likely: bool) {
        self.hint = likely;
        self.inner.expect_continuation(likely);
    }

    fn forward(&mut self, path: Path, patches: &PatchSet, steps: &mut [Step<'_, B::Kv>]) -> Result<Vec<Output>, BackendError> {
        if let Some(hints) = &self.hints {
            hints.lock().expect("hints").push(Hinted { likely: self.hint, path, steps: steps.len() });
        }
        self.hint = false;
        let outputs = self.inner.forward(path, patches, steps)?;
        if self.fail_batched && steps.len() >= 2 {
            self.fail_batched = false;
            return Err(injected("forward"));
        }
        Ok(outputs)
    }
}

/// The scheduler hints a continuation (the CUDA backend's speculative step) exactly where the next
/// call continues this one: a lone request is hinted on every step but the one that reaches its token
/// limit; a request on the golden path beside one decoding on the fast path never is, since the
/// scheduler alternates between the two; the fast one is again once it is alone.
fn continuation_hints_follow_the_schedule<B: Backend + 'static>(make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static) {
    let model = common::shared_model();
    let log = Arc::new(Mutex::new(Vec::new()));
    let recorder = log.clone();
    let engine = start(move || Ok(Faulty { hints: Some(recorder.clone()), ..Faulty::wrap(make()?) }), options(&model));
    let taken = |log: &Arc<Mutex<Vec<Hinted>>>| std::mem::take(&mut *log.lock().expect("log"));

    let alone = generate(&engine, tokens("Count from one to one hundred: one, two, three,"), 5, greedy(), PatchSet::default()).done();
    let hints = taken(&log);
    assert_eq!(hints.len(), alone.sampled.len(), "one forward per token: {hints:?}");
    if alone.finish == Some(Finish::Length) {
        let (last, before) = hints.split_last().expect("forwards");
        assert!(before.iter().all(|h| h.likely) && !last.likely, "{hints:?}");
    }

    // A fast-path request decoding, then a golden one beside it.
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt = tokens("Count from one to one hundred: one, two, three, four, five,");
    let request = GenerateRequest { prompt, max_tokens: 40, sampling: greedy(), path: Path::Fast, patches: PatchSet::default(), events };
    engine.submit(request).expect("the engine is running");
    let mut fast = rx;
    assert!(matches!(fast.blocking_recv(), Some(Event::Started { .. })));
    assert!(matches!(fast.blocking_recv(), Some(Event::Token(_))));
    let golden = generate(&engine, tokens("The capital of France is"), 4, greedy(), PatchSet::default()).done();
    // (Its Started event and first token were taken above.)
    let fast = hear(fast);
    assert!(fast.finish.is_some() && fast.error.is_none(), "{fast:?}");
    let hints = taken(&log);
    let golden_calls: Vec<&Hinted> = hints.iter().filter(|h| h.path == Path::Golden).collect();
    assert_eq!(golden_calls.len(), golden.sampled.len(), "{hints:?}");
    assert!(golden_calls.iter().all(|h| !h.likely && h.steps == 1), "a golden step beside a fast one was hinted: {hints:?}");
    // While the golden request ran, each fast call was followed by a golden one: not hinted either
    // (the fast call during which the golden request arrived was, rightly: a hint is no promise).
    let first_golden = hints.iter().position(|h| h.path == Path::Golden).expect("golden calls");
    for pair in hints[first_golden..].windows(2) {
        if pair[0].path != pair[1].path {
            assert!(!pair[0].likely, "a hinted call followed by another path's: {hints:?}");
        }
    }
    let last_golden = hints.iter().rposition(|h| h.path == Path::Golden).expect("golden calls");
    // After the golden request's last call, the fast request alone: hinted up to its last call.
    let after = &hints[last_golden + 1..];
    assert!(after.iter().all(|h| h.path == Path::Fast), "{hints:?}");
    if fast.finish == Some(Finish::Length) && after.len() >= 2 {
        assert!(
            after[..after.len() - 1].iter().all(|h| h.likely) && !after[after.len() - 1].likely,
            "the fast request alone again: {hints:?}"
        );
    }
}

/// (d) A failed forward pass ends every request in it with the backend's error; their KV (written,
/// but not trusted) is not reused, and the engine goes on serving.
fn a_failed_step_ends_only_its_requests<B: Backend + 'static>(make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static) {
    let model = common::shared_model();
    let engine = start(move || Ok(Faulty { fail_batched: true, ..Faulty::wrap(make()?) }), options(&model));
    let first_prompt = tokens("Count from one to one hundred: one, two, three, four,");
    let mut first = submit(&engine, first_prompt.clone(), 64, greedy(), PatchSet::default());
    assert!(matches!(first.blocking_recv(), Some(Event::Started { .. })));
    assert!(matches!(first.blocking_recv(), Some(Event::Token(_))));
    // The first request is decoding: the second joins its step, which fails.
    let second = generate(&engine, tokens("A second request joins the batch"), 4, greedy(), PatchSet::default());
    let first = hear(first);
    for heard in [&first, &second] {
        assert_eq!(heard.error.as_deref(), Some("faulty backend: injected forward failure"), "{heard:?}");
    }
    let again = generate(&engine, first_prompt, 4, greedy(), PatchSet::default()).done();
    assert_eq!(again.cached, 0, "a failed sequence's KV was offered for reuse");
}

/// A backend that cannot give a new sequence its cache refuses that request alone.
fn a_failed_admission_ends_only_its_request<B: Backend + 'static>(make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static) {
    let model = common::shared_model();
    let engine = start(move || Ok(Faulty { fail_new_kv: Some(0), ..Faulty::wrap(make()?) }), options(&model));
    let prompt = tokens("No room for this one");
    let refused = generate(&engine, prompt.clone(), 2, greedy(), PatchSet::default());
    assert!(!refused.started, "{refused:?}");
    assert_eq!(refused.error.as_deref(), Some("faulty backend: injected new_kv failure"));
    generate(&engine, prompt, 2, greedy(), PatchSet::default()).done();
}

/// (e) `start_backend` returns the error of a backend that cannot be built, or says its thread died.
fn a_backend_that_cannot_start_is_the_start_error<B: Backend + 'static>(
    _make: impl Fn() -> Result<B, BackendError> + Send + Clone + 'static,
) {
    let model = common::shared_model();
    let failing = || -> Result<B, BackendError> { Err(BackendError::new("test", "no such device")) };
    let err = scheduler::start_backend(model.clone(), options(&model), failing).err().expect("the start fails");
    assert_eq!(err.to_string(), "test backend: no such device");
    let panicking = || -> Result<B, BackendError> { panic!("a backend constructor that panics (expected by this test)") };
    let err = scheduler::start_backend(model.clone(), options(&model), panicking).err().expect("the start fails");
    assert!(err.to_string().contains("stopped while its backend was starting"), "{err}");
}

#[test]
fn the_handle_names_its_backend() {
    let model = common::shared_model();
    assert_eq!(scheduler::start(model.clone(), options(&model)).0.backend, "cpu");
    let engine = start(|| Ok(Faulty::wrap(CpuBackend::new(common::shared_model()))), options(&model));
    assert_eq!(engine.backend, "faulty cpu");
}
