//! Detector thresholds and tolerances, with the documented defaults (docs/findings.md). Phrase lists
//! are data: the built-in files in `phrases/` plus any the user adds.

use std::path::Path;
use std::time::Duration;

/// Thresholds the detectors run with.
#[derive(Debug, Clone)]
pub struct DetectConfig {
    /// Off: turns are captured but not diagnosed.
    pub enabled: bool,
    /// Engine prompt tokens may fall short of the local count by this fraction before it is truncation
    /// (once the engine/local ratio is known; before that, `truncation_cold_fraction`).
    pub truncation_fraction: f64,
    /// The same, before enough turns have shown the engine/local ratio.
    pub truncation_cold_fraction: f64,
    /// ... and by at least this many tokens.
    pub truncation_min_tokens: u64,
    /// Before the ratio is known, a shortfall is truncation when the engine's count grew by less than
    /// this fraction of what the local count grew since the previous turn (a wrong tokenizer grows
    /// both in proportion; a truncating engine's count stalls)...
    pub truncation_growth_fraction: f64,
    /// ... or, on a conversation's first turn, when the engine saw less than this fraction of the prompt.
    pub truncation_first_turn_fraction: f64,
    /// Without a tokenizer: a request that grew by this many bytes while the engine's prompt count
    /// stayed flat or fell is truncation.
    pub flat_growth_bytes: u64,
    /// Without a count: an extended request whose engine count grew by less than this fraction of what
    /// its added text bytes predict at the fitted tokens-per-byte rate, ...
    pub rate_growth_fraction: f64,
    /// ... by at least this many tokens, is truncation by rate (a warning: an estimate).
    pub rate_min_tokens: u64,
    /// A conversation's first turn, at the upstream's rate: below this fraction of the prediction ...
    pub rate_first_turn_fraction: f64,
    /// ... and at least this many tokens short.
    pub rate_first_turn_min_tokens: u64,
    /// Engine-reported cached tokens may exceed the longest common prefix by this many (block rounding).
    pub cache_block_tokens: u64,
    /// A cache miss needs at least this many reusable tokens...
    pub miss_min_tokens: u64,
    /// ... of which the engine reused less than this fraction.
    pub miss_fraction: f64,
    /// Earlier prompts older than this are not expected to still be cached.
    pub miss_window: Duration,
    /// Earlier prompts kept in memory for prefix comparison (and their total tokens).
    pub recent_prompts: usize,
    pub recent_tokens: usize,
    /// The engine count, fitted as scale · local + offset over the last `drift_turns` turns (each
    /// within `drift_tolerance` of the line), is drift when the scale is off 1 by more than
    /// `drift_fraction` or the offset exceeds `drift_offset_tokens`.
    pub drift_fraction: f64,
    pub drift_offset_tokens: f64,
    pub drift_turns: usize,
    pub drift_tolerance: f64,
    /// Lower-cased phrases that, in a reply, deny the context the request carries.
    pub amnesia_phrases: Vec<String>,
    /// Lower-cased phrases that, in an error, mean the prompt was refused for its length.
    pub overflow_phrases: Vec<String>,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            enabled: true,
            truncation_fraction: 0.03,
            truncation_cold_fraction: 0.10,
            truncation_min_tokens: 8,
            truncation_growth_fraction: 0.5,
            truncation_first_turn_fraction: 0.5,
            flat_growth_bytes: 1024,
            rate_growth_fraction: 0.5,
            rate_min_tokens: 32,
            rate_first_turn_fraction: 0.4,
            rate_first_turn_min_tokens: 256,
            cache_block_tokens: 16,
            miss_min_tokens: 128,
            miss_fraction: 0.5,
            miss_window: Duration::from_secs(1800),
            recent_prompts: 256,
            recent_tokens: 4 << 20,
            drift_fraction: 0.03,
            drift_offset_tokens: 4.0,
            drift_turns: 4,
            drift_tolerance: 0.02,
            amnesia_phrases: phrases(include_str!("phrases/amnesia.txt")),
            overflow_phrases: phrases(include_str!("phrases/overflow.txt")),
        }
    }
}

/// A phrase file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("--amnesia-phrases {path}: {source}")]
pub struct PhraseFileError {
    pub path: std::path::PathBuf,
    pub source: std::io::Error,
}

impl DetectConfig {
    /// Adds the phrases of a user file (one per line, `#` comments) to the amnesia list.
    pub fn add_amnesia_phrases(&mut self, path: &Path) -> Result<(), PhraseFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| PhraseFileError { path: path.to_path_buf(), source })?;
        self.amnesia_phrases.extend(phrases(&text));
        Ok(())
    }
}

/// One phrase per non-empty, non-comment line, normalised like the text it is matched against.
pub fn phrases(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(normalise).collect()
}

/// Lower case, typographic apostrophes made plain, runs of whitespace made one space.
pub fn normalise(text: &str) -> String {
    let lowered = text.to_lowercase().replace(['\u{2019}', '\u{2018}', '`'], "'");
    lowered.split_whitespace().collect::<Vec<_>>().join(" ")
}
