"""Registration with the controller and heartbeats, over the management network.

The controller learns a storage server from the agent rather than from the
data plane alone: the agent knows its data-plane MAC and address, its admin
URL, its store and capacity, and what it owns (which a restarted controller
needs to rebuild the B-tree). Heartbeats carry the key total so the
controller sees a server fill up, and their absence is how it notices a dead
agent whose edge port is still up.

Protocol (the controller side lives in `controller/`):

    POST {controller}/metaflow/agents                  the full identity -> 2xx
    POST {controller}/metaflow/agents/{name}/heartbeat {"keys", "owned", "frozen"}
         -> 2xx, or 404 when the controller does not know us (it restarted):
            we register again.

A controller that is down is not an agent error: we log once per outage
and keep trying every interval, serving clients all the while.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from nat_agent.agent import Agent

log = logging.getLogger("metaflow.agent.registration")


class Registrar:
    def __init__(self, agent: Agent, controller: str, interval: float = 2.0) -> None:
        self.agent = agent
        self.base = controller.rstrip("/") + "/metaflow/agents"
        self.interval = interval
        self.registered = False
        self.heartbeats = 0
        self._task: asyncio.Task | None = None
        self._down_since_logged = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="registrar")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _identity(self) -> dict:
        ident = self.agent.identity
        return {"name": ident.name, "data_ip": ident.data_ip, "data_mac": ident.data_mac,
                "data_port": ident.data_port, "admin_url": ident.admin_url,
                "store": self.agent.store.kind, "capacity": ident.capacity,
                "space": str(self.agent.space),
                "owned": [str(b) for b in self.agent.ownership.owned]}

    async def _beat(self) -> dict:
        return {"keys": await self.agent.store.total(),
                "owned": [str(b) for b in self.agent.ownership.owned],
                "frozen": [str(b) for b in self.agent.ownership.frozen]}

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.interval))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    await self._once(session)
                    if self._down_since_logged:
                        log.info("controller at %s reachable again", self.base)
                    self._down_since_logged = False
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    self.registered = False
                    if not self._down_since_logged:
                        log.warning("controller at %s unreachable (%s); retrying every %.1f s",
                                    self.base, exc, self.interval)
                        self._down_since_logged = True
                await asyncio.sleep(self.interval)

    async def _once(self, session: aiohttp.ClientSession) -> None:
        if self.registered:
            url = f"{self.base}/{self.agent.identity.name}/heartbeat"
            async with session.post(url, json=await self._beat()) as response:
                if response.status == 404:
                    log.info("controller forgot us; registering again")
                    self.registered = False
                else:
                    response.raise_for_status()
                    self.heartbeats += 1
                    return
        async with session.post(self.base, json=await self._identity()) as response:
            response.raise_for_status()
        self.registered = True
        log.info("registered with the controller at %s", self.base)
