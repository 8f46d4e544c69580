//! Latency distributions: nearest-rank percentiles over recorded nanosecond samples, and the
//! microsecond formatting the markdown tables use.

/// p50, p90, p99, p99.9 and max of one sample set, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(samples_ns: &[u64]) -> Percentiles {
        if samples_ns.is_empty() {
            return Percentiles::default();
        }
        let mut sorted = samples_ns.to_vec();
        sorted.sort_unstable();
        let at = |q: f64| {
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1] as f64 / 1000.0
        };
        Percentiles { p50: at(0.50), p90: at(0.90), p99: at(0.99), p999: at(0.999), max: sorted[sorted.len() - 1] as f64 / 1000.0 }
    }

    /// The five columns `p50 | p90 | p99 | p99.9 | max` in µs.
    pub fn cells(&self) -> String {
        format!("{} | {} | {} | {} | {}", us(self.p50), us(self.p90), us(self.p99), us(self.p999), us(self.max))
    }
}

/// Microseconds with one decimal below 100 µs, whole above.
pub fn us(value: f64) -> String {
    if value.abs() < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// Microseconds with an explicit sign, for added latency.
pub fn signed_us(value: f64) -> String {
    if value >= 0.0 {
        format!("+{}", us(value))
    } else {
        us(value)
    }
}

/// The median of a small set of values (already in µs).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}
