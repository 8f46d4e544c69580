//! The device buffers one forward pass works in, allocated once for the largest pass (token rows and
//! sequences), so passes allocate nothing and a captured CUDA graph's addresses stay valid.

use std::sync::Arc;

use ctxscope_kernels::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, DriverError, PinnedHostSlice};
use ctxscope_kernels::device::{sync_len, DeviceError};

use crate::model::ModelConfig;

pub use ctxscope_kernels::device::MAX_SPLITS;

/// Scratch for the matmul variants: rounded copies of inputs, bf16 inputs for cuBLAS, the gate|up
/// product of a wide SwiGLU, an un-added residual product.
pub struct Scratch {
    pub tmp: CudaSlice<f32>,
    pub xb: CudaSlice<u16>,
    pub gu: CudaSlice<f32>,
    pub proj: CudaSlice<f32>,
}

pub struct Workspace {
    pub max_rows: usize,
    pub max_seqs: usize,
    pub x: CudaSlice<f32>,
    pub h: CudaSlice<f32>,
    pub qkv: CudaSlice<f32>,
    pub att: CudaSlice<f32>,
    pub act: CudaSlice<f32>,
    pub scratch: Scratch,
    pub inputs: PassInputs,
    pub kv_base: RowBases,
    pub normed: CudaSlice<f32>,
    pub logits: CudaSlice<f32>,
    pub part_o: CudaSlice<f32>,
    pub part_ml: CudaSlice<f32>,
    /// The persistent decode step's barrier and attention counters (zero between steps).
    pub sync: CudaSlice<u32>,
    pub picked: Picked,
    /// Per output sequence: temperature, top_p, uniform (device top-p sampling), and what it drew.
    pub sampling: SampleParams,
    pub sampled: Picked,
    /// RoPE's inverse frequencies of the model (`Device::rope_table`), read by the streamed QKV launches.
    pub rope_table: CudaSlice<f64>,
}

impl Workspace {
    pub fn new(
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        max_rows: usize,
        max_seqs: usize,
        rope_table: CudaSlice<f64>,
    ) -> Result<Workspace, DeviceError> {
        let (r, s) = (max_rows, max_seqs);
        let kvd = c.kv_dim();
        let wide = c.dim.max(c.ffn_dim);
        let f = |n: usize| stream.alloc_zeros::<f32>(n.max(1));
        Ok(Workspace {
            max_rows,
            max_seqs,
            x: f(r * c.dim)?,
            h: f(r * c.dim)?,
            qkv: f(r * (c.dim + 2 * kvd))?,
            att: f(r * c.dim)?,
            act: f(r * c.ffn_dim)?,
            scratch: Scratch {
                tmp: f(r * wide)?,
                xb: stream.alloc_zeros::<u16>(r * wide)?,
                gu: f(r * 2 * c.ffn_dim)?,
                proj: f(r * c.dim)?,
            },
            inputs: PassInputs { buf: stream.alloc_zeros::<i32>(2 * r + s)?, rows: r, staged: vec![0; 2 * r + s] },
            kv_base: RowBases { buf: stream.alloc_zeros::<u64>(r)?, held: Vec::new() },
            normed: f(s * c.dim)?,
            logits: f(s * c.vocab)?,
            part_o: f(s * c.n_heads * MAX_SPLITS * c.head_dim)?,
            part_ml: f(s * c.n_heads * MAX_SPLITS * 2)?,
            sync: stream.alloc_zeros::<u32>(sync_len(c.n_kv_heads))?,
            picked: Picked::new(stream, s)?,
            sampling: SampleParams { buf: f(3 * s)?, seqs: s, staged: vec![0.0; 3 * s] },
            sampled: Picked::new(stream, s)?,
            rope_table,
        })
    }
}

/// A pass's integer inputs in one allocation, so that one copy uploads them: the token id and the
/// position of each of up to `rows` rows, then, per output sequence, the row whose logits it needs.
pub struct PassInputs {
    buf: CudaSlice<i32>,
    rows: usize,
    /// The host side of the copy, laid out as on the device.
    staged: Vec<i32>,
}

impl PassInputs {
    pub fn ids(&self, n: usize) -> CudaView<'_, i32> {
        self.buf.slice(..n)
    }

    pub fn positions(&self, n: usize) -> CudaView<'_, i32> {
        self.buf.slice(self.rows..self.rows + n)
    }

    pub fn last_rows(&self, s: usize) -> CudaView<'_, i32> {
        self.buf.slice(2 * self.rows..2 * self.rows + s)
    }

    /// The ids and (from the second view's start) the positions, for a decode pass that writes its
    /// next step's inputs itself (`Device::argmax_advancing`).
    pub fn next_step(&mut self) -> (CudaViewMut<'_, i32>, CudaViewMut<'_, i32>) {
        self.buf.split_at_mut(self.rows)
    }

    /// Uploads one pass's ids and positions (as many of each) and its output rows, in one copy of
    /// the part of the buffer they reach.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, ids: &[i32], positions: &[i32], last: &[i32]) -> Result<(), DriverError> {
        let r = self.rows;
        assert!(
            ids.len() == positions.len() && ids.len() <= r && 2 * r + last.len() <= self.staged.len(),
            "a pass larger than its workspace"
        );
        upload_sections(stream, &mut self.staged, &mut self.buf, &[(0, ids), (r, positions), (2 * r, last)])
    }
}

/// Copies each (offset, values) section into `staged` at its offset, then uploads `staged` into `buf`
/// in one copy, as far as the last non-empty section reaches.
fn upload_sections<T: DeviceRepr + Copy>(
    stream: &Arc<CudaStream>,
    staged: &mut [T],
    buf: &mut CudaSlice<T>,
    sections: &[(usize, &[T])],
) -> Result<(), DriverError> {
    let mut end = 0;
    for &(at, values) in sections {
        staged[at..at + values.len()].copy_from_slice(values);
        if !values.is_empty() {
            end = end.max(at + values.len());
        }
    }
    stream.memcpy_htod(&staged[..end], &mut buf.slice_mut(..end))
}

/// Per output sequence, the sampling parameters (temperature, top_p, the uniform draw) in one
/// allocation, so that one copy uploads them.
pub struct SampleParams {
    buf: CudaSlice<f32>,
    seqs: usize,
    staged: Vec<f32>,
}

impl SampleParams {
    /// The temperatures, top_ps and uniforms of the first `n` sequences.
    pub fn views(&self, n: usize) -> (CudaView<'_, f32>, CudaView<'_, f32>, CudaView<'_, f32>) {
        let s = self.seqs;
        (self.buf.slice(..n), self.buf.slice(s..s + n), self.buf.slice(2 * s..2 * s + n))
    }

    /// Uploads the parameters of `temps.len()` sequences (as many of each) in one copy.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, temps: &[f32], top_ps: &[f32], uniforms: &[f32]) -> Result<(), DriverError> {
        let (s, n) = (self.seqs, temps.len());
        assert!(n <= s && top_ps.len() == n && uniforms.len() == n, "more sampled sequences than the workspace holds");
        upload_sections(stream, &mut self.staged, &mut self.buf, &[(0, temps), (s, top_ps), (2 * s, uniforms)])
    }
}

/// Per row, the base address of its sequence's KV cache, and what was last uploaded there: from
/// one decode step to the next the bases rarely change, so an upload of the same bases is skipped
/// (nothing else writes the buffer).
pub struct RowBases {
    buf: CudaSlice<u64>,
    held: Vec<u64>,
}

impl RowBases {
    pub fn slice(&self, n: usize) -> CudaView<'_, u64> {
        self.buf.slice(..n)
    }

    pub fn upload(&mut self, stream: &Arc<CudaStream>, bases: &[u64]) -> Result<(), DriverError> {
        if self.held.get(..bases.len()) == Some(bases) {
            return Ok(());
        }
        stream.memcpy_htod(bases, &mut self.buf.slice_mut(..bases.len()))?;
        if self.held.len() < bases.len() {
            self.held.resize(bases.len(), 0);
        }
        self.held[..bases.len()].copy_from_slice(bases);
        Ok(())
    }
}

/// Per output sequence, a picked token (greedy, or drawn), then (from `seqs` on) its log-probability's bits, in one
/// allocation so that one copy brings both back, into page-locked memory so that the copy need not
/// hold the host (`start_read`, then `finish_read` when the picks are wanted).
pub struct Picked {
    buf: CudaSlice<i32>,
    seqs: usize,
    host: PinnedHostSlice<i32>,
    /// Recorded after each `start_read`'s copy. The device's context tracks no events
    /// (`Device::new`), so the page-locked slice's own event is never recorded and waiting on it
    /// would return at once, before the copy has landed.
    copied: CudaEvent,
}

impl Picked {
    fn new(stream: &Arc<CudaStream>, seqs: usize) -> Result<Picked, DeviceError> {
        // SAFETY: the page-locked memory is zeroed below before anything reads it.
        let mut host = unsafe { stream.context().alloc_pinned_with_flags::<i32>(2 * seqs, 0) }?;
        host.as_mut_slice()?.fill(0);
        let copied = stream.context().new_event(None)?;
        Ok(Picked { buf: stream.alloc_zeros::<i32>(2 * seqs)?, seqs, host, copied })
    }

    /// `f` given the first `s` tokens and log-probabilities, as the argmax kernel writes them.
    pub fn write<R>(&mut self, s: usize, f: impl FnOnce(&mut CudaViewMut<'_, i32>, &mut CudaViewMut<'_, f32>) -> R) -> R {
        assert!(s <= self.seqs, "more outputs than the workspace holds");
        let (mut tokens, mut rest) = self.buf.split_at_mut(self.seqs);
        let mut tokens = tokens.slice_mut(..s);
        // SAFETY: f32 has i32's size and alignment and every bit pattern is a valid f32; the view
        // covers `s <= seqs` elements of the allocation's second half.
        let mut logprobs = unsafe { rest.transmute_mut::<f32>(s) }.expect("the second half holds `seqs` values");
        f(&mut tokens, &mut logprobs)
    }

    /// Queues the copy of the first `n` picks back (after the work queued so far; returns at once).
    pub fn start_read(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<(), DriverError> {
        stream.memcpy_dtoh(&self.buf.slice(..self.seqs + n), &mut self.host)?;
        self.copied.record(stream)
    }

    /// The first `n` (token, log-probability) pairs of the last `start_read` (waits for that copy
    /// only, not for work queued after it).
    pub fn finish_read(&self, n: usize) -> Result<Vec<(i32, f32)>, DriverError> {
        self.copied.synchronize()?;
        let both = self.host.as_slice()?;
        Ok((0..n).map(|k| (both[k], f32::from_bits(both[self.seqs + k] as u32))).collect())
    }
}
