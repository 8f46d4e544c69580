//! RoPE frequencies as transformers computes them, in its f32 steps: plain, and with YaRN scaling as
//! DeepSeek-V4 uses it on its compressed layers (and their compressors and indexer), read from
//! config.json and turned into the frequencies and cos/sin scale of `_compute_yarn_parameters`
//! (checked against it on the `tiny` checkpoint, tests/fixtures/deepseek_v4/tiny/reference_yarn.json,
//! and at the released size, tests/fixtures/deepseek_v4/flash).

use serde_json::Value;

/// A YaRN entry that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum YarnError {
    #[error("config.json's YaRN entry has no {0}")]
    Missing(&'static str),
    #[error("config.json: YaRN factor {factor} over {original} original positions")]
    Invalid { factor: f64, original: f64 },
}

/// `theta^(2i / dim)` of pair `i`, in f32 as transformers' `base ** (arange(0, dim, 2).float() / dim)`.
fn pos_freq(theta: f64, dim: usize, i: usize) -> f32 {
    (theta as f32).powf((2 * i) as f32 / dim as f32)
}

/// Plain RoPE's inverse frequency of each of the `dim / 2` pairs at base `theta`.
pub fn plain_inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2).map(|i| 1.0 / pos_freq(theta, dim, i)).collect()
}

/// The parameters of a `rope_type: "yarn"` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_positions: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// The scale on cos and sin (transformers' `attention_factor`).
    pub attention_factor: f64,
    /// Whether the ramp's ends are rounded outward to whole pairs (transformers' `truncate`).
    pub truncate: bool,
}

impl Yarn {
    /// From a rope-parameters entry of type yarn. `max_positions` is the model's
    /// `max_position_embeddings` (the factor when the entry names none); `attention_factor`, when the
    /// entry has none, is the one the writer's convention implies: `default_attention` if given
    /// (DeepSeek-V4's flat form: 1.0), else transformers' `0.1 ln(factor) + 1` (with `mscale` and
    /// `mscale_all_dim`, their ratio).
    pub fn from_entry(
        entry: &Value,
        max_positions: Option<f64>,
        default_attention: Option<f64>,
        truncate: bool,
    ) -> Result<Yarn, YarnError> {
        let num = |k: &str| entry.get(k).and_then(Value::as_f64);
        let original = num("original_max_position_embeddings").ok_or(YarnError::Missing("original_max_position_embeddings"))?;
        let factor = match num("factor") {
            Some(f) => f,
            None => max_positions.ok_or(YarnError::Missing("factor"))? / original,
        };
        if !(factor.is_finite() && factor > 0.0 && original.is_finite() && original > 0.0) {
            return Err(YarnError::Invalid { factor, original });
        }
        let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
        let attention_factor = match (num("attention_factor"), default_attention, num("mscale"), num("mscale_all_dim")) {
            (Some(a), ..) => a,
            (None, Some(a), ..) => a,
            (None, None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(factor, m) / mscale(factor, all),
            _ => mscale(factor, 1.0),
        };
        // transformers reads `beta_fast or 32`: a 0 is the default too.
        let beta = |k: &str, default: f64| num(k).filter(|b| *b != 0.0).unwrap_or(default);
        Ok(Yarn {
            factor,
            original_max_positions: original,
            beta_fast: beta("beta_fast", 32.0),
            beta_slow: beta("beta_slow", 1.0),
            attention_factor,
            truncate,
        })
    }

    /// The inverse frequency of each of the `dim / 2` pairs at base `theta`: interpolated (divided by
    /// the factor) for slowly turning pairs, extrapolated (as they are) for fast ones, a linear ramp
    /// between.
    pub fn inv_freq(&self, theta: f64, dim: usize) -> Vec<f32> {
        let correction = |rotations: f64| {
            (dim as f64 * (self.original_max_positions / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction(self.beta_fast), correction(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        let span = (high - low) as f32;
        let factor = self.factor as f32;
        (0..dim / 2)
            .map(|i| {
                let pos_freq = pos_freq(theta, dim, i);
                let (extrapolated, interpolated) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
                let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                interpolated * (1.0 - keep) + extrapolated * keep
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// DeepSeek-V4's own parameters (factor 16 over 65,536 positions, base 160,000, 64 channels):
    /// the fast pairs keep their frequency, the slow ones are divided by 16, the ramp lies between.
    #[test]
    fn deepseek_v4s_parameters_ramp_from_extrapolated_to_interpolated() {
        let entry = json!({"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1});
        let yarn = Yarn::from_entry(&entry, Some(1048576.0), Some(1.0), true).unwrap();
        assert_eq!(yarn.attention_factor, 1.0);
        let freqs = yarn.inv_freq(160000.0, 64);
        let plain = |i: usize| 1.0 / 160000f32.powf((2 * i) as f32 / 64.0);
        assert_eq!(freqs[0], plain(0));
        assert_eq!(freqs[31], 1.0 / (16.0 * 160000f32.powf(62.0 / 64.0)));
        let ramp: Vec<usize> =
            (0..32).filter(|&i| freqs[i] != plain(i) && freqs[i] != 1.0 / (16.0 * 160000f32.powf((2 * i) as f32 / 64.0))).collect();
        assert!(!ramp.is_empty() && ramp.len() < 32, "{ramp:?}");
        assert!(freqs.windows(2).all(|w| w[1] < w[0]), "frequencies fall pair by pair");
    }

    #[test]
    fn attention_factor_follows_transformers_defaults() {
        let entry = json!({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256});
        assert!((Yarn::from_entry(&entry, None, None, true).unwrap().attention_factor - (0.1 * 16f64.ln() + 1.0)).abs() < 1e-15);
        let with = json!({"factor": 16.0, "original_max_position_embeddings": 256, "mscale": 1.0, "mscale_all_dim": 1.0});
        assert_eq!(Yarn::from_entry(&with, None, None, true).unwrap().attention_factor, 1.0);
        let implied = json!({"original_max_position_embeddings": 256});
        assert_eq!(Yarn::from_entry(&implied, Some(4096.0), None, true).unwrap().factor, 16.0);
        assert!(Yarn::from_entry(&implied, None, None, true).is_err());
        assert!(Yarn::from_entry(&json!({"factor": 16.0}), None, None, true).is_err());
    }
}
