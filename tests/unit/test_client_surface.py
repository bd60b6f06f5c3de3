"""The client's surface without a network: what `client_lib` exports, one
error family for bad input (refused before anything is sent), the standalone
route's parsing, MOVED hints, and the retry budget's bookkeeping."""

from __future__ import annotations

import math

import pytest

import client_lib
from client_lib import (
    AsyncMetaFlowClient,
    FileMetadata,
    InvalidArgument,
    InvalidPath,
    MetaFlowClient,
    MetaFlowError,
    RetryPolicy,
    Unavailable,
)
from client_lib.client import _Call, _moved_hint, _Retry, host_port
from client_lib.resp import ErrorReply, moved_message


def test_the_package_exports_what_a_file_system_needs():
    from client_lib import (  # noqa: F401 - the import is the test
        DEFAULT_SPACE,
        BadReply,
        Block,
        MetadataFormatError,
        ServerError,
        mdid,
        normalize_path,
    )
    assert client_lib.__version__ and isinstance(client_lib.__version__, str)
    for name in client_lib.__all__:
        assert hasattr(client_lib, name), name
    for error in (client_lib.InvalidPath, client_lib.MetadataFormatError, client_lib.ServerError,
                  client_lib.BadReply, client_lib.Unavailable, client_lib.ApiError):
        assert issubclass(error, MetaFlowError)


class Unreachable:
    """A route that fails the test if the client ever tries to send."""

    def __call__(self, address: str) -> tuple[str, int]:
        raise AssertionError(f"sent a request to {address} for bad input")


@pytest.mark.parametrize("kwargs, message", [
    ({"space": "nonsense"}, "not a CIDR block"),
    ({"space": "100.64.0.1/10"}, "not a CIDR block"),
    ({"port": 0}, "port"),
    ({"port": "9000"}, "port"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": math.inf}, "timeout"),
    ({"deadline": -1}, "deadline"),
    ({"deadline": "5"}, "deadline"),
    ({"max_idle": -1}, "max_idle"),
    ({"retry": 3}, "RetryPolicy"),
    ({"via": "127.0.0.1:http"}, "HOST"),
    ({"via": "127.0.0.1:70000"}, "HOST"),
    ({"via": "[::1]x"}, "IPV6"),
    ({"via": ("127.0.0.1", 9000)}, "via is text"),
    ({"via": "127.0.0.1:9000", "route": Unreachable()}, "not both"),
])
@pytest.mark.parametrize("cls", [MetaFlowClient, AsyncMetaFlowClient])
def test_bad_settings_are_invalid_arguments(cls, kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        cls(**kwargs)


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"attempts": 1.5}, {"attempts": True}, {"base": -1},
                                    {"base": 1, "cap": 0.5}, {"base": "0.1"}, {"cap": math.inf}])
def test_bad_retry_policies_are_invalid_arguments(kwargs):
    with pytest.raises(InvalidArgument):
        RetryPolicy(**kwargs)


def test_bad_paths_and_values_are_refused_before_anything_is_sent():
    with MetaFlowClient(route=Unreachable()) as client:
        # (a NUL makes an entry key, `/dir NUL name`: these are bad ones)
        for path in ("relative", "", "/a\0", "/a\0b/c", "/a\0..", "rel\0b", "/" + "x" * 5000):
            with pytest.raises(InvalidPath):
                client.get(path)
        with pytest.raises(InvalidPath, match="str or bytes"):
            client.exists(42)
        with pytest.raises(InvalidArgument, match="bytes or a FileMetadata"):
            client.put("/a", "text")
        with pytest.raises(InvalidPath):
            client.address("a/b")
    assert client.stats.requests == 0 and client.stats.connects == 0


def test_address_and_mdid_follow_the_clients_space():
    client = MetaFlowClient("10.0.0.0/8")
    assert client.address("/a//b/") == client.address("/a/b") == client_lib.mdid_address("/a/b", client.space)
    assert client.mdid("/a/b") == client_lib.mdid("/a/b", client_lib.Block.parse("10.0.0.0/8"))


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1", ("127.0.0.1", 9000)),
    ("127.0.0.1:7000", ("127.0.0.1", 7000)),
    ("agent-3", ("agent-3", 9000)),
    ("[::1]:7000", ("::1", 7000)),
    ("[::1]", ("::1", 9000)),
    ("fd00::1", ("fd00::1", 9000)),
])
def test_via_host_and_port(text, expected):
    assert host_port(text, 9000) == expected
    assert MetaFlowClient(via=text).route is not None
    assert MetaFlowClient(via=text).route("100.64.0.1") == expected


def test_moved_hints_name_the_new_owner_and_the_old_form_names_no_one():
    def hint(message: str, space: str = "100.64.0.0/10") -> tuple[str, int] | None:
        return _moved_hint(ErrorReply(message), client_lib.Block.parse(space))
    assert hint(moved_message(0x64400001, "10.0.0.7", 9000)) == ("10.0.0.7", 9000)
    assert hint(moved_message(5, "fd00::7", 9000)) == ("fd00::7", 9000)
    assert hint(moved_message(5, "server-7", 9000)) == ("server-7", 9000)
    assert hint("MOVED 100.64.0.1") is None
    assert hint("MOVED 100.64.0.1 127.0.0.1:9000") is None  # not an ID: the older form
    # An ID's own address is the agent saying "ask the switches": the route decides.
    assert hint(moved_message(0x64400001, "100.64.0.1", 9000)) is None
    assert hint(moved_message(1, "::1", 9000), "::/0") is None
    assert hint(moved_message(1, "100.64.0.1", 9000), "fd00::/8") == ("100.64.0.1", 9000)


def test_a_hint_is_followed_once_per_call_at_once():
    client = MetaFlowClient(retry=RetryPolicy(attempts=5, base=0.001, cap=0.002), deadline=10)
    call = _Call(client, "/a")
    first = call.next()
    assert first is not None and first.hint is None and first.pause == 0
    call.failed(_Retry("MOVED 1 10.0.0.7:9000", ("10.0.0.7", 9000)))
    hinted = call.next()
    assert hinted is not None and hinted.hint == ("10.0.0.7", 9000) and hinted.pause == 0
    call.failed(_Retry("MOVED 1 10.0.0.8:9000", ("10.0.0.8", 9000)))  # the hint was stale
    back = call.next()
    assert back is not None and back.hint is None and back.pause > 0  # the switches decide again
    call.failed(_Retry("MOVED 1 10.0.0.9:9000", ("10.0.0.9", 9000)))
    assert all(a is not None and a.hint is None for a in (call.next(), call.next()))
    assert call.next() is None
    error = call.gave_up()
    assert isinstance(error, Unavailable) and error.attempts == 5 and error.reason.startswith("MOVED")
    assert client.stats.hints == 1 and client.stats.retries == 4


def test_hints_are_not_followed_when_turned_off():
    client = MetaFlowClient(follow_moved=False)
    call = _Call(client, "/a")
    call.next()
    call.failed(_Retry("MOVED 1 10.0.0.7:9000", ("10.0.0.7", 9000)))
    attempt = call.next()
    assert attempt is not None and attempt.hint is None


def test_every_attempt_ends_by_the_deadline():
    client = MetaFlowClient(timeout=2.0, deadline=0.3, retry=RetryPolicy(attempts=3, base=1.0, cap=1.0))
    call = _Call(client, "/a")
    first = call.next()
    assert first is not None and 0.29 <= first.seconds <= 0.3  # the deadline, not the 2 s timeout
    call.failed(_Retry("timeout"))
    second = call.next()  # a 0.5-1 s pause would overrun: it is shortened to leave an attempt time
    assert second is not None and second.pause < 0.3 and second.until <= first.until + 1e-9


def test_file_metadata_errors_are_in_the_family():
    with pytest.raises(MetaFlowError):
        FileMetadata("/a", size="big")
    with pytest.raises(MetaFlowError):
        FileMetadata.from_bytes(b'{"v":1,"p":"/a","s":"big"}')
