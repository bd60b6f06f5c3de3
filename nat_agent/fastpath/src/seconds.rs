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
//! The lane reads the clock once per command it answers and once before a
//! batch (`Batch`): a command's seconds run from the end of the one before
//! (so they take in its parsing) to its reply. Like commands of a pipeline
//! landing in the same bucket are added up first and added to the
//! histogram together, so a pipeline pays its atomic adds once per run of
//! them, not per command.
//!
//! The bounds are `Latency`'s, handed over by Python (`REQUEST_BUCKETS`),
//! and a value is placed as `bisect_left` places it there: in the first
//! bucket whose bound is at or above it, past the last bound in +Inf. So
//! the two paths' counts add up bucket by bucket into one histogram.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
        if seconds.is_nan() || seconds < 0.0 {
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
    /// rounded first.
    pub(crate) fn record(&self, seconds: f64) {
        self.add(self.bucket(seconds), 1, nanos(seconds));
    }

    fn bucket(&self, seconds: f64) -> usize {
        self.bounds.partition_point(|&bound| bound < seconds)
    }

    /// `count` observations in `bucket` whose seconds sum to `nanos`: no lock.
    fn add(&self, bucket: usize, count: u64, nanos: u64) {
        self.counts[bucket].fetch_add(count, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Seconds summed in whole nanoseconds, an integer an atomic can add (`as` saturates).
fn nanos(seconds: f64) -> u64 {
    (seconds * 1e9).round() as u64
}

/// The seconds of the commands one lane call answers (see the module's
/// docstring); what it holds back is added when it is dropped.
pub(crate) struct Batch<'a> {
    clock: Instant,
    held: Option<(&'a Histogram, usize)>,
    count: u64,
    nanos: u64,
}

impl<'a> Batch<'a> {
    pub(crate) fn start() -> Self {
        Batch { clock: Instant::now(), held: None, count: 0, nanos: 0 }
    }

    /// A command of `histogram` answered just now.
    pub(crate) fn answered(&mut self, histogram: &'a Histogram) {
        let now = Instant::now();
        let seconds = (now - self.clock).as_secs_f64();
        self.clock = now;
        let bucket = histogram.bucket(seconds);
        if !matches!(self.held, Some((held, at)) if ptr::eq(held, histogram) && at == bucket) {
            self.add();
            self.held = Some((histogram, bucket));
        }
        self.count += 1;
        self.nanos += nanos(seconds);
    }

    fn add(&mut self) {
        if let Some((histogram, bucket)) = self.held.take() {
            histogram.add(bucket, self.count, self.nanos);
        }
        (self.count, self.nanos) = (0, 0);
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.add();
    }
}
