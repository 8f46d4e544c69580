//! The CUDA backend (engine feature `cuda`): the model's weights on the GPU twice — f32 for the
//! golden path (exact f32 GEMMs, the CPU golden path's numbers to ~1e-5) and bf16 for the fast path
//! (bf16 GEMM inputs, f32 accumulation, f32 activations, norms and KV) — every sequence's KV cache on
//! the device with the scheduler's prefix reuse, batched decode through GEMV kernels (streamed, with
//! the RMSNorms folded in; `pass`) and split-K attention, and each unpatched decode pass of up to
//! `gemv_rows` sequences captured once as a CUDA graph and replayed, so a small model is not bound
//! by kernel launches. Greedy tokens are picked on the device;
//! only requests that need the logits (sampling, top logprobs) copy them back.

mod dsv4;
mod kv;
mod pass;
mod weights;
mod workspace;

use std::collections::HashMap;
use std::sync::Arc;

use ctxscope_kernels::blas::Blas;
use ctxscope_kernels::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use ctxscope_kernels::cudarc::driver::CudaGraph;
use ctxscope_kernels::device::{Device, DeviceError, StreamTuning, GEMV_MAX_ROWS, MAX_GROUP, MAX_HEAD_DIM};

pub use dsv4::Dsv4Products;
pub use kv::DeviceKv;
pub use pass::Numerics;
use pass::{Pass, Plan, PrefillChunk};
use weights::DeviceWeights;
use workspace::{Workspace, MAX_SPLITS};

use crate::backend::{Backend, BackendError, Output, SequenceKv, Step, Want};
use crate::forward::Path;
use crate::model::{Model, ModelConfig};
use crate::patch::PatchSet;
use crate::scheduler::EngineOptions;

use kv::{error, gpu_error};

/// The model on one GPU.
pub struct DeviceBackend {
    ordinal: usize,
    device: Device,
    blas: Blas,
    config: ModelConfig,
    /// The golden (f32) and fast (bf16) weights, indexed by `path_index`.
    weights: [DeviceWeights; 2],
    ws: Workspace,
    /// Positions per sequence cache.
    ctx: usize,
    graphs: HashMap<(Path, usize), CudaGraph>,
    /// Replay decode passes as CUDA graphs (on unless `CTXSCOPE_CUDA_GRAPHS=0`).
    use_graphs: bool,
    /// Launch a greedy decode pass's graph again right after it, as the next step (on unless
    /// `CTXSCOPE_CUDA_SPECULATE=0`): see [`Speculation`].
    speculate: bool,
    /// The step so launched and not yet taken.
    speculation: Option<Speculation>,
    /// The caller's hint for the coming call ([`Backend::expect_continuation`]; true until told).
    continuation: bool,
    /// Widest pass computed with the GEMV kernels (and captured as a graph); wider passes use cuBLAS
    /// without a graph. By model size (`default_gemv_rows`); `CTXSCOPE_CUDA_GEMV_ROWS` (1..=8) overrides.
    gemv_rows: usize,
    /// Plain GEMV passes stream the weights with the norms folded in (`Pass::stream`; on unless
    /// `CTXSCOPE_CUDA_STREAM_GEMV=0`).
    stream_gemv: bool,
    /// Decode attention's split-K partials per (row, KV head); 0: two blocks per SM (`splits`).
    attn_splits: usize,
    /// Decode attention in thread-block clusters of this many blocks per (row, KV head), merged in
    /// distributed shared memory (`Device::attn_decode_cluster`); 0: split-K with global partials.
    /// `CTXSCOPE_CUDA_ATTN_CLUSTER` (default 16), capped by what the device allows (none before sm_90).
    attn_cluster: usize,
    /// One-row decode passes run as one persistent launch (`Pass::persistent`; off unless
    /// `CTXSCOPE_CUDA_PERSISTENT=1`: measured slower than the kernel-per-op pass on the H200, BENCHMARKS.md).
    persistent: bool,
}

impl DeviceBackend {
    /// Opens GPU `ordinal`, compiles the kernels, uploads the weights (f32 and bf16) and allocates the
    /// workspace for `options.step_tokens` rows and `options.max_batch` sequences per pass.
    pub fn new(model: Arc<Model>, ordinal: usize, options: &EngineOptions) -> Result<DeviceBackend, BackendError> {
        let c = model.config.clone();
        if c.head_dim > MAX_HEAD_DIM
            || !c.head_dim.is_multiple_of(4)
            || c.n_heads / c.n_kv_heads.max(1) > MAX_GROUP
            || !c.dim.is_multiple_of(32)
            || !c.ffn_dim.is_multiple_of(32)
        {
            return Err(error(format!(
                "model shape not supported by the kernels (head_dim {} <= {MAX_HEAD_DIM} and a multiple of 4, heads per KV head {} <= {MAX_GROUP}, widths multiples of 32)",
                c.head_dim,
                c.n_heads / c.n_kv_heads.max(1)
            )));
        }
        let fail = gpu_error(ordinal);
        let device = Device::new(ordinal).map_err(&fail)?;
        let blas = Blas::new(device.stream.clone()).map_err(&fail)?;
        let (golden, fast) = DeviceWeights::upload(&device, &model).map_err(&fail)?;
        let max_seqs = options.max_batch.max(1);
        let rope_table = device.rope_table(c.rope_base, c.head_dim).map_err(&fail)?;
        let ws = Workspace::new(&device.stream, &c, options.step_tokens.max(max_seqs), max_seqs, rope_table).map_err(&fail)?;
        device.stream.synchronize().map_err(|e| fail(e.into()))?;
        let tuning = &options.device;
        let gemv_rows = tuning.gemv_rows.unwrap_or_else(|| default_gemv_rows(&c)).clamp(1, GEMV_MAX_ROWS);
        Ok(DeviceBackend {
            ordinal,
            device,
            blas,
            config: c,
            weights: [golden, fast],
            ws,
            ctx: options.ctx,
            graphs: HashMap::new(),
            use_graphs: tuning.graphs,
            speculate: tuning.speculate,
            speculation: None,
            continuation: true,
            gemv_rows,
            stream_gemv: tuning.stream_gemv,
            attn_splits: tuning.attn_splits.min(MAX_SPLITS),
            attn_cluster: 0,
            persistent: tuning.persistent,
        }
        .with_attn_cluster(tuning.attn_cluster))
    }

    /// Turns decode-graph replay on or off (off: every pass launches its kernels one by one).
    pub fn set_graphs(&mut self, on: bool) {
        self.settle();
        self.use_graphs = on;
    }

    /// Turns the speculative next decode step on or off ([`Speculation`]).
    pub fn set_speculate(&mut self, on: bool) {
        self.settle();
        self.speculate = on;
    }

    /// Waits for a speculative step still running and forgets it, so that the device is idle and the
    /// next pass starts from the host's inputs (before timing, and before graphs are dropped).
    pub fn settle(&mut self) {
        if self.speculation.take().is_some() {
            // An error here shows up again at the next pass, which uploads and launches anew.
            let _ = self.device.stream.synchronize();
        }
    }

    /// Chooses the decode GEMVs: streamed (`stream`, with `tuning`'s blocks per SM, bytes in flight
    /// per lane — normalized to what the kernel supports — and spread) or the one-warp-per-row kernels.
    /// Captured graphs are dropped, so the next passes capture the new choice.
    pub fn set_stream_gemv(&mut self, stream: bool, tuning: StreamTuning) {
        self.settle();
        self.stream_gemv = stream;
        self.device.tuning = StreamTuning {
            spread: tuning.spread,
            ..self.device.tuning.with(tuning.blocks_per_sm, tuning.lane_bytes, tuning.qkv_lane_bytes)
        };
        self.graphs.clear();
    }

    /// The streamed GEMV's tuning now in use.
    pub fn stream_tuning(&self) -> StreamTuning {
        self.device.tuning
    }

    /// Sets how many split-K partials decode attention cuts each (row, KV head) into (0: enough
    /// blocks for two per SM, the default; `CTXSCOPE_CUDA_ATTN_SPLITS` at start-up). Captured graphs
    /// are dropped.
    pub fn set_attn_splits(&mut self, splits: usize) {
        self.settle();
        self.attn_splits = splits.min(MAX_SPLITS);
        self.graphs.clear();
    }

    /// Sets decode attention's cluster size (0: split-K with global partials; above what the device
    /// allows: the most it allows). Captured graphs are dropped.
    pub fn set_attn_cluster(&mut self, cluster: usize) {
        self.settle();
        self.attn_cluster = cluster.min(self.device.max_cluster);
        self.graphs.clear();
    }

    fn with_attn_cluster(mut self, cluster: usize) -> DeviceBackend {
        self.set_attn_cluster(cluster);
        self
    }

    /// Turns the persistent decode step for one-row decode passes on or off. Captured graphs are dropped.
    pub fn set_persistent(&mut self, on: bool) {
        self.settle();
        self.persistent = on;
        self.graphs.clear();
    }

    /// Whether one-row decode passes run as the persistent step.
    pub fn persistent(&self) -> bool {
        self.persistent
    }

    /// Whether a plain one-row decode pass on `path` runs as the persistent step now: it is on, the
    /// pass would stream, and the kernel takes the model's shape on this device.
    pub fn takes_step(&self, path: Path) -> bool {
        let plan = Plan { rows: 1, decode: 1, prefill: Vec::new(), outputs: 1, splits: self.splits(1), cluster: self.attn_cluster };
        self.pass(Numerics::default()).step_shape(self.weights(path), &plan).is_some()
    }

    fn pass(&self, numerics: Numerics) -> Pass<'_> {
        Pass {
            device: &self.device,
            blas: &self.blas,
            config: &self.config,
            numerics,
            gemv_rows: self.gemv_rows,
            stream: self.stream_gemv,
            persistent: self.persistent,
        }
    }

    /// Decode attention's cluster size now in use (0: split-K).
    pub fn attn_cluster(&self) -> usize {
        self.attn_cluster
    }

    /// The split-K setting now in use (0: the default rule).
    pub fn attn_splits(&self) -> usize {
        self.attn_splits
    }

    /// Seconds per replay of the captured decode graph for `rows` sequences on `path`, replayed `reps`
    /// times back to back: the GPU's time for a decode step without the host's part (uploading the
    /// step, copying the tokens back). `None` until a decode pass of that size has run. Each replay
    /// writes the next position of the last decode pass's sequences (the pass leaves its next step's
    /// inputs on the device), so their caches must still be alive, with `reps` positions of room.
    pub fn time_graph_replay(&mut self, path: Path, rows: usize, reps: usize) -> Result<Option<f64>, BackendError> {
        self.settle();
        let Some(graph) = self.graphs.get(&(path, rows)) else { return Ok(None) };
        let fail = |e: ctxscope_kernels::cudarc::driver::DriverError| gpu_error(self.ordinal)(e.into());
        self.device.stream.synchronize().map_err(fail)?;
        let started = std::time::Instant::now();
        for _ in 0..reps {
            graph.launch().map_err(fail)?;
        }
        self.device.stream.synchronize().map_err(fail)?;
        Ok(Some(started.elapsed().as_secs_f64() / reps.max(1) as f64))
    }

    /// One replay of the captured decode graph for `rows` sequences on `path` with the kernel timeline
    /// traced (`ctxscope_kernels::device::trace`): per kernel kind, where its time went. `None` until a
    /// decode pass of that size has run (as `time_graph_replay`), or with the kernels compiled without
    /// their timeline marks (`CTXSCOPE_CUDA_TRACE=1` compiles them in).
    pub fn trace_graph_replay(&mut self, path: Path, rows: usize) -> Result<Option<Vec<String>>, BackendError> {
        use ctxscope_kernels::device::trace;
        self.settle();
        let Some(graph) = self.graphs.get(&(path, rows)).filter(|_| self.device.tracing) else { return Ok(None) };
        let gpu = gpu_error(self.ordinal);
        self.device.stream.synchronize().map_err(|e| gpu(e.into()))?;
        let recording = self.device.trace_start(1 << 20).map_err(&gpu)?;
        let launched = graph.launch().map_err(|e| gpu(e.into()));
        let (records, lost) = self.device.trace_stop(recording).map_err(&gpu)?;
        launched?;
        let mut lines = trace::summary(&trace::launches(&records));
        if lost > 0 {
            lines.push(format!("{lost} record slots did not fit"));
        }
        Ok(Some(lines))
    }

    /// Bytes of weights one decode step reads on `path`.
    pub fn weight_bytes(&self, path: Path) -> usize {
        self.weights(path).bytes_per_token()
    }

    /// Split-K partials per (row, head) for `rows` decode rows: enough blocks to cover the chip twice.
    fn splits(&self, rows: usize) -> usize {
        if self.attn_splits > 0 {
            return self.attn_splits;
        }
        let blocks = rows * self.config.n_kv_heads;
        (2 * self.device.multiprocessors).div_ceil(blocks.max(1)).clamp(1, MAX_SPLITS)
    }

    fn weights(&self, path: Path) -> &DeviceWeights {
        &self.weights[path_index(path)]
    }

    /// Runs one planned pass: replays (capturing on first use) the decode graph for plain decode
    /// passes of up to `gemv_rows` sequences, enqueues the kernels otherwise.
    fn run(&mut self, path: Path, numerics: Numerics, plan: &Plan) -> Result<(), DeviceError> {
        let graphable = self.use_graphs && numerics.is_plain() && plan.prefill.is_empty() && plan.rows <= self.gemv_rows;
        // A field borrow (not `self.weights(path)`), so the workspace can be borrowed mutably beside it.
        let weights = &self.weights[path_index(path)];
        let pass = Pass {
            device: &self.device,
            blas: &self.blas,
            config: &self.config,
            numerics,
            gemv_rows: self.gemv_rows,
            stream: self.stream_gemv,
            persistent: self.persistent,
        };
        if !graphable {
            return pass.enqueue(weights, &mut self.ws, plan);
        }
        let key = (path, plan.rows);
        if !self.graphs.contains_key(&key) {
            let stream = &self.device.stream;
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let enqueued = pass.enqueue(weights, &mut self.ws, plan);
            // End the capture whatever happened, so the stream is usable again.
            let graph = stream.end_capture(CUgraphInstantiate_flags(0));
            match (enqueued, graph) {
                (Ok(()), Ok(Some(graph))) => {
                    self.graphs.insert(key, graph);
                }
                // A capture can be invalidated from outside (another thread synchronizing the whole
                // context, as freeing a cuBLAS handle does): nothing was run, so run this pass
                // eagerly and capture again next time. A real error shows up eagerly too.
                (captured, graph) => {
                    let why = captured
                        .err()
                        .map(|e| e.to_string())
                        .or(graph.err().map(|e| e.to_string()))
                        .unwrap_or_else(|| "nothing recorded".into());
                    tracing::warn!(
                        rows = plan.rows,
                        path = path.as_str(),
                        "decode graph capture failed ({why}); running this pass without a graph"
                    );
                    return pass.enqueue(weights, &mut self.ws, plan);
                }
            }
        }
        self.graphs[&key].launch()?;
        Ok(())
    }
}

impl Drop for DeviceBackend {
    fn drop(&mut self) {
        // Not while a speculative step still runs the graphs and buffers about to be freed.
        self.settle();
    }
}

/// Where `path`'s weights sit in `DeviceBackend::weights`.
fn path_index(path: Path) -> usize {
    match path {
        Path::Golden => 0,
        Path::Fast => 1,
    }
}

/// Widest decode pass run on the GEMV kernels (and so replayed as a graph) by default, for a model
/// of at least `SMALL_MODEL_PARAMS`. Measured on the H200 (1B shape, bf16): cuBLAS 2,681 tokens/s at 4
/// sequences and 4,748 at 8 against the GEMVs' 2,098 and 1,681 — a GEMV's per-row FMA and input
/// traffic grows with the rows while a tensor-core GEMM reads the weights once for all of them.
const DEFAULT_GEMV_ROWS: usize = 3;
/// Below this many parameters a decode step is bound by launches, not by the bytes it reads, so the
/// eager cuBLAS pass loses to the graph-replayed GEMVs at every width and `default_gemv_rows` is
/// `GEMV_MAX_ROWS`. Measured on the H200 (135M shape, bf16; BENCHMARKS.md "Batched decode"): 4
/// sequences 1,674–2,338 tokens/s on cuBLAS over five runs (below batch 1's 1,875 in two) against
/// 3,648 on the GEMVs; 8 sequences 3,399–4,540 against 4,270.
const SMALL_MODEL_PARAMS: usize = 500_000_000;

/// `CTXSCOPE_CUDA_GEMV_ROWS` unless set: every width on the GEMVs for a small model, else
/// `DEFAULT_GEMV_ROWS`.
fn default_gemv_rows(c: &ModelConfig) -> usize {
    let params = c.n_layers * (2 * c.dim * c.dim + 2 * c.kv_dim() * c.dim + 3 * c.ffn_dim * c.dim) + c.vocab * c.dim;
    if params < SMALL_MODEL_PARAMS {
        GEMV_MAX_ROWS
    } else {
        DEFAULT_GEMV_ROWS
    }
}

/// A greedy decode step already running on the device: the graph of the pass before it, launched
/// again right after that pass, its inputs left on the device by the pass itself (the picks as the
/// next ids, the positions one on). The next `forward` takes it when asked exactly that step — the
/// same sequences, in the same order, each with its pick as its one token, greedy — and reads back
/// its picks without uploading or launching anything; the host's work around a step then overlaps
/// the GPU's. Asked anything else, the step is left to run to its end unused: one step of GPU time
/// before the next pass, and K/V written one position past each sequence's committed length, which
/// nothing reads before it is written again.
struct Speculation {
    path: Path,
    /// Per row (the sequences in order): the token it runs with, the cache length it assumes
    /// committed, and the cache.
    tokens: Vec<u32>,
    lengths: Vec<usize>,
    bases: Vec<u64>,
}

impl Speculation {
    /// This step, running with `picked` (the previous step's picks, read back) as its tokens.
    fn fed(self, picked: &[(i32, f32)]) -> Speculation {
        Speculation { tokens: picked.iter().map(|p| p.0 as u32).collect(), ..self }
    }

    fn is_step(&self, path: Path, numerics: Numerics, steps: &[Step<'_, DeviceKv>]) -> bool {
        self.path == path
            && numerics.is_plain()
            && steps.len() == self.tokens.len()
            && steps.iter().enumerate().all(|(i, s)| {
                s.tokens == [self.tokens[i]]
                    && s.kv.len() == self.lengths[i]
                    && s.kv.base() == self.bases[i]
                    && matches!(s.want, Want::Greedy)
            })
    }
}

/// One sequence's part of a pass: its step index and the rows of its tokens taken.
struct Part {
    step: usize,
    from: usize,
    take: usize,
    finishes: bool,
}

impl Backend for DeviceBackend {
    type Kv = DeviceKv;

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn samples(&self) -> bool {
        true
    }

    fn expect_continuation(&mut self, likely: bool) {
        self.continuation = likely;
    }

    fn new_kv(&mut self) -> Result<DeviceKv, BackendError> {
        let per_pos = self.config.n_layers * 2 * self.config.kv_dim();
        DeviceKv::new(&self.device.stream, self.ctx, per_pos)
    }

    fn forward(&mut self, path: Path, patches: &PatchSet, steps: &mut [Step<'_, DeviceKv>]) -> Result<Vec<Output>, BackendError> {
        let numerics = Numerics::new(patches);
        for step in steps.iter() {
            if step.tokens.is_empty() || step.kv.len() + step.tokens.len() > step.kv.capacity() {
                return Err(error(format!(
                    "{} tokens after {} do not fit a cache of {} positions",
                    step.tokens.len(),
                    step.kv.len(),
                    step.kv.capacity()
                )));
            }
        }
        if let Some(speculation) = self.speculation.take() {
            if speculation.is_step(path, numerics, steps) {
                return self.take_speculated(speculation, steps).map_err(gpu_error(self.ordinal));
            }
            // Asked something else: the speculative step runs to its end unused before this call's
            // passes (the stream orders them); its K/V writes land past the committed lengths.
        }
        // Single-token sequences first (batched decode attention), then prefill chunks.
        let mut order: Vec<usize> = (0..steps.len()).collect();
        order.sort_by_key(|&i| steps[i].tokens.len() != 1);
        let mut done = vec![0usize; steps.len()];
        let mut outputs: Vec<Option<Output>> = vec![None; steps.len()];
        while order.iter().any(|&i| done[i] < steps[i].tokens.len()) {
            // Fill one pass with as many rows as the workspace takes.
            let mut parts = Vec::new();
            let (mut rows, mut outs) = (0, 0);
            for &i in &order {
                let left = steps[i].tokens.len() - done[i];
                if left == 0 || rows == self.ws.max_rows || outs == self.ws.max_seqs {
                    continue;
                }
                let take = left.min(self.ws.max_rows - rows);
                let finishes = take == left;
                parts.push(Part { step: i, from: done[i], take, finishes });
                rows += take;
                outs += usize::from(finishes);
            }
            let (mut ids, mut positions, mut bases, mut last) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            // Sampling parameters per output row (rows that do not sample draw nothing that is read).
            let (mut temps, mut top_ps, mut uniforms) = (Vec::new(), Vec::new(), Vec::new());
            let mut plan = Plan { rows, decode: 0, prefill: Vec::new(), outputs: outs, splits: 1, cluster: self.attn_cluster };
            for part in &parts {
                let step = &steps[part.step];
                let start = step.kv.len();
                let row = ids.len();
                ids.extend(step.tokens[part.from..part.from + part.take].iter().map(|&t| t.min(self.config.vocab as u32 - 1) as i32));
                positions.extend((start..start + part.take).map(|p| p as i32));
                bases.extend(std::iter::repeat_n(step.kv.base(), part.take));
                if part.finishes {
                    last.push((row + part.take - 1) as i32);
                    let (t, p, u) = match step.want {
                        Want::Sample { temperature, top_p, uniform } => (temperature, top_p, uniform),
                        _ => (1.0, 1.0, 0.0),
                    };
                    temps.push(t);
                    top_ps.push(p);
                    uniforms.push(u);
                }
                if step.tokens.len() == 1 {
                    plan.decode += 1;
                } else {
                    plan.prefill.push(PrefillChunk { row, n: part.take, start, kv_base: step.kv.base() });
                }
            }
            plan.splits = self.splits(plan.decode);
            let upload = |this: &mut DeviceBackend| -> Result<(), DeviceError> {
                let s = &this.device.stream;
                this.ws.inputs.upload(s, &ids, &positions, &last)?;
                this.ws.kv_base.upload(s, &bases)?;
                Ok(())
            };
            let fail = gpu_error(self.ordinal);
            upload(self).map_err(&fail)?;
            self.run(path, numerics, &plan).map_err(&fail)?;
            if parts.iter().any(|p| p.finishes && matches!(steps[p.step].want, Want::Sample { .. })) {
                self.sample(&temps, &top_ps, &uniforms).map_err(&fail)?;
            }
            // The whole call in one greedy decode pass: its graph runs again at once as the next step.
            let whole = parts.len() == steps.len() && parts.iter().all(|p| p.finishes && p.from == 0);
            let then = (whole && self.can_speculate(path, numerics, &plan, steps)).then_some(path);
            let collected = self.collect(&parts, steps, then).map_err(&fail)?;
            for part in &parts {
                steps[part.step].kv.commit(part.take);
                done[part.step] += part.take;
            }
            for (step, output) in collected {
                outputs[step] = Some(output);
            }
        }
        Ok(outputs.into_iter().map(|o| o.expect("every step finished in some pass")).collect())
    }
}

impl DeviceBackend {
    /// Draws a token for each output row with the top-p kernel (after the pass, outside any graph).
    fn sample(&mut self, temps: &[f32], top_ps: &[f32], uniforms: &[f32]) -> Result<(), DeviceError> {
        let (s, n, ws) = (&self.device.stream, temps.len(), &mut self.ws);
        ws.sampling.upload(s, temps, top_ps, uniforms)?;
        let vocab = self.config.vocab;
        let (temperature, top_p, uniform) = ws.sampling.views(n);
        let logits = ws.logits.slice(..n * vocab);
        let device = &self.device;
        ws.sampled.write(n, |token, logprob| device.top_p(&logits, n, vocab, (&temperature, &top_p, &uniform), token, logprob))
    }

    /// Copies back what the finished sequences of a pass want (waits for the pass); `then`: launches
    /// the pass's graph again as the next step before waiting ([`Speculation`]).
    fn collect(&mut self, parts: &[Part], steps: &[Step<'_, DeviceKv>], then: Option<Path>) -> Result<Vec<(usize, Output)>, DeviceError> {
        let finished: Vec<&Part> = parts.iter().filter(|p| p.finishes).collect();
        let n = finished.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        self.ws.picked.start_read(&self.device.stream, n)?;
        let next = match then {
            Some(path) => Some(self.launch_next(path, steps)?),
            None => None,
        };
        let s = &self.device.stream;
        let sampled = finished.iter().any(|p| matches!(steps[p.step].want, Want::Sample { .. }));
        if sampled {
            self.ws.sampled.start_read(s, n)?;
        }
        let picked = self.ws.picked.finish_read(n)?;
        let drawn = if sampled { self.ws.sampled.finish_read(n)? } else { Vec::new() };
        let vocab = self.config.vocab;
        let mut out = Vec::with_capacity(n);
        for (k, part) in finished.iter().enumerate() {
            let output = match steps[part.step].want {
                Want::Greedy => Output::Token { token: picked[k].0 as u32, logprob: picked[k].1 },
                Want::Sample { .. } => Output::Token { token: drawn[k].0 as u32, logprob: drawn[k].1 },
                Want::Logits => {
                    let mut logits = vec![0f32; vocab];
                    s.memcpy_dtoh(&self.ws.logits.slice(k * vocab..(k + 1) * vocab), &mut logits)?;
                    Output::Logits(logits)
                }
            };
            out.push((part.step, output));
        }
        match next {
            Some(next) => self.speculation = Some(next.fed(&picked)),
            None => s.synchronize()?,
        }
        Ok(out)
    }

    /// Whether this call's one decode pass (`plan`, over every step) may be followed by its graph as
    /// the next step: on, the caller expecting the continuation, a captured graph, every sequence
    /// greedy with room for one more position past this step's.
    fn can_speculate(&self, path: Path, numerics: Numerics, plan: &Plan, steps: &[Step<'_, DeviceKv>]) -> bool {
        let graphed =
            numerics.is_plain() && plan.prefill.is_empty() && plan.rows == steps.len() && self.graphs.contains_key(&(path, plan.rows));
        graphed && steps.iter().all(|s| s.tokens.len() == 1 && matches!(s.want, Want::Greedy)) && self.may_launch_next(steps)
    }

    /// What every speculative launch needs, after a plain greedy decode pass: speculation and graphs
    /// on, the caller expecting the continuation, room in every cache for one more position past the
    /// next step's.
    fn may_launch_next(&self, steps: &[Step<'_, DeviceKv>]) -> bool {
        self.speculate && self.continuation && self.use_graphs && steps.iter().all(|s| s.kv.len() + 2 <= s.kv.capacity())
    }

    /// Launches the graph of `steps`' decode pass again, as the step after this one (its inputs are on
    /// the device already: `Device::argmax_advancing`); the tokens it runs with come with the picks
    /// (`Speculation::fed`).
    fn launch_next(&self, path: Path, steps: &[Step<'_, DeviceKv>]) -> Result<Speculation, DeviceError> {
        self.graphs[&(path, steps.len())].launch()?;
        Ok(Speculation {
            path,
            tokens: Vec::new(),
            lengths: steps.iter().map(|s| s.kv.len() + 1).collect(),
            bases: steps.iter().map(|s| s.kv.base()).collect(),
        })
    }

    /// Answers a call that asks exactly the speculative step: its picks, read back once it is done;
    /// when it may, the step after it goes out before the wait.
    fn take_speculated(&mut self, speculation: Speculation, steps: &mut [Step<'_, DeviceKv>]) -> Result<Vec<Output>, DeviceError> {
        let n = steps.len();
        self.ws.picked.start_read(&self.device.stream, n)?;
        let next = if self.may_launch_next(steps) { Some(self.launch_next(speculation.path, steps)?) } else { None };
        let picked = self.ws.picked.finish_read(n)?;
        for step in steps.iter_mut() {
            step.kv.commit(1);
        }
        self.speculation = next.map(|next| next.fed(&picked));
        Ok(picked.into_iter().map(|(token, logprob)| Output::Token { token: token as u32, logprob }).collect())
    }
}
