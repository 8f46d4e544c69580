//! Each kernel module's machine code for the device, had the cheapest sound way — built into the binary
//! ahead of time (`build.rs`) for this architecture and these sources, else the on-disk cache
//! (`cache`), else NVRTC straight to a CUBIN, the modules that need it compiled in parallel threads —
//! then loaded with `cuModuleLoadData`, which for a CUBIN needs no PTX JIT (the JIT was most of a fresh
//! machine's start: BENCHMARKS.md, "GPU start-up"). A built-in or cached module the driver refuses is
//! compiled again. One report per module (where its code came from, how long getting and loading it
//! took), logged at info.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::cache::{DirStore, KernelCache, Origin};
use crate::cubin::{compile_cubin, nvrtc_version};
use crate::entry::{decode, Key};
use crate::error::DeviceError;
use crate::settings::KernelSettings;
use crate::{full_source, SOURCES};

/// The modules `build.rs` compiled ahead of time: `COMPILER` (the NVRTC that made them) and `ENTRIES`
/// (module, architecture, cache entry); empty unless the build set `CTXSCOPE_CUDA_AOT_ARCH`.
mod built_in {
    include!(concat!(env!("OUT_DIR"), "/built_in.rs"));
}

/// The architectures this binary carries built-in modules for (empty: it compiles at start-up).
pub fn built_in_archs() -> Vec<&'static str> {
    let mut archs: Vec<&str> = built_in::ENTRIES.iter().map(|(_, arch, _)| *arch).collect();
    archs.dedup();
    archs
}

/// How one module was had.
#[derive(Debug)]
pub struct ModuleReport {
    pub module: &'static str,
    pub origin: Origin,
    /// Size of its CUBIN.
    pub bytes: usize,
    /// Time to get the CUBIN: compiling, or reading and checking an entry.
    pub fetch: Duration,
    /// Time `cuModuleLoadData` took.
    pub load: Duration,
}

/// Every module of `SOURCES` loaded into `ctx` for `arch` (such as `sm_90`), in `SOURCES` order, with
/// how each was had.
pub(crate) fn load_modules(
    ctx: &Arc<CudaContext>,
    arch: &str,
    settings: &KernelSettings,
) -> Result<Vec<(Arc<CudaModule>, ModuleReport)>, DeviceError> {
    let started = Instant::now();
    let options = settings.options();
    let sources: Vec<(&'static str, String)> = SOURCES.iter().map(|(module, source)| (*module, full_source(source))).collect();
    let cache = KernelCache::new(settings.cache_dir.clone().map(DirStore::new));
    // 1. Built in, when made from these very sources for this architecture (the key says so).
    let mut got: Vec<Option<(Vec<u8>, Origin, Duration)>> = sources
        .iter()
        .map(|(module, full)| {
            let t = Instant::now();
            let entry = built_in::ENTRIES.iter().find(|(m, a, _)| m == module && *a == arch).filter(|_| settings.built_in_usable())?;
            let key = Key::new(module, full, arch, built_in::COMPILER, &options);
            let code = decode(&key, entry.2).ok()?;
            Some((code.to_vec(), Origin::BuiltIn, t.elapsed()))
        })
        .collect();
    // 2. The others from the cache or NVRTC, one thread each.
    let compiler = if got.iter().any(Option::is_none) { Some(compiler()?) } else { None };
    std::thread::scope(|s| {
        let handles: Vec<_> = sources
            .iter()
            .zip(&got)
            .filter(|(_, have)| have.is_none())
            .map(|((module, full), _)| {
                let (cache, options, compiler) = (&cache, &options, compiler.as_deref().unwrap_or_default());
                s.spawn(move || fetch(cache, module, full, arch, compiler, options, false))
            })
            .collect();
        let mut results = handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        for slot in got.iter_mut().filter(|have| have.is_none()) {
            // One result per empty slot, in order (the filter above).
            *slot = results.next().transpose()?;
        }
        Ok::<(), DeviceError>(())
    })?;
    // 3. Load each; what the driver refuses and was not compiled just now is compiled again.
    let mut loaded = Vec::with_capacity(sources.len());
    for ((module, full), have) in sources.iter().zip(got) {
        let (mut code, mut origin, mut fetch_time) = have.expect("step 2 filled every slot step 1 left empty");
        let t = Instant::now();
        let mut module_result = ctx.load_module(Ptx::from_binary(code.clone()));
        if module_result.is_err() && !matches!(origin, Origin::Compiled { .. }) {
            tracing::warn!(module, %origin, error = ?module_result.as_ref().err(), "the driver refused a kernel module; compiling it again");
            let compiler = compiler.clone().map_or_else(self::compiler, Ok)?;
            (code, origin, fetch_time) = fetch(&cache, module, full, arch, &compiler, &options, true)?;
            module_result = ctx.load_module(Ptx::from_binary(code.clone()));
        }
        let module_handle = module_result?;
        let report = ModuleReport { module, origin, bytes: code.len(), fetch: fetch_time, load: t.elapsed() };
        tracing::info!(
            module,
            origin = %report.origin,
            bytes = report.bytes,
            fetch_ms = report.fetch.as_secs_f64() * 1e3,
            load_ms = report.load.as_secs_f64() * 1e3,
            "kernel module ready"
        );
        loaded.push((module_handle, report));
    }
    tracing::info!(
        arch,
        cache = %settings.cache_dir.as_ref().map_or("off".to_string(), |d| d.display().to_string()),
        seconds = started.elapsed().as_secs_f64(),
        "kernel modules ready"
    );
    Ok(loaded)
}

/// The loadable NVRTC's version, or why there is none.
fn compiler() -> Result<String, DeviceError> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(DeviceError::NoCompiler);
    }
    nvrtc_version().map_err(|e| DeviceError::Compile { module: "(version query)".into(), detail: e.to_string() })
}

/// `module`'s CUBIN from the cache (unless `fresh`) or compiled with NVRTC, and the time it took.
fn fetch(
    cache: &KernelCache<DirStore>,
    module: &str,
    full: &str,
    arch: &str,
    compiler: &str,
    options: &[String],
    fresh: bool,
) -> Result<(Vec<u8>, Origin, Duration), DeviceError> {
    let t = Instant::now();
    let key = Key::new(module, full, arch, compiler, options);
    let (code, origin) = cache.get_or_compile(&key, fresh, || {
        let flags: Vec<&str> = options.iter().map(String::as_str).collect();
        let failed = |detail: String| DeviceError::Compile { module: module.to_string(), detail };
        let compiled = compile_cubin(full, arch, &flags).map_err(|e| failed(e.to_string()))?;
        compiled.cubin.ok_or_else(|| failed(compiled.log))
    })?;
    Ok((code, origin, t.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the build put in the binary was made from these very sources: each entry's key (the
    /// source's hash with the architecture and compiler) checks, and its payload is a whole ELF file.
    #[test]
    fn every_built_in_module_matches_its_source() {
        for (module, arch, entry) in built_in::ENTRIES {
            let (_, source) = SOURCES.iter().find(|(m, _)| m == module).unwrap_or_else(|| panic!("{module}: no such module"));
            let key = Key::new(module, &full_source(source), arch, built_in::COMPILER, &[]);
            let code = decode(&key, entry).unwrap_or_else(|e| panic!("built-in {module} for {arch}: {e}"));
            assert!(code.starts_with(b"\x7fELF"), "{module}: not a CUBIN");
        }
        if let Ok(archs) = std::env::var("CTXSCOPE_CUDA_AOT_ARCH") {
            for arch in archs.split(',').filter(|a| !a.is_empty()) {
                assert_eq!(built_in::ENTRIES.iter().filter(|(_, a, _)| *a == arch).count(), SOURCES.len(), "{arch}");
            }
        }
    }
}
