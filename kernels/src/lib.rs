//! CUDA kernels of the engine's device backend: CUDA C sources in `kernels/cuda/`, compiled once at
//! start-up with NVRTC for the device's architecture, and one launch wrapper per kernel. Everything that
//! touches the device is behind the `cuda` feature; without it this crate only carries the sources, so
//! CPU-only builds and CI never need CUDA.

/// The CUDA C sources, by module name.
pub const SOURCES: [(&str, &str); 2] =
    [("elementwise", include_str!("../cuda/elementwise.cu")), ("attention", include_str!("../cuda/attention.cu"))];

/// Kernel entry points every source must define (checked by the tests, launched by the wrappers).
pub const KERNELS: [&str; 6] = ["rmsnorm_f32", "rope_f32", "swiglu_f32", "add_f32", "attention_f32", "embed_f32"];

#[cfg(feature = "cuda")]
pub use cudarc;

#[cfg(feature = "cuda")]
pub mod blas;
#[cfg(feature = "cuda")]
pub mod device;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_defined_extern_c_in_a_source() {
        for kernel in KERNELS {
            let defined = SOURCES.iter().any(|(_, src)| src.contains(&format!("extern \"C\" __global__ void {kernel}(")));
            assert!(defined, "{kernel} is not defined in kernels/cuda/");
        }
    }
}
