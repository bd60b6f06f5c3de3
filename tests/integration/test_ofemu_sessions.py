"""benchmarks.ofemu's switch connections over real TCP: a switch that fails on
a message, or whose controller goes silent, connects again instead of
leaving the fabric for the rest of the run (a switch task that died kept the
controller short of switches with no word of why)."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from os_ken.ofproto import ofproto_v1_0 as ofp

from benchmarks import ofemu
from benchmarks.ofemu import HEADER, EmulatedSwitch, Emulator, message
from topology import builders

GRAPH = builders.fat_tree(4, servers=8)


class Listener:
    """A controller's OpenFlow port that records, per connection, the message
    types it received, and does what `serve` says with each connection."""

    def __init__(self, serve) -> None:
        self.serve = serve
        self.sessions: list[list[int]] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: list[int] = []
        self.sessions.append(seen)
        try:
            await self.serve(len(self.sessions), reader, writer, seen)
        finally:
            writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def read_one(reader: asyncio.StreamReader, seen: list[int]) -> int:
    head = await reader.readexactly(HEADER.size)
    _version, msg_type, length, _xid = HEADER.unpack(head)
    await reader.readexactly(length - HEADER.size)
    seen.append(msg_type)
    return msg_type


async def until(check, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.02)


@dataclass
class Run:
    """One emulated switch's connections to a `Listener`, once it reconnected."""

    listener: Listener
    emulator: Emulator
    switch: EmulatedSwitch
    connected_after: bool
    """Whether the switch was connected when the run ended (after `linger`)."""


def run_switch(serve, linger: float = 0.0) -> Run:
    """A switch of `GRAPH` connected to a controller that `serve`s, until it
    has connected a second time and `linger` seconds more."""
    async def go() -> Run:
        listener = Listener(serve)
        port = await listener.start()
        emulator = Emulator(GRAPH)
        switch = next(iter(emulator.switches.values()))
        task = asyncio.create_task(switch.run("127.0.0.1", port))
        try:
            await until(lambda: len(listener.sessions) >= 2)
            await asyncio.sleep(linger)
            return Run(listener, emulator, switch, switch.connected)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await listener.close()

    return asyncio.run(go())


def test_a_message_the_switch_fails_on_is_said_and_the_switch_connects_again() -> None:
    async def serve(n: int, reader, writer, seen) -> None:
        await read_one(reader, seen)   # its HELLO
        if n == 1:   # a FLOW_MOD far too short to parse
            writer.write(message(ofp.OFPT_FLOW_MOD, 9, struct.pack("!I", 0)))
        await reader.read()   # until it hangs up (or the test ends)

    run = run_switch(serve)
    errors = run.emulator.counters.session_errors
    assert len(errors) == 1 and run.switch.name in errors[0]
    assert run.listener.sessions[1][:1] == [ofp.OFPT_HELLO]


def test_a_silent_controller_gets_an_echo_request_then_loses_the_connection(monkeypatch) -> None:
    monkeypatch.setattr(ofemu, "INACTIVITY_PROBE_S", 0.2)

    async def serve(n: int, reader, writer, seen) -> None:
        if n == 1:   # reads, never answers
            while True:
                try:
                    await read_one(reader, seen)
                except asyncio.IncompleteReadError:
                    return
        else:   # answers every echo: the connection stays
            while True:
                if await read_one(reader, seen) == ofp.OFPT_ECHO_REQUEST:
                    writer.write(message(ofp.OFPT_ECHO_REPLY, 0))

    run = run_switch(serve, linger=1.5)   # several probe periods on the answering one
    silent, answering = run.listener.sessions[:2]
    counters = run.emulator.counters
    assert silent[0] == ofp.OFPT_HELLO and ofp.OFPT_ECHO_REQUEST in silent
    assert counters.probes_failed == 1 and len(run.listener.sessions) == 2
    assert answering.count(ofp.OFPT_ECHO_REQUEST) >= 2 and run.connected_after
    assert 0 < counters.echo_rtt_max < 2 * ofemu.INACTIVITY_PROBE_S   # answered in time
