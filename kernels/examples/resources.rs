//! Compiles every kernel module to Hopper machine code (sm_90 CUBIN) with NVRTC and prints ptxas's
//! resource report (registers, shared memory, stack, spills) and each kernel's code size — no GPU
//! needed, only libnvrtc (`LD_LIBRARY_PATH` to its folder; PyPI's `nvidia-cuda-nvrtc` has one). Run:
//! `cargo run -p ctxscope-kernels --features cuda --example resources [-- NVRTC options]`, e.g.
//! `-- -DCTX_TRACE` for the kernels with their timeline marks. `CUBIN_DIR=dir` also writes each
//! module's CUBIN there (for `nvdisasm`).

use ctxscope_kernels::cubin::{code_sizes, compile_cubin};
use ctxscope_kernels::{PRELUDE, SOURCES};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut failed = false;
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let mut options = vec!["--ptxas-options=-v"];
    options.extend(extra.iter().map(String::as_str));
    for (module, source) in SOURCES {
        let compiled = compile_cubin(&format!("{PRELUDE}\n{source}"), "sm_90", &options)?;
        println!("== {module}: {}", if compiled.cubin.is_some() { "ok" } else { "FAILED" });
        for line in
            compiled.log.lines().filter(|l| l.contains("Used") || l.contains("spill") || l.contains("error") || l.contains("Compiling"))
        {
            println!("  {line}");
        }
        if let Some(cubin) = &compiled.cubin {
            println!("  cubin {} bytes", cubin.len());
            for (kernel, bytes) in code_sizes(cubin) {
                println!("  code {bytes:>7} bytes  {kernel}");
            }
            if let Some(dir) = std::env::var_os("CUBIN_DIR") {
                std::fs::write(std::path::Path::new(&dir).join(format!("{module}.cubin")), cubin)?;
            }
        }
        failed |= compiled.cubin.is_none();
    }
    if failed {
        return Err("a module did not compile".into());
    }
    Ok(())
}
