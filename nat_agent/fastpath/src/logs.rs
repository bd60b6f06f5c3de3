//! `Logs`: the write-ahead logs of a LevelDB directory, for the group
//! commit's sync (`durable.rs`): fdatasync each, and the directory when a
//! log is new since the last sync (`nat_agent.leveldb_store` says why every
//! log and not only the newest).
//!
//! Why kept open: opening the directory, listing it and opening each log for
//! every sync (an `openat`, two `getdents64`, a `close`, and an `openat` and
//! `close` per log) was about 2.4 % of the agent's CPU under
//! `redis-benchmark` SETs (`perf`, 2026-12-07), for a list that changes once
//! per memtable (tens of thousands of writes), and most of it was the path
//! lookups of the two `openat`s. So the directory stream and the logs stay
//! open: a sync rewinds the stream (`rewinddir`, which POSIX makes see the
//! directory as it is now, as a new `opendir` would), reads it, and opens
//! only a log it has not seen. Listing at every sync keeps the promise
//! without any watch: an inotify watch, tried first, saved the listing too,
//! but took one of the user's 128 inotify instances per agent, and a
//! Mininet fabric of 200 agents run as root would take them all from every
//! other process of that user.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An open directory stream, closed when dropped.
struct Directory(*mut libc::DIR);

// SAFETY: the stream is used by one thread at a time (`Logs` is behind the sync group's mutex).
unsafe impl Send for Directory {}

impl Drop for Directory {
    fn drop(&mut self) {
        // SAFETY: a stream `opendir` returned, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

impl Directory {
    fn open(path: &Path) -> io::Result<Self> {
        let name = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a NUL-terminated path.
        let stream = unsafe { libc::opendir(name.as_ptr()) };
        if stream.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Directory(stream))
    }

    /// The names in the directory now (from the start: the stream is rewound).
    fn names(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        // SAFETY: a stream `opendir` returned; each entry is read before the next call.
        unsafe {
            libc::rewinddir(self.0);
            loop {
                *libc::__errno_location() = 0;
                let entry = libc::readdir(self.0);
                if entry.is_null() {
                    let errno = *libc::__errno_location();
                    return if errno == 0 { Ok(names) } else { Err(io::Error::from_raw_os_error(errno)) };
                }
                if let Ok(name) = CStr::from_ptr((*entry).d_name.as_ptr()).to_str() {
                    names.push(name.to_owned());
                }
            }
        }
    }

    /// fsync the directory (its entries), through the stream's own descriptor.
    fn sync(&self) -> io::Result<()> {
        // SAFETY: the stream's descriptor, valid while the stream is open.
        if unsafe { libc::fsync(libc::dirfd(self.0)) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

pub struct Logs {
    directory: PathBuf,
    suffix: String,
    /// The directory's stream; None until the first sync (or after a failure).
    stream: Option<Directory>,
    /// The logs as last listed, open.
    open: HashMap<String, File>,
}

impl Logs {
    pub fn new(directory: PathBuf, suffix: String) -> Self {
        Logs { directory, suffix, stream: None, open: HashMap::new() }
    }

    /// fdatasync every log, and the directory if a log is new.
    pub fn sync(&mut self) -> io::Result<()> {
        let result = self.sync_listed();
        if result.is_err() {
            // Opened afresh (every log new, so the directory synced too) at the next sync.
            self.stream = None;
            self.open.clear();
        }
        result
    }

    fn sync_listed(&mut self) -> io::Result<()> {
        let first = self.stream.is_none();
        if first {
            self.stream = Some(Directory::open(&self.directory)?);
        }
        let stream = self.stream.as_mut().expect("opened above");
        let mut before = std::mem::take(&mut self.open);
        let mut new = first;
        for name in stream.names()? {
            if !name.ends_with(&self.suffix) {
                continue;
            }
            let file = match before.remove(&name) {
                Some(file) => file,
                None => match File::open(self.directory.join(&name)) {
                    Ok(file) => {
                        new = true;
                        file
                    }
                    Err(err) if err.kind() == io::ErrorKind::NotFound => continue, // compacted meanwhile
                    Err(err) => return Err(err),
                },
            };
            self.open.insert(name, file);
        }
        let mut names: Vec<&String> = self.open.keys().collect();
        names.sort(); // oldest first, as LevelDB numbers them
        for name in names {
            self.open[name].sync_data()?;
        }
        if new {
            stream.sync()?;
        }
        Ok(())
    }
}
