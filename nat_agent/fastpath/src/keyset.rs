//! `KeySet`: which records exist, in memory, so that a write learns whether
//! it creates its record without asking LevelDB (issue 27).
//!
//! Why: the store counts records per MetaDataID (for the controller's
//! splits), so every write must know whether its record is new. Asking
//! LevelDB meant a lookup in its memtable's skip list before every put,
//! about a fifth of a worker's time under `redis-benchmark` SETs (perf,
//! `leveldb::MemTable::Get`). A set of the record keys' 128-bit hashes
//! answers in one probe, for about 20 bytes a record.
//!
//! Keys are hashed with two SipHash keys drawn at random for each set, so
//! no one can choose paths that collide, and two keys meet by chance with
//! odds of about n²/2¹²⁹. The store fills it at open and keeps it in step
//! on every write and delete, on both paths (`nat_agent.leveldb_store`).

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;

#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct KeySet {
    seeds: (RandomState, RandomState),
    keys: Mutex<HashSet<u128>>,
}

#[pymethods]
impl KeySet {
    #[new]
    fn new() -> Self {
        KeySet { seeds: (RandomState::new(), RandomState::new()), keys: Mutex::new(HashSet::new()) }
    }

    /// Record that `key` exists; whether it was absent.
    pub(crate) fn add(&self, key: &[u8]) -> bool {
        let hash = self.hash(key);
        self.lock().insert(hash)
    }

    /// Record that `key` is gone; whether it was there.
    pub(crate) fn discard(&self, key: &[u8]) -> bool {
        let hash = self.hash(key);
        self.lock().remove(&hash)
    }

    fn __contains__(&self, key: &[u8]) -> bool {
        let hash = self.hash(key);
        self.lock().contains(&hash)
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }
}

impl KeySet {
    fn hash(&self, key: &[u8]) -> u128 {
        (u128::from(self.seeds.0.hash_one(key)) << 64) | u128::from(self.seeds.1.hash_one(key))
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<u128>> {
        self.keys.lock().expect("never poisoned: nothing panics holding it")
    }
}
