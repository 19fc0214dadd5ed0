//! Summaries of repeated measurements: median and spread, and nearest-rank percentiles.

use serde::Serialize;

/// The median of `samples` (the mean of the middle two for an even count); not empty.
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let mid = samples.len() / 2;
    if samples.len().is_multiple_of(2) {
        (samples[mid - 1] + samples[mid]) / 2.0
    } else {
        samples[mid]
    }
}

/// The nearest-rank `p`-th percentile (0 < p <= 100) of sorted, non-empty `sorted`.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median and range of one figure over the repeats.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// `None` for no samples (a figure nothing measured).
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        if sorted.is_empty() {
            return None;
        }
        let median = median(&mut sorted);
        Some(Self { median, min: sorted[0], max: sorted[sorted.len() - 1], n: sorted.len() })
    }
}

/// Latency percentiles, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub n: usize,
}

impl Percentiles {
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        Some(Self { p50: percentile(&sorted, 50.0), p90: percentile(&sorted, 90.0), p99: percentile(&sorted, 99.0), n: sorted.len() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&samples).unwrap();
        assert_eq!((p.p50, p.p90, p.p99), (50.0, 90.0, 99.0));
        let one = Percentiles::of(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert!(Percentiles::of(&[]).is_none());
    }

    #[test]
    fn spread_keeps_the_range() {
        let s = Spread::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 5.0, 3));
    }
}
