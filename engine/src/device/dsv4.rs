//! DeepSeek-V4's weight products on a GPU (the first stage of its CUDA path): each matrix a pass
//! multiplies is uploaded on first use (f32 for the golden path, bf16 for the fast one) and kept;
//! each product runs on the device, a GEMV for up to [`GEMV_MAX_ROWS`] rows (decode) and a cuBLAS
//! GEMM for more (a prompt's chunk), with the input rows sent over and the outputs read back. The rest
//! of the pass (mHC, norms, RoPE, attention, the compressors and indexer, routing) stays on the host.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Mutex;

use ctxscope_kernels::blas::{Activations, Blas, Compute};
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
        Ok(Dsv4Products { inner: Mutex::new(Inner { device, blas, matrices: HashMap::new() }), bf16, label })
    }

    /// Device bytes the uploaded matrices hold.
    pub fn resident_bytes(&self) -> usize {
        self.inner.lock().map(|inner| inner.matrices.values().map(Matrix::bytes).sum()).unwrap_or(0)
    }

    fn try_products(&self, w: &[f32], xs: &[f32], k: usize) -> Result<Vec<f32>, DeviceError> {
        let (rows, n) = (w.len() / k, xs.len() / k);
        let mut guard =
            self.inner.lock().map_err(|_| DeviceError::Shape { kernel: "dsv4 products", detail: "an earlier product panicked".into() })?;
        let inner = &mut *guard;
        // Products arrive from the thread pool's threads too.
        inner.device.ctx.bind_to_thread()?;
        let stream = inner.device.stream.clone();
        let matrix = match inner.matrices.entry((w.as_ptr() as usize, w.len())) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => new.insert(Matrix::upload(&stream, w, rows, k, self.bf16)?),
        };
        let x = stream.clone_htod(xs)?;
        let mut y = stream.alloc_zeros::<f32>(n * rows)?;
        if n <= GEMV_MAX_ROWS && k.is_multiple_of(8) {
            inner.device.gemv(&*matrix, &x.as_view(), &mut y.as_view_mut(), n, GemvMode::Store, self.bf16)?;
        } else if self.bf16 {
            let mut xb = stream.alloc_zeros::<u16>(n * k)?;
            inner.device.to_bf16(&x.as_view(), &mut xb.as_view_mut(), n * k)?;
            inner.blas.matmul(matrix, Activations::Bf16(&xb.as_view()), &mut y.as_view_mut(), n, Compute::F32, false)?;
        } else {
            inner.blas.matmul(matrix, Activations::F32(&x.as_view()), &mut y.as_view_mut(), n, Compute::F32, false)?;
        }
        Ok(stream.clone_dtoh(&y)?)
    }
}

impl Products for Dsv4Products {
    /// A device failure mid-pass cannot be answered with host numbers (they differ in the last
    /// bits), so it panics with the device's error; the backend turns that into the request's error.
    fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
        if xs.is_empty() || w.is_empty() {
            return Vec::new();
        }
        self.try_products(w, xs, k)
            .unwrap_or_else(|e| panic!("{}: a {}x{k} product of {} rows failed: {e}", self.label, w.len() / k, xs.len() / k))
    }
}
