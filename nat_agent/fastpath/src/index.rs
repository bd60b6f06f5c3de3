//! `MdidIndex`: the LevelDB store's index of its records: the mdid of every
//! record in a sorted multiset, so that counting the records of an ID range
//! is two rank lookups instead of a walk of LevelDB's keys, and a 128-bit
//! fingerprint of every record key, so that a write knows whether it
//! creates a record (and must count it) without reading LevelDB first.
//!
//! Why here: it was a Python `SortedList`, which the compiled lane called
//! under the GIL for every record it created (about 7 % of the agent's CPU
//! under `redis-benchmark` SETs of new paths, `perf`, 2026-12-07), after a
//! LevelDB read of every key a turn wrote, only to tell new from old (a
//! second walk of the memtable's skip list beside the insert's: 2 to 4 µs
//! of CPU per SET, measured by skipping it). The lane now updates this one
//! directly and reads nothing. The store's Python code (put, delete,
//! migrations, `count`) calls the same object; `nat_agent.mdid_index` is
//! the same methods over a `SortedList`, the fallback without the extension
//! and the oracle of `tests/unit/test_mdid_index.py`.
//!
//! The fingerprints are two SipHash-1-3 values of the key under random keys
//! chosen when the index is made: 128 bits, so among a billion records the
//! chance that two share one is about 10^-21 (a shared one would make the
//! second record's creation uncounted, never lose a write), and no client
//! can choose paths that collide. 16 bytes a record, and 16 for its mdid.
//!
//! The layout is `SortedList`'s: sorted chunks of at most `2 * LOAD` IDs and
//! each chunk's largest, so an insert moves at most `2 * LOAD` IDs, and a
//! rank is a binary search over the chunks' largest, a sum of the chunks'
//! lengths before it (about n / LOAD of them: a microsecond at a million
//! records) and a binary search in one chunk.

use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
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
}

/// The hasher of a set of fingerprints, which are hashes already: their low 64 bits.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte); // never called: fingerprints are u128s
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

/// What the lock guards: both halves change together.
#[derive(Default)]
struct Records {
    ids: Chunks,
    keys: HashSet<u128, BuildHasherDefault<Prehashed>>,
}

/// A store's records: their mdids and key fingerprints (see the module).
#[pyclass(frozen, module = "nat_agent._fastpath")]
pub struct MdidIndex {
    records: Mutex<Records>,
    /// Bytes of an mdid at the head of a record key (`nat_agent.store.record_key`).
    id_bytes: usize,
    hashers: [RandomState; 2],
}

impl MdidIndex {
    fn lock(&self) -> MutexGuard<'_, Records> {
        // Every change leaves both halves whole before it can panic: a poisoned lock's data is sound.
        self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fingerprint(&self, key: &[u8]) -> u128 {
        let [high, low] = &self.hashers;
        (u128::from(high.hash_one(key)) << 64) | u128::from(low.hash_one(key))
    }

    /// The mdid at the head of a record key.
    fn id_of(&self, key: &[u8]) -> PyResult<u128> {
        let head = key.get(..self.id_bytes).ok_or_else(|| PyValueError::new_err("a record key shorter than its mdid"))?;
        Ok(head.iter().fold(0u128, |n, &b| (n << 8) | u128::from(b)))
    }

    /// A record of `id` with `key` was written: counted if it is new; whether it was.
    pub(crate) fn created(&self, id: u128, key: &[u8]) -> bool {
        let fingerprint = self.fingerprint(key);
        let mut records = self.lock();
        let new = records.keys.insert(fingerprint);
        if new {
            records.ids.insert(id);
        }
        new
    }

    /// The record keys of an iterable, each with its mdid; an error (and
    /// nothing) if one is not bytes or is shorter than an mdid.
    fn keyed(&self, keys: &Bound<'_, PyAny>) -> PyResult<Vec<(u128, Vec<u8>)>> {
        keys.try_iter()?
            .map(|key| {
                let key: Vec<u8> = key?.extract()?;
                Ok((self.id_of(&key)?, key))
            })
            .collect()
    }

    /// The record of `id` with `key` was deleted: whether it was counted.
    pub(crate) fn deleted(&self, id: u128, key: &[u8]) -> bool {
        let fingerprint = self.fingerprint(key);
        let mut records = self.lock();
        records.keys.remove(&fingerprint) && records.ids.remove(id)
    }
}

#[pymethods]
impl MdidIndex {
    /// The index of the record keys `keys` (in any order), whose mdids are
    /// `id_bytes` long.
    #[new]
    #[pyo3(signature = (id_bytes, keys=None))]
    fn new(id_bytes: usize, keys: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        if !(1..=16).contains(&id_bytes) {
            return Err(PyValueError::new_err(format!("mdids of {id_bytes} bytes")));
        }
        let index = MdidIndex {
            records: Mutex::new(Records::default()),
            id_bytes,
            hashers: [RandomState::new(), RandomState::new()],
        };
        let Some(keys) = keys else { return Ok(index) };
        let mut ids = Vec::new();
        let mut fingerprints = HashSet::default();
        for (id, key) in index.keyed(keys)? {
            if fingerprints.insert(index.fingerprint(&key)) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        *index.lock() = Records { ids: Chunks::from_sorted(ids), keys: fingerprints };
        Ok(index)
    }

    /// A record of `key` was created (a key already counted is not counted again).
    fn add(&self, key: &[u8]) -> PyResult<()> {
        self.created(self.id_of(key)?, key);
        Ok(())
    }

    /// The record of `key` was deleted; ValueError if it was not counted.
    fn remove(&self, key: &[u8]) -> PyResult<()> {
        if self.deleted(self.id_of(key)?, key) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!("{key:?} not in the index")))
        }
    }

    /// Records of each of `keys` were created.
    fn update(&self, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        for (id, key) in self.keyed(keys)? {
            self.created(id, &key);
        }
        Ok(())
    }

    /// The records of `keys` were deleted; how many of them were counted.
    fn remove_keys(&self, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(self.keyed(keys)?.into_iter().filter(|(id, key)| self.deleted(*id, key)).count())
    }

    /// Records counted with an ID in `first..=last` (0 if `first > last`).
    fn count(&self, first: u128, last: u128) -> usize {
        self.lock().ids.count(first, last)
    }

    fn __len__(&self) -> usize {
        self.lock().ids.len
    }

    /// Whether `add` of a key already counted is ignored: always, here
    /// (`nat_agent.mdid_index.SortedMdids` has False).
    #[getter]
    fn knows_keys(&self) -> bool {
        true
    }
}
