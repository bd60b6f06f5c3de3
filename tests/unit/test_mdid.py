"""The MetaDataID rule is a wire contract: these tests pin it bit for bit."""

from __future__ import annotations

import hashlib
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_lib import DEFAULT_SPACE, mdid, normalize_path
from client_lib.cidr import Block
from client_lib.errors import InvalidPath, MetaFlowError
from client_lib.mdid import NAME_MAX, PATH_MAX, entry_key, mdid_address, mdid_of_key, normalize_key

# (path, space, expected ID). Computed once when the rule was fixed; a change
# here means every stored key moves, so never edit these to make a test pass.
PINNED: list[tuple[str | bytes, str, int]] = [
    ("/", "100.64.0.0/10", 1682382224),
    ("/home/alice/notes.txt", "100.64.0.0/10", 1685889107),
    ("/data//proj/./raw/../clean/part-00000.parquet", "100.64.0.0/10", 1684796347),
    ("/home/josé/données/café.txt", "100.64.0.0/10", 1683180090),
    (b"/raw/\xff\xfe", "100.64.0.0/10", 1684953668),
    ("/raw/\udcff\udcfe", "100.64.0.0/10", 1684953668),
    ("/warehouse/sales.db/orders/dt=2023-07-14/part-00000.parquet", "0.0.0.0/0", 562879331),
    ("/home/josé/données/café.txt", "0.0.0.0/0", 1079200314),
    ("/tmp/x", "192.168.7.0/24", 3232237479),
    ("/a//b/./c/../d/", "192.168.7.0/24", 3232237507),
    (
        "/home/alice/notes.txt",
        "fd00:1234:5678:9abc::/64",
        336295052163582544989384389427392888705,
    ),
    (
        "/日本語/ファイル.txt",
        "fd00:1234:5678:9abc::/64",
        336295052163582544980285701012103529550,
    ),
    ("/home/alice/notes.txt", "::/0", 230601046357303893047113374438074040193),
    ("/a//b/./c/../d/", "::/0", 184408607409821216067739288062200182989),
]


def _reference(key: bytes, cidr: str) -> int:
    """The rule written out independently of client_lib, from an already normal key."""
    network = ipaddress.ip_network(cidr)
    digest_size = 8 if network.version == 4 else 16
    value = int.from_bytes(hashlib.blake2b(key, digest_size=digest_size).digest(), "big")
    return int(network.network_address) + value % network.num_addresses


@pytest.mark.parametrize(("path", "cidr", "expected"), PINNED)
def test_pinned_vectors(path: str | bytes, cidr: str, expected: int) -> None:
    assert mdid(path, Block.parse(cidr)) == expected


@pytest.mark.parametrize(
    ("key", "cidr"),
    [
        (b"/", "100.64.0.0/10"),
        (b"/home/alice/notes.txt", "100.64.0.0/10"),
        (b"/data/proj/clean/part-00000.parquet", "100.64.0.0/10"),
        ("/home/josé/données/café.txt".encode(), "0.0.0.0/0"),
        (b"/raw/\xff\xfe", "100.64.0.0/10"),
        (b"/a/b/d", "192.168.7.0/24"),
        ("/日本語/ファイル.txt".encode(), "fd00:1234:5678:9abc::/64"),
        (b"/a/b/d", "::/0"),
    ],
)
def test_matches_independent_computation(key: bytes, cidr: str) -> None:
    assert mdid(key, Block.parse(cidr)) == _reference(key, cidr)


def test_pinned_vectors_agree_with_reference() -> None:
    for path, cidr, expected in PINNED:
        assert _reference(normalize_path(path), cidr) == expected


def test_default_space_and_address() -> None:
    assert str(DEFAULT_SPACE) == "100.64.0.0/10"
    assert mdid("/home/alice/notes.txt") == 1685889107
    assert mdid_address("/home/alice/notes.txt") == "100.124.160.83"
    space = Block.parse("fd00:1234:5678:9abc::/64")
    assert mdid_address("/home/alice/notes.txt", space) == "fd00:1234:5678:9abc:f2c1:44cb:4a7f:3f81"


def test_equivalent_spellings_share_an_id() -> None:
    assert mdid("/a//b/./c/../d/") == mdid("/a/b/d") == mdid(b"/a/b/d")


def test_no_unicode_normalization() -> None:
    nfc, nfd = "/caf\u00e9", "/cafe\u0301"
    assert normalize_path(nfc) != normalize_path(nfd)
    assert mdid(nfc) != mdid(nfd)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", b"/"),
        ("/a//b/./c/../d/", b"/a/b/d"),
        ("/..", b"/"),
        ("/../../a", b"/a"),
        ("//", b"/"),
        ("//a", b"/a"),
        ("///a///b///", b"/a/b"),
        ("/a/b/..", b"/a"),
        ("/a/b/../..", b"/"),
        ("/a/./.", b"/a"),
        ("/a/.", b"/a"),
        ("/.a/..b/...", b"/.a/..b/..."),
        ("/a b/ c ", b"/a b/ c "),
        ("/home/josé", "/home/josé".encode()),
        (b"/x//y/", b"/x/y"),
        (b"/raw/\xff", b"/raw/\xff"),
        ("/raw/\udcff", b"/raw/\xff"),
    ],
)
def test_normalize(path: str | bytes, expected: bytes) -> None:
    assert normalize_path(path) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "empty"),
        (b"", "empty"),
        ("a/b", "absolute"),
        ("./a", "absolute"),
        (b"a", "absolute"),
        ("/a\0b", "NUL"),
        (b"/a\0", "NUL"),
        ("/" + "x" * PATH_MAX, "too long"),
    ],
)
def test_normalize_rejects(path: str | bytes, message: str) -> None:
    """One error family: a path that cannot be a key is `InvalidPath`, which is
    still the ``ValueError`` the agent catches."""
    with pytest.raises(InvalidPath, match=message):
        normalize_path(path)
    assert issubclass(InvalidPath, ValueError) and issubclass(InvalidPath, MetaFlowError)


def test_max_length_is_configurable_and_applies_to_normal_form() -> None:
    assert normalize_path("/" + "x" * (PATH_MAX - 1)) == b"/" + b"x" * (PATH_MAX - 1)
    assert normalize_path("/abc//", max_length=4) == b"/abc"
    with pytest.raises(ValueError, match="too long"):
        normalize_path("/abcd", max_length=4)
    with pytest.raises(ValueError, match="too long"):
        mdid("/" + "x" * PATH_MAX)


def test_normalize_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        normalize_path(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cidr", "first", "prefixlen", "width", "last"),
    [
        ("100.64.0.0/10", 0x64400000, 10, 32, 0x647FFFFF),
        ("0.0.0.0/0", 0, 0, 32, 2**32 - 1),
        ("192.168.7.0/24", 0xC0A80700, 24, 32, 0xC0A807FF),
        ("10.1.2.3/32", 0x0A010203, 32, 32, 0x0A010203),
        ("::/0", 0, 0, 128, 2**128 - 1),
        ("fd00::/64", 0xFD00 << 112, 64, 128, (0xFD00 << 112) + 2**64 - 1),
    ],
)
def test_space_parse(cidr: str, first: int, prefixlen: int, width: int, last: int) -> None:
    space = Block.parse(cidr)
    assert (space.first, space.plen, space.width) == (first, prefixlen, width)
    assert space.last == last
    assert space.size == 2 ** (width - prefixlen)
    assert str(space) == cidr
    assert space.contains(first) and space.contains(last)
    assert not space.contains(first - 1) and not space.contains(last + 1)
    assert Block.parse(str(space)) == space


@pytest.mark.parametrize("cidr", ["10.0.0.1/8", "100.64.0.0/33", "fd00::1/64", "not a cidr"])
def test_space_parse_rejects(cidr: str) -> None:
    with pytest.raises(ValueError):
        Block.parse(cidr)


def test_space_constructor_validates() -> None:
    with pytest.raises(ValueError):
        Block(first=1, plen=24, width=32)
    with pytest.raises(ValueError):
        Block(first=0, plen=8, width=64)
    with pytest.raises(ValueError):
        Block(first=2**32, plen=8, width=32)


def test_space_address() -> None:
    assert DEFAULT_SPACE.address(0x64400001) == "100.64.0.1"
    # Small IDs of an IPv6 space are still IPv6 addresses.
    assert Block.parse("::/0").address(1) == "::1"
    with pytest.raises(ValueError):
        DEFAULT_SPACE.address(0)


def test_space_is_frozen_and_hashable() -> None:
    with pytest.raises(AttributeError):
        DEFAULT_SPACE.plen = 8  # type: ignore[misc]
    assert {DEFAULT_SPACE: 1}[Block.parse("100.64.0.0/10")] == 1


_segment = st.sampled_from(["", ".", "..", "a", "bc", "é", "x y", "...", ".h", "日本"])
_paths = st.lists(_segment, max_size=12).map(lambda parts: "/" + "/".join(parts))


@given(_paths)
def test_normalize_properties(path: str) -> None:
    key = normalize_path(path)
    assert normalize_path(key) == key
    assert normalize_path(key.decode()) == key
    assert key.startswith(b"/")
    assert b"//" not in key
    assert key == b"/" or not key.endswith(b"/")
    components = key.split(b"/")[1:]
    assert b"." not in components and b".." not in components


@given(st.binary(max_size=64))
def test_normalize_properties_raw_bytes(tail: bytes) -> None:
    path = b"/" + tail.replace(b"\0", b"")
    key = normalize_path(path)
    assert normalize_path(key) == key
    components = key.split(b"/")[1:]
    assert key == b"/" or all(c not in (b"", b".", b"..") for c in components)


@st.composite
def _spaces(draw: st.DrawFn) -> Block:
    width = draw(st.sampled_from([32, 128]))
    prefixlen = draw(st.integers(0, width))
    host_bits = width - prefixlen
    first = draw(st.integers(0, 2**width - 1)) >> host_bits << host_bits
    return Block(first=first, plen=prefixlen, width=width)


@given(_spaces(), _paths)
def test_mdid_inside_space(space: Block, path: str) -> None:
    value = mdid(path, space)
    assert space.contains(value)
    assert Block.parse(str(space)) == space
    assert ipaddress.ip_address(space.address(value)) in ipaddress.ip_network(str(space))
    assert value == _reference(normalize_path(path), str(space))


# -- entry keys: a directory's entries live with it ---------------------------------------

names = st.binary(min_size=1, max_size=NAME_MAX).filter(
    lambda n: b"/" not in n and b"\0" not in n and n not in (b".", b".."))


@given(directory=st.text(min_size=1).map(lambda t: "/" + t.replace("\0", "")), name=names,
       space=st.sampled_from([DEFAULT_SPACE, Block.parse("0.0.0.0/0"), Block.parse("fd00::/8")]))
def test_an_entry_has_its_directorys_id_and_round_trips(directory: str, name: bytes, space: Block) -> None:
    try:
        key = entry_key(directory, name)
    except InvalidPath:   # the directory's normal form plus the name is over PATH_MAX
        return
    assert key == normalize_path(directory) + b"\0" + name
    assert mdid_of_key(key, space) == mdid(directory, space)
    assert normalize_key(key) == key                  # a server accepts it as it is
    assert normalize_key(directory + "//" + "\0" + name.decode("utf-8", "surrogateescape")) == key


def test_entry_keys_are_apart_from_paths_and_only_hash_the_directory() -> None:
    assert entry_key("/a/./b/", "c") == b"/a/b\0c"
    assert mdid_of_key(b"/a/b\0c") == mdid_of_key(b"/a/b\0d") == mdid("/a/b")
    assert mdid_of_key(b"/a/b/c") != mdid("/a/b")     # the path /a/b/c is elsewhere
    assert normalize_key("/x//y") == b"/x/y"          # no NUL: a path, normalized as before
    assert entry_key("/", "top") == b"/\0top"


@pytest.mark.parametrize("name, message", [
    (b"", "1 to 255 bytes"), (b"x" * (NAME_MAX + 1), "1 to 255 bytes"), (b"a/b", "not a file name"),
    (b"a\0b", "not a file name"), (b".", "not a file name"), (b"..", "not a file name"),
])
def test_entry_key_rejects_what_cannot_be_a_name(name: bytes, message: str) -> None:
    with pytest.raises(InvalidPath, match=message):
        entry_key("/d", name)
    with pytest.raises(InvalidPath):
        normalize_key(b"/d\0" + name)


def test_an_entry_key_is_bounded_like_a_path() -> None:
    directory = "/" + "d" * (PATH_MAX - 10)
    with pytest.raises(InvalidPath, match="too long"):
        entry_key(directory, "n" * 20)
    with pytest.raises(InvalidPath, match="relative|absolute"):
        entry_key("relative", "n")
