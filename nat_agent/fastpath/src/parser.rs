//! `CommandParser`: `nat_agent.resp_commands.CommandParser`, in Rust.
//!
//! The structure follows the Python parser step for step (`_line`,
//! `_command`, `_inline`, `_refuse`, `_discard`), so that the two can be
//! read side by side; only the representation differs (byte offsets into
//! one buffer, argument slices turned into Python bytes once a command is
//! whole).

use std::sync::LazyLock;

use memchr::memmem;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::number::{self, Number};
use crate::pyrepr::bytes_repr;

const CRLF: &[u8] = b"\r\n";
const INLINE_SPACE: &[u8] = b" \t\n\r\x0b\x0c"; // what bytes.split() splits on

/// Why a parse attempt stopped short of a command.
enum Stop {
    /// The buffer ends inside the command: wait for more bytes.
    Incomplete,
    /// `ProtocolError(message)`: the connection cannot be resynchronized.
    Protocol(String),
    /// `BulkTooLarge(size, limit)`, the size as Python prints it.
    BulkTooLarge(String, i64),
    /// `ArgumentTooLarge(name, index, size, limit)`: the command is refused.
    ArgumentTooLarge(Vec<u8>, usize, i64, i64),
    /// The argument-limit callable raised.
    Python(PyErr),
    /// A look-ahead (`take_leading`) met a command it must leave whole for
    /// `next_command` (an argument over its limit).
    Declined,
}

impl From<PyErr> for Stop {
    fn from(err: PyErr) -> Self {
        Stop::Python(err)
    }
}

impl Stop {
    /// The exception the Python parser raises for the same input:
    /// `ProtocolError` and `BulkTooLarge` are the wire contract's
    /// (`client_lib.resp`), `ArgumentTooLarge` the command side's
    /// (`nat_agent.resp_commands`).
    fn raise(self, py: Python<'_>) -> PyErr {
        let resp = match py.import("client_lib.resp") {
            Ok(module) => module,
            Err(err) => return err,
        };
        let made = match self {
            Stop::Incomplete | Stop::Declined => {
                return PyValueError::new_err("internal: not an error of the input")
            }
            Stop::Python(err) => return err,
            Stop::Protocol(message) => resp.getattr("ProtocolError").and_then(|cls| cls.call1((message,))),
            Stop::BulkTooLarge(size, limit) => py
                .import("builtins")
                .and_then(|b| b.getattr("int"))
                .and_then(|int| int.call1((size,)))
                .and_then(|size| resp.getattr("BulkTooLarge").and_then(|cls| cls.call1((size, limit)))),
            Stop::ArgumentTooLarge(name, index, size, limit) => py
                .import("nat_agent.resp_commands")
                .and_then(|commands| commands.getattr("ArgumentTooLarge"))
                .and_then(|cls| cls.call1((PyBytes::new(py, &name), index, size, limit))),
        };
        match made {
            Ok(exception) => PyErr::from_value(exception),
            Err(err) => err,
        }
    }
}

type Parsed<T> = Result<T, Stop>;

#[pyclass(module = "nat_agent._fastpath")]
pub struct CommandParser {
    max_bulk: i64,
    max_args: i64,
    max_line: usize,
    limit: Option<Limit>,
    buf: Vec<u8>,
    pos: usize,
    /// Bytes the buffer must hold before a new attempt can get further.
    wanted: usize,
    /// A refused command being discarded: bulk strings left (counting the
    /// current one), and payload bytes left of the current one (-1: its
    /// header has not been read yet).
    refused: i64,
    left: i64,
    /// Set while `take_leading` looks ahead: refuse nothing, decline instead.
    looking: bool,
}

/// Per-argument limits: a Python callable, as the Python `CommandParser`
/// takes, or the compiled `ArgLimits`, read without calling into Python.
enum Limit {
    Callable(PyObject),
    Native(ArgLimits),
}

/// The service's argument limits as data: `value` bytes for the arguments
/// of `values_from`'s commands from the index it gives on (values), `key`
/// bytes for every other argument (keys, names, words). Callable as a
/// `nat_agent.resp_commands.ArgLimit`, so the Python parser can take it too.
#[pyclass(module = "nat_agent._fastpath", frozen)]
#[derive(Clone)]
pub struct ArgLimits {
    key: i64,
    value: i64,
    values_from: Vec<(Vec<u8>, usize)>,
}

#[pymethods]
impl ArgLimits {
    #[new]
    fn new(key: i64, value: i64, values_from: Vec<(Vec<u8>, usize)>) -> Self {
        let values_from = values_from.into_iter().map(|(name, first)| (name.to_ascii_uppercase(), first)).collect();
        ArgLimits { key, value, values_from }
    }

    fn __call__(&self, name: &[u8], index: usize) -> i64 {
        self.of(name, index)
    }
}

impl ArgLimits {
    /// Command names compare as `bytes.upper()` would make them equal (ASCII only).
    fn of(&self, name: &[u8], index: usize) -> i64 {
        match self.values_from.iter().find(|(known, _)| known.eq_ignore_ascii_case(name)) {
            Some((_, first)) if index >= *first => self.value,
            _ => self.key,
        }
    }
}

#[pymethods]
impl CommandParser {
    /// The defaults are `client_lib.resp`'s `DEFAULT_MAX_*`, written out so
    /// that the signature shows them: `tests/unit/test_fastpath.py` holds
    /// the two signatures equal.
    #[new]
    #[pyo3(signature = (max_bulk = 1048576, max_args = 64, max_line = 65536, limit = None))]
    pub(crate) fn new(py: Python<'_>, max_bulk: i64, max_args: i64, max_line: usize, limit: Option<PyObject>) -> Self {
        let limit = limit.map(|limit| match limit.downcast_bound::<ArgLimits>(py) {
            Ok(native) => Limit::Native(native.get().clone()),
            Err(_) => Limit::Callable(limit),
        });
        CommandParser {
            max_bulk,
            max_args,
            max_line,
            limit,
            buf: Vec::new(),
            pos: 0,
            wanted: 0,
            refused: 0,
            left: -1,
            looking: false,
        }
    }

    pub(crate) fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet consumed by a complete message.
    #[getter]
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Whether a request has started and not ended.
    #[getter]
    pub(crate) fn busy(&self) -> bool {
        !self.buf.is_empty() || self.refused > 0
    }

    /// The next complete command as a list of bytes, or None; raises as
    /// the Python `CommandParser.next_command` does.
    pub(crate) fn next_command<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        loop {
            if self.refused != 0 {
                match self.discard() {
                    Ok(()) => {}
                    Err(Stop::Incomplete) => return Ok(None),
                    Err(stop) => return Err(stop.raise(py)),
                }
            }
            if self.buf.is_empty() || self.buf.len() < self.wanted {
                return Ok(None);
            }
            self.pos = 0;
            match self.command(py) {
                Ok(args) => {
                    let command = if args.is_empty() {
                        None
                    } else {
                        let items = args.iter().map(|arg| match arg {
                            Arg::Range(start, end) => PyBytes::new(py, &self.buf[*start..*end]),
                            Arg::Owned(bytes) => PyBytes::new(py, bytes),
                        });
                        Some(PyList::new(py, items)?)
                    };
                    self.buf.drain(..self.pos);
                    self.wanted = 0;
                    if command.is_some() {
                        return Ok(command);
                    }
                    // A blank line between commands: skipped, as Redis does.
                }
                Err(Stop::Incomplete) => return Ok(None),
                Err(stop) => return Err(stop.raise(py)),
            }
        }
    }
}

/// One argument of a parsed command: a range of the buffer (a bulk
/// string), or a copy (a word of an inline command).
enum Arg {
    Range(usize, usize),
    Owned(Vec<u8>),
}

impl CommandParser {
    /// For `FastLane`: offer the leading complete multibulk commands, in
    /// order, to `take` (the buffer and each argument's byte range), and
    /// drop the ones it took. It stops at the first command `take` declines
    /// (false), and at anything it is not offered: an inline command, a
    /// partial one, one with an argument over its limit, a protocol error.
    /// Those stay in the buffer, untouched, for `next_command` to meet.
    /// Returns how many commands were taken.
    pub(crate) fn take_leading<F>(&mut self, py: Python<'_>, mut take: F) -> usize
    where
        F: FnMut(&[u8], &[(usize, usize)]) -> bool,
    {
        if self.refused != 0 {
            return 0;
        }
        let mut base = 0;
        let mut taken = 0;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        self.looking = true;
        while self.buf.get(base) == Some(&b'*') && self.buf.len() >= self.wanted {
            self.pos = base;
            let Ok(args) = self.command(py) else { break };
            ranges.clear();
            ranges.extend(args.iter().filter_map(|arg| match arg {
                Arg::Range(start, end) => Some((*start, *end)),
                Arg::Owned(_) => None,
            }));
            if ranges.len() != args.len() || !take(&self.buf, &ranges) {
                break;
            }
            base = self.pos;
            taken += 1;
        }
        self.looking = false;
        if base > 0 {
            self.buf.drain(..base);
            self.wanted = 0; // it was counted from the old start
        }
        taken
    }

    fn line(&mut self) -> Parsed<(usize, usize)> {
        // Built once: `memmem::find` builds a finder per call (three per SET).
        static LINE_END: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(CRLF));
        let Some(found) = LINE_END.find(&self.buf[self.pos..]) else {
            if self.buf.len() - self.pos > self.max_line {
                return Err(Stop::Protocol(format!("line longer than {} bytes", self.max_line)));
            }
            self.wanted = self.buf.len() + 1;
            return Err(Stop::Incomplete);
        };
        if found > self.max_line {
            return Err(Stop::Protocol(format!("line longer than {} bytes", self.max_line)));
        }
        let start = self.pos;
        self.pos = start + found + 2;
        Ok((start, start + found))
    }

    fn length(header: &[u8], what: &str) -> Parsed<Number> {
        number::parse(header).ok_or_else(|| {
            Stop::Protocol(format!("invalid {what} length {}", bytes_repr(&header[..header.len().min(32)])))
        })
    }

    fn bulk_size(&self, header: &[u8]) -> Parsed<i64> {
        let size = Self::length(header, "bulk")?;
        if size.value < -1 {
            return Err(Stop::Protocol(format!("invalid bulk length {}", size.text)));
        }
        if size.value > i128::from(self.max_bulk) {
            return Err(Stop::BulkTooLarge(size.text, self.max_bulk));
        }
        Ok(size.value as i64)
    }

    fn bulk_body(&mut self, size: i64) -> Parsed<(usize, usize)> {
        let end = self.pos + size as usize;
        if self.buf.len() < end + 2 {
            self.wanted = end + 2;
            return Err(Stop::Incomplete);
        }
        if &self.buf[end..end + 2] != CRLF {
            return Err(Stop::Protocol("bulk string not terminated by CRLF".into()));
        }
        let start = self.pos;
        self.pos = end + 2;
        Ok((start, end))
    }

    fn count(&self, header: &[u8]) -> Parsed<i64> {
        let count = Self::length(header, "array")?;
        if count.value < -1 {
            return Err(Stop::Protocol(format!("invalid array length {}", count.text)));
        }
        if count.value > i128::from(self.max_args) {
            return Err(Stop::Protocol(format!(
                "array of {} elements exceeds the limit of {}",
                count.text, self.max_args
            )));
        }
        Ok(count.value as i64)
    }

    /// The most bytes argument `index` of command `name` may have.
    fn limit_of(&self, py: Python<'_>, name: &[u8], index: usize) -> Parsed<Option<i64>> {
        match &self.limit {
            None => Ok(None),
            Some(Limit::Native(limits)) => Ok(Some(limits.of(name, index))),
            Some(Limit::Callable(limit)) => Ok(Some(limit.call1(py, (PyBytes::new(py, name), index))?.extract(py)?)),
        }
    }

    /// One command, or an empty list for a blank line.
    fn command(&mut self, py: Python<'_>) -> Parsed<Vec<Arg>> {
        let (start, end) = self.line()?;
        if self.buf.get(start) != Some(&b'*') {
            let line = self.buf[start..end].to_vec();
            return self.inline(py, &line);
        }
        let count = self.count(&self.buf[start + 1..end])?;
        if count <= 0 {
            return Err(Stop::Protocol("empty command".into()));
        }
        let mut args: Vec<Arg> = Vec::with_capacity(count as usize);
        for index in 0..count as usize {
            let size = self.argument_size()?;
            if self.limit.is_some() {
                let name: &[u8] = match args.first() {
                    Some(Arg::Range(a, b)) => &self.buf[*a..*b],
                    _ => b"",
                };
                if let Some(most) = self.limit_of(py, name, index)? {
                    if size > most {
                        if self.looking {
                            return Err(Stop::Declined);
                        }
                        let name = name.to_vec(); // the buffer is dropped below
                        self.refuse(count - index as i64, size);
                        return Err(Stop::ArgumentTooLarge(name, index, size, most));
                    }
                }
            }
            let (a, b) = self.bulk_body(size)?;
            args.push(Arg::Range(a, b));
        }
        Ok(args)
    }

    /// The length a command argument's header announces (a bulk string, not null).
    fn argument_size(&mut self) -> Parsed<i64> {
        let (start, end) = self.line()?;
        let header = &self.buf[start..end];
        if header.first() != Some(&b'$') {
            return Err(Stop::Protocol(format!(
                "expected a bulk string, got {}",
                bytes_repr(&header[..header.len().min(1)])
            )));
        }
        let size = self.bulk_size(&header[1..])?;
        if size == -1 {
            return Err(Stop::Protocol("null bulk string in a command".into()));
        }
        Ok(size)
    }

    /// Inline commands (`PING\r\n`), as typed into telnet or nc.
    fn inline(&mut self, py: Python<'_>, line: &[u8]) -> Parsed<Vec<Arg>> {
        let words: Vec<&[u8]> =
            line.split(|b| INLINE_SPACE.contains(b)).filter(|word| !word.is_empty()).collect();
        if words.len() as i64 > self.max_args {
            return Err(Stop::Protocol(format!(
                "inline command of {} words exceeds the limit of {}",
                words.len(),
                self.max_args
            )));
        }
        if self.limit.is_some() {
            for (index, word) in words.iter().enumerate() {
                let name: &[u8] = if index > 0 { words[0] } else { b"" };
                if let Some(most) = self.limit_of(py, name, index)? {
                    if word.len() as i64 > most {
                        self.refuse(0, 0);
                        return Err(Stop::ArgumentTooLarge(name.to_vec(), index, word.len() as i64, most));
                    }
                }
            }
        }
        Ok(words.into_iter().map(|word| Arg::Owned(word.to_vec())).collect())
    }

    /// Forget the refused command's bytes so far; discard `bulks` more bulk
    /// strings, the first of which has `size` payload bytes and no header left.
    fn refuse(&mut self, bulks: i64, size: i64) {
        self.buf.drain(..self.pos);
        self.pos = 0;
        self.wanted = 0;
        self.refused = bulks;
        self.left = size;
    }

    /// Drop a refused command's remaining bytes as they arrive. Headers are
    /// still checked, so the connection stays in step with the client.
    fn discard(&mut self) -> Parsed<()> {
        while self.refused != 0 {
            if self.left < 0 {
                self.pos = 0;
                let size = self.argument_size()?;
                self.buf.drain(..self.pos);
                self.pos = 0;
                self.wanted = 0;
                self.left = size;
            }
            let dropped = (self.left as usize).min(self.buf.len());
            self.buf.drain(..dropped);
            self.left -= dropped as i64;
            if self.left != 0 || self.buf.len() < 2 {
                return Err(Stop::Incomplete);
            }
            if &self.buf[..2] != CRLF {
                return Err(Stop::Protocol("bulk string not terminated by CRLF".into()));
            }
            self.buf.drain(..2);
            self.refused -= 1;
            self.left = -1;
        }
        Ok(())
    }
}
