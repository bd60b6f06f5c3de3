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
    TERM_HEADER,
    Signer,
    Verifier,
    _body_hash,
    _digest,
    load_secret,
    write_secret,
)
from client_lib.api.clients import ApiClient, _error
from client_lib.api.rest import REST, Registration, TreeView
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.errors import AuthError, Conflict, InvalidArgument, NotFound, NotLeader
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


def test_a_request_without_a_term_signs_as_before_and_one_with_a_term_covers_it() -> None:
    clock = Clock()
    signer, verifier = Signer(SECRET, clock), Verifier(SECRET, clock=clock)
    plain, nonce = signer.sign(HOST, "POST", "/assign", "", b"{}")
    assert TERM_HEADER not in plain
    sig = plain[AUTH_HEADER].rpartition("sig=")[2]   # the formula of every release before terms
    assert sig == _digest(SECRET, "request", HOST, "POST", "/assign", "", str(int(clock.now)), nonce,
                          _body_hash(b"{}"))
    assert verifier.verify("POST", "/assign", "", plain, b"{}") == (nonce, None)
    termed, nonce = signer.sign(HOST, "POST", "/assign", "", b"{}", term=7)
    assert termed[TERM_HEADER] == "7" and termed[AUTH_HEADER].rpartition("sig=")[2] != sig
    assert verifier.verify("POST", "/assign", "", termed, b"{}") == (nonce, 7)
    with pytest.raises(InvalidArgument):
        signer.sign(HOST, "POST", "/assign", "", b"{}", term=-1)


@pytest.mark.parametrize("tamper", ["lowered", "raised", "stripped", "added", "garbage"])
def test_the_term_cannot_be_changed_stripped_or_added(tamper: str) -> None:
    signer, verifier = Signer(SECRET), Verifier(SECRET)
    headers, _ = signer.sign(HOST, "POST", "/assign", "", b"{}", term=None if tamper == "added" else 5)
    if tamper == "stripped":
        del headers[TERM_HEADER]
    else:
        headers[TERM_HEADER] = {"lowered": "4", "raised": "6", "added": "5", "garbage": "5x"}[tamper]
    with pytest.raises(AuthError) as caught:
        verifier.verify("POST", "/assign", "", headers, b"{}")
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


def test_dispatcher_hands_the_verified_term_to_the_handler() -> None:
    dispatcher = Dispatcher(ADMIN.ALL, Verifier(SECRET))
    headers, _ = Signer(SECRET).sign(HOST, "GET", "/health", "", b"", term=9)
    assert _call(dispatcher.resolve("GET", "/health", "", headers, b"")).term == 9
    assert _call(dispatcher.resolve("GET", "/health", "", _signed("GET", "/health")[0], b"")).term is None
    termed, _ = Signer(SECRET).sign(HOST, "GET", "/health", "", b"", term=3)
    lowered = {k.lower(): v for k, v in termed.items()}
    assert _call(dispatcher.resolve("GET", "/health", "", lowered, b"")).term == 3
    unsigned = Dispatcher(ADMIN.ALL, None)
    assert _call(unsigned.resolve("GET", "/health", "", {TERM_HEADER: "4"}, b"")).term == 4


def test_not_leader_is_503_and_names_the_leader_both_ways() -> None:
    dispatcher = Dispatcher(REST.ALL, Verifier(SECRET))
    headers, nonce = _signed("POST", "/register", b"{}")
    call = Call(REST.register, {}, None, nonce)
    failed = dispatcher.fail(call, NotLeader("this controller is a standby", leader="http://10.255.0.9:8080"))
    assert failed.status == 503 == status_of(NotLeader("x"))
    body = codec.loads(ErrorBody, failed.body)
    assert body.leader == "http://10.255.0.9:8080" and "the leader is http://10.255.0.9:8080" in body.error
    Signer(SECRET).check_response(nonce, 503, failed.body, failed.headers, "test")
    error = _error("POST http://c1/register", failed.status, failed.body)
    assert isinstance(error, NotLeader) and error.status == 503
    assert error.leader == "http://10.255.0.9:8080" and str(error).count("http://10.255.0.9:8080") == 1
    unknown = _error("POST http://c1/register", 503, codec.dumps(ErrorBody("standby; no leader yet")))
    assert isinstance(unknown, NotLeader) and unknown.leader is None
    assert not isinstance(_error("x", 502, b"{}"), NotLeader)


def test_clients_carry_their_term() -> None:
    client = ApiClient("http://10.255.0.3:9001", SECRET, term=4)
    request = client._prepare(ADMIN.health, None, {})
    assert request.headers[TERM_HEADER] == "4"
    assert _call(Dispatcher(ADMIN.ALL, Verifier(SECRET)).resolve(
        request.method, request.path, "", request.headers, request.body)).term == 4
    client.term = None
    assert TERM_HEADER not in client._prepare(ADMIN.health, None, {}).headers


def test_auth_header_names_are_case_insensitive() -> None:
    headers, nonce = _signed("GET", "/health")
    lowered = {k.lower(): v for k, v in headers.items()}
    assert AUTH_HEADER.lower() in lowered
    assert Verifier(SECRET).check("GET", "/health", "", lowered, b"") == nonce
    reply = {k.lower(): v for k, v in Verifier(SECRET).response_headers(nonce, 200, b"").items()}
    assert SIGNATURE_HEADER.lower() in reply
    Signer(SECRET).check_response(nonce, 200, b"", reply, "test")
