"""Both API clients against a real HTTP server that dispatches by the same declarations."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from client_lib.api import codec
from client_lib.api.admin import ADMIN, Assigned, AssignRequest, Health, Member, MigrationList, Role
from client_lib.api.auth import Verifier
from client_lib.api.clients import ApiClient, AsyncApiClient
from client_lib.cidr import Block
from client_lib.errors import ApiError, AuthError, Conflict, NotFound
from client_lib.server.api import Call, Dispatcher, wsgi_app

SECRET = b"0123456789abcdef0123456789abcdef"
SPACE = Block.parse("100.64.0.0/10")


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _handle(call: Call) -> object:
    if call.route is ADMIN.health:
        return Health("ok", "t", "leveldb", SPACE, None, None, 9000, "http://x", 1, 0, [], [], [], 0.0)
    if call.route is ADMIN.assign:
        if not call.body.roles:
            raise ValueError("nothing to assign")
        return Assigned(call.body.roles, None)
    if call.route is ADMIN.migration:
        raise KeyError(f"no migration {call.params['id']!r}")
    return MigrationList([])


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    secret = getattr(request, "param", SECRET)
    dispatcher = Dispatcher(ADMIN.ALL, Verifier(secret), open_reads=False)

    app = wsgi_app(dispatcher, _handle)
    httpd = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_sync_client_calls_and_raises_by_status(server: str) -> None:
    client = ApiClient(server, SECRET)
    assert client.call(ADMIN.health).name == "t"
    role = Role(Block.parse("100.64.0.0/12"), 3, True, [Member("t", "127.0.0.1:9002")])
    assert client.call(ADMIN.assign, AssignRequest([role])).roles == [role]
    with pytest.raises(Conflict, match="nothing to assign"):
        client.call(ADMIN.assign, AssignRequest([]))
    with pytest.raises(NotFound, match="no migration 'a b'"):
        client.call(ADMIN.migration, id="a b")
    with pytest.raises(AuthError) as refused:
        ApiClient(server, None).call(ADMIN.assign, AssignRequest([role]))
    assert refused.value.status == 401


@pytest.mark.parametrize("server", [b"the server has another secret"], indirect=True)
def test_a_server_with_another_secret_is_not_trusted(server: str) -> None:
    with pytest.raises(AuthError):
        ApiClient(server, SECRET).call(ADMIN.health)


def test_async_client_calls_concurrently(server: str) -> None:
    async def main() -> None:
        client = AsyncApiClient(server, SECRET)
        healths = await asyncio.gather(*[client.call(ADMIN.health) for _ in range(20)])
        assert {h.name for h in healths} == {"t"}
        with pytest.raises(NotFound):
            await client.call(ADMIN.migration, id="x")

    asyncio.run(main())


def test_unreachable_server_is_an_api_error_without_status() -> None:
    with pytest.raises(ApiError) as failed:
        ApiClient("http://127.0.0.1:1", SECRET, timeout=2).call(ADMIN.health)
    assert failed.value.status is None and "refused" in str(failed.value)

    async def main() -> None:
        with pytest.raises(ApiError):
            await AsyncApiClient("http://127.0.0.1:1", SECRET, timeout=2).call(ADMIN.health)

    asyncio.run(main())


def test_bodies_are_checked_before_sending(server: str) -> None:
    wrong: Any = AssignRequest([])   # Any: the type checker would refuse it; the client must refuse it too
    with pytest.raises(TypeError):
        ApiClient(server, SECRET).call(ADMIN.health, wrong)
    assert codec.loads(AssignRequest, codec.dumps(AssignRequest([]))) == AssignRequest([])
