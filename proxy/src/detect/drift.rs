//! The engine/local prompt-token ratio of one upstream and model: steady and off 1 means the configured
//! tokenizer or chat template is not the engine's (`token_count_drift`); steady near 1 is the baseline
//! that truncation is measured against.

use std::collections::VecDeque;

/// Recent engine/local ratios.
#[derive(Debug, Default)]
pub struct Drift {
    /// (local tokens, engine/local ratio), newest last.
    samples: VecDeque<(u64, f64)>,
}

/// An established ratio: enough recent turns, of different lengths, agreeing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Steady {
    pub ratio: f64,
    pub turns: usize,
    pub spread: f64,
}

impl Drift {
    pub fn push(&mut self, local: u64, engine: u64, keep: usize) {
        if local == 0 {
            return;
        }
        self.samples.push_back((local, engine as f64 / local as f64));
        while self.samples.len() > keep {
            self.samples.pop_front();
        }
    }

    /// The median ratio of the last `turns` samples, when they agree within `spread` and span prompts
    /// of different lengths (a truncating engine's ratio falls as prompts grow; repeats of one prompt
    /// prove nothing).
    pub fn steady(&self, turns: usize, spread: f64) -> Option<Steady> {
        if turns == 0 || self.samples.len() < turns {
            return None;
        }
        let last: Vec<(u64, f64)> = self.samples.iter().rev().take(turns).copied().collect();
        let (lo, hi) = last.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, r)| (lo.min(*r), hi.max(*r)));
        let (short, long) = last.iter().fold((u64::MAX, 0), |(s, l), (n, _)| (s.min(*n), l.max(*n)));
        if hi - lo > spread || (long as f64) < short as f64 * 1.2 {
            return None;
        }
        Some(Steady { ratio: self.median(turns), turns, spread: hi - lo })
    }

    /// Median of the last `turns` ratios (all when fewer), for the gauge.
    pub fn median(&self, turns: usize) -> f64 {
        let mut ratios: Vec<f64> = self.samples.iter().rev().take(turns.max(1)).map(|(_, r)| *r).collect();
        if ratios.is_empty() {
            return 1.0;
        }
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_needs_agreement_and_a_spread_of_lengths() {
        let mut drift = Drift::default();
        for local in [100, 150, 200, 260] {
            drift.push(local, local * 9 / 10, 4);
        }
        let steady = drift.steady(4, 0.05).unwrap();
        assert!((steady.ratio - 0.9).abs() < 0.01);
        // A truncating engine: the ratio falls as prompts grow.
        let mut truncating = Drift::default();
        for local in [100, 150, 200, 260] {
            truncating.push(local, local.min(120), 4);
        }
        assert!(truncating.steady(4, 0.05).is_none());
        // The same prompt four times proves nothing.
        let mut repeated = Drift::default();
        for _ in 0..4 {
            repeated.push(500, 250, 4);
        }
        assert!(repeated.steady(4, 0.05).is_none());
    }
}
