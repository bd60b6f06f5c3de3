//! The agent's request path out of CPython, one piece at a time (issue 13).
//!
//! * `FastLane` (`lane.rs`) answers the common commands (GET, SET, EXISTS,
//!   PING) end to end: parse, normalize, hash, ownership check, store call,
//!   reply; it leaves everything else to the Python service, which stays the
//!   oracle it is fuzzed against.
//! * `ServiceLoop` (`server.rs`) serves the port itself on N threads, the
//!   lane on each, handing what the lane declines to the service.
//! * `route` (`keys.rs`) is its key step on its own, for that comparison.
//! * `OpsCounts` (`ops.rs`) counts what the lane served per bucket of the ID
//!   space, for the admin API's `POST /ops`.
//!
//! The first piece was the RESP *command* parser the service runs on every
//! byte a client sends: `CommandParser` is a drop-in for the Python
//! `nat_agent.resp_commands.CommandParser` (feed, next_command, pending,
//! busy), with the same limits, the same refusal of an oversized argument
//! (the rest of that command is discarded as it arrives, never buffered),
//! and the same exceptions with the same messages. The Python parser stays the oracle:
//! `tests/unit/test_fastpath.py` feeds both the same random frames in the
//! same random chunks and requires identical results.

mod keys;
mod lane;
mod number;
mod ops;
mod parser;
mod pyrepr;
mod server;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A raw key's normalized form and MetaDataID in `space` (a
/// `client_lib.cidr.Block`), or None where the service answers an error.
#[pyfunction]
fn route<'py>(
    py: Python<'py>,
    raw: &[u8],
    space: &Bound<'py, PyAny>,
    max_length: usize,
) -> PyResult<Option<(Bound<'py, PyBytes>, u128)>> {
    let space = keys::Keyspace::of(space, max_length)?;
    Ok(space.route(raw).map(|(key, id)| (PyBytes::new(py, &key), id)))
}

#[pymodule]
fn _fastpath(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<parser::CommandParser>()?;
    m.add_class::<parser::ArgLimits>()?;
    m.add_class::<lane::FastLane>()?;
    m.add_class::<server::ServiceLoop>()?;
    m.add_function(wrap_pyfunction!(route, m)?)?;
    Ok(())
}
