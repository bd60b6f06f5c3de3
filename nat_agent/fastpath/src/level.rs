//! `LevelDB`: the store's LevelDB, opened by the extension (issue 27, part 2).
//!
//! Why: with LevelDB reached through plyvel, every record the lane read or
//! wrote was a Python call made with the GIL, from the workers as from the
//! event loop. Here the lane calls LevelDB directly (`Table::get`,
//! `Table::write`), and a batch is written with the GIL released. LevelDB
//! lets one process open a directory once, so the Python control plane
//! (migrations, scans, the state document) reaches the same handle through
//! the same classes, whose methods are the subset of plyvel's that
//! `nat_agent.leveldb_store` uses, with plyvel's names: plyvel stays the
//! fallback without the extension, and the oracle of `tests/unit/test_level.py`.
//!
//! LevelDB is Debian's (`libleveldb-dev`, 1.23, with snappy), linked
//! statically through its C API (`leveldb/c.h`, declared below): the
//! extension carries it, as plyvel's wheels carry theirs, and the on-disk
//! format is the one plyvel writes, so an existing store opens unchanged.
//!
//! Closing: LevelDB must not be closed while an iterator of it lives. A
//! store's scan is an async generator that holds its iterator across awaits,
//! so `close` first destroys every live iterator (which then answers that
//! the database is closed), then the database.

use std::ffi::{c_char, c_int, c_uchar, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// LevelDB's opaque C types: only ever behind a pointer it made.
macro_rules! opaque {
    ($($name:ident),* $(,)?) => {
        $(
            #[repr(C)]
            struct $name([u8; 0]);
        )*
    };
}

opaque!(RawDb, RawOptions, RawReadOptions, RawWriteOptions, RawBatch, RawIterator, RawCache, RawFilter);

/// `leveldb_no_compression`, `leveldb_snappy_compression`.
const NO_COMPRESSION: c_int = 0;
const SNAPPY: c_int = 1;

extern "C" {
    fn leveldb_open(options: *const RawOptions, name: *const c_char, errptr: *mut *mut c_char) -> *mut RawDb;
    fn leveldb_close(db: *mut RawDb);
    fn leveldb_compact_range(db: *mut RawDb, start: *const c_char, startlen: usize, limit: *const c_char, limitlen: usize);
    fn leveldb_put(db: *mut RawDb, options: *const RawWriteOptions, key: *const c_char, keylen: usize,
                   val: *const c_char, vallen: usize, errptr: *mut *mut c_char);
    fn leveldb_delete(db: *mut RawDb, options: *const RawWriteOptions, key: *const c_char, keylen: usize,
                      errptr: *mut *mut c_char);
    fn leveldb_write(db: *mut RawDb, options: *const RawWriteOptions, batch: *mut RawBatch, errptr: *mut *mut c_char);
    fn leveldb_get(db: *mut RawDb, options: *const RawReadOptions, key: *const c_char, keylen: usize,
                   vallen: *mut usize, errptr: *mut *mut c_char) -> *mut c_char;
    fn leveldb_create_iterator(db: *mut RawDb, options: *const RawReadOptions) -> *mut RawIterator;
    fn leveldb_iter_destroy(it: *mut RawIterator);
    fn leveldb_iter_valid(it: *const RawIterator) -> c_uchar;
    fn leveldb_iter_seek(it: *mut RawIterator, key: *const c_char, keylen: usize);
    fn leveldb_iter_next(it: *mut RawIterator);
    fn leveldb_iter_key(it: *const RawIterator, keylen: *mut usize) -> *const c_char;
    fn leveldb_iter_value(it: *const RawIterator, vallen: *mut usize) -> *const c_char;
    fn leveldb_iter_get_error(it: *const RawIterator, errptr: *mut *mut c_char);
    fn leveldb_writebatch_create() -> *mut RawBatch;
    fn leveldb_writebatch_destroy(batch: *mut RawBatch);
    fn leveldb_writebatch_put(batch: *mut RawBatch, key: *const c_char, keylen: usize, val: *const c_char, vallen: usize);
    fn leveldb_writebatch_delete(batch: *mut RawBatch, key: *const c_char, keylen: usize);
    fn leveldb_options_create() -> *mut RawOptions;
    fn leveldb_options_destroy(options: *mut RawOptions);
    fn leveldb_options_set_create_if_missing(options: *mut RawOptions, value: c_uchar);
    fn leveldb_options_set_compression(options: *mut RawOptions, value: c_int);
    fn leveldb_options_set_filter_policy(options: *mut RawOptions, policy: *mut RawFilter);
    fn leveldb_options_set_cache(options: *mut RawOptions, cache: *mut RawCache);
    fn leveldb_options_set_write_buffer_size(options: *mut RawOptions, size: usize);
    fn leveldb_filterpolicy_create_bloom(bits_per_key: c_int) -> *mut RawFilter;
    fn leveldb_filterpolicy_destroy(policy: *mut RawFilter);
    fn leveldb_cache_create_lru(capacity: usize) -> *mut RawCache;
    fn leveldb_cache_destroy(cache: *mut RawCache);
    fn leveldb_readoptions_create() -> *mut RawReadOptions;
    fn leveldb_readoptions_destroy(options: *mut RawReadOptions);
    fn leveldb_writeoptions_create() -> *mut RawWriteOptions;
    fn leveldb_writeoptions_destroy(options: *mut RawWriteOptions);
    fn leveldb_writeoptions_set_sync(options: *mut RawWriteOptions, value: c_uchar);
    fn leveldb_free(ptr: *mut c_void);
}

/// LevelDB's error (a C string it allocated, or null): taken and freed.
fn check(error: *mut c_char) -> Result<(), String> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: LevelDB sets errptr to a NUL-terminated string allocated with malloc.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { leveldb_free(error.cast()) };
    Err(message)
}

/// An open database and what it was opened with, freed together.
struct Handle {
    db: *mut RawDb,
    options: *mut RawOptions,
    filter: *mut RawFilter,
    cache: *mut RawCache,
    read: *mut RawReadOptions,
    /// Write options without and with `sync`.
    write: [*mut RawWriteOptions; 2],
}

// SAFETY: LevelDB's DB is safe for concurrent use from several threads
// (db.h); the options are not changed after `open`.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: each pointer was created by LevelDB in `open` and is freed once, here, after the DB.
        unsafe {
            if !self.db.is_null() {
                leveldb_close(self.db);
            }
            leveldb_options_destroy(self.options);
            if !self.filter.is_null() {
                leveldb_filterpolicy_destroy(self.filter);
            }
            if !self.cache.is_null() {
                leveldb_cache_destroy(self.cache);
            }
            leveldb_readoptions_destroy(self.read);
            for options in self.write {
                leveldb_writeoptions_destroy(options);
            }
        }
    }
}

/// How a database is opened: plyvel's keywords, those the store sets.
struct OpenOptions {
    create_if_missing: bool,
    snappy: bool,
    bloom_filter_bits: c_int,
    lru_cache_size: Option<usize>,
    write_buffer_size: Option<usize>,
}

impl Handle {
    fn open(path: &str, how: &OpenOptions) -> Result<Handle, String> {
        let name = CString::new(path).map_err(|_| format!("a path with a NUL byte: {path:?}"))?;
        // SAFETY: plain constructors and setters on pointers LevelDB just made.
        let mut handle = unsafe {
            let options = leveldb_options_create();
            leveldb_options_set_create_if_missing(options, how.create_if_missing.into());
            leveldb_options_set_compression(options, if how.snappy { SNAPPY } else { NO_COMPRESSION });
            let filter = if how.bloom_filter_bits > 0 {
                leveldb_filterpolicy_create_bloom(how.bloom_filter_bits)
            } else {
                ptr::null_mut()
            };
            if !filter.is_null() {
                leveldb_options_set_filter_policy(options, filter);
            }
            let cache = how.lru_cache_size.map_or(ptr::null_mut(), |size| leveldb_cache_create_lru(size));
            if !cache.is_null() {
                leveldb_options_set_cache(options, cache);
            }
            if let Some(size) = how.write_buffer_size {
                leveldb_options_set_write_buffer_size(options, size);
            }
            let write = [leveldb_writeoptions_create(), leveldb_writeoptions_create()];
            leveldb_writeoptions_set_sync(write[1], 1);
            Handle { db: ptr::null_mut(), options, filter, cache, read: leveldb_readoptions_create(), write }
        };
        let mut error = ptr::null_mut();
        // SAFETY: valid options and a NUL-terminated name; on failure db is null and Drop skips it.
        handle.db = unsafe { leveldb_open(handle.options, name.as_ptr(), &mut error) };
        check(error)?;
        Ok(handle)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let (mut length, mut error) = (0usize, ptr::null_mut());
        // SAFETY: an open DB; the value LevelDB returns is malloc'ed, copied, then freed.
        let value = unsafe { leveldb_get(self.db, self.read, key.as_ptr().cast(), key.len(), &mut length, &mut error) };
        check(error)?;
        if value.is_null() {
            return Ok(None);
        }
        let copy = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), length) }.to_vec();
        unsafe { leveldb_free(value.cast()) };
        Ok(Some(copy))
    }

    fn write(&self, batch: &[Change], sync: bool) -> Result<(), String> {
        let mut error = ptr::null_mut();
        // SAFETY: an open DB; the batch is built from live slices and destroyed here.
        unsafe {
            let raw = leveldb_writebatch_create();
            for change in batch {
                match change {
                    Change::Put(key, value) => leveldb_writebatch_put(
                        raw, key.as_ptr().cast(), key.len(), value.as_ptr().cast(), value.len()),
                    Change::Delete(key) => leveldb_writebatch_delete(raw, key.as_ptr().cast(), key.len()),
                }
            }
            leveldb_write(self.db, self.write[usize::from(sync)], raw, &mut error);
            leveldb_writebatch_destroy(raw);
        }
        check(error)
    }

    fn put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), String> {
        let mut error = ptr::null_mut();
        // SAFETY: an open DB and live slices.
        unsafe {
            leveldb_put(self.db, self.write[usize::from(sync)], key.as_ptr().cast(), key.len(),
                        value.as_ptr().cast(), value.len(), &mut error);
        }
        check(error)
    }

    fn delete(&self, key: &[u8], sync: bool) -> Result<(), String> {
        let mut error = ptr::null_mut();
        // SAFETY: an open DB and a live slice.
        unsafe { leveldb_delete(self.db, self.write[usize::from(sync)], key.as_ptr().cast(), key.len(), &mut error) };
        check(error)
    }
}

/// One change of a write batch (full keys, prefix included).
#[derive(Clone)]
pub(crate) enum Change {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// Where an iterator is: live, past its range (or closed by its owner), or
/// cut off by the database's `close`.
enum Cursor {
    Live(RawCursor),
    Ended,
    Closed,
}

struct RawCursor(*mut RawIterator);

// SAFETY: a LevelDB iterator may move between threads; the Mutex around it
// keeps it to one at a time.
unsafe impl Send for RawCursor {}

impl Drop for RawCursor {
    fn drop(&mut self) {
        // SAFETY: created by leveldb_create_iterator and destroyed once, before its DB (see `Database::close`).
        unsafe { leveldb_iter_destroy(self.0) };
    }
}

/// The database, shared by its tables and iterators: None once closed.
struct Database {
    path: String,
    handle: RwLock<Option<Handle>>,
    cursors: Mutex<Vec<Weak<Mutex<Cursor>>>>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("never poisoned: nothing panics holding it")
}

impl Database {
    fn with<T>(&self, act: impl FnOnce(&Handle) -> Result<T, String>) -> PyResult<T> {
        let handle = self.handle.read().expect("never poisoned");
        let handle = handle.as_ref().ok_or_else(|| closed(&self.path))?;
        act(handle).map_err(PyOSError::new_err)
    }

    fn cursor(&self) -> PyResult<Arc<Mutex<Cursor>>> {
        let handle = self.handle.read().expect("never poisoned");
        let handle = handle.as_ref().ok_or_else(|| closed(&self.path))?;
        // SAFETY: an open DB; the iterator is destroyed before it (`close`).
        let raw = unsafe { leveldb_create_iterator(handle.db, handle.read) };
        let cursor = Arc::new(Mutex::new(Cursor::Live(RawCursor(raw))));
        let mut cursors = locked(&self.cursors);
        cursors.retain(|weak| weak.strong_count() > 0);
        cursors.push(Arc::downgrade(&cursor));
        Ok(cursor)
    }

    fn close(&self) {
        let mut handle = self.handle.write().expect("never poisoned");
        for cursor in locked(&self.cursors).drain(..).filter_map(|weak| weak.upgrade()) {
            let mut cursor = locked(&cursor);
            if matches!(*cursor, Cursor::Live(_)) {
                *cursor = Cursor::Closed;
            }
        }
        handle.take();
    }
}

fn closed(path: &str) -> PyErr {
    PyRuntimeError::new_err(format!("LevelDB {path} is closed"))
}

/// A LevelDB database opened by the extension: plyvel's `DB`, as far as
/// the store uses it.
#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct LevelDB {
    database: Arc<Database>,
}

#[pymethods]
impl LevelDB {
    /// Open the directory `name` with plyvel's keywords: `compression` None
    /// or "snappy", a Bloom filter of `bloom_filter_bits` per key (0: none),
    /// an LRU block cache of `lru_cache_size` bytes and a memtable of
    /// `write_buffer_size` bytes (LevelDB's defaults when None). Raises
    /// OSError as LevelDB words it (a missing directory, a lock held).
    #[new]
    #[pyo3(signature = (name, *, create_if_missing=false, compression=Some("snappy"), bloom_filter_bits=0,
                        lru_cache_size=None, write_buffer_size=None))]
    fn new(
        py: Python<'_>,
        name: &str,
        create_if_missing: bool,
        compression: Option<&str>,
        bloom_filter_bits: c_int,
        lru_cache_size: Option<usize>,
        write_buffer_size: Option<usize>,
    ) -> PyResult<Self> {
        let snappy = match compression {
            None => false,
            Some("snappy") => true,
            Some(other) => return Err(PyValueError::new_err(format!("compression must be None or 'snappy', not {other:?}"))),
        };
        let how = OpenOptions { create_if_missing, snappy, bloom_filter_bits, lru_cache_size, write_buffer_size };
        let handle = py.allow_threads(|| Handle::open(name, &how)).map_err(PyOSError::new_err)?;
        let database = Database { path: name.to_owned(), handle: RwLock::new(Some(handle)), cursors: Mutex::new(Vec::new()) };
        Ok(LevelDB { database: Arc::new(database) })
    }

    /// The keys under `prefix`, as a table of their own (plyvel's `prefixed_db`).
    fn prefixed_db(&self, prefix: Vec<u8>) -> Table {
        Table { database: Arc::clone(&self.database), prefix }
    }

    /// Compact the keys from `start` to `stop` (None: from the first, to
    /// the last) into tables, the memtable included, the GIL released.
    #[pyo3(signature = (*, start=None, stop=None))]
    fn compact_range(&self, py: Python<'_>, start: Option<Vec<u8>>, stop: Option<Vec<u8>>) -> PyResult<()> {
        let bound = |key: &Option<Vec<u8>>| key.as_ref().map_or((ptr::null(), 0), |k| (k.as_ptr().cast::<c_char>(), k.len()));
        let ((first, first_len), (last, last_len)) = (bound(&start), bound(&stop));
        let (first, last) = (first as usize, last as usize); // addresses, to cross allow_threads
        py.allow_threads(|| {
            self.database.with(|handle| {
                // SAFETY: an open DB; null bounds mean the whole key space; the slices outlive the call.
                unsafe { leveldb_compact_range(handle.db, first as *const c_char, first_len, last as *const c_char, last_len) };
                Ok(())
            })
        })
    }

    #[getter]
    fn closed(&self) -> bool {
        self.database.handle.read().expect("never poisoned").is_none()
    }

    /// Close it (every live iterator first); a second close does nothing.
    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.database.close());
    }
}

/// The keys of a database that start with a prefix, the prefix left out
/// (plyvel's `PrefixedDB`); the lane reads and writes records through it.
#[pyclass(module = "nat_agent._fastpath", name = "LevelTable", frozen)]
pub struct Table {
    database: Arc<Database>,
    prefix: Vec<u8>,
}

impl Table {
    fn full(&self, key: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), key].concat()
    }

    /// The value of `key` (the prefix left out), for the lane: no Python.
    pub(crate) fn get_raw(&self, key: &[u8]) -> PyResult<Option<Vec<u8>>> {
        let full = self.full(key);
        self.database.with(|handle| handle.get(&full))
    }

    /// Delete `key`, for the lane (not synced): no Python, and the GIL kept.
    pub(crate) fn delete_raw(&self, key: &[u8]) -> PyResult<()> {
        let full = self.full(key);
        self.database.with(|handle| handle.delete(&full, false))
    }

    /// Write `(key, value)` pairs as one batch, for the lane: no Python.
    pub(crate) fn put_all(&self, pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>, sync: bool) -> PyResult<()> {
        let batch: Vec<Change> = pairs.into_iter().map(|(key, value)| Change::Put(self.full(&key), value)).collect();
        self.database.with(|handle| handle.write(&batch, sync))
    }
}

#[pymethods]
impl Table {
    /// Gets, and writes that do not sync, keep the GIL: a read, then a write
    /// that depends on it (the store's conditional writes, on the event
    /// loop) must not let a worker's conditional write of the same record
    /// (`FastLane`, under the GIL too) come between them. Each is a memtable
    /// or block-cache access; only a sync is worth letting go of the GIL for.
    fn get<'py>(&self, py: Python<'py>, key: &[u8]) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let value = self.get_raw(key)?;
        Ok(value.map(|value| PyBytes::new(py, &value)))
    }

    #[pyo3(signature = (key, value, *, sync=false))]
    fn put(&self, py: Python<'_>, key: &[u8], value: &[u8], sync: bool) -> PyResult<()> {
        let full = self.full(key);
        let put = || self.database.with(|handle| handle.put(&full, value, sync));
        if sync { py.allow_threads(put) } else { put() }
    }

    #[pyo3(signature = (key, *, sync=false))]
    fn delete(&self, py: Python<'_>, key: &[u8], sync: bool) -> PyResult<()> {
        let full = self.full(key);
        let delete = || self.database.with(|handle| handle.delete(&full, sync));
        if sync { py.allow_threads(delete) } else { delete() }
    }

    /// A batch of puts and deletes, written at once by its `write`.
    #[pyo3(signature = (*, sync=false))]
    fn write_batch(slf: Py<Self>, sync: bool) -> WriteBatch {
        WriteBatch { table: slf, sync, changes: Mutex::new(Vec::new()) }
    }

    /// The keys from `start` (or the first) up to `stop` (excluded; or the
    /// last), in order, with their values unless `include_value` is false;
    /// one consistent snapshot. Also a context manager that closes it.
    #[pyo3(signature = (*, start=None, stop=None, include_start=true, include_value=true))]
    fn iterator(
        &self,
        start: Option<Vec<u8>>,
        stop: Option<Vec<u8>>,
        include_start: bool,
        include_value: bool,
    ) -> PyResult<Range> {
        let cursor = self.database.cursor()?;
        let first = self.full(start.as_deref().unwrap_or(b""));
        if let Cursor::Live(raw) = &*locked(&cursor) {
            // SAFETY: a live iterator (just made, under its lock).
            unsafe { leveldb_iter_seek(raw.0, first.as_ptr().cast(), first.len()) };
        }
        Ok(Range {
            database: Arc::clone(&self.database),
            cursor,
            prefix: self.prefix.clone(),
            skip: (!include_start && start.is_some()).then_some(first),
            stop: stop.map(|stop| self.full(&stop)),
            include_value,
        })
    }
}

/// plyvel's `WriteBatch`: puts and deletes kept until `write`.
#[pyclass(module = "nat_agent._fastpath", name = "LevelBatch", frozen)]
pub struct WriteBatch {
    table: Py<Table>,
    sync: bool,
    changes: Mutex<Vec<Change>>,
}

#[pymethods]
impl WriteBatch {
    fn put(&self, key: &[u8], value: &[u8]) {
        let full = self.table.get().full(key);
        locked(&self.changes).push(Change::Put(full, value.to_vec()));
    }

    fn delete(&self, key: &[u8]) {
        let full = self.table.get().full(key);
        locked(&self.changes).push(Change::Delete(full));
    }

    /// Write what was kept, as one LevelDB write (the GIL released); the
    /// batch is empty afterwards.
    fn write(&self, py: Python<'_>) -> PyResult<()> {
        let changes = std::mem::take(&mut *locked(&self.changes));
        let table = self.table.get();
        py.allow_threads(|| table.database.with(|handle| handle.write(&changes, self.sync)))
    }
}

/// plyvel's iterator over a `Table`'s range.
#[pyclass(module = "nat_agent._fastpath", name = "LevelIterator", frozen)]
pub struct Range {
    database: Arc<Database>,
    cursor: Arc<Mutex<Cursor>>,
    prefix: Vec<u8>,
    /// The start key itself, when it is excluded.
    skip: Option<Vec<u8>>,
    stop: Option<Vec<u8>>,
    include_value: bool,
}

impl Range {
    /// The next key and value in range, full keys; None at the end.
    fn step(&self) -> PyResult<Option<(Vec<u8>, Vec<u8>)>> {
        let mut guard = locked(&self.cursor);
        let raw = match &*guard {
            Cursor::Live(raw) => raw.0,
            Cursor::Ended => return Ok(None),
            Cursor::Closed => return Err(closed(&self.database.path)),
        };
        loop {
            // SAFETY: a live iterator, under its lock; key and value are copied before it moves.
            let (key, value) = unsafe {
                if leveldb_iter_valid(raw) == 0 {
                    let mut error = ptr::null_mut();
                    leveldb_iter_get_error(raw, &mut error);
                    *guard = Cursor::Ended;
                    check(error).map_err(PyOSError::new_err)?;
                    return Ok(None);
                }
                let (mut key_length, mut value_length) = (0usize, 0usize);
                let key = std::slice::from_raw_parts(leveldb_iter_key(raw, &mut key_length).cast::<u8>(), key_length).to_vec();
                let value = if self.include_value {
                    std::slice::from_raw_parts(leveldb_iter_value(raw, &mut value_length).cast::<u8>(), value_length).to_vec()
                } else {
                    Vec::new()
                };
                leveldb_iter_next(raw);
                (key, value)
            };
            if !key.starts_with(&self.prefix) || self.stop.as_ref().is_some_and(|stop| key >= *stop) {
                *guard = Cursor::Ended;
                return Ok(None);
            }
            if self.skip.as_ref() == Some(&key) {
                continue;
            }
            return Ok(Some((key, value)));
        }
    }

    fn end(&self) {
        let mut cursor = locked(&self.cursor);
        if matches!(*cursor, Cursor::Live(_)) {
            *cursor = Cursor::Ended;
        }
    }
}

#[pymethods]
impl Range {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        let Some((key, value)) = self.step()? else { return Ok(None) };
        let key = PyBytes::new(py, &key[self.prefix.len()..]);
        Ok(Some(if self.include_value {
            (key, PyBytes::new(py, &value)).into_pyobject(py)?.into_any().unbind()
        } else {
            key.into_any().unbind()
        }))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, _kind: PyObject, _value: PyObject, _traceback: PyObject) {
        self.end();
    }

    /// Let go of the snapshot now rather than when collected.
    fn close(&self) {
        self.end();
    }
}
