//! `/proc/PID/stat` (parent and start time), the boot time from `/proc/stat`, the kernel's clock
//! tick from this process's auxiliary vector, and a process's descendants.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `AT_CLKTCK` in the auxiliary vector: the `sysconf(_SC_CLK_TCK)` value, without libc.
const AT_CLKTCK: u64 = 17;
/// What Linux has used on every architecture for `USER_HZ` when the auxiliary vector cannot be read.
const DEFAULT_CLK_TCK: u64 = 100;
/// Descendants followed (an engine's workers; a whole tree of thousands is not an engine).
pub const MAX_DESCENDANTS: usize = 256;

/// The fields of `/proc/PID/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    /// Field 22: clock ticks after boot at which the process started.
    pub start_ticks: u64,
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field N is fields[N - 3].
    Some(Stat { ppid: fields.get(1)?.parse().ok()?, start_ticks: fields.get(19)?.parse().ok()? })
}

/// Boot time in Unix seconds: the `btime` line of `/proc/stat`.
pub fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|line| line.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// Clock ticks per second for `/proc/PID/stat`'s times: `AT_CLKTCK` from `/proc/self/auxv` (pairs
/// of native-endian machine words), else 100.
pub fn clock_ticks() -> u64 {
    std::fs::read("/proc/self/auxv").ok().and_then(|auxv| clock_ticks_in(&auxv)).unwrap_or(DEFAULT_CLK_TCK)
}

fn clock_ticks_in(auxv: &[u8]) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |bytes: &[u8]| -> u64 {
        let mut buf = [0u8; WORD];
        buf.copy_from_slice(bytes);
        usize::from_ne_bytes(buf) as u64
    };
    auxv.chunks_exact(2 * WORD)
        .map(|pair| (word(&pair[..WORD]), word(&pair[WORD..])))
        .find(|(k, _)| *k == AT_CLKTCK)
        .map(|(_, v)| v)
        .filter(|&v| v > 0)
}

/// Every process's parent under `proc_root` (processes that exit meanwhile are skipped).
pub fn parents(proc_root: &Path) -> BTreeMap<u32, u32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else { return BTreeMap::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(|pid| {
            let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
            Some((pid, parse_stat(&text)?.ppid))
        })
        .collect()
}

/// `pid`'s descendants (children, their children, ...), nearest first, at most [`MAX_DESCENDANTS`].
pub fn descendants(pid: u32, parents: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&child, &parent) in parents {
        children.entry(parent).or_default().push(child);
    }
    let (mut found, mut seen, mut at) = (Vec::new(), BTreeSet::from([pid]), vec![pid]);
    while !at.is_empty() {
        for parent in std::mem::take(&mut at) {
            for &child in children.get(&parent).into_iter().flatten() {
                if found.len() < MAX_DESCENDANTS && seen.insert(child) {
                    found.push(child);
                    at.push(child);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let line = "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 12345678 900 18446744073709551615";
        assert_eq!(parse_stat(line), Some(Stat { ppid: 17, start_ticks: 987654 }));
        assert_eq!(parse_stat("1 (x) S"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let own = parse_stat(&own).unwrap();
        assert_eq!(own.ppid, parents(Path::new("/proc"))[&std::process::id()]);
    }

    #[test]
    fn boot_time_and_clock_tick() {
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"), Some(1_700_000_000));
        let mut auxv = Vec::new();
        for (k, v) in [(6usize, 4096usize), (AT_CLKTCK as usize, 250), (0, 0)] {
            auxv.extend_from_slice(&k.to_ne_bytes());
            auxv.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(clock_ticks_in(&auxv), Some(250));
        assert_eq!(clock_ticks_in(&auxv[..16]), None);
        // Linux's USER_HZ is 100 on the architectures this runs on; the auxiliary vector says so.
        assert_eq!(clock_ticks(), 100);
    }

    #[test]
    fn descendants_are_followed_down_and_cycles_stop() {
        let parents = BTreeMap::from([(2, 1), (3, 2), (4, 2), (5, 9), (6, 3), (1, 6)]);
        assert_eq!(descendants(2, &parents), vec![3, 4, 6, 1]);
        assert_eq!(descendants(5, &parents), Vec::<u32>::new());
    }
}
