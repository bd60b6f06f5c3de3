"""`Registrar.stop` ends the heartbeat loop even when the cancellation is
swallowed: a cancellation that lands as a request times out can come back
as the request's error, which the loop takes for a controller that is down
(seen as an agent that would not exit on SIGTERM in the nemesis)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from client_lib.api.leaders import Leaders
from client_lib.errors import ApiError
from nat_agent.registration import Registrar


class SwallowingController:
    """Answers no heartbeat, and turns every cancellation into an ApiError."""

    base_url = "http://controller"

    def __init__(self) -> None:
        self.swallowed = 0

    async def call(self, route: object, body: object = None, **params: str) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.swallowed += 1
            raise ApiError("request timed out") from None


def test_stop_ends_a_loop_that_swallows_its_cancellation() -> None:
    async def main() -> int:
        registrar = Registrar.__new__(Registrar)
        store = SimpleNamespace(total=lambda: asyncio.sleep(0, result=0))
        ownership = SimpleNamespace(owned=[], frozen=[], degraded=[])
        registrar.agent = SimpleNamespace(store=store, ownership=ownership,
                                          identity=SimpleNamespace(name="a"))  # type: ignore[assignment]
        controller = SwallowingController()
        registrar.leaders = Leaders([controller.base_url])
        registrar._clients = {controller.base_url: controller}   # type: ignore[dict-item]
        registrar.registration = lambda: None   # type: ignore[method-assign,assignment,return-value]
        registrar.interval, registrar.registered, registrar.heartbeats = 0.01, True, 0
        registrar._task, registrar._stopping, registrar._trouble, registrar._told = None, False, None, 0.0
        registrar._hopped = False
        registrar._silent, registrar._quick = None, {}
        registrar._port, registrar._udp = 0, None   # a controller without liveness datagrams: HTTP only
        registrar.start()
        await asyncio.sleep(0.05)
        await asyncio.wait_for(registrar.stop(), 5)
        return controller.swallowed

    assert asyncio.run(main()) >= 1
