//! `Histogram`: the seconds one command took on the compiled path, for the
//! agent's `metaflow_agent_request_seconds` (`nat_agent.metrics`).
//!
//! Why its own: the Python path's `nat_agent.latency.Latency` is a list
//! that only the event loop's thread adds to; the lane runs on the event
//! loop and on every worker thread at once. Here an observation is two
//! relaxed atomic adds (its bucket, its nanoseconds), from whichever thread
//! served the request, and no lock: the counts are read only at a scrape,
//! where only their sums matter, not their order against other memory.
//!
//! The bounds are `Latency`'s, handed over by Python (`REQUEST_BUCKETS`),
//! and a value is placed as `bisect_left` places it there: in the first
//! bucket whose bound is at or above it, past the last bound in +Inf. So
//! the two paths' counts add up bucket by bucket into one histogram.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct Histogram {
    bounds: Box<[f64]>,
    /// One per bound, then +Inf.
    counts: Box<[AtomicU64]>,
    nanos: AtomicU64,
}

#[pymethods]
impl Histogram {
    /// `bounds`: the buckets' upper bounds in seconds, ascending (+Inf is implied).
    #[new]
    fn new(bounds: Vec<f64>) -> PyResult<Self> {
        if !bounds.windows(2).all(|pair| pair[0] < pair[1]) {
            return Err(PyValueError::new_err("a histogram's bounds must ascend"));
        }
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Ok(Histogram { bounds: bounds.into_boxed_slice(), counts, nanos: AtomicU64::new(0) })
    }

    /// One observation of `seconds`, as the lane makes it (a duration: not
    /// negative, not NaN); the tests hold its placement to `Latency`'s.
    fn observe(&self, seconds: f64) -> PyResult<()> {
        if !(seconds >= 0.0) {
            return Err(PyValueError::new_err(format!("not a duration: {seconds}")));
        }
        self.record(seconds);
        Ok(())
    }

    /// The counts per bucket (not cumulative; the last is +Inf's) and the
    /// sum of the seconds observed, read without stopping the observers.
    fn snapshot(&self) -> (Vec<u64>, f64) {
        let counts = self.counts.iter().map(|count| count.load(Ordering::Relaxed)).collect();
        (counts, self.nanos.load(Ordering::Relaxed) as f64 / 1e9)
    }
}

impl Histogram {
    /// One observation of `seconds` (not negative), placed as given, not
    /// rounded first: the request path's, with no lock and no allocation.
    pub(crate) fn record(&self, seconds: f64) {
        let bucket = self.bounds.partition_point(|&bound| bound < seconds);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // The sum in whole nanoseconds, an integer an atomic can add (`as` saturates).
        self.nanos.fetch_add((seconds * 1e9).round() as u64, Ordering::Relaxed);
    }
}
