//! The engine's prompt-token count as a function of the local count, engine ≈ scale · local + offset,
//! fitted over an upstream's recent turns. A steady fit away from the identity means the configured
//! tokenizer (scale) or chat template (offset: a default system prompt, a BOS) is not the engine's
//! (`token_count_drift`); a steady fit is also the baseline truncation is measured against.

use std::collections::VecDeque;

use ctxscope_store::{FindingKind, Severity, TurnRecord};

use super::{DetectConfig, Draft};

/// Recent (local, engine) prompt counts.
#[derive(Debug, Default)]
pub struct Drift {
    samples: VecDeque<(u64, u64)>,
}

/// An established relation: enough recent turns, of different lengths, on one line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Steady {
    pub scale: f64,
    pub offset: f64,
    pub turns: usize,
    /// Largest distance of a sample from the line, in tokens.
    pub residual: f64,
}

impl Steady {
    /// What the engine should count for a prompt of `local` tokens.
    pub fn expected(&self, local: u64) -> f64 {
        self.scale * local as f64 + self.offset
    }
}

/// Scales outside this range are not a tokenizer mismatch (a truncating engine's count is flat: 0).
const PLAUSIBLE_SCALE: std::ops::RangeInclusive<f64> = 0.5..=2.0;

impl Drift {
    pub fn push(&mut self, local: u64, engine: u64, keep: usize) {
        if local == 0 {
            return;
        }
        self.samples.push_back((local, engine));
        while self.samples.len() > keep {
            self.samples.pop_front();
        }
    }

    /// The least-squares line through the last `turns` samples, when they span prompts of different
    /// lengths (at least 1.2x), sit on it within `tolerance` of the engine count (and 2 tokens), and
    /// its scale is plausible for two tokenizers of one language.
    pub fn steady(&self, turns: usize, tolerance: f64) -> Option<Steady> {
        if turns < 2 || self.samples.len() < turns {
            return None;
        }
        let last: Vec<(f64, f64)> = self.samples.iter().rev().take(turns).map(|&(l, e)| (l as f64, e as f64)).collect();
        let (short, long) = last.iter().fold((f64::MAX, 0.0f64), |(s, l), (x, _)| (s.min(*x), l.max(*x)));
        if long < short * 1.2 {
            return None;
        }
        let n = last.len() as f64;
        let (mx, my) = (last.iter().map(|p| p.0).sum::<f64>() / n, last.iter().map(|p| p.1).sum::<f64>() / n);
        let sxx: f64 = last.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = last.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let scale = sxy / sxx;
        let offset = my - scale * mx;
        let residual = last.iter().map(|p| (p.1 - (scale * p.0 + offset)).abs()).fold(0.0, f64::max);
        let allowed = last.iter().map(|p| p.1 * tolerance).fold(2.0f64, f64::max);
        (residual <= allowed && PLAUSIBLE_SCALE.contains(&scale)).then_some(Steady { scale, offset, turns, residual })
    }

    /// Median engine/local ratio of the last `turns` samples (1 when none), for the gauge.
    pub fn median_ratio(&self, turns: usize) -> f64 {
        let mut ratios: Vec<f64> = self.samples.iter().rev().take(turns.max(1)).map(|&(l, e)| e as f64 / l as f64).collect();
        if ratios.is_empty() {
            return 1.0;
        }
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    }
}

/// `token_count_drift`: the engine's count has settled on a line away from the local count.
pub(crate) fn finding(drift: &mut Drift, config: &DetectConfig, turn: &TurnRecord) -> Option<Draft> {
    let local = turn.local_tokens.as_ref()?;
    let engine = turn.usage.as_ref()?.prompt_tokens?;
    // Every turn is a sample: a truncating engine's count goes flat, which `steady` refuses.
    drift.push(local.prompt, engine, config.drift_turns);
    let steady = drift.steady(config.drift_turns, config.drift_tolerance)?;
    let scale_off = (steady.scale - 1.0).abs() > config.drift_fraction;
    let offset_off = steady.offset.abs() > config.drift_offset_tokens;
    if !scale_off && !offset_off {
        return None;
    }
    let model = turn.model.as_deref().unwrap_or("");
    let what = match (scale_off, offset_off) {
        (true, _) => format!("{:.1}% {} tokens", (steady.scale - 1.0).abs() * 100.0, if steady.scale > 1.0 { "more" } else { "fewer" }),
        (false, _) => format!("a steady {:+.0} tokens", steady.offset),
    };
    Some(Draft {
        kind: FindingKind::TokenCountDrift,
        severity: Severity::Warning,
        summary: format!(
            "engine counts {what} than {} over {} turns (engine = {:.3} x local {:+.1}): the configured tokenizer or chat template is not the engine's",
            local.tokenizer, steady.turns, steady.scale, steady.offset
        ),
        evidence: serde_json::json!({
            "scale": steady.scale, "offset": steady.offset, "residual": steady.residual, "turns": steady.turns,
            "tokenizer": local.tokenizer, "last_local_tokens": local.prompt, "last_engine_tokens": engine,
        }),
        cause: format!("token_count_drift/{}/{model}/{}", turn.upstream, local.tokenizer),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift(pairs: &[(u64, u64)]) -> Drift {
        let mut d = Drift::default();
        for &(l, e) in pairs {
            d.push(l, e, 4);
        }
        d
    }

    #[test]
    fn a_scale_or_an_offset_is_steady_a_truncating_engine_is_not() {
        let scaled = drift(&[(100, 90), (150, 135), (200, 180), (260, 234)]).steady(4, 0.02).unwrap();
        assert!((scaled.scale - 0.9).abs() < 0.01 && scaled.offset.abs() < 1.0, "{scaled:?}");
        // A default system prompt the local template lacks: +21 on every prompt.
        let offset = drift(&[(19, 40), (62, 83), (105, 126), (147, 168)]).steady(4, 0.02).unwrap();
        assert!((offset.scale - 1.0).abs() < 0.01 && (offset.offset - 21.0).abs() < 0.5, "{offset:?}");
        assert!((offset.expected(200) - 221.0).abs() < 0.5);
        // Context shift: the engine's count is flat at its context size.
        assert!(drift(&[(100, 96), (150, 96), (200, 96), (260, 96)]).steady(4, 0.02).is_none());
        // Truncation starting midway: not on one line.
        assert!(drift(&[(60, 60), (90, 90), (130, 96), (170, 96)]).steady(4, 0.02).is_none());
        // The same prompt four times proves nothing.
        assert!(drift(&[(500, 250); 4]).steady(4, 0.02).is_none());
    }
}
