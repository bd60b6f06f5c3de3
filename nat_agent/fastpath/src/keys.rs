//! Keys as the service accepts them, and the MetaDataID each routes to:
//! `client_lib.mdid.normalize_key` followed by the service's strict UTF-8
//! check, and `client_lib.mdid.mdid_of_key`. A key that the Python side
//! would refuse is `None` here: the compiled path then leaves the command to
//! the Python path, which words the error.
//! `tests/integration/test_fast_lane.py` holds the two to the same answers.
//!
//! Every number the rules need (the limits, the digest size, an ID's bytes
//! in a record key) comes from its Python declaration through `Keyspace`'s
//! constructor (`nat_agent.service.keyspace`): none is restated here.

use std::borrow::Cow;
use std::sync::LazyLock;

use blake2::digest::{Update, VariableOutput};
use blake2::Blake2bVar;
use memchr::{memchr, memmem};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A key's limits: `client_lib.mdid.PATH_MAX` (or the service's own) and `NAME_MAX`.
#[derive(Clone, Copy)]
struct Limits {
    max_length: usize,
    name_max: usize,
}

/// `normalize_path` for bytes: the canonical key of an absolute path.
fn normalize_path(raw: &[u8], max_length: usize) -> Option<Cow<'_, [u8]>> {
    if raw.first() != Some(&b'/') || memchr(0, raw).is_some() {
        return None;
    }
    // Finders built once: `memmem::find` builds one per call, which was
    // most of the cost of a short key's normalization.
    static MARKS: LazyLock<[memmem::Finder<'static>; 3]> =
        LazyLock::new(|| [b"//".as_slice(), b"/./", b"/../"].map(memmem::Finder::new));
    let canonical = MARKS.iter().all(|mark| mark.find(raw).is_none())
        && !(raw.ends_with(b"/") || raw.ends_with(b"/.") || raw.ends_with(b"/.."));
    let key: Cow<'_, [u8]> = if canonical {
        Cow::Borrowed(raw)
    } else {
        let mut parts: Vec<&[u8]> = Vec::new();
        for component in raw.split(|&b| b == b'/') {
            if component == b".." {
                parts.pop();
            } else if !component.is_empty() && component != b"." {
                parts.push(component);
            }
        }
        let mut joined = Vec::with_capacity(raw.len());
        joined.push(b'/');
        joined.extend_from_slice(&parts.join(&b'/'));
        Cow::Owned(joined)
    };
    (key.len() <= max_length).then_some(key)
}

/// `entry_key`: ``directory NUL name``, with the directory normalized.
fn entry_key(directory: &[u8], name: &[u8], limits: Limits) -> Option<Vec<u8>> {
    let max_length = limits.max_length;
    if name.is_empty() || name.len() > limits.name_max || name == b"." || name == b".." {
        return None;
    }
    if memchr(b'/', name).is_some() || memchr(0, name).is_some() {
        return None;
    }
    let directory = normalize_path(directory, max_length)?;
    let mut key = Vec::with_capacity(directory.len() + 1 + name.len());
    key.extend_from_slice(&directory);
    key.push(0);
    key.extend_from_slice(name);
    (key.len() <= max_length).then_some(key)
}

/// `normalize_key`, and the service's refusal of a key that is not UTF-8.
fn normalize_key(raw: &[u8], limits: Limits) -> Option<Cow<'_, [u8]>> {
    let key = match memchr(0, raw) {
        Some(nul) => Cow::Owned(entry_key(&raw[..nul], &raw[nul + 1..], limits)?),
        None => normalize_path(raw, limits.max_length)?,
    };
    std::str::from_utf8(&key).is_ok().then_some(key)
}

/// The MetaDataID space (a CIDR block), how IDs are hashed into it and
/// stored, and a key's limits: all as the Python declarations give them.
#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct Keyspace {
    first: u128,
    mask: u128,
    digest: usize,
    /// Bytes of an ID in a record key (`nat_agent.store.encode_mdid`).
    id_bytes: usize,
    limits: Limits,
}

#[pymethods]
impl Keyspace {
    /// `space`: a `client_lib.cidr.Block` (which checked its width and
    /// prefix); `digest_size`: BLAKE2b's, in bytes (`client_lib.mdid.digest_size`);
    /// `id_bytes`: an ID's in a record key (`nat_agent.store.check_width`);
    /// `max_length`, `name_max`: a key's and a file name's limits.
    #[new]
    #[pyo3(signature = (*, space, digest_size, id_bytes, max_length, name_max))]
    fn new(space: &Bound<'_, PyAny>, digest_size: usize, id_bytes: usize, max_length: usize,
           name_max: usize) -> PyResult<Self> {
        let first: u128 = space.getattr("first")?.extract()?;
        let width: u32 = space.getattr("width")?.extract()?;
        let host_bits = width - space.getattr("plen")?.extract::<u32>()?;
        if !(1..=16).contains(&digest_size) || !(1..=16).contains(&id_bytes) {
            return Err(PyValueError::new_err(format!(
                "an ID is at most 16 bytes: digest_size {digest_size}, id_bytes {id_bytes}")));
        }
        let mask = if host_bits >= 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
        Ok(Keyspace { first, mask, digest: digest_size, id_bytes, limits: Limits { max_length, name_max } })
    }

    /// A raw key's normalized form and MetaDataID, or None where the service
    /// answers an error (what the lane does with every key it is given).
    #[pyo3(name = "route")]
    fn route_py<'py>(&self, py: Python<'py>, raw: &[u8]) -> Option<(Bound<'py, PyBytes>, u128)> {
        self.route(raw).map(|(key, id)| (PyBytes::new(py, &key), id))
    }
}

impl Keyspace {
    /// `mdid_of_key` of a normalized key: BLAKE2b of the key up to its first
    /// NUL, as a big-endian number, modulo the space's size (a power of two).
    pub fn mdid(&self, key: &[u8]) -> u128 {
        let route = match memchr(0, key) {
            Some(nul) => &key[..nul],
            None => key,
        };
        let mut hasher = Blake2bVar::new(self.digest).expect("checked: 1 to 16 bytes");
        hasher.update(route);
        let mut out = [0u8; 16];
        hasher.finalize_variable(&mut out[..self.digest]).expect("the buffer has the digest's size");
        let number = out[..self.digest].iter().fold(0u128, |n, &b| (n << 8) | u128::from(b));
        self.first + (number & self.mask)
    }

    /// The normalized key and its ID, or None where the service answers an error.
    pub fn route<'a>(&self, raw: &'a [u8]) -> Option<(Cow<'a, [u8]>, u128)> {
        let key = normalize_key(raw, self.limits)?;
        let id = self.mdid(&key);
        Some((key, id))
    }

    /// `nat_agent.store.record_key`: the ID big-endian in fixed width, then the path.
    pub fn record_key(&self, id: u128, key: &[u8]) -> Vec<u8> {
        let mut record = Vec::with_capacity(self.id_bytes + key.len());
        record.extend_from_slice(&id.to_be_bytes()[16 - self.id_bytes..]);
        record.extend_from_slice(key);
        record
    }
}
