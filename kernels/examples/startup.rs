//! Where a kernel module's start-up time goes, per module, on GPU 0: NVRTC to PTX and the driver's
//! PTX-to-SASS JIT at load (the path before CUBINs), against NVRTC straight to a CUBIN and its load.
//! Modules one at a time, so each time is its own. Run it with `CUDA_CACHE_DISABLE=1` (and a fresh
//! HOME) to see a fresh machine, whose JIT cache (~/.nv/ComputeCache) is empty:
//! `CUDA_CACHE_DISABLE=1 ./startup` (scripts/device/startup.sh does, among other runs).

use std::time::Instant;

use ctxscope_kernels::cubin::{compile_cubin, nvrtc_version};
use ctxscope_kernels::cudarc::driver::CudaContext;
use ctxscope_kernels::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use ctxscope_kernels::{full_source, SOURCES};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let ctx = CudaContext::new(0)?;
    let context_s = t.elapsed().as_secs_f64();
    let (major, minor) = ctx.compute_capability()?;
    let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
    println!("{} ({arch}), {}, context in {context_s:.3} s", ctx.name()?, nvrtc_version()?);
    println!("{:<12} {:>10} {:>12} {:>12} {:>12} {:>10}", "module", "PTX (s)", "PTX JIT (s)", "CUBIN (s)", "load (s)", "CUBIN KB");
    let mut sums = [0f64; 4];
    for (module, source) in SOURCES {
        let full = full_source(source);
        let t = Instant::now();
        let ptx = compile_ptx_with_opts(&full, CompileOptions { arch: Some(arch), ..Default::default() })?;
        let ptx_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        drop(ctx.load_module(ptx)?);
        let jit_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let compiled = compile_cubin(&full, arch, &[])?;
        let cubin = compiled.cubin.ok_or_else(|| format!("{module}: {}", compiled.log))?;
        let cubin_s = t.elapsed().as_secs_f64();
        let bytes = cubin.len();
        let t = Instant::now();
        drop(ctx.load_module(Ptx::from_binary(cubin))?);
        let load_s = t.elapsed().as_secs_f64();
        for (sum, v) in sums.iter_mut().zip([ptx_s, jit_s, cubin_s, load_s]) {
            *sum += v;
        }
        println!("{module:<12} {ptx_s:>10.2} {jit_s:>12.2} {cubin_s:>12.2} {load_s:>12.3} {:>10}", bytes / 1024);
    }
    println!("{:<12} {:>10.2} {:>12.2} {:>12.2} {:>12.3}", "total", sums[0], sums[1], sums[2], sums[3]);
    Ok(())
}
