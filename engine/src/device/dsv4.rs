//! DeepSeek-V4's weight products on a GPU (the first stage of its CUDA path): each matrix a pass
//! multiplies is uploaded when prepared or on first use (f32 for the golden path, bf16 for the fast
//! one) and kept;
//! each product runs on the device, a GEMV for up to [`GEMV_MAX_ROWS`] rows (decode) and a cuBLAS
//! GEMM for more (a prompt's chunk); the products a pass hands over together share one copy of their
//! input rows and one copy of their outputs back. The rest of the pass (mHC, norms, RoPE, attention,
//! the compressors and indexer, routing) stays on the host.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ctxscope_kernels::blas::{Activations, Blas, Compute};
use ctxscope_kernels::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use ctxscope_kernels::device::{Device, DeviceError, GemvMode, Matrix, GEMV_MAX_ROWS};

use crate::forward::dsv4_products::Products;

/// A GPU computing DeepSeek-V4's products in one precision.
pub struct Dsv4Products {
    inner: Mutex<Inner>,
    /// The fast path: bf16 weights, inputs rounded to bf16, f32 accumulation and outputs.
    bf16: bool,
    label: String,
}

struct Inner {
    device: Device,
    blas: Blas,
    /// Scratch on the device, grown as needed: the input rows, their bf16 copy, the outputs.
    x: Option<CudaSlice<f32>>,
    xb: Option<CudaSlice<u16>>,
    y: Option<CudaSlice<f32>>,
    /// By the host slice's address and length: the model's weights never move or change while a
    /// pass can reach them (the model outlives every state that holds this executor).
    matrices: HashMap<(usize, usize), Matrix>,
}

impl Dsv4Products {
    /// Opens GPU `ordinal` (its own context and stream) for products in f32 or, with `bf16`, bf16.
    pub fn open(ordinal: usize, bf16: bool) -> Result<Dsv4Products, DeviceError> {
        let device = Device::new(ordinal)?;
        let blas = Blas::new(device.stream.clone())?;
        let label = format!("cuda:{ordinal} {}", if bf16 { "bf16" } else { "f32" });
        Ok(Dsv4Products { inner: Mutex::new(Inner { device, blas, x: None, xb: None, y: None, matrices: HashMap::new() }), bf16, label })
    }

    /// Each `(matrix, rows)` of `jobs`: every job's rows sent in one copy, each product launched, the
    /// outputs read back in one copy.
    fn try_products(&self, jobs: &[(&[f32], &[f32])], k: usize) -> Result<Vec<Vec<f32>>, DeviceError> {
        let mut guard = self.lock("dsv4 products")?;
        let inner = &mut *guard;
        let stream = inner.device.stream.clone();
        // Per job: its rows, where they start in the sent rows, its outputs, where they start.
        let rows: Vec<usize> = jobs.iter().map(|(_, xs)| xs.len() / k).collect();
        let outputs: Vec<usize> = jobs.iter().zip(&rows).map(|((w, _), n)| n * (w.len() / k)).collect();
        let sent: Vec<f32> = jobs.iter().flat_map(|(_, xs)| xs.iter().copied()).collect();
        let total: usize = outputs.iter().sum();
        let x = grown(&stream, &mut inner.x, sent.len())?;
        stream.memcpy_htod(&sent, &mut x.slice_mut(..sent.len()))?;
        let y = grown(&stream, &mut inner.y, total)?;
        // Up to GEMV_MAX_ROWS rows a GEMV kernel (rounding the rows to bf16 as it loads them on the
        // fast path); more, cuBLAS (the rows converted to bf16 first on the fast path).
        let gemv = |n: usize| n <= GEMV_MAX_ROWS && k.is_multiple_of(8);
        if self.bf16 && rows.iter().any(|&n| !gemv(n)) {
            let xb = grown(&stream, &mut inner.xb, sent.len())?;
            inner.device.to_bf16(&x.slice(..sent.len()), &mut xb.slice_mut(..sent.len()), sent.len())?;
        }
        let (mut x_at, mut y_at) = (0, 0);
        for (((w, xs), &n), &len) in jobs.iter().zip(&rows).zip(&outputs) {
            let matrix = resident(&mut inner.matrices, &stream, w, k, self.bf16)?;
            let input = x_at..x_at + xs.len();
            let mut out = y.slice_mut(y_at..y_at + len);
            if n == 0 {
                // Nothing to multiply: an empty output.
            } else if gemv(n) {
                inner.device.gemv(matrix, &x.slice(input), &mut out, n, GemvMode::Store, self.bf16)?;
            } else if self.bf16 {
                let xb = inner
                    .xb
                    .as_ref()
                    .map(|b| b.slice(input))
                    .ok_or(DeviceError::Shape { kernel: "dsv4 products", detail: "no bf16 rows".into() })?;
                inner.blas.matmul(matrix, Activations::Bf16(&xb), &mut out, n, Compute::F32, false)?;
            } else {
                inner.blas.matmul(matrix, Activations::F32(&x.slice(input)), &mut out, n, Compute::F32, false)?;
            }
            x_at += xs.len();
            y_at += len;
        }
        let mut host = vec![0f32; total];
        stream.memcpy_dtoh(&y.slice(..total), &mut host)?;
        stream.synchronize()?;
        let mut rest = host.as_slice();
        Ok(outputs
            .iter()
            .map(|&len| {
                let (this, after) = rest.split_at(len);
                rest = after;
                this.to_vec()
            })
            .collect())
    }
}

/// `buffer`, grown to hold at least `len` elements (its contents not kept).
fn grown<'b, T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buffer: &'b mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<&'b mut CudaSlice<T>, DeviceError> {
    if buffer.as_ref().is_none_or(|b| b.len() < len) {
        *buffer = Some(stream.alloc_zeros::<T>(len.max(1))?);
    }
    Ok(buffer.as_mut().expect("just made"))
}

impl Dsv4Products {
    /// The device's state, its context bound to this thread (calls arrive from the thread pool's
    /// threads too).
    fn lock(&self, kernel: &'static str) -> Result<MutexGuard<'_, Inner>, DeviceError> {
        let inner = self.inner.lock().map_err(|_| DeviceError::Shape { kernel, detail: "an earlier product panicked".into() })?;
        inner.device.ctx.bind_to_thread()?;
        Ok(inner)
    }

    /// Uploads each of `matrices` not on the device yet.
    fn upload(&self, matrices: &[(&[f32], usize)]) -> Result<(), DeviceError> {
        let mut guard = self.lock("dsv4 upload")?;
        let inner = &mut *guard;
        let stream = inner.device.stream.clone();
        for &(w, k) in matrices {
            resident(&mut inner.matrices, &stream, w, k, self.bf16)?;
        }
        stream.synchronize()?;
        Ok(())
    }
}

/// `w` (rows of `k`) on the device: the copy uploaded before, or uploaded now.
fn resident<'m>(
    matrices: &'m mut HashMap<(usize, usize), Matrix>,
    stream: &Arc<CudaStream>,
    w: &[f32],
    k: usize,
    bf16: bool,
) -> Result<&'m Matrix, DeviceError> {
    Ok(match matrices.entry((w.as_ptr() as usize, w.len())) {
        Entry::Occupied(known) => known.into_mut(),
        Entry::Vacant(new) => new.insert(Matrix::upload(stream, w, w.len() / k, k, bf16)?),
    })
}

impl Products for Dsv4Products {
    fn prepare(&self, matrices: &[(&[f32], usize)]) -> Result<(), String> {
        self.upload(matrices).map_err(|e| format!("{}: uploading {} matrices: {e}", self.label, matrices.len()))
    }

    /// A device failure mid-pass cannot be answered with host numbers (they differ in the last
    /// bits), so it panics with the device's error; the backend turns that into the request's error.
    fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
        self.products_each(&[(w, xs)], k).pop().unwrap_or_default()
    }

    fn products_each(&self, jobs: &[(&[f32], &[f32])], k: usize) -> Vec<Vec<f32>> {
        if k == 0 || jobs.iter().all(|(_, xs)| xs.is_empty()) {
            return jobs.iter().map(|_| Vec::new()).collect();
        }
        let rows: usize = jobs.iter().map(|(_, xs)| xs.len() / k).sum();
        self.try_products(jobs, k).unwrap_or_else(|e| panic!("{}: {} products of {rows} rows of {k} failed: {e}", self.label, jobs.len()))
    }
}
