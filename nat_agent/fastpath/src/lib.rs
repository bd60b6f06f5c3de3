//! The agent's request path out of CPython, one piece at a time (issue 13).
//!
//! * `FastLane` (`lane.rs`) answers the common commands (GET, SET, EXISTS,
//!   PING) end to end: parse, normalize, hash, ownership check, store call,
//!   reply; it leaves everything else to the Python service, which stays the
//!   oracle it is fuzzed against.
//! * `ServiceLoop` (`server.rs`) serves the port itself on N threads, the
//!   lane on each, handing what the lane declines to the service.
//! * `Keyspace` (`keys.rs`) is its key step (normalize, hash), built from
//!   the Python declarations of the space and the limits; its `route` is
//!   that step on its own, for the comparison with the Python path.
//! * `LaneView` (`lane.rs`) is what the lane knows of the agent's state:
//!   where it may answer (from `Ownership.fast_ranges`, pushed by Python)
//!   and which keys have a replicated write under way (the replicator's
//!   own dict); `Acknowledgement` is what a worker's turn of replicated
//!   writes waits on.
//! * `OpsCounts` (`ops.rs`) counts what the lane served per bucket of the ID
//!   space, for the admin API's `POST /ops`.
//! * `SyncGroup` (`durable.rs`) is the group commit's ledger under
//!   `--fsync batch`, shared by the workers (which send a turn's replies
//!   after the one sync that covers its writes) and the Python path.
//! * `MdidIndex` (`index.rs`) is the LevelDB store's range index (the mdid
//!   of every record, to count ID ranges), which the lane updates directly.
//! * `LevelDB` (`level.rs`) is the store's LevelDB, opened here so that the
//!   lane reads and writes records without Python; the store reaches it
//!   through plyvel's method names (plyvel is the fallback).
//! * `Histogram` (`seconds.rs`) keeps the seconds each command took on the
//!   lane, lock-free, for the agent's Prometheus metrics.
//!
//! The first piece was the RESP *command* parser the service runs on every
//! byte a client sends: `CommandParser` is a drop-in for the Python
//! `nat_agent.resp_commands.CommandParser` (feed, next_command, pending,
//! busy), with the same limits, the same refusal of an oversized argument
//! (the rest of that command is discarded as it arrives, never buffered),
//! and the same exceptions with the same messages. The Python parser stays the oracle:
//! `tests/unit/test_fastpath.py` feeds both the same random frames in the
//! same random chunks and requires identical results.

mod durable;
mod index;
mod keys;
mod lane;
mod level;
mod logs;
mod number;
mod ops;
mod parser;
mod pyrepr;
mod seconds;
mod server;

use pyo3::prelude::*;

#[pymodule]
fn _fastpath(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<parser::CommandParser>()?;
    m.add_class::<parser::ArgLimits>()?;
    m.add_class::<keys::Keyspace>()?;
    m.add_class::<lane::LaneView>()?;
    m.add_class::<lane::FastLane>()?;
    m.add_class::<lane::Acknowledgement>()?;
    m.add_class::<seconds::Histogram>()?;
    m.add_class::<server::ServiceLoop>()?;
    m.add_class::<durable::SyncGroup>()?;
    m.add_class::<index::MdidIndex>()?;
    m.add_class::<level::LevelDB>()?;
    m.add_class::<level::Table>()?;
    m.add_class::<level::WriteBatch>()?;
    m.add_class::<level::Range>()?;
    Ok(())
}
