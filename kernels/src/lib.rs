//! CUDA kernels of the engine's device backend: CUDA C sources in `kernels/cuda/`, compiled to machine
//! code for the device's architecture (built in ahead of time, kept in an on-disk cache, or compiled at
//! start-up with NVRTC: `loader`), and one launch wrapper per kernel. Everything that
//! touches the device is behind the `cuda` feature; without it this crate only carries the sources, so
//! CPU-only builds and CI never need CUDA.

pub mod sources;
pub use sources::{full_source, PRELUDE, SOURCES};

/// Kernel entry points every source must define (checked by the tests, launched by the wrappers).
pub const KERNELS: [&str; 35] = [
    "rmsnorm_f32",
    "embed_f32",
    "embed_bf16",
    "rope_kv",
    "rope_inv_freq_table",
    "swiglu_f32",
    "add_f32",
    "to_bf16",
    "round_f32",
    "q8_blocks",
    "gemv_bf16",
    "gemv_f32",
    "gemv_qkv_rope_bf16",
    "gemv_qkv_rope_f32",
    "gemv_stream_bf16",
    "gemv_stream_f32",
    "gemv_stream_bf16_m0",
    "gemv_stream_bf16_m1",
    "gemv_stream_bf16_m2",
    "gemv_stream_bf16_m3",
    "gemv_stream_bf16_m0_n1",
    "gemv_stream_bf16_m1_n1",
    "gemv_stream_bf16_m2_n1",
    "gemv_stream_bf16_m3_n1",
    "gemv_stream_bf16_m3_p1",
    "gemv_stream_bf16_m3_n1_p1",
    "attn_prefill",
    "attn_decode",
    "attn_decode_cluster",
    "attn_decode_cluster_hd64_c16",
    "attn_decode_cluster_hd128_c16",
    "decode_step_bf16",
    "decode_step_f32",
    "argmax_logprob",
    "top_p_sample",
];

#[cfg(feature = "cuda")]
pub use cudarc;

#[cfg(feature = "cuda")]
pub mod blas;
pub mod cache;
pub mod cubin;
#[cfg(feature = "cuda")]
pub mod device;
pub mod entry;
#[cfg(feature = "cuda")]
pub mod error;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
pub mod loader;
pub mod settings;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Whether libnvrtc can be loaded for a test that compiles kernels. scripts/test.sh installs it and
    /// sets CTXSCOPE_REQUIRE_NVRTC, so there a missing library fails; elsewhere the test says what it
    /// skipped (`skipped`) and checks nothing else.
    #[cfg(feature = "cuda")]
    pub(crate) fn nvrtc_present(skipped: &str) -> bool {
        // SAFETY: only probes whether the shared library can be opened.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return true;
        }
        assert!(std::env::var_os("CTXSCOPE_REQUIRE_NVRTC").is_none(), "CTXSCOPE_REQUIRE_NVRTC is set but libnvrtc cannot be loaded");
        eprintln!("libnvrtc not found (set LD_LIBRARY_PATH to its folder): {skipped}");
        false
    }

    #[test]
    fn every_kernel_is_defined_extern_c_in_a_source() {
        for kernel in KERNELS {
            // `extern "C" __global__ void [__launch_bounds__(..)] name(` on one line.
            let defined = SOURCES.iter().any(|(_, src)| {
                src.lines().any(|l| {
                    l.starts_with("extern \"C\" __global__ void ")
                        && (l.contains(&format!("void {kernel}(")) || l.contains(&format!(") {kernel}(")))
                })
            });
            assert!(defined, "{kernel} is not defined in kernels/cuda/");
        }
    }

    /// Every module compiles with NVRTC for Hopper (sm_90) where libnvrtc can be loaded — no GPU
    /// needed (`scripts/test.sh` installs it from PyPI's `nvidia-cuda-nvrtc` and sets
    /// CTXSCOPE_REQUIRE_NVRTC); elsewhere, without NVRTC, it says so and checks nothing else.
    #[cfg(feature = "cuda")]
    #[test]
    fn every_module_compiles_for_sm90_with_nvrtc() {
        if !nvrtc_present("kernels not compiled") {
            return;
        }
        // As served, and with the timeline marks compiled in (CTXSCOPE_CUDA_TRACE=1).
        for defines in [vec![], vec!["-DCTX_TRACE".to_string()]] {
            for (module, source) in SOURCES {
                let options = cudarc::nvrtc::CompileOptions { arch: Some("sm_90"), options: defines.clone(), ..Default::default() };
                let full = format!("{PRELUDE}\n{source}");
                if let Err(e) = cudarc::nvrtc::compile_ptx_with_opts(full, options) {
                    panic!("{module} does not compile (options {defines:?}): {e:?}");
                }
            }
        }
    }
}
