//! Comparing a launch's output with its reference and the table of results: `Cmp` (one comparison),
//! `Row` (the worst of a group), `Report` (the rows and the informative lines). Outputs are allocated
//! NaN-poisoned (`nan_buf`) and read back after a synchronize (`read`), so a fault or an unwritten
//! element shows at the check that caused it.

use std::error::Error;
use std::sync::Arc;

use ctxscope_kernels::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

pub(crate) type Res<T = ()> = Result<T, Box<dyn Error>>;

/// Poisoned elements after every output: a kernel that writes past its output shows here.
pub(crate) const TAIL: usize = 64;
/// Limit of f32 arithmetic against an f64 reference (reduction order, expf, FMA contraction).
pub(crate) const F32_LIMIT: f64 = 1e-5;

/// One launch (or a few merged) against its reference.
#[derive(Default)]
pub(crate) struct Cmp {
    pub(crate) elems: usize,
    /// ‖out − ref‖ / ‖ref‖ over the finite outputs.
    pub(crate) rel: f64,
    pub(crate) max_abs: f64,
    /// Elements that fail outright: not finite, differing where exactness is required, written past
    /// the end or where nothing should have been written.
    pub(crate) bad: usize,
    pub(crate) why: String,
}

impl Cmp {
    pub(crate) fn flag(mut self, count: usize, what: &str) -> Cmp {
        if count > 0 {
            self.bad += count;
            if !self.why.is_empty() {
                self.why.push_str(", ");
            }
            self.why.push_str(&format!("{count} {what}"));
        }
        self
    }

    /// The poisoned tail after the output must still be NaN.
    pub(crate) fn tail(self, tail: &[f32]) -> Cmp {
        let written = tail.iter().filter(|v| !v.is_nan()).count();
        self.flag(written, "written past the end")
    }

    pub(crate) fn merge(self, other: Cmp) -> Cmp {
        let why = [self.why, other.why].into_iter().filter(|w| !w.is_empty()).collect::<Vec<_>>().join(", ");
        Cmp {
            elems: self.elems + other.elems,
            rel: self.rel.max(other.rel),
            max_abs: self.max_abs.max(other.max_abs),
            bad: self.bad + other.bad,
            why,
        }
    }
}

/// Relative (norm-wise) and max absolute error of `out` against `want`; outputs that are not finite
/// (where the reference is) are bad, as are outputs missing from either side.
pub(crate) fn compare(out: &[f32], want: &[f64]) -> Cmp {
    let (mut err2, mut ref2, mut max_abs, mut nonfinite) = (0f64, 0f64, 0f64, 0usize);
    for (&o, &w) in out.iter().zip(want) {
        if !w.is_finite() {
            if f64::from(o) != w {
                nonfinite += 1;
            }
            continue;
        }
        if !o.is_finite() {
            nonfinite += 1;
            continue;
        }
        let d = f64::from(o) - w;
        err2 += d * d;
        ref2 += w * w;
        max_abs = max_abs.max(d.abs());
    }
    let rel = if ref2 > 0.0 { (err2 / ref2).sqrt() } else { err2.sqrt() };
    let cmp = Cmp { elems: want.len(), rel, max_abs, ..Cmp::default() };
    cmp.flag(nonfinite, "not finite").flag(out.len().abs_diff(want.len()), "missing")
}

/// As `compare`, and every element must equal its reference exactly (±0 equal).
pub(crate) fn exact(out: &[f32], want: &[f32]) -> Cmp {
    let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    let differ = out.iter().zip(want).filter(|(o, w)| o.is_finite() && *o != *w).count();
    compare(out, &want64).flag(differ, "differ")
}

pub(crate) fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// One line of the table: the worst of a group of launches.
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) elems: usize,
    pub(crate) rel: f64,
    pub(crate) max_abs: f64,
    pub(crate) limit: f64,
    pub(crate) bad: usize,
    pub(crate) worst: String,
    pub(crate) first_bad: String,
}

impl Row {
    pub(crate) fn new(name: impl Into<String>, limit: f64) -> Row {
        Row { name: name.into(), elems: 0, rel: 0.0, max_abs: 0.0, limit, bad: 0, worst: String::new(), first_bad: String::new() }
    }

    pub(crate) fn add(&mut self, label: &str, c: Cmp) {
        self.elems += c.elems;
        self.max_abs = self.max_abs.max(c.max_abs);
        if c.bad > 0 && self.first_bad.is_empty() {
            self.first_bad = format!("{label}: {}", c.why);
        }
        self.bad += c.bad;
        if !self.rel.is_nan() && (c.rel.is_nan() || c.rel > self.rel) {
            self.rel = c.rel;
            self.worst = label.to_string();
        }
        if self.worst.is_empty() {
            self.worst = label.to_string();
        }
    }

    fn passed(&self) -> bool {
        self.bad == 0 && self.rel <= self.limit
    }
}

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
    pub(crate) info: Vec<String>,
}

impl Report {
    pub(crate) fn single(&mut self, name: impl Into<String>, limit: f64, c: Cmp) {
        let mut row = Row::new(name, limit);
        row.add("", c);
        self.rows.push(row);
    }

    /// Prints the table; true when every row passed.
    pub(crate) fn print(&self) -> bool {
        println!();
        println!(
            "{:<44} {:>8} {:>8} {:>8} {:>6} {:>5} {:<4} note (first failure, else worst case)",
            "check", "elements", "rel err", "max abs", "limit", "bad", ""
        );
        for r in &self.rows {
            let note = if r.first_bad.is_empty() { r.worst.clone() } else { r.first_bad.clone() };
            let note: String = note.chars().take(64).collect();
            let verdict = if r.passed() { "ok" } else { "FAIL" };
            println!(
                "{:<44} {:>8} {:>8.1e} {:>8.1e} {:>6.0e} {:>5} {:<4} {note}",
                r.name, r.elems, r.rel, r.max_abs, r.limit, r.bad, verdict
            );
        }
        let failed = self.rows.iter().filter(|r| !r.passed()).count();
        if failed == 0 {
            println!("all {} checks passed", self.rows.len());
        } else {
            println!("FAILED: {failed} of {} checks", self.rows.len());
        }
        failed == 0
    }
}

pub(crate) fn nan_buf(s: &Arc<CudaStream>, n: usize) -> Res<CudaSlice<f32>> {
    Ok(s.clone_htod(&vec![f32::NAN; n])?)
}

/// Waits for the stream (so a kernel fault is reported here) and copies `buf` back.
pub(crate) fn read<T: DeviceRepr>(s: &Arc<CudaStream>, buf: &CudaSlice<T>) -> Res<Vec<T>> {
    s.synchronize()?;
    Ok(s.clone_dtoh(buf)?)
}
