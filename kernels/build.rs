//! Builds the kernel modules into the binary ahead of time when asked: with the `cuda` feature and
//! `CTXSCOPE_CUDA_AOT_ARCH=sm_90` (a comma-separated list of real architectures) at build time, and
//! libnvrtc loadable here (no GPU needed), each module is compiled to a CUBIN exactly as the run-time
//! path compiles it (`src/cubin.rs`, the same options), wrapped as a cache entry keyed by its source's
//! hash (`src/entry.rs`), and included by `src/loader.rs`, which checks that key against the sources
//! it was built with before using one. Otherwise the binary carries none and compiles at start-up.

use std::fmt::Write;
use std::path::PathBuf;

#[allow(dead_code)]
#[path = "src/cubin.rs"]
mod cubin;
#[allow(dead_code)]
#[path = "src/entry.rs"]
mod entry;
#[allow(dead_code)]
#[path = "src/sources.rs"]
mod sources;

fn main() {
    for path in ["build.rs", "src/entry.rs", "src/sources.rs", "src/cubin.rs", "cuda"] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-env-changed=CTXSCOPE_CUDA_AOT_ARCH");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let archs = std::env::var("CTXSCOPE_CUDA_AOT_ARCH").unwrap_or_default();
    let archs: Vec<&str> = archs.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
    let (compiler, entries) = if archs.is_empty() { (String::new(), Vec::new()) } else { build(&archs) };
    let mut code = format!("pub const COMPILER: &str = {compiler:?};\npub const ENTRIES: &[(&str, &str, &[u8])] = &[\n");
    for (module, arch, entry) in entries {
        let file = out.join(format!("{module}.{arch}.entry"));
        std::fs::write(&file, entry).expect("OUT_DIR is writable");
        writeln!(code, "    ({module:?}, {arch:?}, include_bytes!({:?})),", file.display().to_string()).expect("a String");
    }
    code.push_str("];\n");
    std::fs::write(out.join("built_in.rs"), code).expect("OUT_DIR is writable");
}

/// The compiler's name and version, and (module, architecture, entry) for every module and `archs`.
#[cfg(feature = "cuda")]
fn build(archs: &[&str]) -> (String, Vec<(String, String, Vec<u8>)>) {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        panic!(
            "CTXSCOPE_CUDA_AOT_ARCH is set but libnvrtc cannot be loaded: put its folder on LD_LIBRARY_PATH \
             (PyPI's nvidia-cuda-nvrtc has one; scripts/device/prepare.sh shows how)"
        );
    }
    let compiler = cubin::nvrtc_version().unwrap_or_else(|e| panic!("NVRTC version: {e}"));
    for arch in archs {
        assert!(arch.starts_with("sm_"), "CTXSCOPE_CUDA_AOT_ARCH takes real architectures such as sm_90, not {arch:?}");
    }
    let jobs: Vec<(&str, &str, String)> = archs
        .iter()
        .flat_map(|arch| sources::SOURCES.iter().map(move |(module, source)| (*module, *arch, sources::full_source(source))))
        .collect();
    let entries = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(module, arch, full)| {
                let compiler = &compiler;
                s.spawn(move || {
                    let compiled = cubin::compile_cubin(full, arch, &[]).unwrap_or_else(|e| panic!("NVRTC on {module}: {e}"));
                    let Some(code) = compiled.cubin else {
                        panic!("{module} does not compile for {arch}:\n{}", compiled.log);
                    };
                    let key = entry::Key::new(module, full, arch, compiler, &[]);
                    (module.to_string(), arch.to_string(), entry::encode(&key, &code))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    (compiler, entries)
}

#[cfg(not(feature = "cuda"))]
fn build(_: &[&str]) -> (String, Vec<(String, String, Vec<u8>)>) {
    println!("cargo:warning=CTXSCOPE_CUDA_AOT_ARCH is ignored without the cuda feature");
    (String::new(), Vec::new())
}
