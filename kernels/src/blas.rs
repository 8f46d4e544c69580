//! Large GEMMs through cuBLAS (`cublasGemmEx`) for prefill and wide batches: f32 weights with f32
//! activations under a selectable compute type (`32F` exact, or `32F_FAST_16BF`, the bf16-tensor-core
//! mode a "fast" deployment silently switches to), or bf16 weights with bf16 activations; f32 output
//! either stored or added to (the residual stream).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{result, sys, CudaBlas};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

use crate::device::{DeviceError, Matrix, MatrixData};

/// The GEMM's compute type for f32 weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// `CUBLAS_COMPUTE_32F`: f32 multiply-accumulate.
    F32,
    /// `CUBLAS_COMPUTE_32F_FAST_16BF`: inputs rounded to bf16 on the tensor cores, f32 accumulate.
    F32Fast16Bf,
}

impl Compute {
    fn sys(self) -> sys::cublasComputeType_t {
        match self {
            Compute::F32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            Compute::F32Fast16Bf => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
        }
    }
}

/// The activations of one GEMM: f32 (with f32 weights) or bf16 bits (with bf16 weights).
pub enum Activations<'a> {
    F32(&'a CudaView<'a, f32>),
    Bf16(&'a CudaView<'a, u16>),
}

/// A cuBLAS handle on the device's stream.
pub struct Blas {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Blas {
    pub fn new(stream: Arc<CudaStream>) -> Result<Blas, DeviceError> {
        let blas = CudaBlas::new(stream.clone()).map_err(|e| DeviceError::Blas(e.to_string()))?;
        Ok(Blas { blas, stream })
    }

    /// Row-major `y[n][rows] (+)= x[n][cols] · w[rows][cols]ᵀ` (the engine's weight layout: one row
    /// per output). In cuBLAS's column-major terms: `yᵀ = op_T(w) · xᵀ`.
    pub fn matmul(
        &self,
        w: &Matrix,
        x: Activations<'_>,
        y: &mut CudaViewMut<'_, f32>,
        n: usize,
        compute: Compute,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let (rows, cols) = (w.rows, w.cols);
        let x_len = match &x {
            Activations::F32(v) => v.len(),
            Activations::Bf16(v) => v.len(),
        };
        if x_len < n * cols || y.len() < n * rows {
            return Err(DeviceError::Shape { kernel: "gemm", detail: format!("x {x_len} y {} for {rows}x{cols}, n {n}", y.len()) });
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        let (yp, _y) = y.device_ptr_mut(&self.stream);
        let f32_type = sys::cudaDataType::CUDA_R_32F;
        let bf16_type = sys::cudaDataType::CUDA_R_16BF;
        let (wp, xp, in_type, compute) = match (&w.data, &x) {
            (MatrixData::F32(m), Activations::F32(v)) => {
                (m.device_ptr(&self.stream).0, v.device_ptr(&self.stream).0, f32_type, compute.sys())
            }
            (MatrixData::Bf16(m), Activations::Bf16(v)) => {
                (m.device_ptr(&self.stream).0, v.device_ptr(&self.stream).0, bf16_type, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F)
            }
            _ => return Err(DeviceError::Shape { kernel: "gemm", detail: "weights and activations must both be f32 or both bf16".into() }),
        };
        // SAFETY: w holds rows*cols, x at least n*cols and y at least n*rows elements of the declared
        // types (checked above); all three stay alive until the call is queued on this stream (the only
        // one); leading dimensions match the row-major layouts.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                rows as i32,
                n as i32,
                cols as i32,
                (&alpha as *const f32).cast::<c_void>(),
                wp as *const c_void,
                in_type,
                cols as i32,
                xp as *const c_void,
                in_type,
                cols as i32,
                (&beta as *const f32).cast::<c_void>(),
                yp as *mut c_void,
                f32_type,
                rows as i32,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| DeviceError::Blas(e.to_string()))
    }
}
