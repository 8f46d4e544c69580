//! Device check of every kernel wrapper (`./devcheck/kernels_check` on a lent GPU; built by
//! scripts/device/prepare.sh): deterministic random inputs, each launch on the GPU against a plain CPU
//! reference written here (f64 where that is natural; exact emulations of the patches' bf16, FP8 and Q8
//! roundings), every output poisoned with NaN before its launch and followed by a poisoned tail, so an
//! unwritten element or a write past the end shows. Timings first, the table LAST; exits non-zero
//! when a check misses its limit or a call fails.
//!
//! This file runs the sections in order and prints the table; each kernel family's checks live in
//! their own module, over the shared comparisons (`report`), CPU references (`reference`) and inputs
//! (`rng`).

mod attention;
mod elementwise;
mod gemv;
mod matmul;
mod norm;
mod reference;
mod report;
mod rng;
mod rope;
mod sample;
mod shapes;
mod stream;
mod timing;

use std::process::ExitCode;
use std::time::Instant;

use ctxscope_kernels::device::Device;

use report::{Report, Res, Row};
use rng::Rng;

type Section = fn(&Device, &mut Rng, &mut Report) -> Res;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("kernels check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Res<bool> {
    let started = Instant::now();
    let dev = Device::new(0)?;
    let ready = started.elapsed().as_secs_f64();
    let name = dev.ctx.name()?;
    println!(
        "{name}, {} SMs: Device::new(0) (context + {} kernel modules) took {ready:.2} s",
        dev.multiprocessors,
        ctxscope_kernels::SOURCES.len()
    );
    for r in &dev.module_reports {
        let (fetch, load) = (r.fetch.as_secs_f64() * 1e3, r.load.as_secs_f64() * 1e3);
        println!("  {:<12} {:>8} bytes  fetched in {fetch:>8.1} ms, loaded in {load:>6.1} ms: {}", r.module, r.bytes, r.origin);
    }
    let sections: [(&str, Section); 16] = [
        ("rmsnorm", norm::check_rmsnorm),
        ("embed", elementwise::check_embed),
        ("rope_kv", rope::check_rope_kv),
        ("elementwise", elementwise::check_elementwise),
        ("gemv", gemv::check_gemv),
        ("gemv timing", gemv::time_gemv),
        ("gemv_stream", stream::check_stream),
        ("gemv_stream timing", stream::time_stream),
        ("cuBLAS matmul", matmul::check_matmul),
        ("attn_prefill", attention::check_prefill),
        ("attn_decode", attention::check_decode),
        ("small kernels timed", timing::time_small),
        ("argmax_logprob", sample::check_argmax),
        ("top_p_sample", sample::check_top_p),
        // Last: a wrapper that wrongly accepts a bad shape may launch out of bounds.
        ("wrapper shape checks", shapes::check_shapes),
        ("device errors", shapes::check_sticky),
    ];
    let mut rep = Report::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, section) in sections {
        let t = Instant::now();
        if let Err(e) = section(&dev, &mut rng, &mut rep) {
            let mut row = Row::new(format!("{name}: ERROR"), 0.0);
            row.bad = 1;
            row.first_bad = e.to_string();
            rep.rows.push(row);
        }
        rep.info.push(format!("{name}: {:.2} s", t.elapsed().as_secs_f64()));
    }
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    for line in &rep.info {
        println!("  {line}");
    }
    Ok(rep.print())
}
