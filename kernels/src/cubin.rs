//! Hopper machine code (CUBIN) from NVRTC without a GPU, and what each kernel's code weighs: a kernel
//! that runs once per launch fetches its instructions with a cold cache on every SM, so its code size
//! is on a decode step's critical path (decode attention: 93 KB → 38 KB of code took 38 µs off a 916 µs
//! step on the H200, BENCHMARKS.md). The `resources` example prints the sizes; a test keeps decode
//! attention's under a budget.

/// Each kernel's machine-code size in bytes, from a CUBIN (an ELF64 file with one `.text.<kernel>`
/// section per kernel). Empty for anything that is not a little-endian ELF64 file; a truncated file
/// gives the sections that could be read, never a panic.
pub fn code_sizes(elf: &[u8]) -> Vec<(String, u64)> {
    let bytes = |at: usize, n: usize| elf.get(at..at.checked_add(n)?);
    let u16_at = |at: usize| bytes(at, 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |at: usize| bytes(at, 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let u64_at = |at: usize| bytes(at, 8).map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
    // Magic, 64-bit class, little-endian data.
    if bytes(0, 6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Vec::new();
    }
    let (Some(table), Some(entry), Some(count), Some(names)) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e)) else {
        return Vec::new();
    };
    let header = |i: usize| (table as usize).checked_add(i.checked_mul(entry)?);
    let Some(strtab) = header(names).and_then(|h| u64_at(h.checked_add(0x18)?)) else {
        return Vec::new();
    };
    let name = |offset: usize| -> Option<String> {
        let start = (strtab as usize).checked_add(offset)?;
        let rest = elf.get(start..)?;
        let end = rest.iter().position(|&c| c == 0)?;
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    (0..count)
        .filter_map(|i| {
            let h = header(i)?;
            let section = name(u32_at(h)?)?;
            let kernel = section.strip_prefix(".text.")?;
            Some((kernel.to_string(), u64_at(h.checked_add(0x20)?)?))
        })
        .collect()
}

/// Why a module could not be compiled to a CUBIN.
#[cfg(feature = "cuda")]
#[derive(Debug, thiserror::Error)]
pub enum CubinError {
    #[error("the source holds a NUL byte")]
    Nul,
    #[error("NVRTC: {0:?}")]
    Nvrtc(cudarc::nvrtc::result::NvrtcError),
}

/// A module compiled by NVRTC: its log (ptxas's resource report with `--ptxas-options=-v`) and its
/// CUBIN, `None` when it did not compile (the log says why).
#[cfg(feature = "cuda")]
pub struct Compiled {
    pub log: String,
    pub cubin: Option<Vec<u8>>,
}

/// Compiles `source` (a whole module: `PRELUDE` and the module's source) to machine code for a real
/// architecture such as `sm_90`, with extra NVRTC `options`. Needs libnvrtc, not a GPU.
#[cfg(feature = "cuda")]
pub fn compile_cubin(source: &str, arch: &str, options: &[&str]) -> Result<Compiled, CubinError> {
    use cudarc::nvrtc::{result, sys};
    let source = std::ffi::CString::new(source).map_err(|_| CubinError::Nul)?;
    let program = result::create_program(&source, None).map_err(CubinError::Nvrtc)?;
    let arch = format!("--gpu-architecture={arch}");
    let mut all = vec![arch.as_str()];
    all.extend_from_slice(options);
    // SAFETY: `program` was just created and is destroyed below, after its log and CUBIN are read.
    let compiled = unsafe { result::compile_program(program, &all) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(program) };
    let mut cubin = None;
    if compiled.is_ok() {
        let mut size = 0usize;
        // SAFETY: a compiled program for a real architecture has a CUBIN of this size.
        let read = unsafe { sys::nvrtcGetCUBINSize(program, &mut size) }.result().and_then(|()| {
            let mut bytes = vec![0u8; size];
            // SAFETY: `bytes` holds the size NVRTC just reported.
            unsafe { sys::nvrtcGetCUBIN(program, bytes.as_mut_ptr().cast()) }.result().map(|()| bytes)
        });
        cubin = Some(read.map_err(CubinError::Nvrtc)?);
    }
    // SAFETY: created above, not used after.
    unsafe { result::destroy_program(program) }.map_err(CubinError::Nvrtc)?;
    let log = log.map_err(CubinError::Nvrtc)?.iter().take_while(|c| **c != 0).map(|c| *c as u8 as char).collect();
    Ok(Compiled { log, cubin })
}

/// The loadable libnvrtc's version, as `nvrtc MAJOR.MINOR` (part of every compiled module's cache key).
/// Callers check that libnvrtc can be loaded first (`cudarc::nvrtc::sys::is_culib_present`).
#[cfg(feature = "cuda")]
pub fn nvrtc_version() -> Result<String, CubinError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(CubinError::Nvrtc)?;
    Ok(format!("nvrtc {major}.{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 file: a null section, `.text.k` of 1234 bytes and the section-name table.
    fn tiny_elf() -> Vec<u8> {
        let names = b"\0.text.k\0.shstrtab\0";
        let (strtab, table) = (64usize, 64 + names.len().next_multiple_of(8));
        let mut elf = vec![0u8; table + 3 * 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&(table as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        elf[strtab..strtab + names.len()].copy_from_slice(names);
        let section = |elf: &mut Vec<u8>, i: usize, name: u32, offset: u64, size: u64| {
            let h = table + 64 * i;
            elf[h..h + 4].copy_from_slice(&name.to_le_bytes());
            elf[h + 0x18..h + 0x20].copy_from_slice(&offset.to_le_bytes());
            elf[h + 0x20..h + 0x28].copy_from_slice(&size.to_le_bytes());
        };
        section(&mut elf, 1, 1, 0, 1234);
        section(&mut elf, 2, 9, strtab as u64, names.len() as u64);
        elf
    }

    #[test]
    fn code_sizes_reads_the_kernels_text_sections() {
        assert_eq!(code_sizes(&tiny_elf()), vec![("k".to_string(), 1234)]);
    }

    #[test]
    fn code_sizes_of_a_truncated_or_foreign_file_is_what_it_can_read() {
        let elf = tiny_elf();
        for cut in 0..elf.len() {
            let sizes = code_sizes(&elf[..cut]);
            assert!(sizes.is_empty() || sizes == vec![("k".to_string(), 1234)], "cut at {cut}: {sizes:?}");
        }
        assert!(code_sizes(b"not an ELF file at all").is_empty());
        let mut big_endian = elf.clone();
        big_endian[5] = 2;
        assert!(code_sizes(&big_endian).is_empty());
    }

    /// Decode attention's machine code stays within a budget: it runs once per launch on every SM
    /// (cold instruction cache), and its code size measurably costs decode time (module doc). 38 KB
    /// with NVRTC 13.5 at one warp per query head; 93 KB when each warp owned up to four heads.
    #[cfg(feature = "cuda")]
    #[test]
    fn decode_attention_stays_within_its_code_budget() {
        const BUDGET: u64 = 48 * 1024;
        if !crate::tests::nvrtc_present("code size not checked") {
            return;
        }
        let (_, source) = crate::SOURCES.iter().find(|(module, _)| *module == "attention").expect("the attention module");
        let compiled = compile_cubin(&format!("{}\n{source}", crate::PRELUDE), "sm_90", &[]).expect("NVRTC runs");
        let cubin = compiled.cubin.unwrap_or_else(|| panic!("attention does not compile:\n{}", compiled.log));
        let sizes = code_sizes(&cubin);
        let size_of = |name: &str| sizes.iter().find(|(kernel, _)| kernel == name).map(|(_, size)| *size).expect("the kernel in the CUBIN");
        for kernel in ["attn_decode_cluster", "attn_decode_cluster_hd64_c16", "attn_decode_cluster_hd128_c16"] {
            let size = size_of(kernel);
            assert!(size <= BUDGET, "{kernel} is {size} bytes of machine code, over its budget of {BUDGET}");
        }
        // The compile-time head dimension is there to shorten the code.
        assert!(size_of("attn_decode_cluster_hd64_c16") < size_of("attn_decode_cluster"));
    }
}
