//! What can go wrong on the device: the driver, compiling or loading kernels, a launch whose
//! buffers do not fit its shape, cuBLAS.

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error(
        "the CUDA driver library (libcuda) cannot be loaded: this machine has no NVIDIA driver, or its folder is not on LD_LIBRARY_PATH"
    )]
    NoDriver,
    #[error("NVRTC could not compile {module}: {detail}")]
    Compile { module: String, detail: String },
    #[error(
        "libnvrtc cannot be loaded, and this binary carries no kernels built for this GPU: install CUDA's NVRTC (or PyPI's \
         nvidia-cuda-nvrtc) and put its folder on LD_LIBRARY_PATH, or build with CTXSCOPE_CUDA_AOT_ARCH=sm_XX (kernels/README.md)"
    )]
    NoCompiler,
    #[error("{kernel}: {detail}")]
    Shape { kernel: &'static str, detail: String },
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("kernel trace: {0}")]
    Trace(&'static str),
    #[error(transparent)]
    Settings(#[from] crate::settings::BadDefine),
}
