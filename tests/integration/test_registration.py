"""A real agent registers with a controller and keeps it informed, through
the signed REST API; it neither trusts a controller without the cluster's
secret nor fights a controller that gives its name to another server; and
after a restart it serves nothing until the controller says what it holds.

The controller here is a stand-in serving the declared REST routes through
the same `Dispatcher` as the real one, so that each test can make it forget
the agent, refuse the name, or hold another secret on cue.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from client_lib.api.admin import ADMIN, AssignRequest, Member, Role
from client_lib.api.auth import load_secret, write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, Ack, Heartbeat, Registered, Registration
from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy, Unavailable
from client_lib.errors import Conflict, NotFound, NotLeader
from client_lib.mdid import mdid
from client_lib.server.api import Call
from mininet_scenarios.daemons import ROOT, AgentProcess
from nat_agent.ports import listen_port
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
        self.term = 0                          # the leadership term they are answered with
        self.standby_for: str | None = None    # set: a standby, naming this leader ("": none known)

    def handle(self, call: Call) -> object:
        if self.standby_for is not None:
            raise NotLeader("this controller is a standby", leader=self.standby_for or None)
        if call.route is REST.register:
            if self.refusals_left:
                self.refusals_left -= 1
                raise Conflict(f"{call.body.name} is bound to another server (10.0.0.99)", 409)
            self.registrations.append(call.body)
            return Registered(call.body.name, self.roles, self.term)
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
                                 [role], suspended=True, incarnation=first.incarnation)
    assert first.data_mac  # read from the interface holding the data address
    # the same process registering again says so: no restart (`Registration.incarnation`)
    assert len(first.incarnation) == 16 and controller.registrations[1].incarnation == first.incarnation
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


# -- several controllers, one leader ---------------------------------------------

def test_an_agent_follows_the_leader_a_standby_names(tmp_path: Path, cluster_secret: Path) -> None:
    """Two controller URLs, the first a standby naming the second: the agent
    registers with the second. When leadership moves back, the new leader
    (which knows nothing of the agent) gets a registration too; each move is
    logged once, not once per heartbeat."""
    secret = load_secret(cluster_secret)
    first, second = Controller(), Controller()
    with FakeApi(REST.ALL, secret, first.handle) as one, FakeApi(REST.ALL, secret, second.handle) as two:
        first.standby_for = two.url
        with _agent(tmp_path, f"{one.url},{two.url}", cluster_secret) as agent:
            _until(lambda: len(second.beats) >= 3)
            assert first.registrations == [] and len(second.registrations) == 1
            assert [c.route for c in one.calls] == [REST.register]   # asked once, then followed
            first.standby_for, second.standby_for = None, one.url      # a takeover
            _until(lambda: len(first.beats) >= 3)
            assert len(first.registrations) == 1 and first.registrations[0].name == agent.name
            beats = len(second.beats)
            time.sleep(0.5)
            assert len(second.beats) == beats   # it talks to one controller at a time
    moves = [line for line in agent.log().splitlines() if "is not the leader" in line]
    assert len(moves) == 2, moves
    assert f"trying {two.url}" in moves[0] and f"trying {one.url}" in moves[1]


def test_an_agent_moves_past_a_controller_that_does_not_answer(tmp_path: Path,
                                                               cluster_secret: Path) -> None:
    """No answer at all (nothing listens) moves the agent to the next URL; a
    standby that knows no leader too."""
    secret = load_secret(cluster_secret)
    lost, leader = Controller(), Controller()
    lost.standby_for = ""
    dead = f"http://127.0.0.1:{listen_port()}"
    with FakeApi(REST.ALL, secret, lost.handle) as standby, FakeApi(REST.ALL, secret, leader.handle) as api, \
            _agent(tmp_path, f"{dead},{standby.url},{api.url}", cluster_secret) as agent:
        _until(lambda: len(leader.beats) >= 2)
    assert len(leader.registrations) == 1 and lost.registrations == []
    assert f"controller at {dead} unreachable" in agent.log()
    assert f"the controller at {standby.url} is not the leader" in agent.log()


def test_an_agent_sent_back_to_a_leader_that_just_did_not_answer_waits_there_briefly(
        tmp_path: Path, cluster_secret: Path) -> None:
    """The leader paused: its socket accepts and answers nothing. The agent's
    request times out, the standby it tries next still names the paused one
    (its lease has not run out); the agent goes back to the paused one with a
    short timeout (`QUICK_S`), not another full one, so it registers with
    the standby soon after its takeover."""
    secret = load_secret(cluster_secret)
    standby = Controller()
    with socket.socket() as paused:
        paused.bind(("127.0.0.1", 0))
        paused.listen(16)   # connections complete in the kernel; nobody answers
        silent = f"http://127.0.0.1:{paused.getsockname()[1]}"
        standby.standby_for = silent
        with FakeApi(REST.ALL, secret, standby.handle) as api, \
                _agent(tmp_path, f"{silent},{api.url}", cluster_secret) as agent:
            _until(lambda: bool(api.calls))   # the request to the paused one timed out; a 503
            elected = time.monotonic()
            standby.standby_for = None
            _until(lambda: bool(standby.registrations))
            took = time.monotonic() - elected
    assert took < 0.85, (took, agent.log())   # a full request timeout (1 s) there: 1.2 s measured


def test_a_registration_answer_from_an_older_leader_is_not_adopted(tmp_path: Path,
                                                                   cluster_secret: Path) -> None:
    """The agent obeyed a leader of term 5 (an exclusive /assign): an answer
    to its registration at term 3 (a deposed leader) changes nothing, also
    after a restart (the term is saved with the roles); one at term 6 is
    adopted."""
    controller = Controller()
    with FakeApi(REST.ALL, load_secret(cluster_secret), controller.handle) as api:
        agent = _agent(tmp_path, api.url, cluster_secret, own=False)
        role = Role(OWN, (5 << 32) | 1, True, [agent.member()])
        with agent:
            _until(lambda: len(controller.beats) >= 1)
            ApiClient(agent.admin_url, agent.secret, term=5).call(
                ADMIN.assign, AssignRequest([role], exclusive=True))
            controller.roles, controller.term = [], 3   # "declared failed", says the old leader
            controller.forget.set()
            _until(lambda: "older leader" in agent.log())
            time.sleep(0.5)
            health = agent.call(ADMIN.health)
            assert health.roles == [role] and not health.suspended
            agent.kill()
            agent.start()
            _until(lambda: agent.log().count("older leader") >= 2)
            assert agent.call(ADMIN.health).roles == [role]   # suspended, but nothing dropped
            newer = Role(OWN, (6 << 32) | 1, True, [agent.member()])
            controller.roles, controller.term = [newer], 6
            _until(lambda: agent.call(ADMIN.health).roles == [newer])
            assert not agent.call(ADMIN.health).suspended


class _DeafUdp:
    """Takes liveness datagrams and never replies (a controller starved of
    CPU replies late or not at all); keeps when each came."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.arrivals: list[float] = []
        self.running = True
        self.thread = threading.Thread(target=self._take, daemon=True)
        self.thread.start()

    def _take(self) -> None:
        while self.running:
            try:
                self.sock.recv(2048)
            except TimeoutError:
                continue
            self.arrivals.append(time.monotonic())

    def close(self) -> None:
        self.running = False
        self.thread.join(5)
        self.sock.close()


def test_datagrams_taken_but_not_answered_back_off_the_http_heartbeats(tmp_path: Path,
                                                                        cluster_secret: Path) -> None:
    """The controller takes the agent's datagrams (its heartbeat answers
    say so, `Ack.datagram_age_s`) but its replies do not come: the agent
    keeps beating by datagram and sends its HTTP heartbeats ever less often
    (1, 2, 4 s apart), instead of going over to HTTP alone at the full rate,
    which is what a starved controller can least afford."""
    udp = _DeafUdp()
    http: list[float] = []

    def handle(call: Call) -> object:
        if call.route is REST.register:
            return Registered(call.body.name, [], 0, liveness_port=udp.port)
        if call.route is REST.heartbeat:
            http.append(time.monotonic())
            last = udp.arrivals[-1] if udp.arrivals else None
            return Ack(True, None if last is None else time.monotonic() - last)
        raise NotFound(f"the stand-in does not serve {call.route}", 404)

    try:
        with FakeApi(REST.ALL, load_secret(cluster_secret), handle) as api, \
                AgentProcess(f"leveldb:{tmp_path / 'db'}", "--controller", api.url, "--heartbeat", "0.2",
                             "--liveness-datagrams", "--data-ip", "127.0.0.1", "--capacity", "1234",
                             log_path=tmp_path / "agent.log", secret_file=cluster_secret):
            _until(lambda: len(udp.arrivals) >= 1)
            started = time.monotonic()
            time.sleep(10)
            ended = time.monotonic()
    finally:
        udp.close()
    after = [t for t in http if t > started]
    recent = [t for t in udp.arrivals if t > ended - 2]
    gaps = [round(b - a, 1) for a, b in zip(after, after[1:])]
    # HTTP alone at 5 a second would be about 50; backing off 1, 2, 4, 4 s apart: about 4
    assert 2 <= len(after) <= 7, (len(after), gaps)
    assert gaps and max(gaps) >= 3.5, gaps
    assert len(recent) >= 5, "the datagrams went on"
