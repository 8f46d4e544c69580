//! Teacher-forced logits of a DeepSeek-V4 checkpoint under one patch set at chosen context lengths,
//! for the distance-from-golden table by length (docs/engine.md): a seeded token sequence is fed
//! in chunks without the output head, and at each length L the logits of positions L..L+16 are written as raw
//! little-endian f32 rows to `OUT.L.bin`, each file complete once its window is. Run once with
//! `golden` and once per patch set, then compare the files (scripts/deepseek_v4/patch_table.py).
//! `deepseek_v4_patches DIR PATCHES|golden OUT [LENGTHS, default 1024,4096]`

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use ctxscope_engine::forward::deepseek_v4::DeepseekV4Model;
use ctxscope_engine::PatchSet;

/// Positions measured after each length.
const WINDOW: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, patches, out, ..] = args.as_slice() else {
        eprintln!("usage: deepseek_v4_patches DIR PATCHES|golden OUT [LENGTHS]");
        std::process::exit(2);
    };
    let lengths: Vec<usize> =
        args.get(4).map_or("1024,4096", String::as_str).split(',').map(|l| l.trim().parse().expect("lengths are integers")).collect();
    let set = if patches == "golden" { PatchSet::default() } else { PatchSet::parse(patches).unwrap_or_else(|e| panic!("{e}")) };
    let model = DeepseekV4Model::load(&PathBuf::from(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let vocab = model.config.vocab_size as u64;
    let end = lengths.iter().max().copied().unwrap_or(0) + WINDOW;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let tokens: Vec<u32> = (0..end)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (2 + seed % (vocab - 2)) as u32
        })
        .collect();
    let mut state = model.state(&set);
    let started = Instant::now();
    for length in lengths {
        assert!(length >= state.len(), "lengths rise by at least {WINDOW}");
        // Up to the length without the output head, then the measured positions.
        let seen = state.len();
        model.advance(&mut state, &tokens[seen..length]);
        let rows: Vec<u8> =
            model.forward(&mut state, &tokens[length..length + WINDOW]).iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
        let path = format!("{out}.{length}.bin");
        std::fs::File::create(&path).and_then(|mut f| f.write_all(&rows)).unwrap_or_else(|e| panic!("{path}: {e}"));
        eprintln!("{patches}: {} positions in {:.1} s", length + WINDOW, started.elapsed().as_secs_f64());
    }
}
