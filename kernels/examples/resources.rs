//! Compiles every kernel module to Hopper machine code (sm_90 CUBIN) with NVRTC and prints ptxas's
//! resource report (registers, shared memory, stack, spills) — no GPU needed, only libnvrtc
//! (`LD_LIBRARY_PATH` to its folder; PyPI's `nvidia-cuda-nvrtc` has one). Run:
//! `cargo run -p ctxscope-kernels --features cuda --example resources [-- NVRTC options]`, e.g.
//! `-- -DCTX_TRACE` for the kernels with their timeline marks.

use std::ffi::CString;

use ctxscope_kernels::cudarc::nvrtc::{result, sys};
use ctxscope_kernels::{PRELUDE, SOURCES};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut failed = false;
    let extra: Vec<String> = std::env::args().skip(1).collect();
    for (module, source) in SOURCES {
        let full = CString::new(format!("{PRELUDE}\n{source}"))?;
        let program = result::create_program(&full, None)?;
        let mut options = vec!["--gpu-architecture=sm_90", "--ptxas-options=-v"];
        options.extend(extra.iter().map(String::as_str));
        // SAFETY: `program` was just created and is destroyed below; options are plain strings.
        let compiled = unsafe { result::compile_program(program, &options) };
        // SAFETY: as above; the log is read before the program is destroyed.
        let log = unsafe { result::get_program_log(program) }?;
        let log: String = log.iter().take_while(|c| **c != 0).map(|c| *c as u8 as char).collect();
        println!("== {module}: {}", if compiled.is_ok() { "ok" } else { "FAILED" });
        for line in log.lines().filter(|l| l.contains("Used") || l.contains("spill") || l.contains("error") || l.contains("Compiling")) {
            println!("  {line}");
        }
        let mut size = 0usize;
        if compiled.is_ok() {
            // SAFETY: a compiled program has a CUBIN for a real architecture; only its size is read.
            unsafe { sys::nvrtcGetCUBINSize(program, &mut size) }.result()?;
            println!("  cubin {size} bytes");
        }
        failed |= compiled.is_err();
        // SAFETY: created above, not used after.
        unsafe { result::destroy_program(program) }?;
    }
    if failed {
        return Err("a module did not compile".into());
    }
    Ok(())
}
