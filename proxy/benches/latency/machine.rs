//! What else the machine was doing: CPU model, cores, load average, and the CPU time other
//! processes used while the bench ran (all busy time in /proc/stat minus the bench's own and its
//! proxies'), so a run disturbed by a concurrent build can be recognised and repeated.

use std::time::Instant;

/// CPU counters at the start of the run.
pub struct Usage {
    started: Instant,
    busy: u64,
    own: u64,
}

impl Usage {
    pub fn start() -> Usage {
        Usage { started: Instant::now(), busy: busy_ticks(), own: process_ticks("self") }
    }

    /// Other processes' CPU since `start`, as a share of the whole machine, given the ticks the
    /// bench's child processes used.
    pub fn others_share(&self, children_ticks: u64) -> f64 {
        let busy = busy_ticks().saturating_sub(self.busy);
        let own = process_ticks("self").saturating_sub(self.own) + children_ticks;
        let capacity = self.started.elapsed().as_secs_f64() * clock_ticks() * cores() as f64;
        if capacity > 0.0 {
            busy.saturating_sub(own) as f64 / capacity
        } else {
            0.0
        }
    }
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// user + system ticks of a process (`"self"` or a pid), 0 when unreadable.
pub fn process_ticks(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    // Fields after the parenthesised command name start at field 3; utime and stime are 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let fields: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse().ok()).collect();
    fields.iter().sum()
}

/// Busy ticks of all CPUs (everything but idle and iowait).
fn busy_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else { return 0 };
    let Some(line) = stat.lines().next() else { return 0 };
    let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already counted in user).
    values.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}
