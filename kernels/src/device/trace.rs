//! Kernel timeline tracing, a diagnostic (kernels compiled with it: `CTXSCOPE_CUDA_TRACE=1`): while a
//! trace is on, the streamed GEMVs, decode attention and argmax append (global timer, kernel, event,
//! block) records to a device buffer (prelude `trace_mark`); `launches` groups them into launches and
//! `summary` says where a pass's time went:
//! each launch's start relative to the previous one's end, its wait for the previous kernel, its input
//! staging and its work.

use std::collections::HashMap;
use std::fmt::Write;

use cudarc::driver::{CudaSlice, DevicePtr};

use super::{Device, DeviceError};

/// Event numbers (prelude `TRACE_*`): a block starts (0), returns from `griddepcontrol.wait` (1), has
/// its input staged (2; attention: its partial written), ends (3, the last of them); milestones inside
/// decode attention (4: query, newest row and first tile ready; 5: its span attended). Also the
/// record slots a block's start mark reserves (prelude `TRACE_EVENTS`): a later mark of the same event
/// in that block overwrites its slot.
const EVENTS: usize = 6;
const START: usize = 0;
const WAITED: usize = 1;
const STAGED: usize = 2;
/// The milestones `summary` reports where a kind marks them, with their names.
const MILESTONES: [(usize, &str); 2] = [(4, "ready"), (5, "attended")];

/// A trace being recorded: the device buffer ([0] record slots reserved, [1] capacity in records,
/// then (time, tag) pairs; each block's start mark reserves `EVENTS` slots, its other marks fill their
/// event's slot, unused slots stay zero).
pub struct Trace {
    buf: CudaSlice<u64>,
    capacity: usize,
}

/// One record: when (ns, the GPU's global timer), which kernel, which event, which block of how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub ns: u64,
    pub kind: u8,
    pub event: u8,
    pub blocks: u32,
    pub block: u32,
}

/// One launch's blocks: per block, the time of each event it marked.
#[derive(Debug, Clone)]
pub struct Launch {
    pub kind: u8,
    pub blocks: u32,
    pub marks: HashMap<u32, [Option<u64>; EVENTS]>,
}

/// The name of a kernel kind (prelude `TRACE_*`; gemv_stream kinds are 16 + mode; decode_step's
/// phases 24 + phase, each traced as a launch of its own).
pub fn kind_name(kind: u8) -> &'static str {
    match kind {
        1 => "attn_decode",
        2 => "argmax",
        3 => "attn_cluster",
        16 => "stream store",
        17 => "stream accumulate",
        18 => "stream swiglu",
        19 => "stream qkv+rope",
        24 => "step qkv+rope",
        25 => "step attention",
        26 => "step o",
        27 => "step gate/up",
        28 => "step down",
        29 => "step output",
        _ => "unknown",
    }
}

impl Launch {
    /// Earliest and latest time of `event` over the blocks that marked it.
    pub fn span(&self, event: usize) -> Option<(u64, u64)> {
        let times = self.marks.values().filter_map(|m| m[event]);
        times.fold(None, |acc, t| Some(acc.map_or((t, t), |(lo, hi): (u64, u64)| (lo.min(t), hi.max(t)))))
    }

    /// The last mark of any block: the launch's end as far as the trace can tell.
    pub fn last(&self) -> u64 {
        self.marks.values().flat_map(|m| m.iter().flatten().copied()).max().unwrap_or(0)
    }

    pub fn first(&self) -> u64 {
        self.span(START).map_or(0, |s| s.0)
    }
}

impl Device {
    /// Starts recording up to `capacity` records (every module's `ctx_trace` pointed at a fresh buffer).
    /// Work already enqueued may add records too: synchronize first for a clean trace.
    pub fn trace_start(&self, capacity: usize) -> Result<Trace, DeviceError> {
        if !self.tracing {
            return Err(DeviceError::Trace("the kernels were compiled without their marks: set CTXSCOPE_CUDA_TRACE=1"));
        }
        let mut buf = self.stream.alloc_zeros::<u64>(2 + 2 * capacity)?;
        self.stream.memcpy_htod(&[0u64, capacity as u64], &mut buf.slice_mut(0..2))?;
        let ptr = buf.device_ptr(&self.stream).0;
        self.set_trace(ptr)?;
        Ok(Trace { buf, capacity })
    }

    /// Waits for the enqueued work, stops recording and returns the records (and how many record
    /// slots were reserved past the capacity: those blocks' marks are missing).
    pub fn trace_stop(&self, trace: Trace) -> Result<(Vec<Record>, usize), DeviceError> {
        self.stream.synchronize()?;
        self.set_trace(0)?;
        Ok(decode(&self.stream.clone_dtoh(&trace.buf)?, trace.capacity))
    }

    fn set_trace(&self, ptr: u64) -> Result<(), DeviceError> {
        for module in &self.modules {
            let mut global = module.get_global("ctx_trace", &self.stream)?;
            // SAFETY: `ctx_trace` is a `u64*` in every module (the prelude).
            let Some(mut view) = (unsafe { global.transmute_mut::<u64>(1) }) else {
                return Err(DeviceError::Trace("a module's ctx_trace is not a pointer"));
            };
            self.stream.memcpy_htod(&[ptr], &mut view)?;
        }
        Ok(())
    }
}

/// The records of a trace buffer (see `Trace`) holding `capacity` of them, skipping empty slots, and
/// the slots reserved past the capacity.
fn decode(host: &[u64], capacity: usize) -> (Vec<Record>, usize) {
    let reserved = host[0] as usize;
    let kept = reserved.min(capacity);
    let records = (0..kept)
        .map(|i| (host[2 + 2 * i], host[3 + 2 * i]))
        .filter(|&(_, tag)| tag != 0)
        .map(|(ns, tag)| Record {
            ns,
            kind: (tag >> 56) as u8,
            event: ((tag >> 48) & 0xff) as u8,
            blocks: ((tag >> 24) & 0xff_ffff) as u32,
            block: (tag & 0xff_ffff) as u32,
        })
        .collect();
    (records, reserved - kept)
}

/// Groups records into launches, in order of their first start. Launches of one kernel never run at
/// once on a stream, so a block's start opens a new launch of its kind when the latest one already
/// has that block started; its other marks go to the latest launch of its kind where that block
/// started and has not marked that event yet.
pub fn launches(records: &[Record]) -> Vec<Launch> {
    let mut sorted = records.to_vec();
    sorted.sort_by_key(|r| (r.ns, r.event));
    let mut out: Vec<Launch> = Vec::new();
    let mut latest: HashMap<(u8, u32), Vec<usize>> = HashMap::new();
    for r in sorted {
        let event = usize::from(r.event).min(EVENTS - 1);
        let key = (r.kind, r.blocks);
        let list = latest.entry(key).or_default();
        let target = if event == START {
            match list.last() {
                Some(&i) if !out[i].marks.contains_key(&r.block) => Some(i),
                _ => None,
            }
        } else {
            list.iter().rev().copied().find(|&i| out[i].marks.get(&r.block).is_some_and(|m| m[event].is_none()))
        };
        let i = match target {
            Some(i) => i,
            None if event == START => {
                out.push(Launch { kind: r.kind, blocks: r.blocks, marks: HashMap::new() });
                list.push(out.len() - 1);
                out.len() - 1
            }
            None => continue, // a mark whose start fell outside the trace
        };
        out[i].marks.entry(r.block).or_insert([None; EVENTS])[event] = Some(r.ns);
    }
    out.sort_by_key(Launch::first);
    out
}

/// Per kernel kind and the kind traced before it (so a layer's two residual products, after attention
/// and after gate/up, are told apart; kernels without marks are not seen), means over its launches
/// (µs): the gap from the previous launch's last mark to its
/// first start (negative: it started before the previous one ended, as programmatic launch allows),
/// from that end to its first block's release from the wait, the spread of the releases, the staging
/// (last release to last staged), the work after staging (to its last mark), and the whole launch
/// (first start to last mark), then each milestone marked (from the last release to the last block's
/// mark); then the pass from first start to last mark.
pub fn summary(launches: &[Launch]) -> Vec<String> {
    #[derive(Default)]
    struct Sum {
        n: usize,
        gap: f64,
        release: f64,
        spread: f64,
        staging: f64,
        work: f64,
        whole: f64,
        blocks: u32,
        /// Per milestone: launches that marked it, summed µs.
        milestones: [(usize, f64); MILESTONES.len()],
    }
    let us = |a: u64, b: u64| (a as f64 - b as f64) / 1e3;
    let mut by_kind: Vec<((u8, u8), Sum)> = Vec::new();
    for (i, l) in launches.iter().enumerate() {
        let Some(before) = i.checked_sub(1).map(|p| &launches[p]) else { continue };
        let (prev, key) = (before.last(), (l.kind, before.kind));
        let slot = match by_kind.iter().position(|(k, _)| *k == key) {
            Some(p) => p,
            None => {
                by_kind.push((key, Sum::default()));
                by_kind.len() - 1
            }
        };
        let s = &mut by_kind[slot].1;
        let (first, last) = (l.first(), l.last());
        let waited = l.span(WAITED).unwrap_or((first, first));
        let staged = l.span(STAGED).map_or(waited.1, |s| s.1);
        s.n += 1;
        s.gap += us(first, prev);
        s.release += us(waited.0, prev);
        s.spread += us(waited.1, waited.0);
        s.staging += us(staged, waited.1);
        s.work += us(last, staged);
        s.whole += us(last, first);
        s.blocks = l.blocks;
        for ((event, _), (count, sum)) in MILESTONES.iter().zip(s.milestones.iter_mut()) {
            if let Some((_, hi)) = l.span(*event) {
                *count += 1;
                *sum += us(hi, waited.1);
            }
        }
    }
    let mut lines = Vec::new();
    for ((kind, before), s) in &by_kind {
        let n = s.n.max(1) as f64;
        let mut line = String::new();
        let name = format!("{} after {}", kind_name(*kind), kind_name(*before));
        let _ = write!(
            line,
            "{name:<40} x{:<3} {:>4} blocks: gap {:>6.2}  release {:>6.2}  spread {:>5.2}  staging {:>5.2}  work {:>6.2}  launch {:>6.2} us",
            s.n,
            s.blocks,
            s.gap / n,
            s.release / n,
            s.spread / n,
            s.staging / n,
            s.work / n,
            s.whole / n
        );
        for ((_, label), (count, sum)) in MILESTONES.iter().zip(&s.milestones) {
            if *count > 0 {
                let _ = write!(line, "  {label} {:>5.2}", sum / *count as f64);
            }
        }
        lines.push(line);
    }
    if let (Some(a), Some(b)) = (launches.first(), launches.last()) {
        lines.push(format!("{} launches traced, first start to last mark {:.1} us", launches.len(), us(b.last(), a.first())));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ns: u64, kind: u8, event: u8, blocks: u32, block: u32) -> Record {
        Record { ns, kind, event, blocks, block }
    }

    #[test]
    fn a_buffer_decodes_to_its_filled_slots() {
        // Capacity 12: block 3 of 8 of kind 17 reserved slots 0..6 and marked start (0) and end (3);
        // block 0 of kind 3 reserved 6..12 and marked start and milestone 4; a third reservation
        // (12..18) did not fit.
        let tag = |kind: u64, event: u64, blocks: u64, block: u64| kind << 56 | event << 48 | blocks << 24 | block;
        let mut host = vec![0u64; 2 + 2 * 12];
        host[0] = 18;
        host[1] = 12;
        for (slot, ns, t) in
            [(0, 100, tag(17, 0, 8, 3)), (3, 400, tag(17, 3, 8, 3)), (6, 150, tag(3, 0, 128, 0)), (10, 900, tag(3, 4, 128, 0))]
        {
            host[2 + 2 * slot] = ns;
            host[3 + 2 * slot] = t;
        }
        let (records, lost) = decode(&host, 12);
        assert_eq!(records, vec![rec(100, 17, 0, 8, 3), rec(400, 17, 3, 8, 3), rec(150, 3, 0, 128, 0), rec(900, 3, 4, 128, 0)]);
        assert_eq!(lost, 6);
    }

    #[test]
    fn records_group_into_launches_even_when_the_next_starts_before_the_previous_ends() {
        let mut r = Vec::new();
        // Launch A (kind 17, 2 blocks) 0..100, launch B (kind 18) starts at 90 (programmatic), then A again.
        for b in 0..2 {
            r.extend([rec(u64::from(b), 17, 0, 2, b), rec(10, 17, 1, 2, b), rec(20, 17, 2, 2, b), rec(100, 17, 3, 2, b)]);
            r.extend([rec(90, 18, 0, 2, b), rec(101, 18, 1, 2, b), rec(110, 18, 2, 2, b), rec(200, 18, 3, 2, b)]);
            r.extend([rec(195, 17, 0, 2, b), rec(201, 17, 1, 2, b), rec(210, 17, 2, 2, b), rec(300, 17, 3, 2, b)]);
        }
        let l = launches(&r);
        assert_eq!(l.iter().map(|l| l.kind).collect::<Vec<_>>(), vec![17, 18, 17]);
        assert!(l
            .iter()
            .all(|l| l.marks.len() == 2
                && l.marks.values().all(|m| m[..4].iter().all(Option::is_some) && m[4..].iter().all(Option::is_none))));
        assert_eq!((l[0].last(), l[1].first(), l[2].last()), (100, 90, 300));
        let lines = summary(&l);
        // B started 10 ns before A's end: a negative gap; released 1 ns after it.
        assert!(
            lines[0].starts_with("stream swiglu after stream accumulate ")
                && lines[0].contains("gap  -0.01")
                && lines[0].contains("release   0.00"),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("stream accumulate after stream swiglu ") && lines[1].contains("x1 "), "{lines:?}");
        assert!(lines.last().unwrap().contains("3 launches traced, first start to last mark 0.3 us"), "{lines:?}");
        assert!(!lines[0].contains("ready"), "no milestones marked: none reported: {lines:?}");
    }

    #[test]
    fn attention_milestones_are_reported_from_the_last_release() {
        let mut r = Vec::new();
        for b in 0..2 {
            r.extend([rec(0, 19, 0, 2, b), rec(1000, 19, 1, 2, b), rec(2000, 19, 3, 2, b)]);
            // Attention: released at 3000 and 3500, ready at 4000 and 5500 (the last: 2 us after the
            // last release), attended at 6000, merged at 7000, ends at 8000.
            r.extend([rec(2500, 3, 0, 2, b), rec(3000 + 500 * u64::from(b), 3, 1, 2, b), rec(4000 + 1500 * u64::from(b), 3, 4, 2, b)]);
            r.extend([rec(6000, 3, 5, 2, b), rec(7000, 3, 2, 2, b), rec(8000, 3, 3, 2, b)]);
        }
        let lines = summary(&launches(&r));
        assert!(
            lines[0].starts_with("attn_cluster after stream qkv+rope") && lines[0].contains("ready  2.00  attended  2.50"),
            "{lines:?}"
        );
    }
}
