//! Compiles every kernel module to Hopper machine code (sm_90 CUBIN) with NVRTC and prints ptxas's
//! resource report (registers, shared memory, stack, spills) — no GPU needed, only libnvrtc
//! (`LD_LIBRARY_PATH` to its folder; PyPI's `nvidia-cuda-nvrtc` has one). Run:
//! `cargo run -p ctxscope-kernels --features cuda --example resources [-- NVRTC options]`, e.g.
//! `-- -DCTX_TRACE` for the kernels with their timeline marks. Also prints each kernel's machine-code
//! size; `CUBIN_DIR=dir` writes each module's CUBIN there (for `nvdisasm`).

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
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds the size NVRTC just reported.
            unsafe { sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast()) }.result()?;
            println!("  cubin {size} bytes");
            if let Some(dir) = std::env::var_os("CUBIN_DIR") {
                std::fs::write(std::path::Path::new(&dir).join(format!("{module}.cubin")), &cubin)?;
            }
            for (kernel, bytes) in text_sections(&cubin) {
                println!("  code {bytes:>7} bytes  {kernel}");
            }
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

/// The machine-code size of each kernel in a CUBIN (an ELF64 file: one `.text.<kernel>` section each),
/// since an instruction-cache-cold kernel that runs once per launch pays for every line it fetches.
fn text_sections(elf: &[u8]) -> Vec<(String, u64)> {
    let u16_at = |o: usize| elf.get(o..o + 2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| elf.get(o..o + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()) as usize);
    let u64_at = |o: usize| elf.get(o..o + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    if elf.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Vec::new();
    }
    let (table, entry, count, names) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| table + i * entry;
    let strtab = u64_at(header(names) + 0x18) as usize;
    let name = |off: usize| {
        let start = strtab + off;
        let end = elf[start.min(elf.len())..].iter().position(|&c| c == 0).map_or(elf.len(), |n| start + n);
        String::from_utf8_lossy(&elf[start.min(end)..end]).into_owned()
    };
    (0..count)
        .filter_map(|i| name(u32_at(header(i))).strip_prefix(".text.").map(|k| (k.to_string(), u64_at(header(i) + 0x20))))
        .collect()
}
