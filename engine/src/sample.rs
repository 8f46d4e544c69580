//! Choosing the next token: greedy at temperature 0, otherwise temperature + top-p from a seeded
//! generator; log-probabilities of the chosen token and the top alternatives on request.

/// Sampling settings of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    /// How many top alternatives to report with each token (0: none).
    pub top_logprobs: usize,
    pub logprobs: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_p: 1.0, seed: 0, top_logprobs: 0, logprobs: false }
    }
}

/// One sampled token with its log-probability and the top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// A seeded sampler (SplitMix64).
pub struct Sampler {
    params: SamplingParams,
    state: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let state = params.seed ^ 0x9E37_79B9_7F4A_7C15;
        Sampler { params, state }
    }

    fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next uniform in [0, 1) of this request's generator (what a device sampler draws with).
    pub fn uniform(&mut self) -> f64 {
        self.next_f64()
    }

    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        let logsumexp = log_sum_exp(logits);
        let token = if self.params.temperature <= 0.0 { argmax(logits) } else { self.draw(logits) };
        let want_top = if self.params.logprobs { self.params.top_logprobs } else { 0 };
        Sampled { token, logprob: logits[token as usize] - logsumexp, top: top_k(logits, want_top, logsumexp) }
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let t = self.params.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f64)> = logits.iter().enumerate().map(|(i, l)| (i as u32, (((l - max) / t) as f64).exp())).collect();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f64 = probs.iter().map(|p| p.1).sum();
        let mut kept = 0.0;
        let mut cut = probs.len();
        for (i, p) in probs.iter().enumerate() {
            kept += p.1 / total;
            if kept >= self.params.top_p as f64 {
                cut = i + 1;
                break;
            }
        }
        probs.truncate(cut.max(1));
        let mass: f64 = probs.iter().map(|p| p.1).sum();
        let mut r = self.next_f64() * mass;
        for (token, p) in &probs {
            if r < *p {
                return *token;
            }
            r -= p;
        }
        probs.last().map_or(0, |p| p.0)
    }
}

/// Index of the largest logit (the lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|l| ((l - max) as f64).exp()).sum();
    max + sum.ln() as f32
}

/// The `k` most likely tokens with their log-probabilities, most likely first.
pub fn top_k(logits: &[f32], k: usize, logsumexp: f32) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    idx.select_nth_unstable_by(k - 1, |a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
    idx.truncate(k);
    idx.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
    idx.into_iter().map(|i| (i, logits[i as usize] - logsumexp)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_with_logprobs() {
        let mut s = Sampler::new(SamplingParams { logprobs: true, top_logprobs: 2, ..Default::default() });
        let out = s.sample(&[0.0, 3.0, 1.0]);
        assert_eq!(out.token, 1);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!(out.logprob < 0.0 && out.logprob > -0.2);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_top_p_cuts_the_tail() {
        let logits = [2.0, 1.9, -10.0, -10.0];
        let params = SamplingParams { temperature: 1.0, top_p: 0.9, seed: 42, ..Default::default() };
        let draw =
            |p: &SamplingParams| (0..50).map(|_| 0).scan(Sampler::new(p.clone()), |s, _| Some(s.sample(&logits).token)).collect::<Vec<_>>();
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        assert!(a.iter().all(|t| *t < 2));
        assert!(a.contains(&0) && a.contains(&1));
    }
}
