//! `OpsCounts`: the requests the lane served, per bucket of the ID space, for
//! `nat_agent.ops_meter` (the load behind the admin API's `POST /ops`).
//!
//! The buckets are `nat_agent.ops_meter.Buckets`, taken as given so that both
//! paths count alike: bucket `(id - first) >> shift`, `number` of them. One
//! relaxed atomic add per request, from whichever thread serves it: the
//! counts are read a few times a second, and only their sums matter, not
//! their order against other memory.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub struct OpsCounts {
    first: u128,
    shift: u32,
    counts: Box<[AtomicU64]>,
}

impl OpsCounts {
    /// The buckets of a `nat_agent.ops_meter.Buckets`.
    pub fn of(buckets: &Bound<'_, PyAny>) -> PyResult<Self> {
        let number: usize = buckets.getattr("number")?.extract()?;
        Ok(OpsCounts {
            first: buckets.getattr("first")?.extract()?,
            shift: buckets.getattr("shift")?.extract()?,
            counts: (0..number).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// One request served for `id` (an ID of the space).
    pub fn count(&self, id: u128) {
        let bucket = usize::try_from(id.wrapping_sub(self.first) >> self.shift).ok();
        if let Some(counter) = bucket.and_then(|b| self.counts.get(b)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The cumulative counts as native-endian u64s: what `array('Q', ...)` reads.
    pub fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut out = Vec::with_capacity(self.counts.len() * 8);
        for counter in self.counts.iter() {
            out.extend_from_slice(&counter.load(Ordering::Relaxed).to_ne_bytes());
        }
        PyBytes::new(py, &out)
    }
}
