//! `FastLane`: the service's common commands answered in one compiled step.
//!
//! Why: against a bare uvloop server (`benchmarks/agent_bench.py`'s "python
//! floor", as fast as raw redis), the agent's own per-request Python work was
//! most of its latency: coroutine, dispatch, normalize, hash, ownership,
//! store call, reply. Here a connection's leading complete commands are
//! parsed, routed, checked and answered without entering the interpreter
//! except for the store's own calls.
//!
//! It answers only what it can answer exactly as the Python path would, and
//! leaves the rest (the first command it declines, and everything after it)
//! in the parser for `MetadataService.execute`: so replies stay in order and
//! every error, redirect and refusal is still worded in one place. What it
//! takes on:
//!
//! * `GET key`, `EXISTS key` (one key), `SET key value` (no options), `PING`;
//! * on a worker thread, with the extension's LevelDB not synced per write,
//!   the file system's conditional writes: `SET key value NX|XX|IFEQ old`,
//!   `DEL key` (one key), `DELIFEQ key value` and `ECREATE dir name value`,
//!   made at once under the GIL (`conditional`);
//! * a key that normalizes (`keys::normalize_key`) into an ID the table says
//!   is served here: reads where `Ownership.decide` says SERVE, writes where
//!   that holds, the block has no other member and no migration froze the
//!   ID (`Ownership.fast_ranges`, pushed into the `LaneView` by the service
//!   whenever the ownership's version moves);
//! * under `--fsync batch`, writes and reads of a key whose last write is
//!   not yet synced only from a worker thread (`server.rs`), which writes a
//!   turn's SETs as one batch (`Turn`, `apply`) and sends the replies after
//!   the sync that covers them (`durable::SyncGroup`); on the event loop,
//!   which cannot wait there, they are declined;
//! * on a worker thread, plain SETs to blocks with other members
//!   (`Ownership.fast_ranges`' third table), kept in the turn with its other
//!   writes: when the turn ends their keys are registered with the Python
//!   replicator (`Replicator.begin_turn`) before the batch is written, the
//!   stream goes to the event loop, and the turn's replies wait for its
//!   `Acknowledgement` as well as for the sync (`server.rs`);
//! * no key with a replicated write under way (the replicator's `writing`,
//!   which the `LaneView` watches): reads of one wait for it, and writes of
//!   one follow it, on the Python path.
//!
//! On the event loop everything runs synchronously inside one
//! `data_received` callback, so no ownership change and no migration step
//! can come between a check and its store call (what `InFlight` guards on
//! the Python path). The worker threads of `server.rs` call the lane too;
//! there the store's own calls release the GIL, so a worker holds
//! `ServiceLoop`'s gate across a turn of its loop, until the turn's writes
//! have landed, and `InFlight.drain` closes it (`barrier`) before a
//! migration copies anything.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::durable::SyncGroup;
use crate::index::MdidIndex;
use crate::keys::Keyspace;
use crate::level::Table as LevelTable;
use crate::ops::OpsCounts;
use crate::parser::CommandParser;
use crate::seconds::{Batch, Histogram};

type Table = Vec<(u128, u128)>;

/// Where the records the lane creates and deletes are counted.
enum Index {
    /// The extension's own (`RecordAccess.index`), updated without Python.
    Native(Py<MdidIndex>),
    /// `RecordAccess.counted` and `uncounted`, called under the GIL.
    Python { counted: PyObject, uncounted: PyObject },
}

/// A store's records as `nat_agent.store.RecordAccess` hands them over.
struct Records {
    get: PyObject,
    put: PyObject,
    put_options: Option<Py<PyDict>>,
    index: Index,
    group: Option<Py<SyncGroup>>,
    put_batch: Option<PyObject>,
    /// The extension's own table of the records, called instead of the
    /// above (`RecordAccess.native`), and whether its writes sync.
    native: Option<(Py<LevelTable>, bool)>,
    /// The store's lock that every write holds until its records are counted
    /// (`RecordAccess.order`; see `Records::ordered`).
    order: Option<PyObject>,
}

/// `RecordAccess.order`, held: released when dropped, also on an early return.
struct Ordered<'py>(Bound<'py, PyAny>);

impl Drop for Ordered<'_> {
    fn drop(&mut self) {
        if let Err(err) = self.0.call_method0("release") {
            err.write_unraisable(self.0.py(), None);
        }
    }
}

impl Records {
    fn of(access: &Bound<'_, PyAny>) -> PyResult<Self> {
        let optional = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
            let value = access.getattr(name)?;
            Ok((!value.is_none()).then_some(value))
        };
        let put_options = optional("put_options")?.map(|o| o.downcast_into::<PyDict>()).transpose()?;
        let sync = match &put_options {
            Some(options) => options.get_item("sync")?.map(|sync| sync.is_truthy()).transpose()?.unwrap_or(false),
            None => false,
        };
        Ok(Records {
            get: access.getattr("get")?.unbind(),
            put: access.getattr("put")?.unbind(),
            put_options: put_options.map(Bound::unbind),
            index: match optional("index")? {
                Some(index) => Index::Native(index.downcast_into::<MdidIndex>()?.unbind()),
                None => Index::Python { counted: access.getattr("counted")?.unbind(),
                                        uncounted: access.getattr("uncounted")?.unbind() },
            },
            group: optional("group")?.map(|g| g.downcast_into::<SyncGroup>()).transpose()?.map(Bound::unbind),
            put_batch: optional("put_batch")?.map(Bound::unbind),
            native: optional("native")?.map(|t| t.downcast_into::<LevelTable>()).transpose()?.map(|t| (t.unbind(), sync)),
            order: optional("order")?.map(Bound::unbind),
        })
    }

    /// Hold the store's order lock until the guard drops: from before a
    /// write (or the read a conditional write decides on) to after its
    /// records are counted. A batch lands with the GIL released and is
    /// counted after, so without it a DEL on another thread could find a
    /// record in between, delete it and uncount it before it was counted:
    /// the index would count a record that is gone (and, on the Python path,
    /// the DEL's reply was an internal error).
    ///
    /// `blocking`: wait for it (`threading.Lock.acquire` releases the GIL
    /// meanwhile, so whatever was checked under the GIL must be checked again
    /// after), or take it only if it is free: None when it is not (the caller
    /// declines, and the Python path answers). Some(None): the store has none.
    fn ordered<'py>(&self, py: Python<'py>, blocking: bool) -> PyResult<Option<Option<Ordered<'py>>>> {
        let Some(order) = &self.order else { return Ok(Some(None)) };
        let order = order.bind(py).clone();
        if !order.call_method1("acquire", (blocking,))?.is_truthy()? {
            return Ok(None);
        }
        Ok(Some(Some(Ordered(order))))
    }

    /// Count a record of `id` and `key` the lane created (`created`) or
    /// deleted. Made after the write, so never undone: a failure to count
    /// is reported, not retried.
    fn recount(&self, py: Python<'_>, id: u128, key: &[u8], created: bool) {
        let counted = match &self.index {
            Index::Native(index) if created => {
                index.get().created(id, key);
                Ok(())
            }
            Index::Native(index) => match index.get().deleted(id, key) {
                true => Ok(()),
                false => Err(PyValueError::new_err(format!("a deleted record of {id} was not in the index"))),
            },
            Index::Python { counted, uncounted } => {
                (if created { counted } else { uncounted }).call1(py, (PyBytes::new(py, key),)).map(drop)
            }
        };
        if let Err(err) = counted {
            err.write_unraisable(py, None);
        }
    }

    /// The records among `keys` that do not exist, to count once they are
    /// written (`recount`): none to ask with the compiled index, which
    /// counts a key only once (`MdidIndex::created`), so all of them then.
    fn to_count<'k>(&self, py: Python<'_>, keys: impl Iterator<Item = (&'k Vec<u8>, u128)>)
                    -> PyResult<Vec<(u128, Vec<u8>)>> {
        let mut fresh = Vec::new();
        for (key, id) in keys {
            if matches!(self.index, Index::Native(_)) || self.get(py, key)?.is_none() {
                fresh.push((id, key.clone()));
            }
        }
        Ok(fresh)
    }

    /// The record of `key`: None if there is none, Err if the store failed.
    fn get(&self, py: Python<'_>, key: &[u8]) -> PyResult<Option<Value>> {
        if let Some((table, _)) = &self.native {
            return Ok(table.get().get_raw(key)?.map(Value::Bytes));
        }
        let value = self.get.call1(py, (PyBytes::new(py, key),))?;
        if value.is_none(py) {
            return Ok(None);
        }
        Ok(Some(Value::Python(value.downcast_bound::<PyBytes>(py)?.clone().unbind())))
    }

    /// Write one record (not under a group commit); the GIL released
    /// while the native table waits for its sync (`--fsync always`).
    fn put(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        if let Some((table, sync)) = &self.native {
            let (table, pair) = (table.get(), [(key.to_vec(), value.to_vec())]);
            return if *sync { py.allow_threads(|| table.put_all(pair, true)) } else { table.put_all(pair, false) };
        }
        let options = self.put_options.as_ref().map(|o| o.bind(py));
        self.put.call(py, (PyBytes::new(py, key), PyBytes::new(py, value)), options).map(drop)
    }

    /// The native table, when its writes do not sync: where the workers'
    /// conditional writes are made at once, the GIL kept from the read of
    /// the record to the write (see `FastLane::conditional`).
    fn unsynced_native(&self) -> Option<&LevelTable> {
        match &self.native {
            Some((table, false)) => Some(table.get()),
            _ => None,
        }
    }

    /// Write a turn's records as one batch, the GIL released for the
    /// native table (synced under `--fsync always`: one sync for the turn).
    fn put_batch(&self, py: Python<'_>, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> PyResult<()> {
        if let Some((table, sync)) = &self.native {
            let table = table.get();
            return py.allow_threads(|| table.put_all(pairs, *sync));
        }
        let Some(put_batch) = &self.put_batch else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("a turn's writes need a store with batches"));
        };
        let pairs = PyList::new(py, pairs.iter().map(|(key, value)| (PyBytes::new(py, key), PyBytes::new(py, value))))?;
        put_batch.call1(py, (pairs,)).map(drop)
    }
}

/// What is served here, as of one `Ownership.version`.
struct Tables {
    version: i64,
    reads: Table,
    writes: Table,
    /// Writes to blocks with other members: a worker's turn's plain SETs.
    replicated: Table,
}

/// The lane's view of the agent's state, which Python keeps current through
/// its methods: the tables of one `Ownership.version`, the version the
/// ownership is at now (`Ownership.on_version`: the tables are stale until
/// `set_table` brings them to it), and the keys with a replicated write
/// under way (`Replicator.writing`, the dict itself, read under the GIL).
///
/// Shared by the event loop and the worker threads, hence frozen: the
/// tables are swapped whole (an `Arc`), never borrowed across a store call,
/// since a store call releases the GIL and another thread may swap them.
#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct LaneView {
    tables: Mutex<Arc<Tables>>,
    current: AtomicI64,
    writing: OnceLock<Py<PyDict>>,
}

#[pymethods]
impl LaneView {
    /// Nothing served, no write under way, the tables at no version (-1)
    /// and so stale.
    #[new]
    fn new() -> Self {
        let tables = Tables { version: -1, reads: Vec::new(), writes: Vec::new(), replicated: Vec::new() };
        LaneView { tables: Mutex::new(Arc::new(tables)), current: AtomicI64::new(0), writing: OnceLock::new() }
    }

    /// The ranges (first, last) served for reads, for writes and for
    /// replicated writes at `version` (`Ownership.fast_ranges`); each list
    /// sorted and disjoint.
    fn set_table(&self, version: i64, reads: Table, writes: Table, replicated: Table) {
        *self.tables.lock().expect("never poisoned: nothing panics holding it") =
            Arc::new(Tables { version, reads, writes, replicated });
    }

    /// The `Ownership.version` the tables were computed at.
    #[getter]
    fn version(&self) -> i64 {
        self.tables().version
    }

    /// Called by the ownership whenever its version moves.
    fn set_version(&self, version: i64) {
        self.current.store(version, Ordering::SeqCst);
    }

    /// Whether the tables are older than the ownership's version.
    #[getter]
    pub(crate) fn stale(&self) -> bool {
        self.version() != self.current.load(Ordering::SeqCst)
    }

    /// Watch `writing` (`Replicator.writing`: path -> write under way), once.
    fn watch(&self, writing: Py<PyDict>) -> PyResult<()> {
        self.writing.set(writing).map_err(|_| pyo3::exceptions::PyValueError::new_err("a view watches one replicator"))
    }

    /// Replicated writes under way (keys in `Replicator.writing`).
    #[getter]
    fn writing(&self, py: Python<'_>) -> usize {
        self.writing.get().map_or(0, |writing| writing.bind(py).len())
    }
}

impl LaneView {
    fn tables(&self) -> Arc<Tables> {
        Arc::clone(&self.tables.lock().expect("never poisoned: nothing panics holding it"))
    }

    /// Whether a replicated write of `key` (a normalized key, the Python
    /// path's `path`) is under way: its reads wait for it and its writes
    /// follow it, on the Python path. Read under the GIL, as the replicator
    /// and the workers' `Replicator.begin_turn` change it.
    fn busy(&self, py: Python<'_>, key: &[u8]) -> bool {
        let Some(writing) = self.writing.get().map(|w| w.bind(py)) else { return false };
        if writing.is_empty() {
            return false;
        }
        match std::str::from_utf8(key) {
            Ok(path) => writing.contains(path).unwrap_or(true),
            Err(_) => true,
        }
    }
}

/// What a worker waits on for its turn's replicated SETs: told by the
/// Python replicator (`TurnWrites.end`, on the event loop) whether every
/// synced member acknowledged them.
#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct Acknowledgement {
    /// None while under way; then Some(None) if acknowledged, else Some(why not).
    state: Mutex<Option<Option<String>>>,
    ended: Condvar,
}

#[pymethods]
impl Acknowledgement {
    /// The turn ended: `failure` None if every synced member took it.
    #[pyo3(signature = (failure))]
    fn done(&self, failure: Option<String>) {
        let mut state = self.state.lock().expect("never poisoned");
        if state.is_none() {
            *state = Some(failure);
            self.ended.notify_all();
        }
    }
}

impl Acknowledgement {
    fn new() -> Self {
        Acknowledgement { state: Mutex::new(None), ended: Condvar::new() }
    }

    /// Wait (call without the GIL) for the end; why it failed, if it did.
    /// The replicator ends every turn within its timeout, and at shutdown;
    /// `stopping` ends the wait early when the agent stops before it could.
    pub(crate) fn wait(&self, stopping: &AtomicBool) -> Option<String> {
        let mut state = self.state.lock().expect("never poisoned");
        loop {
            if let Some(outcome) = state.as_ref() {
                return outcome.clone();
            }
            if stopping.load(Ordering::SeqCst) {
                return Some("the agent is shutting down".to_string());
            }
            state = self.ended.wait_timeout(state, Duration::from_millis(50)).expect("never poisoned").0;
        }
    }
}

/// What a turn's replies wait for beyond the sync, once its batch was
/// asked for (`FastLane::apply`).
pub(crate) enum Outcome {
    /// Its replicated SETs are streamed (or about to be): the replica set's
    /// acknowledgement.
    Pending(Py<Acknowledgement>),
    /// Nothing of it was written, for this reason: its replies are TRYAGAIN.
    Refused(String),
}

/// The common commands answered end to end (see the module's docstring);
/// frozen, like its view, since the worker threads share it.
#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct FastLane {
    space: Py<Keyspace>,
    view: Py<LaneView>,
    records: Records,
    stats: Py<PyDict>,
    counters: Vec<Counter>,
    total: PyObject,
    ops: OpsCounts,
    /// `Replicator.begin_turn`: registers a turn's replicated SETs.
    replicate: Option<PyObject>,
}

/// A command the lane takes on: its name (upper case, as the service names
/// it), the `stats` key it counts under, and the seconds it takes here.
type Counter = (Vec<u8>, PyObject, Py<Histogram>);

/// A reply that may be sent only once a sync covers `ticket`, and, if it
/// shows a turn's writes, once that `batch` (its number) is in the store:
/// `out[start..end]`. `replicated`: it shows a replicated SET of the batch
/// (the ID written), so it also waits for the replica set, and fails if
/// the set did not take the turn.
pub(crate) struct Waiting {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) ticket: u64,
    pub(crate) batch: Option<u64>,
    pub(crate) replicated: Option<u128>,
}

/// What a reply waits for (see `Waiting`).
#[derive(Default, Clone, Copy)]
struct Need {
    ticket: u64,
    batch: bool,
    replicated: Option<u128>,
}

/// One turn of a worker's loop under a group commit: its writes, not yet
/// in the store, applied as one batch when the turn ends (`FastLane::apply`)
/// and read by the turn's own later commands meanwhile; and the replies of
/// the last lane call that wait (the caller takes them).
#[derive(Default)]
pub(crate) struct Turn {
    pub(crate) waiting: Vec<Waiting>,
    /// Record key -> (value, ID): the last write of a key in the turn wins.
    writes: HashMap<Vec<u8>, (Vec<u8>, u128)>,
    /// Those of `writes` to blocks with other members: record key -> the
    /// normalized key (the replicator's path).
    replicated: HashMap<Vec<u8>, Vec<u8>>,
    /// The number of the batch the writes will be applied as.
    pub(crate) number: u64,
}

impl Turn {
    pub(crate) fn has_writes(&self) -> bool {
        !self.writes.is_empty()
    }
}

/// A record's value: as plyvel returned it, or as bytes of our own (the
/// extension's table, or a write of this turn's).
enum Value {
    Python(Py<PyBytes>),
    Bytes(Vec<u8>),
}

/// The ID is inside one of the table's sorted, disjoint ranges.
fn within(table: &Table, id: u128) -> bool {
    let after = table.partition_point(|&(first, _)| first <= id);
    after > 0 && id <= table[after - 1].1
}

/// A nil reply, in the protocol the connection speaks.
fn nil(resp3: bool) -> &'static [u8] {
    if resp3 { b"_\r\n" } else { b"$-1\r\n" }
}

fn bulk(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(value.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// What a conditional write asks of the record's value before it.
#[derive(Clone, Copy)]
enum Condition<'a> {
    Absent,
    Present,
    Equal(&'a [u8]),
    /// `ECREATE`: absent, in a directory whose header (this record key) exists.
    InDirectory(&'a [u8]),
}

/// SET's options that the lane takes on: one of NX, XX and IFEQ (GET,
/// expiry and anything else are the Python path's, which words them).
fn set_condition<'a>(options: &[&'a [u8]]) -> Option<Condition<'a>> {
    match options {
        [option] if option.eq_ignore_ascii_case(b"NX") => Some(Condition::Absent),
        [option] if option.eq_ignore_ascii_case(b"XX") => Some(Condition::Present),
        [option, old] if option.eq_ignore_ascii_case(b"IFEQ") => Some(Condition::Equal(old)),
        _ => None,
    }
}

#[pymethods]
impl FastLane {
    /// `keyspace`: the ID space and a key's limits; `view`: where it may
    /// answer, kept current by the service; `access`: the store's records
    /// (`nat_agent.store.RecordAccess`; if its `group` is not None, writes
    /// wait for a sync and are taken on only by the workers); `stats`: the service's counters,
    /// `counters` the name each command counts under and the histogram of
    /// the seconds it takes here (`Histogram`), `total` the name
    /// everything this lane answered counts under; `buckets`: how the
    /// requests it serves are counted by ID (`nat_agent.ops_meter.Buckets`).
    #[new]
    #[pyo3(signature = (*, keyspace, view, access, stats, counters, total, buckets, replicate = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        keyspace: Py<Keyspace>,
        view: Py<LaneView>,
        access: &Bound<'_, PyAny>,
        stats: Py<PyDict>,
        counters: Vec<Counter>,
        total: PyObject,
        buckets: &Bound<'_, PyAny>,
        replicate: Option<PyObject>,
    ) -> PyResult<Self> {
        Ok(FastLane {
            space: keyspace,
            view,
            records: Records::of(access)?,
            stats,
            counters,
            total,
            ops: OpsCounts::of(buckets)?,
            replicate,
        })
    }

    /// The view it answers by (the one it was made with).
    #[getter(view)]
    fn view_py(&self, py: Python<'_>) -> Py<LaneView> {
        self.view.clone_ref(py)
    }

    /// The GET, SET and EXISTS answered here per bucket since the start
    /// (`OpsCounts`); what the lane declines, the Python path counts.
    fn ops_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.ops.to_bytes(py)
    }

    /// Answer the parser's leading complete commands that this lane takes
    /// on, stopping at the first it declines or once the replies reach
    /// `budget` bytes. Returns the replies, or None if it answered nothing.
    fn answer<'py>(
        &self,
        py: Python<'py>,
        mut parser: PyRefMut<'py, CommandParser>,
        resp3: bool,
        budget: usize,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut out = Vec::new();
        let taken = self.answer_into(py, &mut parser, resp3, budget, &mut out, None)?;
        Ok((taken > 0).then(|| PyBytes::new(py, &out)))
    }
}

impl FastLane {
    pub(crate) fn view(&self) -> &LaneView {
        self.view.get()
    }

    /// The group commit the store's writes wait for, if they wait for one.
    pub(crate) fn group(&self) -> Option<&SyncGroup> {
        self.records.group.as_ref().map(Py::get)
    }

    /// Whether a worker keeps the SETs of its turn and writes them as one
    /// batch when the turn ends (`Turn`): under a group commit, and with
    /// the extension's own table in every `--fsync` mode, since one LevelDB
    /// write for the turn costs less than one per SET (one log `write`, and
    /// under `always` one sync).
    pub(crate) fn in_turns(&self) -> bool {
        self.records.group.is_some() || self.records.native.is_some()
    }

    /// `answer`, appending the replies to `out`; returns how many commands
    /// it answered (0: the first one is the Python path's). `turn`: a
    /// worker's turn under a group commit, whose writes are applied when it
    /// ends (`apply`); the replies that wait for them or for a sync are
    /// listed in its `waiting`, and the caller sends them (and those after
    /// them) only once a sync covers them. None declines what would wait.
    pub(crate) fn answer_into(
        &self,
        py: Python<'_>,
        parser: &mut CommandParser,
        resp3: bool,
        budget: usize,
        out: &mut Vec<u8>,
        mut turn: Option<&mut Turn>,
    ) -> PyResult<usize> {
        let tables = self.view.get().tables();
        let start = out.len();
        let mut counts = vec![0u64; self.counters.len()];
        let mut seconds = Batch::start();
        // A replicated SET is the last command of the connection this turn: what
        // follows it is answered once the set has taken it or not (`server.rs`),
        // as the Python path answers a pipeline in order.
        let mut replicated = false;
        let taken = parser.take_leading(py, |buf, args| {
            !replicated
                && out.len() - start < budget
                && self.execute(py, &tables, buf, args, resp3, out, &mut counts, &mut seconds, turn.as_deref_mut())
                    .map(|need| replicated = need.replicated.is_some())
                    .is_some()
        });
        if taken == 0 {
            return Ok(0);
        }
        let stats = self.stats.bind(py);
        let named = self.counters.iter().map(|(_, key, _)| key).zip(counts);
        for (key, n) in named.chain([(&self.total, taken as u64)]) {
            if n > 0 {
                // The dict's own slots, not Counter's methods: a missing key is 0.
                let was: u64 = match stats.get_item(key)? {
                    Some(was) => was.extract()?,
                    None => 0,
                };
                stats.set_item(key, was + n)?;
            }
        }
        Ok(taken)
    }

    /// Apply a turn's writes as one batch (under a group commit taking one
    /// ticket for them first, as every write does), and count the records
    /// they create; the ticket (None if there was nothing to write or no
    /// group commit), and what its replicated SETs wait for. Those are
    /// registered with the replicator before the batch is written (a turn
    /// one of whose keys another write holds is not written at all: its
    /// replies are TRYAGAIN), and streamed once it is. On an error nothing
    /// of the batch is known to be in the store.
    pub(crate) fn apply(&self, py: Python<'_>, turn: &mut Turn) -> PyResult<(Option<u64>, Option<Outcome>)> {
        if turn.writes.is_empty() {
            return Ok((None, None));
        }
        let writes = std::mem::take(&mut turn.writes);
        let replicated = std::mem::take(&mut turn.replicated);
        turn.number += 1;
        // Taken before the roles are checked below: waiting for it releases the GIL.
        let _ordered = self.records.ordered(py, true)?;
        // Every write must still be served here as it was admitted: the role of
        // its block may have changed since (a block now held as a backup must
        // not be written here). Asked of the tables of the ownership's current
        // version (the caller brings the view in step), under the GIL, as every
        // change of the ownership is made.
        let view = self.view.get();
        let tables = view.tables();
        let still = !view.stale()
            && writes.iter().all(|(record_key, (_, id))| {
                within(if replicated.contains_key(record_key) { &tables.replicated } else { &tables.writes }, *id)
            });
        if !still {
            return Ok((None, Some(Outcome::Refused("the block's role changed during the write".to_string()))));
        }
        let mut streamed = None;
        if !replicated.is_empty() {
            let records = PyList::new(py, replicated.iter().map(|(record_key, key)| {
                let (value, id) = &writes[record_key];
                (*id, PyBytes::new(py, key), PyBytes::new(py, value))
            }))?;
            let ack = Py::new(py, Acknowledgement::new())?;
            let begin = self.replicate.as_ref().expect("replicated writes are taken only with a replicator");
            let registered = begin.call1(py, (records, ack.clone_ref(py)))?;
            if registered.is_none(py) {
                let why = "a replicated write of one of its keys was under way".to_string();
                return Ok((None, Some(Outcome::Refused(why))));
            }
            streamed = Some((registered, ack));
        }
        // Asked now, not when the command came: the batch lands right after.
        let created = self.records.to_count(py, writes.iter().map(|(key, (_, id))| (key, *id)))?;
        let ticket = self.group().map(|group| group.begin(writes.keys().cloned().collect()));
        let written = self.records.put_batch(py, writes.into_iter().map(|(key, (value, _))| (key, value)).collect());
        if let (Some(group), Some(ticket)) = (self.group(), ticket) {
            group.end(ticket);
        }
        let replication = match streamed {
            Some((registered, ack)) => {
                let error = written.as_ref().err().map(|err| err.value(py).to_string());
                registered.call_method1(py, "landed", (error,))?;
                Some(Outcome::Pending(ack))
            }
            None => None,
        };
        written?;
        for (id, key) in created {
            self.records.recount(py, id, &key, true);
        }
        Ok((ticket, replication))
    }

    /// One command; None if declined (nothing done, nothing written), else
    /// what its reply waits for. One answered is counted in `counts` and
    /// timed in `seconds`.
    #[allow(clippy::too_many_arguments)]
    fn execute<'a>(
        &'a self,
        py: Python<'_>,
        tables: &Tables,
        buf: &[u8],
        args: &[(usize, usize)],
        resp3: bool,
        out: &mut Vec<u8>,
        counts: &mut [u64],
        seconds: &mut Batch<'a>,
        mut turn: Option<&mut Turn>,
    ) -> Option<Need> {
        let arg = |i: usize| &buf[args[i].0..args[i].1];
        let counter = self.counters.iter().position(|(known, _, _)| known.eq_ignore_ascii_case(arg(0)))?;
        let name = self.counters[counter].0.as_slice(); // as the service names it: upper case
        let start = out.len();
        let need = match (name, args.len()) {
            (b"PING", 1) => {
                out.extend_from_slice(b"+PONG\r\n");
                Some(Need::default())
            }
            (b"GET", 2) | (b"EXISTS", 2) => self.read(py, tables, arg(1), turn.as_deref()).map(|(value, need)| {
                match (name, value) {
                    (b"GET", Some(Value::Python(value))) => bulk(out, value.bind(py).as_bytes()),
                    (b"GET", Some(Value::Bytes(value))) => bulk(out, &value),
                    (b"GET", None) => out.extend_from_slice(nil(resp3)),
                    (_, found) => out.extend_from_slice(if found.is_some() { b":1\r\n" } else { b":0\r\n" }),
                }
                need
            }),
            (b"SET", 3) => {
                let need = self.write(py, tables, arg(1), arg(2), turn.as_deref_mut());
                if need.is_some() {
                    out.extend_from_slice(b"+OK\r\n");
                }
                need
            }
            (b"SET", 4..=5) | (b"ECREATE", 4) => {
                let written = if name == b"SET" {
                    let options: Vec<&[u8]> = (3..args.len()).map(arg).collect();
                    set_condition(&options).and_then(|condition| {
                        self.conditional(py, tables, arg(1), Some(arg(2)), condition, turn.as_deref())
                    })
                } else {
                    self.create_entry(py, tables, arg(1), arg(2), arg(3), turn.as_deref())
                };
                written.map(|(written, need)| {
                    out.extend_from_slice(if written { b"+OK\r\n" } else { nil(resp3) });
                    need
                })
            }
            (b"DEL", 2) | (b"DELIFEQ", 3) => {
                let condition = if name == b"DEL" { Condition::Present } else { Condition::Equal(arg(2)) };
                self.conditional(py, tables, arg(1), None, condition, turn.as_deref()).map(|(deleted, need)| {
                    out.extend_from_slice(if deleted { b":1\r\n" } else { b":0\r\n" });
                    need
                })
            }
            _ => None,
        };
        let need = need?;
        if let (true, Some(turn)) = (need.ticket > 0 || need.batch, turn) {
            let batch = need.batch.then_some(turn.number);
            let end = out.len();
            turn.waiting.push(Waiting { start, end, ticket: need.ticket, batch, replicated: need.replicated });
        }
        counts[counter] += 1;
        seconds.answered(self.counters[counter].2.get());
        Some(need)
    }

    /// The record of a key served here for reads, and what its reply waits
    /// for; None to decline. A store call that fails is declined: the
    /// Python path meets the same failure and answers it. A key written in
    /// this turn, or whose last write is not yet synced, is declined
    /// without a turn (see `answer_into`).
    fn read(&self, py: Python<'_>, tables: &Tables, raw: &[u8], turn: Option<&Turn>) -> Option<(Option<Value>, Need)> {
        let space = self.space.get();
        let (key, id) = space.route(raw)?;
        if !within(&tables.reads, id) {
            return None;
        }
        let record_key = space.record_key(id, &key);
        if let Some(turn) = turn {
            if let Some((value, _)) = turn.writes.get(&record_key) {
                self.ops.count(id);
                let replicated = turn.replicated.contains_key(&record_key).then_some(id);
                return Some((Some(Value::Bytes(value.clone())), Need { batch: true, replicated, ..Need::default() }));
            }
        }
        if self.view.get().busy(py, &key) {
            return None;
        }
        let found = self.records.get(py, &record_key).ok()?;
        let mut need = Need::default();
        // Read first, then ask: a write takes its ticket before it reaches the store.
        if let Some(ticket) = self.group().and_then(|group| group.ticket_of(&record_key)) {
            turn?;
            need.ticket = ticket;
        }
        self.ops.count(id);
        Some((found, need))
    }

    /// `ECREATE directory name value`, as `conditional` with the directory's
    /// header required. Declined where the Python path words an error: a
    /// directory given as an entry key, a bad name, or no header (ENOENT).
    fn create_entry(&self, py: Python<'_>, tables: &Tables, directory: &[u8], name: &[u8], value: &[u8],
                    turn: Option<&Turn>) -> Option<(bool, Need)> {
        if directory.contains(&0) || name.contains(&0) {
            return None;
        }
        let raw = [directory, b"\0", name].concat();
        let (key, id) = self.space.get().route(&raw)?;
        let header = self.space.get().record_key(id, &key[..key.iter().position(|&b| b == 0)?]);
        self.conditional_routed(py, tables, (key, id), Some(value), Condition::InDirectory(&header), turn)
    }

    /// A conditional write (SET with NX, XX or IFEQ; DEL and DELIFEQ of one
    /// key, `value` None; ECREATE) of a key served here for writes: whether
    /// it wrote, and what its reply waits for. Only on a worker (`turn`)
    /// whose store is the extension's table without a sync per write, and
    /// never on a record the turn holds a write of (nor, for ECREATE, its
    /// directory's header): those are declined, and the Python path answers
    /// them after the turn's writes have landed.
    ///
    /// Made at once, not in the turn's batch, and with the store's order lock
    /// (`Records::ordered`, taken only if free: else declined) and the GIL
    /// held from the read of the record to the write and its count: every
    /// other write, a turn's batch, the workers' and the event loop's, runs
    /// before or after, never between. The write takes a ticket of the
    /// group commit, and the reply waits for its sync, as a SET's does; a
    /// condition that fails shows the record as it is, so its reply waits as
    /// a read's does.
    fn conditional(&self, py: Python<'_>, tables: &Tables, raw: &[u8], value: Option<&[u8]>,
                   condition: Condition<'_>, turn: Option<&Turn>) -> Option<(bool, Need)> {
        self.conditional_routed(py, tables, self.space.get().route(raw)?, value, condition, turn)
    }

    /// `conditional` of a key already routed (normalized, with its ID).
    fn conditional_routed(&self, py: Python<'_>, tables: &Tables, (key, id): (Cow<'_, [u8]>, u128),
                          value: Option<&[u8]>, condition: Condition<'_>, turn: Option<&Turn>)
                          -> Option<(bool, Need)> {
        let (turn, table) = (turn?, self.records.unsynced_native()?);
        if !within(&tables.writes, id) || self.view.get().busy(py, &key) {
            return None;
        }
        let record_key = self.space.get().record_key(id, &key);
        let header = match condition {
            Condition::InDirectory(header) => Some(header),
            _ => None,
        };
        if turn.writes.contains_key(&record_key) || header.is_some_and(|h| turn.writes.contains_key(h)) {
            return None;
        }
        let _ordered = self.records.ordered(py, false).ok()??;
        let old = table.get_raw(&record_key).ok()?;
        let holds = match condition {
            Condition::Absent => old.is_none(),
            Condition::Present => old.is_some(),
            Condition::Equal(expected) => old.as_deref() == Some(expected),
            Condition::InDirectory(header) => old.is_none() && table.get_raw(header).ok()?.is_some(),
        };
        let group = self.group();
        let pending = |key: &[u8]| group.and_then(|g| g.ticket_of(key)).unwrap_or(0);
        let mut need = Need::default();
        if !holds {
            if matches!(condition, Condition::InDirectory(_)) && old.is_none() {
                return None; // no header: the Python path words ENOENT (and counts the request)
            }
            need.ticket = pending(&record_key).max(header.map_or(0, pending));
            self.ops.count(id);
            return Some((false, need));
        }
        let ticket = group.map(|group| group.begin(vec![record_key.clone()]));
        let written = match value {
            Some(value) => table.put_all([(record_key.clone(), value.to_vec())], false),
            None => table.delete_raw(&record_key),
        };
        if let (Some(group), Some(ticket)) = (group, ticket) {
            group.end(ticket);
        }
        // Not written: the Python path tries again and words the failure.
        written.ok()?;
        need.ticket = ticket.unwrap_or(0);
        self.ops.count(id);
        if value.is_some() != old.is_some() {
            self.records.recount(py, id, &record_key, value.is_some());
        }
        Some((true, need))
    }

    /// Write a key served here for writes, and what its reply waits for;
    /// None to decline (nothing written). With a turn the write joins its
    /// batch; under a group commit, or to a block with other members, it is
    /// declined without one (see `answer_into`).
    fn write(&self, py: Python<'_>, tables: &Tables, raw: &[u8], value: &[u8], turn: Option<&mut Turn>) -> Option<Need> {
        if self.group().is_some() && turn.is_none() {
            return None;
        }
        let space = self.space.get();
        let (key, id) = space.route(raw)?;
        let replicated = !within(&tables.writes, id);
        if replicated && (turn.is_none() || self.replicate.is_none() || !within(&tables.replicated, id)) {
            return None;
        }
        if self.view.get().busy(py, &key) {
            return None;
        }
        let record_key = space.record_key(id, &key);
        if let Some(turn) = turn {
            if replicated {
                turn.replicated.insert(record_key.clone(), key.into_owned());
            }
            turn.writes.insert(record_key, (value.to_vec(), id));
            self.ops.count(id);
            return Some(Need { batch: true, replicated: replicated.then_some(id), ..Need::default() });
        }
        let _ordered = self.records.ordered(py, false).ok()??;
        let fresh = self.records.to_count(py, std::iter::once((&record_key, id))).ok()?;
        // Not written: the Python path tries again and words the failure.
        self.records.put(py, &record_key, value).ok()?;
        self.ops.count(id);
        for (id, key) in fresh {
            self.records.recount(py, id, &key, true);
        }
        Some(Need::default())
    }
}
