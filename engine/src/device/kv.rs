//! A sequence's KV cache on the device: one buffer of `capacity` positions, position-major
//! ([pos][layer][K, V][kv_dim] f32, the layout cuda/prelude.cuh's `kv_row` reads), so that a prefix is
//! one contiguous copy. Freed (stream-ordered) when dropped.

use std::sync::Arc;

use ctxscope_kernels::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::backend::{BackendError, SequenceKv};

pub struct DeviceKv {
    buf: CudaSlice<f32>,
    len: usize,
    capacity: usize,
    /// Floats per position: n_layers * 2 * kv_dim.
    per_pos: usize,
    stream: Arc<CudaStream>,
}

pub(crate) fn error(message: impl std::fmt::Display) -> BackendError {
    BackendError { backend: "cuda", message: message.to_string() }
}

/// A device error, attributed to GPU `ordinal`.
pub(crate) fn gpu_error(ordinal: usize) -> impl Fn(ctxscope_kernels::device::DeviceError) -> BackendError {
    move |e| error(format!("GPU {ordinal}: {e}"))
}

impl DeviceKv {
    pub fn new(stream: &Arc<CudaStream>, capacity: usize, per_pos: usize) -> Result<DeviceKv, BackendError> {
        // SAFETY: positions are written (rope_kv) before attention reads them; nothing reads past `len`.
        let buf = unsafe { stream.alloc::<f32>(capacity * per_pos) }
            .map_err(|e| error(format!("allocating a KV cache of {capacity} positions: {e}")))?;
        Ok(DeviceKv { buf, len: 0, capacity, per_pos, stream: stream.clone() })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The buffer's device address (what the kernels index from).
    pub fn base(&self) -> u64 {
        self.buf.device_ptr(&self.stream).0
    }

    /// Marks `n` more positions as computed.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }
}

impl SequenceKv for DeviceKv {
    fn len(&self) -> usize {
        self.len
    }

    fn prefix(&self, len: usize) -> Result<DeviceKv, BackendError> {
        let len = len.min(self.len);
        let mut copy = DeviceKv::new(&self.stream, self.capacity, self.per_pos)?;
        if len > 0 {
            let n = len * self.per_pos;
            self.stream.memcpy_dtod(&self.buf.slice(..n), &mut copy.buf.slice_mut(..n)).map_err(error)?;
        }
        copy.len = len;
        Ok(copy)
    }
}
