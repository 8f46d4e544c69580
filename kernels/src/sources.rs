//! The CUDA C sources, by module, as NVRTC compiles them. Its own file so that the build script
//! (`build.rs`, the kernels built ahead of time) compiles exactly what the library loads.

/// Prepended to every module: number-format conversions, warp/block reductions, the KV cache layout.
pub const PRELUDE: &str = include_str!("../cuda/prelude.cuh");

/// The CUDA C sources, by module name (each compiled as `PRELUDE` + source). The `.cuh` parts are
/// shared by two modules: the fused QKV epilogue (RoPE and the K/V store) by the GEMVs and the decode
/// step, the online-softmax tile attention by decode attention and the decode step.
pub const SOURCES: [(&str, &str); 5] = [
    ("elementwise", include_str!("../cuda/elementwise.cu")),
    ("gemv", concat!(include_str!("../cuda/rope_store.cuh"), include_str!("../cuda/gemv.cu"))),
    ("attention", concat!(include_str!("../cuda/attend.cuh"), include_str!("../cuda/attention.cu"))),
    ("decode", concat!(include_str!("../cuda/rope_store.cuh"), include_str!("../cuda/attend.cuh"), include_str!("../cuda/decode.cu"))),
    ("sample", include_str!("../cuda/sample.cu")),
];

/// A whole module as NVRTC compiles it: the prelude, then the module's source.
pub fn full_source(source: &str) -> String {
    format!("{PRELUDE}\n{source}")
}
