//! `SyncGroup`: the group commit's ledger, shared by the worker threads and
//! the Python path (issue 27).
//!
//! Why here: under `--fsync batch` a write is acknowledged only once a sync
//! covers it. When only the event loop could wait for a sync, every such
//! SET left the compiled lane for the Python path. With the ledger in Rust a
//! worker thread writes the commands of its turn, waits for one sync that
//! covers them all (with the GIL released, so other workers go on), and
//! only then sends the turn's replies, as Redis does under `appendfsync
//! always`. The event loop's writes (`nat_agent.group_commit.GroupCommit`,
//! which runs `sync_through` in a worker thread) share the same syncs.
//!
//! The promise, the same as the Python `nat_agent.group_commit.Ledger`'s
//! (its oracle, held to the same answers by `tests/unit/test_sync_group.py`):
//!
//! * A write takes its ticket with `begin` *before* it reaches the store and
//!   gives it back with `end` once it has: a sync covers every ticket
//!   issued before it began, so it first waits for those still under way.
//!   (A ticket taken after the write would let a reader on another thread
//!   see the new value before any ticket says it is not yet on disk.)
//! * The keys a write touched keep its ticket until a sync covers it: a
//!   reader that has read a key asks `ticket_of` and waits for that sync
//!   before replying, so no reply shows what a power loss could take back.
//! * One sync at a time; whoever needs one while none runs leads it, the
//!   others wait for it and then check whether it covered them.
//! * A failed sync is final: every waiter of that sync, and every later
//!   one, gets its error (a second fsync can report success for pages the
//!   kernel dropped after the first failed).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::logs::Logs;
use crate::seconds::Histogram;

/// What a sync does.
enum Sync {
    /// fdatasync every write-ahead log (files named `*suffix`) in the
    /// directory, and the directory itself when a new log has appeared since
    /// the last sync: `nat_agent.leveldb_store`'s reasons, done here without
    /// the GIL (`logs.rs`).
    Logs(Mutex<Logs>),
    /// A Python callable (the tests' model disk), called with the GIL.
    Python(PyObject),
}

/// Why a sync failed: the errno (0 if none) and the message.
type Failure = (i32, String);

struct Ledger {
    issued: u64,
    synced: u64,
    /// Tickets whose write has not reached the store yet.
    writing: BTreeSet<u64>,
    /// Keys written and not yet covered by a sync, with their latest ticket.
    dirty: HashMap<Vec<u8>, u64>,
    syncing: bool,
    failure: Option<Failure>,
    syncs: u64,
}

#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct SyncGroup {
    ledger: Mutex<Ledger>,
    changed: Condvar,
    sync: Sync,
    seconds: Py<Histogram>,
}

fn os_error(failure: &Failure) -> PyErr {
    PyOSError::new_err((failure.0, failure.1.clone()))
}

#[pymethods]
impl SyncGroup {
    /// Either `directory` (and `suffix`, the logs' file name ending) or
    /// `sync`; `seconds` gets how long each sync took.
    #[new]
    #[pyo3(signature = (*, seconds, directory=None, suffix=None, sync=None))]
    fn new(seconds: Py<Histogram>, directory: Option<PathBuf>, suffix: Option<String>, sync: Option<PyObject>) -> PyResult<Self> {
        let sync = match (directory, suffix, sync) {
            (Some(directory), Some(suffix), None) => Sync::Logs(Mutex::new(Logs::new(directory, suffix))),
            (None, None, Some(sync)) => Sync::Python(sync),
            _ => return Err(PyValueError::new_err("a sync group syncs either a directory's logs or a callable")),
        };
        let ledger = Ledger {
            issued: 0,
            synced: 0,
            writing: BTreeSet::new(),
            dirty: HashMap::new(),
            syncing: false,
            failure: None,
            syncs: 0,
        };
        Ok(SyncGroup { ledger: Mutex::new(ledger), changed: Condvar::new(), sync, seconds })
    }

    /// A write of `keys` is about to reach the store: its ticket.
    pub(crate) fn begin(&self, keys: Vec<Vec<u8>>) -> u64 {
        let mut ledger = self.lock();
        ledger.issued += 1;
        let ticket = ledger.issued;
        ledger.writing.insert(ticket);
        for key in keys {
            ledger.dirty.insert(key, ticket);
        }
        ticket
    }

    /// The write of `ticket` has reached the store (or failed to: either
    /// way a sync need not wait for it).
    pub(crate) fn end(&self, ticket: u64) {
        let mut ledger = self.lock();
        ledger.writing.remove(&ticket);
        if ledger.syncing {
            self.changed.notify_all();
        }
    }

    /// Whether a sync covers `ticket`; OSError if a sync failed.
    fn covered(&self, ticket: u64) -> PyResult<bool> {
        let ledger = self.lock();
        match &ledger.failure {
            Some(failure) => Err(os_error(failure)),
            None => Ok(ledger.synced >= ticket),
        }
    }

    /// The ticket of the last write of `key` that no sync covers yet, if any.
    pub(crate) fn ticket_of(&self, key: &[u8]) -> Option<u64> {
        self.lock().dirty.get(key).copied()
    }

    /// Tickets issued so far (the last one).
    #[getter]
    fn issued(&self) -> u64 {
        self.lock().issued
    }

    /// Syncs done.
    #[getter]
    fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Return once a sync covers `ticket`, leading one if none runs; the
    /// GIL is released meanwhile. OSError if a sync failed.
    fn sync_through(&self, py: Python<'_>, ticket: u64) -> PyResult<()> {
        py.allow_threads(|| self.settle(ticket)).map_err(|failure| os_error(&failure))
    }
}

impl SyncGroup {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().expect("never poisoned: nothing panics holding it")
    }

    /// `sync_through` without the GIL (the caller holds none).
    pub(crate) fn settle(&self, ticket: u64) -> Result<(), Failure> {
        let mut ledger = self.lock();
        loop {
            if let Some(failure) = &ledger.failure {
                return Err(failure.clone());
            }
            if ledger.synced >= ticket {
                return Ok(());
            }
            if ledger.syncing {
                ledger = self.changed.wait(ledger).expect("never poisoned");
                continue;
            }
            ledger.syncing = true;
            let target = ledger.issued;
            while ledger.writing.first().is_some_and(|&oldest| oldest <= target) {
                ledger = self.changed.wait(ledger).expect("never poisoned");
            }
            drop(ledger);
            let started = Instant::now();
            let result = self.sync_now();
            ledger = self.lock();
            ledger.syncing = false;
            match result {
                Ok(()) => {
                    ledger.synced = ledger.synced.max(target);
                    ledger.dirty.retain(|_, written| *written > target);
                    ledger.syncs += 1;
                    self.seconds.get().record(started.elapsed().as_secs_f64());
                }
                Err(failure) => ledger.failure = Some(failure),
            }
            self.changed.notify_all();
        }
    }

    fn sync_now(&self) -> Result<(), Failure> {
        match &self.sync {
            Sync::Logs(logs) => {
                let mut logs = logs.lock().expect("never poisoned");
                logs.sync().map_err(|err| (err.raw_os_error().unwrap_or(0), err.to_string()))
            }
            Sync::Python(sync) => Python::with_gil(|py| {
                sync.call0(py).map(drop).map_err(|err| {
                    let value = err.value(py);
                    let errno = value.getattr("errno").ok().and_then(|e| e.extract::<i32>().ok()).unwrap_or(0);
                    let message = value
                        .getattr("strerror")
                        .ok()
                        .and_then(|s| s.extract::<String>().ok())
                        .unwrap_or_else(|| value.to_string());
                    (errno, message)
                })
            }),
        }
    }
}
