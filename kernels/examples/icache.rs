//! What a cold instruction cache costs on GPU 0: kernels of N straight-line FFMAs (16 bytes of machine
//! code each, eight independent chains: a warp can issue one a cycle, one warp a block) time three
//! passes over the same code within a launch (pass 0 fetches the code, passes 1 and 2 find it cached),
//! for launches that follow a load of the module (code in DRAM), a launch of the same kernel (code in
//! L2 and maybe the SM) and a launch of a 256 KB kernel on every SM (code in L2, the SM's cache
//! refilled with other code). One block, or one per SM at once (they share the L2's fetches). A decode
//! step runs each kernel once per launch, so its launches pay pass 0's price: this says how much
//! machine code costs in time.
//! `cargo run --release -p ctxscope-kernels --features cuda --example icache` on a GPU machine (sm_90:
//! `CUBIN_DIR=dir` first where NVRTC is, then `ICACHE_CUBIN=dir/icache.cubin` there; ptxas takes
//! minutes over the longest kernels).

use ctxscope_kernels::cubin::compile_cubin;
use ctxscope_kernels::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use ctxscope_kernels::cudarc::nvrtc::Ptx;

const PASSES: usize = 3;

/// A kernel `straight_<n>` of `n` FFMAs in eight chains; lane 0 writes each pass's cycles and
/// nanoseconds to `t[(block * PASSES + pass) * 2 ..]`.
fn source(n: usize) -> String {
    let mut body = String::new();
    for i in 0..n {
        let k = i % 8;
        body.push_str(&format!("a{k} = fmaf(a{k}, c, 1.0f);\n"));
    }
    format!(
        r#"
extern "C" __global__ void straight_{n}(float* out, unsigned long long* t, float c) {{
    float a0 = threadIdx.x * c, a1 = a0 + 1.0f, a2 = a0 + 2.0f, a3 = a0 + 3.0f, a4 = a0 + 4.0f, a5 = a0 + 5.0f,
          a6 = a0 + 6.0f, a7 = a0 + 7.0f;
#pragma unroll 1
    for (int r = 0; r < {PASSES}; r++) {{
        unsigned long long c0, g0, c1, g1;
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(c0) :: "memory");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0) :: "memory");
{body}
        float s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
        asm volatile("" : "+f"(s) :: "memory");
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(c1) :: "memory");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1) :: "memory");
        if (threadIdx.x == 0) {{
            t[(blockIdx.x * {PASSES} + r) * 2] = c1 - c0;
            t[(blockIdx.x * {PASSES} + r) * 2 + 1] = g1 - g0;
        }}
        a0 = s;
    }}
    out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}}
"#
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes = [256usize, 1024, 2048, 4096, 8192];
    let evictor = 16384;
    let mut all = String::new();
    for n in sizes.iter().chain([&evictor]) {
        all.push_str(&source(*n));
    }
    // CUBIN_DIR=dir: only write the sm_90 CUBIN there (to read its machine code; no GPU needed).
    if let Some(dir) = std::env::var_os("CUBIN_DIR") {
        let compiled = compile_cubin(&all, "sm_90", &[])?;
        let cubin = compiled.cubin.ok_or_else(|| format!("does not compile:\n{}", compiled.log))?;
        std::fs::write(std::path::Path::new(&dir).join("icache.cubin"), cubin)?;
        return Ok(());
    }
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let (major, minor) = ctx.compute_capability()?;
    let arch = format!("sm_{major}{minor}");
    let sms = ctx.attribute(ctxscope_kernels::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
    // ptxas takes minutes over these straight lines: ICACHE_CUBIN=file loads the one CUBIN_DIR wrote.
    let cubin = match std::env::var_os("ICACHE_CUBIN") {
        Some(file) => std::fs::read(file)?,
        None => {
            let compiled = compile_cubin(&all, &arch, &[])?;
            compiled.cubin.ok_or_else(|| format!("does not compile:\n{}", compiled.log))?
        }
    };
    for (kernel, bytes) in ctxscope_kernels::cubin::code_sizes(&cubin) {
        println!("code {bytes:>7} bytes  {kernel}");
    }
    println!("{} ({arch}), {sms} SMs; cycles (and ns) of each pass, median over the blocks", ctx.name()?);
    println!("{:>8} {:>7} {:<22} {:>16} {:>16} {:>16}", "FFMAs", "blocks", "launch after", "pass 0", "pass 1", "pass 2");
    let mut out = stream.alloc_zeros::<f32>(sms * 32)?;
    let mut t = stream.alloc_zeros::<u64>(sms * PASSES * 2)?;
    let c = 0.999f32;
    for &n in &sizes {
        for blocks in [1usize, sms] {
            // A fresh module each time, so that the first launch finds its code in DRAM only.
            let module = ctx.load_module(Ptx::from_binary(cubin.clone()))?;
            let f = module.load_function(&format!("straight_{n}"))?;
            let evict = module.load_function(&format!("straight_{evictor}"))?;
            let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
            let all_sms = LaunchConfig { grid_dim: (sms as u32, 1, 1), ..cfg };
            for after in ["module load", "the same kernel", "a 256 KB kernel"] {
                if after == "a 256 KB kernel" {
                    let mut b = stream.launch_builder(&evict);
                    b.arg(&mut out).arg(&mut t).arg(&c);
                    // SAFETY: the kernel writes sms * 32 floats and sms * PASSES * 2 timings, as allocated.
                    unsafe { b.launch(all_sms) }?;
                }
                let mut b = stream.launch_builder(&f);
                b.arg(&mut out).arg(&mut t).arg(&c);
                // SAFETY: as above, for `blocks` <= sms blocks.
                unsafe { b.launch(cfg) }?;
                let times = stream.clone_dtoh(&t)?;
                let mut cells = Vec::new();
                for pass in 0..PASSES {
                    let mut cyc: Vec<u64> = (0..blocks).map(|b| times[(b * PASSES + pass) * 2]).collect();
                    let mut ns: Vec<u64> = (0..blocks).map(|b| times[(b * PASSES + pass) * 2 + 1]).collect();
                    cyc.sort_unstable();
                    ns.sort_unstable();
                    cells.push(format!("{} ({})", cyc[blocks / 2], ns[blocks / 2]));
                }
                println!("{n:>8} {blocks:>7} {after:<22} {:>16} {:>16} {:>16}", cells[0], cells[1], cells[2]);
            }
        }
    }
    Ok(())
}
