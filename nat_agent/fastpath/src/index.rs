//! `MdidIndex`: the LevelDB store's range index, the mdid of every record in
//! a sorted multiset, so that counting the records of an ID range is two
//! rank lookups instead of a walk of LevelDB's keys.
//!
//! Why here: it was a Python `SortedList`, which the compiled lane called
//! under the GIL for every record it created (about 7 % of the agent's CPU
//! under `redis-benchmark` SETs of new paths, `perf`, 2026-12-07). The lane
//! now updates this one directly; the store's Python code (put, delete,
//! migrations, `count`) calls the same object, with the `SortedList`
//! methods it used, so `nat_agent.mdid_index` keeps `SortedList` as the
//! fallback without the extension and as the oracle of
//! `tests/unit/test_mdid_index.py`.
//!
//! The layout is `SortedList`'s: sorted chunks of at most `2 * LOAD` IDs and
//! each chunk's largest, so an insert moves at most `2 * LOAD` IDs, and a
//! rank is a binary search over the chunks' largest, a sum of the chunks'
//! lengths before it (about n / LOAD of them: a microsecond at a million
//! records) and a binary search in one chunk.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// IDs per chunk a split leaves (a chunk splits beyond twice this).
const LOAD: usize = 1000;

/// The sorted multiset itself, without locking or Python.
#[derive(Default)]
struct Chunks {
    chunks: Vec<Vec<u128>>,
    /// `chunks[i].last()`, kept beside them for the binary search.
    maxes: Vec<u128>,
    len: usize,
}

impl Chunks {
    fn from_sorted(ids: Vec<u128>) -> Self {
        let len = ids.len();
        let chunks: Vec<Vec<u128>> = ids.chunks(LOAD).map(<[u128]>::to_vec).collect();
        let maxes = chunks.iter().map(|c| c[c.len() - 1]).collect();
        Chunks { chunks, maxes, len }
    }

    fn insert(&mut self, id: u128) {
        self.len += 1;
        if self.chunks.is_empty() {
            self.chunks.push(vec![id]);
            self.maxes.push(id);
            return;
        }
        let c = self.maxes.partition_point(|&max| max < id).min(self.chunks.len() - 1);
        let chunk = &mut self.chunks[c];
        let at = chunk.partition_point(|&x| x <= id);
        chunk.insert(at, id);
        self.maxes[c] = chunk[chunk.len() - 1];
        if chunk.len() > 2 * LOAD {
            let tail = chunk.split_off(LOAD);
            self.maxes[c] = chunk[LOAD - 1];
            self.maxes.insert(c + 1, tail[tail.len() - 1]);
            self.chunks.insert(c + 1, tail);
        }
    }

    /// Remove one `id`; whether there was one.
    fn remove(&mut self, id: u128) -> bool {
        let c = self.maxes.partition_point(|&max| max < id);
        let Some(chunk) = self.chunks.get_mut(c) else { return false };
        let at = chunk.partition_point(|&x| x < id);
        if chunk.get(at) != Some(&id) {
            return false;
        }
        chunk.remove(at);
        self.len -= 1;
        if chunk.is_empty() {
            self.chunks.remove(c);
            self.maxes.remove(c);
        } else {
            self.maxes[c] = chunk[chunk.len() - 1];
        }
        true
    }

    /// How many IDs are below `id` (`inclusive`: at most `id`).
    fn rank(&self, id: u128, inclusive: bool) -> usize {
        let below = |x: &u128| if inclusive { *x <= id } else { *x < id };
        let c = self.maxes.partition_point(below);
        let before: usize = self.chunks[..c].iter().map(Vec::len).sum();
        before + self.chunks.get(c).map_or(0, |chunk| chunk.partition_point(below))
    }

    fn count(&self, first: u128, last: u128) -> usize {
        if first > last {
            return 0;
        }
        self.rank(last, true) - self.rank(first, false)
    }

    /// Remove every ID in `first..=last`; how many there were.
    fn remove_range(&mut self, first: u128, last: u128) -> usize {
        if first > last {
            return 0;
        }
        let before = self.len;
        for chunk in &mut self.chunks {
            if chunk[0] <= last && chunk[chunk.len() - 1] >= first {
                chunk.retain(|&x| x < first || x > last);
            }
        }
        let (chunks, maxes): (Vec<_>, Vec<_>) = std::mem::take(&mut self.chunks)
            .into_iter()
            .filter(|c| !c.is_empty())
            .map(|c| {
                let max = c[c.len() - 1];
                (c, max)
            })
            .unzip();
        self.chunks = chunks;
        self.maxes = maxes;
        self.len = self.chunks.iter().map(Vec::len).sum();
        before - self.len
    }
}

/// The IDs of an iterable of Python ints.
fn collect(ids: &Bound<'_, PyAny>) -> PyResult<Vec<u128>> {
    ids.try_iter()?.map(|id| id?.extract::<u128>()).collect()
}

/// The mdids of a store's records, as a sorted multiset (see the module).
#[pyclass(frozen, module = "nat_agent._fastpath")]
pub struct MdidIndex {
    ids: Mutex<Chunks>,
}

impl MdidIndex {
    fn lock(&self) -> MutexGuard<'_, Chunks> {
        // Every change leaves the chunks whole before it can panic: a poisoned lock's data is sound.
        self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A record of `id` was created (the lane's own call).
    pub(crate) fn counted(&self, id: u128) {
        self.lock().insert(id);
    }

    /// A record of `id` was deleted (the lane's own call); whether one was counted.
    pub(crate) fn uncounted(&self, id: u128) -> bool {
        self.lock().remove(id)
    }
}

#[pymethods]
impl MdidIndex {
    /// The index of `ids` (an iterable of ints, in any order).
    #[new]
    #[pyo3(signature = (ids=None))]
    fn new(ids: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let mut sorted = match ids {
            Some(ids) => collect(ids)?,
            None => Vec::new(),
        };
        sorted.sort_unstable();
        Ok(MdidIndex { ids: Mutex::new(Chunks::from_sorted(sorted)) })
    }

    /// Count one more record of `id`.
    fn add(&self, id: u128) {
        self.counted(id);
    }

    /// Count one record of `id` fewer; ValueError if none is counted (as `SortedList.remove`).
    fn remove(&self, id: u128) -> PyResult<()> {
        if self.uncounted(id) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!("{id} not in the index")))
        }
    }

    /// Count one more record of each of `ids`.
    fn update(&self, ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = collect(ids)?; // all of them first: a bad one adds none
        let mut chunks = self.lock();
        for id in ids {
            chunks.insert(id);
        }
        Ok(())
    }

    /// Records counted with an ID in `first..=last` (0 if `first > last`).
    fn count(&self, first: u128, last: u128) -> usize {
        self.lock().count(first, last)
    }

    /// Forget every record with an ID in `first..=last`; how many there were.
    fn remove_range(&self, first: u128, last: u128) -> usize {
        self.lock().remove_range(first, last)
    }

    fn __len__(&self) -> usize {
        self.lock().len
    }
}

