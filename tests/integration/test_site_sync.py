"""The ``replicated`` strategy end to end (issue 29): two sites of one real
agent each, a real `metaflow-site-sync` per site with its SQLite queue, and
writers in both sites. Every update reaches every site; a site that is down
(its agent stopped) or paused gets its backlog once it is back; a
propagation agent killed with -9 and restarted on its queue loses nothing
it acknowledged; concurrent writers of one key leave every site with the
same, newest copy; bad requests are refused and lose nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy, Route
from client_lib.constants import METAFLOW_PORT
from client_lib.errors import ServerError
from client_lib.routes import parse_route, static_route
from client_lib.site_client import SiteClient, read_layout
from client_lib.sites import SiteLayout, Strategy
from client_lib.stamps import Stamp, is_tombstone, stamp_of, stamped, unstamped
from mininet_scenarios.daemons import AgentProcess, SiteSyncProcess
from nat_agent.ports import listen_port

SPACE = Block.parse("100.64.0.0/10")
NAMES = ("east", "west")


@dataclass
class Sites:
    layout: SiteLayout
    agents: dict[str, AgentProcess]
    syncs: dict[str, SiteSyncProcess]
    route: list[str]
    metrics: dict[str, int]

    def scrape(self, site: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """`site`'s propagation agent's metrics: (name, labels) -> value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics[site]}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def client(self, site: str) -> SiteClient:
        return SiteClient(self.layout, Strategy.REPLICATED, site, route=self.static(),
                          retry=RetryPolicy(3, base=0.01, cap=0.05), deadline=3)

    def static(self) -> Route:
        return static_route([parse_route(r, METAFLOW_PORT) for r in self.route], SPACE)

    def held(self, site: str, path: str) -> bytes | None:
        """The copy `site` holds, stamp and all, asked of that site alone."""
        with MetaFlowClient(self.layout.named(site).prefix, route=self.static(),
                            retry=RetryPolicy(1, base=0.01, cap=0.01), follow_moved=False) as client:
            return client.get(path)


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Sites]:
    halves = dict(zip(NAMES, SPACE.halves(), strict=True))
    ports = {name: listen_port() for name in NAMES}
    layout_file = tmp_path / "sites.toml"
    layout_file.write_text(f'space = "{SPACE}"\n' + "".join(
        f'[[site]]\nname = "{name}"\nprefix = "{halves[name]}"\nsync = "127.0.0.1:{ports[name]}"\n'
        for name in NAMES))
    agents = {name: AgentProcess(f"leveldb:{tmp_path / name}", "--space", str(halves[name]),
                                 own=[str(halves[name])], log_path=tmp_path / f"{name}.log")
              for name in NAMES}
    for agent in agents.values():
        agent.launch()
    for agent in agents.values():
        agent.wait_ready()
    route = [f"{halves[name]}=127.0.0.1:{agents[name].port}" for name in NAMES]
    metrics = {name: listen_port() for name in NAMES}
    syncs = {name: SiteSyncProcess(layout_file, name, tmp_path / f"{name}.sqlite", port=ports[name],
                                   route=route, log_path=tmp_path / f"{name}-sync.log",
                                   extra=("--backoff-cap", "0.2", "--timeout", "1",
                                          "--metrics-port", str(metrics[name])))
             for name in NAMES}
    for sync in syncs.values():
        sync.start()
    try:
        yield Sites(read_layout(layout_file), agents, syncs, route, metrics)
    finally:
        for proc in [*syncs.values(), *agents.values()]:
            proc.terminate()
        for proc in [*syncs.values(), *agents.values()]:
            assert proc.stop() == 0, proc.log()[-2000:]


def _converged(sites: Sites, paths: dict[str, bytes]) -> None:
    """Every site holds every path's expected value (stamp removed)."""
    for sync in sites.syncs.values():
        sync.wait_drained()
    for site in NAMES:
        for path, value in paths.items():
            held = sites.held(site, path)
            assert held is not None and stamp_of(held) is not None, (site, path, held)
            assert unstamped(held)[1] == value, (site, path, held)


def test_writes_in_both_sites_reach_every_site_and_read_locally(sites: Sites) -> None:
    want = {}
    with sites.client("east") as east, sites.client("west") as west:
        for i in range(60):
            for name, client in (("east", east), ("west", west)):
                path, value = f"/{name}/f{i}", f"{name}-{i}".encode()
                client.put(path, value)
                assert client.get(path) == value   # its own site's copy, at once
                want[path] = value
        _converged(sites, want)
        assert west.get("/east/f7") == b"east-7" and east.get("/west/f7") == b"west-7"


def _write(client: SiteClient, want: dict[str, bytes], tag: str, count: int, step: int = 1,
           mark: bytes = b"v") -> None:
    """Write ``/tag/i`` for every `step`-th i below `count`, noting each in `want`."""
    for i in range(0, count, step):
        want[f"/{tag}/{i}"] = mark + b"%d" % i
        client.put(f"/{tag}/{i}", want[f"/{tag}/{i}"])


def _stopped(agent: AgentProcess) -> None:
    agent.terminate()
    assert agent.stop() == 0


def test_a_site_that_is_down_or_paused_catches_up_and_loses_nothing(sites: Sites) -> None:
    west = sites.agents["west"]
    want: dict[str, bytes] = {}
    with sites.client("east") as east:
        _stopped(west)
        _write(east, want, "cut", 150)
        _write(east, want, "cut", 150, 3, b"w")   # rewritten while cut off: only the last must arrive
        deadline = time.monotonic() + 10   # the site that is up is not held back by the one down
        while sites.syncs["east"].backlog()["east"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sites.syncs["east"].backlog() == {"east": 0, "west": 200}
        seen = sites.scrape("east")   # what an operator sees: west behind, east applied, failures counted
        assert seen["metaflow_site_backlog_updates", (("site", "west"),)] == 200
        assert seen["metaflow_site_updates_queued_total", ()] >= 200
        applied = sum(v for (name, labels), v in seen.items()
                      if name == "metaflow_site_updates_applied_total" and ("site", "east") in labels)
        assert 150 <= applied <= 200   # a rewrite queued before its first was pushed goes once
        assert seen["metaflow_site_push_failures_total", (("site", "west"),)] >= 1
        west.launch().wait_ready()
        _converged(sites, want)
        assert sites.scrape("east")["metaflow_site_backlog_updates", (("site", "west"),)] == 0

        assert west.proc is not None
        os.kill(west.proc.pid, signal.SIGSTOP)   # a paused site: the writes wait, then arrive
        try:
            _write(east, want, "pause", 20)
        finally:
            os.kill(west.proc.pid, signal.SIGCONT)
        _converged(sites, want)


def test_a_propagation_agent_killed_with_9_loses_nothing_it_acknowledged(sites: Sites) -> None:
    west, sync = sites.agents["west"], sites.syncs["east"]
    want: dict[str, bytes] = {}
    with sites.client("east") as east:
        _stopped(west)
        _write(east, want, "k9", 100)
        sync.kill()
        sync.launch().wait_ready()
        assert sync.backlog()["west"] == 100
        west.launch().wait_ready()
        _converged(sites, want)


def test_concurrent_writers_of_one_key_leave_every_site_the_same_newest_copy(sites: Sites) -> None:
    paths = [f"/race/{i}" for i in range(8)]

    def write(site: str) -> None:
        with sites.client(site) as client:
            for round_ in range(25):
                for path in paths:
                    client.put(path, f"{site}-{round_}".encode())

    threads = [threading.Thread(target=write, args=(site,)) for site in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sync in sites.syncs.values():
        sync.wait_drained()
    for path in paths:
        copies = {site: sites.held(site, path) for site in NAMES}
        assert copies["east"] == copies["west"], copies
        assert copies["east"] is not None and copies["east"].split(b"-")[-1] == b"24"


def test_bad_requests_are_refused_and_queue_nothing(sites: Sites) -> None:
    outbox = sites.syncs["east"].outbox
    good = stamped(b"v", Stamp(1, b"t"))
    for args, error in (((b"QUEUE", b"/a", b"plain"), "no stamp"),
                        ((b"QUEUE", b"/a"), "key-value pairs"),
                        ((b"QUEUE", b"/a//b/", good), "not normalized"),
                        ((b"QUEUE", b"relative", good), "absolute"),
                        ((b"FLUSHALL",), "unknown command")):
        with pytest.raises(ServerError, match=error):
            outbox.call(*args)
    assert sites.syncs["east"].backlog() == {"east": 0, "west": 0}
    sync = sites.syncs["east"]
    assert sync.proc is not None
    sync.proc.send_signal(signal.SIGHUP)   # a reload: the layout is read again, the agent goes on
    deadline = time.monotonic() + 10
    while "layout is unchanged" not in sync.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "layout is unchanged" in sync.log() and outbox.call("PING") is not None


def test_a_delete_reaches_every_site_and_a_later_write_brings_the_entry_back(sites: Sites) -> None:
    with sites.client("east") as east, sites.client("west") as west:
        east.put("/gone", b"1")
        east.put("/back", b"1")
        for sync in sites.syncs.values():
            sync.wait_drained()
        assert west.get("/gone") == b"1"
        east.delete("/gone")
        east.delete("/back")
        assert east.get("/gone") is None   # at once in the deleter's site
        west.put("/back", b"2")            # later than its deletion: it comes back everywhere
        for sync in sites.syncs.values():
            sync.wait_drained()
        assert west.get("/gone") is None and east.get("/gone") is None
        assert east.get("/back") == b"2" and west.get("/back") == b"2"
        assert all(is_tombstone(sites.held(site, "/gone") or b"") for site in NAMES)
