"""The declared APIs without I/O: bodies, routes, signatures and the dispatcher."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_lib.api import codec
from client_lib.api.admin import (
    ADMIN,
    Assigned,
    AssignRequest,
    CountRequest,
    DisownRequest,
    Member,
    MigrateRequest,
    MigrationReport,
    Role,
)
from client_lib.api.auth import (
    AUTH_HEADER,
    SIGNATURE_HEADER,
    Signer,
    Verifier,
    load_secret,
    write_secret,
)
from client_lib.api.rest import REST, Registration, TreeView
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.errors import AuthError, Conflict, InvalidArgument, NotFound
from client_lib.server.api import Call, Dispatcher, ErrorBody, Response, status_of

SECRET = b"0123456789abcdef0123456789abcdef"
HOST = "10.255.0.3:9001"
BLOCK = Block.parse("100.64.0.0/12")
ROLE = Role(BLOCK, 3, True, [Member("s1", "10.255.0.2:9002"), Member("s2", "10.255.0.3:9002", synced=False)])


# -- bodies ----------------------------------------------------------------------

def test_round_trip_of_every_declared_body_type() -> None:
    bodies = [
        AssignRequest([ROLE, Role(Block.parse("100.80.0.0/12"), 7, False, ROLE.members, False)], "m1",
                      exclusive=True),
        DisownRequest([BLOCK], moved_to="s2"),
        MigrateRequest([BLOCK], ["http://10.0.0.1:9001", "http://10.0.0.2:9001"], lease_s=5.0),
        CountRequest([(1, 2), (3, 4)]),
        MigrationReport("m1", [BLOCK], ["http://t"], "copied", 10, None, 0.5, 3.0),
        Registration("s1", "10.0.0.1", "02:00:00:00:00:01", 9000, "http://10.255.0.2:9001",
                     "leveldb", 1000, Block.parse("100.64.0.0/10"), [BLOCK], "10.255.0.2:9002", [ROLE],
                     suspended=True),
        TreeView(True, [], "root", {"root": ["s1"]}, {}),
    ]
    for body in bodies:
        assert codec.loads(type(body), codec.dumps(body)) == body


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"blocks": "100.64.0.0/12"}', "blocks: expected a list"),
    (b'{"blocks": ["100.64.0.1/12"]}', "host bits"),
    (b'{"blocks": [12]}', r"blocks\[0\]: expected a CIDR string"),
    (b'{"blocks": [], "moved_to": 5}', "moved_to: expected a string"),
    (b'{"blocks": [], "extra": 1}', "unknown field"),
    (b'{"moved_to": "x"}', "missing field 'blocks'"),
    (b'[1, 2]', "expected an object"),
    (b'{"blocks": [', "not JSON"),
])
def test_malformed_bodies_name_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(codec.CodecError, match=message):
        codec.loads(DisownRequest, raw)


def test_bool_is_not_an_integer_and_tuples_have_their_length() -> None:
    with pytest.raises(codec.CodecError, match=r"ranges\[0\]\[1\]: expected an integer"):
        codec.loads(CountRequest, b'{"ranges": [[1, true]]}')
    with pytest.raises(codec.CodecError, match="list of 2 values"):
        codec.loads(CountRequest, b'{"ranges": [[1, 2, 3]]}')


def test_responses_are_read_leniently() -> None:
    raw = b'{"roles": [], "data_address": null, "new_field": 1}'
    assert codec.loads(Assigned, raw, strict=False) == Assigned([], None)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), max_size=20))
def test_count_ranges_round_trip(ranges: list[tuple[int, int]]) -> None:
    assert codec.loads(CountRequest, codec.dumps(CountRequest(ranges))).ranges == ranges


# -- routes ----------------------------------------------------------------------

def test_route_paths_are_filled_and_matched_with_encoding() -> None:
    route = ADMIN.commit
    assert route.path(id="a b?") == "/migrations/a%20b%3F/commit"
    assert route.match("POST", "/migrations/a%20b%3F/commit") == {"id": "a b?"}
    with pytest.raises(InvalidArgument):
        route.path(id="a/b")
    with pytest.raises(InvalidArgument):
        route.path(id="")
    assert route.match("GET", "/migrations/x/commit") is None
    assert route.match("POST", "/migrations/x/commit/more") is None
    with pytest.raises(TypeError):
        route.path()


def test_every_route_is_declared_once() -> None:
    for routes in (ADMIN.ALL, REST.ALL):
        keys = [(r.method, r.template) for r in routes]
        assert len(keys) == len(set(keys))
        assert all(isinstance(r, Route) for r in routes)
    assert ADMIN.assign in ADMIN.ALL and REST.register in REST.ALL


# -- signatures ------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_signed_request_is_accepted_once() -> None:
    clock = Clock()
    signer, verifier = Signer(SECRET, clock), Verifier(SECRET, clock=clock)
    headers, nonce = signer.sign(HOST, "POST", "/assign", "", b"{}")
    assert verifier.check("POST", "/assign", "", headers, b"{}") == nonce
    with pytest.raises(AuthError, match="replayed"):
        verifier.check("POST", "/assign", "", headers, b"{}")


@pytest.mark.parametrize("tamper", ["method", "path", "query", "body", "secret", "missing", "stale",
                                    "host", "another server"])
def test_tampered_or_unsigned_requests_are_refused(tamper: str) -> None:
    clock = Clock()
    signer = Signer(b"another secret, 16+ bytes" if tamper == "secret" else SECRET, clock)
    verifier = Verifier(SECRET, "10.255.0.4:9001" if tamper == "another server" else HOST, clock=clock)
    headers, _ = signer.sign(HOST, "POST", "/assign", "", b'{"blocks": []}')
    method, path, query, body = "POST", "/assign", "", b'{"blocks": []}'
    if tamper == "method":
        method = "PUT"
    elif tamper == "path":
        path = "/disown"
    elif tamper == "query":
        query = "x=1"
    elif tamper == "body":
        body = b'{"blocks": ["100.64.0.0/10"]}'
    elif tamper == "missing":
        headers = {}
    elif tamper == "stale":
        clock.now += 120
    elif tamper == "host":
        headers = {**headers, "Host": "10.255.0.4:9001"}
    with pytest.raises(AuthError) as caught:
        verifier.check(method, path, query, headers, body)
    assert caught.value.status == 401


def test_responses_are_signed_for_the_request_nonce() -> None:
    signer, verifier = Signer(SECRET), Verifier(SECRET)
    headers, nonce = signer.sign(HOST, "GET", "/health", "", b"")
    verifier.check("GET", "/health", "", headers, b"")
    reply = verifier.response_headers(nonce, 200, b"{}")
    signer.check_response(nonce, 200, b"{}", reply, "here")
    with pytest.raises(AuthError, match="not signed"):
        signer.check_response(nonce, 200, b'{"x": 1}', reply, "here")
    with pytest.raises(AuthError):
        signer.check_response("other-nonce", 200, b"{}", reply, "here")
    with pytest.raises(AuthError):
        signer.check_response(nonce, 200, b"{}", {}, "here")


def test_secret_files_must_be_private_and_long(tmp_path) -> None:
    good = write_secret(tmp_path / "secret")
    assert len(load_secret(good)) >= 16
    os.chmod(good, 0o644)
    with pytest.raises(InvalidArgument, match="chmod 600"):
        load_secret(good)
    short = write_secret(tmp_path / "short", "abc")
    with pytest.raises(InvalidArgument, match="at least 16"):
        load_secret(short)
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_secret(tmp_path / "missing")


# -- dispatcher ------------------------------------------------------------------

def _signed(method: str, path: str, body: bytes = b"") -> tuple[dict[str, str], str]:
    return Signer(SECRET).sign(HOST, method, path, "", body)


def _call(resolved: Call | Response) -> Call:
    """What `resolve` gave, where the test expects a call for a handler."""
    assert isinstance(resolved, Call), resolved
    return resolved


def _refusal(resolved: Call | Response) -> Response:
    """What `resolve` gave, where the test expects it to refuse."""
    assert isinstance(resolved, Response), resolved
    return resolved


def test_dispatcher_refuses_unsigned_changes_and_can_open_reads() -> None:
    closed = Dispatcher(ADMIN.ALL, Verifier(SECRET))
    opened = Dispatcher(ADMIN.ALL, Verifier(SECRET), open_reads=True)
    body = codec.dumps(AssignRequest([ROLE]))
    for dispatcher in (closed, opened):
        refused = _refusal(dispatcher.resolve("POST", "/assign", "", {}, body))
        assert not hasattr(refused, "route") and refused.status == 401
    assert _refusal(closed.resolve("GET", "/health", "", {}, b"")).status == 401
    call = _call(opened.resolve("GET", "/health", "", {}, b""))
    assert call.route is ADMIN.health and call.nonce is None
    headers, nonce = _signed("POST", "/assign", body)
    call = _call(closed.resolve("POST", "/assign", "", headers, body))
    assert call.route is ADMIN.assign and call.body == AssignRequest([ROLE]) and call.nonce == nonce


def test_dispatcher_answers_unknown_routes_wrong_methods_and_bad_bodies() -> None:
    dispatcher = Dispatcher(ADMIN.ALL, Verifier(SECRET))
    assert _refusal(dispatcher.resolve("GET", "/nothing", "", {}, b"")).status == 404
    assert _refusal(dispatcher.resolve("DELETE", "/assign", "", {}, b"")).status == 405
    headers, _ = _signed("POST", "/assign", b'{"roles": 1}')
    bad = _refusal(dispatcher.resolve("POST", "/assign", "", headers, b'{"roles": 1}'))
    assert bad.status == 400 and b"roles: expected a list" in bad.body


def test_dispatcher_signs_results_and_maps_exceptions() -> None:
    dispatcher = Dispatcher(ADMIN.ALL, Verifier(SECRET))
    headers, nonce = _signed("GET", "/migrations/m1", b"")
    call = _call(dispatcher.resolve("GET", "/migrations/m1", "", headers, b""))
    assert call.params == {"id": "m1"}
    report = MigrationReport("m1", [], ["http://t"], "copied", 0, None, 0.0)
    ok = dispatcher.reply(call, report)
    Signer(SECRET).check_response(nonce, 200, ok.body, ok.headers, "test")
    assert codec.loads(MigrationReport, ok.body) == report
    with pytest.raises(TypeError):
        dispatcher.reply(call, Assigned([], None))
    for exc, status in ((KeyError("no migration"), 404), (NotFound("x"), 404), (Conflict("x"), 409),
                        (ValueError("busy"), 409), (InvalidArgument("bad"), 400),
                        (RuntimeError("bug"), 500)):
        failed = dispatcher.fail(call, exc)
        assert failed.status == status == status_of(exc)
        assert dataclasses.asdict(codec.loads(ErrorBody, failed.body))["error"]
        Signer(SECRET).check_response(nonce, status, failed.body, failed.headers, "test")


def test_auth_header_names_are_case_insensitive() -> None:
    headers, nonce = _signed("GET", "/health")
    lowered = {k.lower(): v for k, v in headers.items()}
    assert AUTH_HEADER.lower() in lowered
    assert Verifier(SECRET).check("GET", "/health", "", lowered, b"") == nonce
    reply = {k.lower(): v for k, v in Verifier(SECRET).response_headers(nonce, 200, b"").items()}
    assert SIGNATURE_HEADER.lower() in reply
    Signer(SECRET).check_response(nonce, 200, b"", reply, "test")
