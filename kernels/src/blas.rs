//! Large GEMMs through cuBLAS (`cublasGemmEx`), f32 in and out, with the compute type selectable so that
//! both exact f32 (`32F`) and the bf16-tensor-core mode (`32F_FAST_16BF`) are reachable: the latter is
//! how a "fast" deployment silently changes numerics, and what a patch can select.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{result, sys, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};

use crate::device::DeviceError;

/// The GEMM's compute type.
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

    /// Row-major `y[n][rows] = x[n][cols] · w[rows][cols]ᵀ` (the engine's weight layout: one row per
    /// output). In cuBLAS's column-major terms: `yᵀ = op_T(w) · xᵀ`. `x` may be a view (a row range).
    pub fn matmul(
        &self,
        w: &CudaSlice<f32>,
        x: &(impl DevicePtr<f32> + DeviceSlice<f32>),
        y: &mut CudaSlice<f32>,
        (rows, cols, n): (usize, usize, usize),
        compute: Compute,
    ) -> Result<(), DeviceError> {
        if w.len() != rows * cols || x.len() != n * cols || y.len() != n * rows {
            return Err(DeviceError::Shape { kernel: "gemm", detail: format!("w {} x {} y {} for {rows}x{cols}, n {n}", w.len(), x.len(), y.len()) });
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (wp, _w) = w.device_ptr(&self.stream);
        let (xp, _x) = x.device_ptr(&self.stream);
        let (yp, _y) = y.device_ptr_mut(&self.stream);
        let f32_type = sys::cudaDataType::CUDA_R_32F;
        // SAFETY: the three buffers hold rows*cols, n*cols and n*rows f32 (checked above) and stay alive
        // (and ordered on this stream by the records) until the call is scheduled; leading dimensions
        // match the row-major layouts.
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
                f32_type,
                cols as i32,
                xp as *const c_void,
                f32_type,
                cols as i32,
                (&beta as *const f32).cast::<c_void>(),
                yp as *mut c_void,
                f32_type,
                rows as i32,
                compute.sys(),
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| DeviceError::Blas(e.to_string()))
    }
}
