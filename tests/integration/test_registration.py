"""A real agent registers with a controller and keeps it informed, through
the signed REST API; it neither trusts a controller without the cluster's
secret nor fights a controller that gives its name to another server; and
after a restart it serves nothing until the controller says what it holds.

The controller here is a stand-in serving the declared REST routes through
the same `Dispatcher` as the real one, so that each test can make it forget
the agent, refuse the name, or hold another secret on cue.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from client_lib.api.admin import ADMIN, AssignRequest, Member, Role
from client_lib.api.auth import load_secret, write_secret
from client_lib.api.rest import REST, Ack, Heartbeat, Registered, Registration
from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy, Unavailable
from client_lib.errors import Conflict, NotFound
from client_lib.mdid import mdid
from client_lib.server.api import Call
from mininet_scenarios.daemons import ROOT, AgentProcess
from tests.integration.fake_api import FakeApi, Listener

OWN = Block.parse("100.64.0.0/12")


class Controller:
    """The controller's side of registration, with switches for misbehaving."""

    def __init__(self) -> None:
        self.registrations: list[Registration] = []
        self.beats: list[Heartbeat] = []
        self.forget = threading.Event()
        self.refusals_left = 0
        self.roles: list[Role] | None = None   # what registrations are answered with

    def handle(self, call: Call) -> object:
        if call.route is REST.register:
            if self.refusals_left:
                self.refusals_left -= 1
                raise Conflict(f"{call.body.name} is bound to another server (10.0.0.99)", 409)
            self.registrations.append(call.body)
            return Registered(call.body.name, self.roles)
        if call.route is REST.heartbeat:
            if self.forget.is_set():
                self.forget.clear()
                raise NotFound(f"no agent {call.params['name']!r}", 404)
            self.beats.append(call.body)
            return Ack(True)
        raise NotFound(f"the stand-in does not serve {call.route}", 404)


def _agent(tmp_path: Path, controller_url: str, secret_file: Path, own: bool = True) -> AgentProcess:
    return AgentProcess(f"leveldb:{tmp_path / 'db'}", "--controller", controller_url, "--heartbeat", "0.2",
                        "--data-ip", "127.0.0.1", "--capacity", "1234", own=[str(OWN)] if own else None,
                        log_path=tmp_path / "agent.log", secret_file=secret_file)


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_registration_and_heartbeats_reach_the_controller(tmp_path: Path, cluster_secret: Path) -> None:
    controller = Controller()
    with FakeApi(REST.ALL, load_secret(cluster_secret), controller.handle) as api, \
            _agent(tmp_path, api.url, cluster_secret) as agent:
        _until(lambda: len(controller.beats) >= 3)
        controller.forget.set()  # the controller restarted: the agent must register again
        _until(lambda: len(controller.registrations) == 2 and len(controller.beats) >= 5)
    first = controller.registrations[0]
    role = Role(OWN, 0, True, [Member(agent.name, agent.replication)])
    assert first == Registration(agent.name, "127.0.0.1", first.data_mac, agent.port, agent.admin_url,
                                 "leveldb", 1234, Block.parse("100.64.0.0/10"), [OWN], agent.replication,
                                 [role], suspended=True)
    assert first.data_mac  # read from the interface holding the data address
    assert controller.beats[-1] == Heartbeat(0, [OWN], [], [])
    assert "registering again" in agent.log()


def test_a_name_bound_to_another_server_is_an_error_retried_not_a_fight(tmp_path: Path,
                                                                        cluster_secret: Path) -> None:
    controller = Controller()
    controller.refusals_left = 5
    with FakeApi(REST.ALL, load_secret(cluster_secret), controller.handle) as api, \
            _agent(tmp_path, api.url, cluster_secret) as agent:
        _until(lambda: len(controller.beats) >= 2)  # registered once the other server was gone
    refusals = [line for line in agent.log().splitlines() if "bound to another server" in line]
    assert len(refusals) == 1 and " ERROR " in refusals[0]  # loud, once, not once per attempt
    assert len(controller.registrations) == 1 and "works again" in agent.log()


@pytest.mark.parametrize("impostor", ["another secret", "unsigned"])
def test_a_controller_without_the_secret_is_not_trusted(tmp_path: Path, cluster_secret: Path,
                                                        impostor: str) -> None:
    controller = Controller()
    if impostor == "another secret":
        server: FakeApi | Listener = FakeApi(REST.ALL, load_secret(write_secret(tmp_path / "other")),
                                             controller.handle)
    else:
        server = Listener()
    with server, _agent(tmp_path, server.url, cluster_secret) as agent:
        _until(lambda: "does not share our secret" in agent.log())
        time.sleep(0.5)  # a few more attempts
    assert controller.registrations == [] and controller.beats == []
    assert "registered with the controller" not in agent.log()
    if isinstance(server, Listener):  # it hears registrations, and the agent never believes it
        assert {path for _, path, _ in server.received} == {"/metaflow/agents"}


def test_a_controller_needs_the_data_plane_address_and_mac(tmp_path: Path, cluster_secret: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "nat_agent.daemon", "--store", f"leveldb:{tmp_path / 'db'}",
                          "--rewrite", "none", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                          "--secret-file", str(cluster_secret), "--controller", "http://127.0.0.1:1",
                          "--data-ip", "192.0.2.77"],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "--controller needs this server's data-plane address and MAC" in out.stderr
    assert "192.0.2.77 is on no interface here" in out.stderr


SPACE = Block.parse("100.64.0.0/10")
SAVED = [p for p in (f"/saved/{i}" for i in range(400)) if OWN.contains(mdid(p, SPACE))]


def _client(agent: AgentProcess) -> MetaFlowClient:
    return MetaFlowClient(space=SPACE, route=lambda _address: (agent.host, agent.port),
                          retry=RetryPolicy(1))


def test_a_restarted_agent_serves_nothing_until_the_controller_says_what_it_holds(
        tmp_path: Path, cluster_secret: Path) -> None:
    """kill -9 and a restart: the agent remembers its roles and reports them,
    suspended, and serves none of them while the controller has no word;
    an exclusive /assign lifts it. Told [] (declared failed meanwhile), it
    drops everything it saved."""
    controller = Controller()
    with FakeApi(REST.ALL, load_secret(cluster_secret), controller.handle) as api:
        agent = _agent(tmp_path, api.url, cluster_secret, own=False)
        role = Role(OWN, 4, True, [agent.member()])
        controller.roles = [role]
        with agent:
            _until(lambda: agent.call(ADMIN.health).roles == [role])   # held as the answer said
            with _client(agent) as client:
                for path in SAVED:
                    client.put(path, path.encode())
            agent.kill()
            controller.roles = None   # the controller is rebuilding: no word yet
            agent.start()
            _until(lambda: len(controller.registrations) == 2)
            again = controller.registrations[1]
            assert again.suspended and again.roles == [role] and again.owned == [OWN]
            health = agent.call(ADMIN.health)
            assert health.suspended and health.roles == [role] and health.keys == len(SAVED)
            with _client(agent) as client, pytest.raises(Unavailable, match="TRYAGAIN"):
                client.get(SAVED[0])
            time.sleep(0.5)   # heartbeats go on, and nothing changes by itself
            assert agent.call(ADMIN.health).suspended
            agent.call(ADMIN.assign, AssignRequest([role], exclusive=True))
            with _client(agent) as client:
                assert all(client.get(path) == path.encode() for path in SAVED)
            # declared failed while it was gone: it rejoins empty
            agent.kill()
            controller.roles = []
            agent.start()
            _until(lambda: not agent.call(ADMIN.health).suspended)
            health = agent.call(ADMIN.health)
            assert health.roles == [] and health.keys == 0
