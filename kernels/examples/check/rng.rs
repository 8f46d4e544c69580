//! The deterministic input generator: every run of the check draws the same inputs, so a failure seen
//! once can be seen again.

/// xorshift64*: a small deterministic generator, so every run draws the same inputs.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.bits() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [-scale, scale).
    pub(crate) fn sym(&mut self, scale: f32) -> f32 {
        ((self.unit() * 2.0 - 1.0) * f64::from(scale)) as f32
    }

    pub(crate) fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym(scale)).collect()
    }

    /// Uniform in [0, n).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n - 1)
    }

    /// A magnitude spread over [lo, hi) on a log scale, with a random sign.
    pub(crate) fn wide(&mut self, lo: f64, hi: f64) -> f32 {
        let m = (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp();
        (if self.bits() & 1 == 1 { -m } else { m }) as f32
    }
}
