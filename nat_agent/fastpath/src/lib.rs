//! The agent's request path out of CPython, one piece at a time (issue 13).
//!
//! This first piece is the RESP *command* parser the service runs on every
//! byte a client sends: `CommandParser` is a drop-in for the command side of
//! `client_lib.resp.RespParser` (feed, next_command, pending, busy), with the
//! same limits, the same refusal of an oversized argument (the rest of that
//! command is discarded as it arrives, never buffered), and the same
//! exceptions with the same messages. The Python parser stays the oracle:
//! `tests/unit/test_fastpath.py` feeds both the same random frames in the
//! same random chunks and requires identical results.

mod number;
mod parser;
mod pyrepr;

use pyo3::prelude::*;

#[pymodule]
fn _fastpath(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<parser::CommandParser>()?;
    Ok(())
}
