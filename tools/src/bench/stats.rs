//! Statistics of timed launches, TFLOP/s, ratios, and how many input sets to rotate.

use serde::{Deserialize, Serialize};

/// Summary of the timed launches of one line on one case.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Median launch time (mean of the two middle values for an even count).
    pub median_ms: f64,
    /// Fastest launch.
    pub min_ms: f64,
    /// 90th percentile (nearest rank).
    pub p90_ms: f64,
    /// Timed launches.
    pub iters: usize,
    /// FLOPs over the median time.
    pub tflops: f64,
}

/// TFLOP/s of `flops` done in `ms` milliseconds (0 for a non-positive time).
pub fn tflops(flops: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        flops / (ms * 1e-3) / 1e12
    } else {
        0.0
    }
}

/// Summarises launch times in milliseconds; `None` when there are none or any is not finite.
pub fn summarize(times_ms: &[f64], flops: f64) -> Option<Timing> {
    if times_ms.is_empty() || times_ms.iter().any(|t| !t.is_finite()) {
        return None;
    }
    let mut t = times_ms.to_vec();
    t.sort_by(f64::total_cmp);
    let n = t.len();
    let median = if n % 2 == 1 {
        t[n / 2]
    } else {
        0.5 * (t[n / 2 - 1] + t[n / 2])
    };
    let p90 = t[(0.9 * n as f64).ceil() as usize - 1];
    Some(Timing {
        median_ms: median,
        min_ms: t[0],
        p90_ms: p90,
        iters: n,
        tflops: tflops(flops, median),
    })
}

/// Our rate over a peer's (> 1: we are faster); `None` unless both are positive.
pub fn ratio(ours: Option<f64>, peer: Option<f64>) -> Option<f64> {
    match (ours, peer) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// How every line is timed: `warmup` untimed launches, more until `warmup_ms` have passed
/// (steady clocks), then `iters` timed launches, or as many as last `window_ms` at the wall
/// time per launch seen in the warm-up ([`window_iters`], at most [`MAX_WINDOW_ITERS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Timed launches (the least, when a window asks for more).
    pub iters: usize,
    /// Untimed launches first (at least 1 is always done).
    pub warmup: usize,
    /// Then untimed launches until this many milliseconds have passed.
    pub warmup_ms: u64,
    /// The least wall time of the timed launches, milliseconds (0: just `iters`).
    pub window_ms: u64,
}

impl Schedule {
    /// Timed launches at `per_call_ms` wall milliseconds per launch.
    pub fn timed_iters(&self, per_call_ms: f64) -> usize {
        window_iters(self.iters, self.window_ms, per_call_ms, MAX_WINDOW_ITERS)
    }
}

/// The most timed launches a window may ask for (peers.py's `MAX_ITERS` is the same).
pub const MAX_WINDOW_ITERS: usize = 20_000;

/// Timed launches: `iters`, or enough to last `window_ms` at `per_call_ms` each (the wall
/// time per launch seen during the warm-up), at most `max_iters`, never fewer than `iters`.
/// A window of 0 or an unusable estimate (not positive, not finite) gives `iters`.
pub fn window_iters(iters: usize, window_ms: u64, per_call_ms: f64, max_iters: usize) -> usize {
    if window_ms == 0 || !(per_call_ms > 0.0 && per_call_ms.is_finite()) {
        return iters;
    }
    let want = (window_ms as f64 / per_call_ms).ceil();
    let want = if want >= max_iters as f64 {
        max_iters
    } else {
        want as usize
    };
    want.max(iters)
}

/// Input sets to rotate so that the sets together exceed three times the L2 cache (at least
/// 2, at most 16), while all sets stay under a quarter of the free device memory (at least 1).
pub fn input_sets(set_bytes: usize, l2_bytes: usize, free_bytes: usize) -> usize {
    let set = set_bytes.max(1);
    let mut n = (3 * l2_bytes).div_ceil(set).clamp(2, 16);
    while n > 1 && n * set > free_bytes / 4 {
        n -= 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_p90() {
        let t: Vec<f64> = (1..=20).rev().map(f64::from).collect();
        let s = summarize(&t, 2e12).unwrap();
        assert_eq!(
            (s.median_ms, s.min_ms, s.p90_ms, s.iters),
            (10.5, 1.0, 18.0, 20)
        );
        assert!((s.tflops - 2e12 / 10.5e-3 / 1e12).abs() < 1e-9);
        assert_eq!(summarize(&[3.0, 1.0, 2.0], 0.0).unwrap().median_ms, 2.0);
        assert!(summarize(&[], 1.0).is_none());
        assert!(summarize(&[f64::NAN], 1.0).is_none());
    }

    #[test]
    fn windows_set_the_launch_count() {
        assert_eq!(window_iters(30, 0, 0.1, MAX_WINDOW_ITERS), 30);
        assert_eq!(window_iters(30, 250, 0.1, MAX_WINDOW_ITERS), 2500);
        assert_eq!(window_iters(30, 250, 100.0, MAX_WINDOW_ITERS), 30);
        assert_eq!(
            window_iters(30, 250, 1e-6, MAX_WINDOW_ITERS),
            MAX_WINDOW_ITERS
        );
        assert_eq!(window_iters(30, 250, f64::NAN, MAX_WINDOW_ITERS), 30);
        assert_eq!(window_iters(30, 250, 0.0, MAX_WINDOW_ITERS), 30);
        assert_eq!(window_iters(30, 250, 1e-6, 10), 30);
    }

    #[test]
    fn sets_cover_l2_within_memory() {
        let l2 = 60 << 20;
        assert_eq!(input_sets(201 << 20, l2, 100 << 30), 2);
        assert_eq!(input_sets(10 << 20, l2, 100 << 30), 16);
        assert_eq!(input_sets(30 << 20, l2, 100 << 30), 6);
        assert_eq!(input_sets(201 << 20, l2, 500 << 20), 1);
    }
}
