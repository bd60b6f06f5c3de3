//! `Logs`: the write-ahead logs of a LevelDB directory, for the group
//! commit's sync (`durable.rs`): fdatasync each, and the directory when a
//! log is new since the last sync (`nat_agent.leveldb_store` says why every
//! log and not only the newest).
//!
//! Why kept open: listing the directory and opening each log for every sync
//! (an `openat`, two `getdents64`, a `close`, and an `openat` and `close` per
//! log) was about 2.4 % of the agent's CPU under `redis-benchmark` SETs
//! (`perf`, 2026-12-07), for a list that changes once per memtable (tens of
//! thousands of writes). An inotify watch on the directory says when a file
//! came or went; only then is it listed again. Sound because a log's
//! creation queues its event before LevelDB writes to it, so before any
//! write a sync covers: a sync that finds no event has every log open.
//! Without inotify (its limits reached) every sync lists, as before.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What makes the list stale: a file created, removed or renamed in (or
/// the watch itself lost: `IN_Q_OVERFLOW` and `IN_IGNORED` come unasked).
const CHANGES: u32 = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO;

pub struct Logs {
    directory: PathBuf,
    suffix: String,
    /// The directory's inotify watch; None: list at every sync.
    watch: Option<OwnedFd>,
    /// The logs as last listed, open; None until listed (or once stale).
    open: Option<HashMap<String, File>>,
}

impl Logs {
    pub fn new(directory: PathBuf, suffix: String) -> Self {
        let watch = watch(&directory).ok();
        Logs { directory, suffix, watch, open: None }
    }

    /// fdatasync every log, and the directory if a log is new.
    pub fn sync(&mut self) -> io::Result<()> {
        let result = self.sync_listed();
        if result.is_err() {
            self.open = None; // listed afresh (every log new) before the next sync
        }
        result
    }

    fn sync_listed(&mut self) -> io::Result<()> {
        let new = if self.changed() || self.open.is_none() { self.list()? } else { false };
        let open = self.open.as_ref().expect("listed above");
        let mut names: Vec<&String> = open.keys().collect();
        names.sort(); // oldest first, as LevelDB numbers them
        for name in names {
            open[name].sync_data()?;
        }
        if new {
            File::open(&self.directory)?.sync_all()?;
        }
        Ok(())
    }

    /// Whether the watch saw a file come or go since the last call (its
    /// queue emptied); always true without a watch.
    fn changed(&mut self) -> bool {
        let Some(watch) = &self.watch else { return true };
        let mut buf = [0u8; 4096];
        let mut changed = false;
        loop {
            // SAFETY: a valid fd and a buffer of the length given.
            let n = unsafe { libc::read(watch.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                changed = true; // only the asked-for events, or the queue overflowed: either way, list
                continue;
            }
            let error = io::Error::last_os_error();
            if n < 0 && error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n < 0 && error.kind() != io::ErrorKind::WouldBlock {
                self.watch = None; // broken: list at every sync from now on
                return true;
            }
            return changed;
        }
    }

    /// List the directory and open its logs (keeping those already open);
    /// whether one is new since the last listing.
    fn list(&mut self) -> io::Result<bool> {
        let first = self.open.is_none();
        let mut before = self.open.take().unwrap_or_default();
        let mut open = HashMap::new();
        let mut new = false;
        for entry in std::fs::read_dir(&self.directory)? {
            let name = entry?.file_name();
            let Ok(name) = name.into_string() else { continue };
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
            open.insert(name, file);
        }
        self.open = Some(open);
        Ok(new || first)
    }
}

/// A non-blocking inotify watch of `directory`'s entries.
fn watch(directory: &Path) -> io::Result<OwnedFd> {
    // SAFETY: plain system calls; the fd is owned from here on.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut path = directory.as_os_str().as_bytes().to_vec();
    path.push(0);
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr().cast(), CHANGES) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}
