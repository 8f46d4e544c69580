//! Stop strings, matched on text: text that could still turn out to be the start of a stop string is
//! held back while streaming, and the stop string itself is never returned.

/// What [`StopMatcher::push`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct StopScan {
    /// Text safe to send now.
    pub text: String,
    /// A stop string matched; `text` ends right before it and generation should end.
    pub stopped: bool,
}

/// Matches a set of stop strings against generated text.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds text; returns what can be released.
    pub fn push(&mut self, text: &str) -> StopScan {
        if self.stops.is_empty() {
            return StopScan { text: text.to_string(), stopped: false };
        }
        self.held.push_str(text);
        // The earliest match wins (the text before it is all the reply has).
        let earliest = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = earliest {
            let mut released = std::mem::take(&mut self.held);
            released.truncate(at);
            return StopScan { text: released, stopped: true };
        }
        let keep = self.partial_suffix();
        let split = self.held.len() - keep;
        let rest = self.held.split_off(split);
        StopScan { text: std::mem::replace(&mut self.held, rest), stopped: false }
    }

    /// Ends the text: whatever was held back was not a stop string after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes of held text, a suffix that is a proper prefix of some stop string (longest such).
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for (start, _) in held.char_indices() {
            let suffix = &held[start..];
            if self.stops.iter().any(|s| s.len() > suffix.len() && s.starts_with(suffix)) {
                best = held.len() - start;
                break;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let scan = m.push(p);
            out.push(scan.text);
            if scan.stopped {
                return (out, true);
            }
        }
        out.push(m.finish());
        (out, false)
    }

    #[test]
    fn holds_back_partial_matches_and_drops_the_stop_text() {
        let (out, stopped) = run(&["END"], &["hello E", "N", "D more"]);
        assert!(stopped);
        assert_eq!(out, vec!["hello ", "", ""]);
        let (out, stopped) = run(&["END"], &["hello E", "NX", " done"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "hello ENX done");
        assert_eq!(out[0], "hello ");
    }

    #[test]
    fn the_earliest_of_several_stops_wins_across_chunks() {
        let (out, stopped) = run(&["world", "lo w"], &["hel", "lo wor", "ld"]);
        assert!(stopped);
        assert_eq!(out.concat(), "hel");
    }

    #[test]
    fn without_stops_text_passes_straight_through() {
        assert_eq!(run(&[], &["a", "b"]).0, vec!["a", "b", ""]);
        assert_eq!(run(&[""], &["a"]).0, vec!["a", ""]);
    }
}
