//! A progress [`Observer`] on stderr: a redrawn bar on a terminal, one line per tenth otherwise
//! (so logs and CI output stay readable). Each run counts from 1 again (bisection runs several).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use crate::model::TurnResult;
use crate::run::Observer;

const BAR_WIDTH: usize = 20;

pub struct StderrProgress {
    terminal: bool,
    /// Tenths already printed (line mode).
    printed: Mutex<usize>,
}

impl StderrProgress {
    /// A bar when stderr is a terminal, lines otherwise.
    pub fn new() -> StderrProgress {
        StderrProgress::with_terminal(std::io::stderr().is_terminal())
    }

    pub fn with_terminal(terminal: bool) -> StderrProgress {
        StderrProgress { terminal, printed: Mutex::new(0) }
    }

    /// What to write for `done` of `total` (None: nothing this time).
    fn render(&self, done: usize, total: usize) -> Option<String> {
        if self.terminal {
            let newline = if done >= total { "\n" } else { "" };
            return Some(format!("\r{} {done}/{total} turns·targets{newline}", bar(done, total)));
        }
        let tenth = (done * 10).checked_div(total).unwrap_or(10);
        let mut printed = self.printed.lock().unwrap_or_else(|e| e.into_inner());
        if done <= 1 {
            // A new run (bisection replays one after another).
            *printed = 0;
        }
        if tenth <= *printed {
            return None;
        }
        *printed = tenth;
        Some(format!("replay: {done}/{total} turns·targets ({}%)\n", tenth * 10))
    }
}

impl Default for StderrProgress {
    fn default() -> StderrProgress {
        StderrProgress::new()
    }
}

impl Observer for StderrProgress {
    fn on_result(&self, _result: &TurnResult, done: usize, total: usize) {
        if let Some(text) = self.render(done, total) {
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(text.as_bytes());
            let _ = stderr.flush();
        }
    }
}

/// `[#####...............]`.
fn bar(done: usize, total: usize) -> String {
    let filled = (done.min(total) * BAR_WIDTH).checked_div(total).unwrap_or(BAR_WIDTH);
    format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_bar_redraws_and_ends_the_line() {
        let p = StderrProgress::with_terminal(true);
        assert_eq!(p.render(12, 40).unwrap(), "\r[######..............] 12/40 turns·targets");
        assert!(p.render(40, 40).unwrap().ends_with("40/40 turns·targets\n"));
    }

    #[test]
    fn lines_once_per_tenth() {
        let p = StderrProgress::with_terminal(false);
        let printed: Vec<usize> = (1..=40).filter(|done| p.render(*done, 40).is_some()).collect();
        assert_eq!(printed, [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]);
        let small = StderrProgress::with_terminal(false);
        let printed: Vec<usize> = (1..=3).filter(|done| small.render(*done, 3).is_some()).collect();
        assert_eq!(printed, [1, 2, 3]);
        assert!(small.render(1, 3).is_some(), "a second run starts over");
    }
}
