"""Two real `metaflow-controller` processes and a real etcd, no Open vSwitch:
exactly one leads; kill -9 of the leader hands the lease to the other within
the TTL and a bit; a leader paused past its lease wakes as a standby and
sends nothing (a fake switch records every message); with etcd stopped both
are standbys and say so, and one leads again once etcd is back."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from os_ken.ofproto import ofproto_v1_0 as ofp

from client_lib.api.auth import write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, Heartbeat, LeadershipView
from client_lib.constants import COOKIE_BASE
from client_lib.errors import MetaFlowError, NotFound, NotLeader
from controller.leadership import term_of
from mininet_scenarios.etcd import EtcdProcess
from mininet_scenarios.metaflow_net import ControllerProcess
from nat_agent.ports import listen_port
from tests.integration.fake_switch import FakeSwitch

TTL_S = 1
TAKEOVER_BOUND_S = TTL_S + 2.5
"""The lease's TTL, etcd's expiry sweep (every 0.5 s), a standby's read (every
TTL/3), and a loaded two-core machine's slack."""


class Pair:
    """Two controllers on one etcd; `api[i]` reads controller i."""

    def __init__(self, tmp: Path, etcd: EtcdProcess, stack: ExitStack) -> None:
        secret = write_secret(tmp / "secret")
        self.secret = secret.read_bytes().strip()
        self.of_ports = [listen_port(), listen_port()]
        self.rest_ports = [listen_port(), listen_port()]
        self.procs = []
        for i in range(2):
            url = f"http://127.0.0.1:{self.rest_ports[i]}"
            proc = ControllerProcess(self.of_ports[i], "127.0.0.1", self.rest_ports[i], secret,
                                     tmp / f"controller{i}.log",
                                     ["--etcd", etcd.url, "--lease-ttl", str(TTL_S), "--advertise-url", url,
                                      "--etcd-prefix", f"/test{self.rest_ports[0]}"]).start()
            stack.callback(proc.stop)
            self.procs.append(proc)
        self.api = [ApiClient(f"http://127.0.0.1:{p}", self.secret, timeout=5) for p in self.rest_ports]
        self.tmp = tmp

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.rest_ports[i]}"

    def view(self, i: int) -> LeadershipView | None:
        try:
            return self.api[i].call(REST.leadership)
        except (MetaFlowError, OSError):
            return None

    def wait(self, what: str, check, timeout: float = 60.0) -> float:
        start = time.monotonic()
        while not check():
            if time.monotonic() - start > timeout:
                logs = "\n".join((self.tmp / f"controller{i}.log").read_text()[-1500:] for i in range(2))
                raise AssertionError(f"{what}: not within {timeout} s\n{logs}")
            time.sleep(0.05)
        return time.monotonic() - start

    def leader(self) -> int:
        """The one leader's index, once exactly one leads and the other follows it."""
        found: list[int] = []

        def one() -> bool:
            views = [self.view(i) for i in range(2)]
            found[:] = [i for i, v in enumerate(views) if v is not None and v.state == "leader"]
            return len(found) == 1 and all(v is not None and v.leader == self.url(found[0]) for v in views)
        self.wait("exactly one leader", one)
        return found[0]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with EtcdProcess(tmp_path / "etcd") as running:
        yield running


def test_one_leads_the_standby_refuses_changes_and_takes_over_a_killed_leader(tmp_path: Path,
                                                                              etcd: EtcdProcess) -> None:
    with ExitStack() as stack:
        pair = Pair(tmp_path, etcd, stack)
        lead = pair.leader()
        other = 1 - lead
        before = pair.view(lead)
        standby = pair.view(other)
        assert before is not None and standby is not None
        assert before.coordinated and before.term > 0 and before.leader == pair.url(lead)
        assert standby.state == "standby" and standby.leader == pair.url(lead) and standby.etcd_reachable
        # A standby answers every changing route 503, naming the leader; the leader serves it.
        with pytest.raises(NotLeader) as refused:
            pair.api[other].call(REST.heartbeat, Heartbeat(0, [], []), name="s1")
        assert refused.value.leader == pair.url(lead) and refused.value.status == 503
        with pytest.raises(NotFound):
            pair.api[lead].call(REST.heartbeat, Heartbeat(0, [], []), name="s1")

        # One switch with both controllers as targets: MASTER from the leader, SLAVE from
        # the standby, and MetaFlow's flow mods from the leader only.
        switches = [FakeSwitch(pair.of_ports[i], dpid=5) for i in range(2)]
        for s in switches:
            stack.callback(s.close)
        pair.wait("roles claimed", lambda: switches[lead].roles() and switches[other].roles())
        pair.wait("base flows from the leader", lambda: switches[lead].flow_mods(COOKIE_BASE) > 0)
        time.sleep(1.0)
        assert switches[lead].roles() == [ofp.NX_ROLE_MASTER]
        assert switches[other].roles() == [ofp.NX_ROLE_SLAVE]
        assert switches[other].flow_mods(COOKIE_BASE) == 0

        pair.procs[lead].kill()
        took = pair.wait("the standby takes over", lambda: (v := pair.view(other)) is not None
                         and v.state == "leader", timeout=30)
        after = pair.view(other)
        assert after is not None and after.term > before.term and after.takeovers == 1
        assert term_of(after.term << 32) == after.term
        assert took <= TAKEOVER_BOUND_S, f"takeover took {took:.2f} s"
        pair.wait("MASTER from the new leader", lambda: switches[other].roles()[-1:] == [ofp.NX_ROLE_MASTER])
        # The new leader takes registrations now.
        with pytest.raises(NotFound):
            pair.api[other].call(REST.heartbeat, Heartbeat(0, [], []), name="s1")


def test_a_leader_paused_past_its_lease_wakes_as_a_standby_and_sends_nothing(tmp_path: Path,
                                                                            etcd: EtcdProcess) -> None:
    with ExitStack() as stack:
        pair = Pair(tmp_path, etcd, stack)
        lead = pair.leader()
        other = 1 - lead
        old = pair.procs[lead].proc
        assert old is not None
        old.send_signal(signal.SIGSTOP)
        stack.callback(old.send_signal, signal.SIGCONT)
        pair.wait("the other takes over", lambda: (v := pair.view(other)) is not None and v.state == "leader",
                  timeout=30)
        # A switch connects to the old leader while it sleeps (the kernel accepts it): the
        # old leader's first word to it on waking is what it believes it is.
        late = FakeSwitch(pair.of_ports[lead], dpid=9)
        stack.callback(late.close)
        time.sleep(2 * TTL_S)
        woke = time.monotonic()
        old.send_signal(signal.SIGCONT)
        pair.wait("the old leader says standby", lambda: (v := pair.view(lead)) is not None
                  and v.state == "standby", timeout=15)
        pair.wait("the woken controller's handshake", lambda: late.roles(woke), timeout=15)
        time.sleep(2.0)   # its ticks, its decision loop's backlog: all of it has run
        assert late.roles(woke) == [ofp.NX_ROLE_SLAVE]
        assert late.flow_mods(COOKIE_BASE) == 0, [m.type for m in late.messages()]
        view = pair.view(lead)
        assert view is not None and view.leader == pair.url(other)
        with pytest.raises(NotLeader):
            pair.api[lead].call(REST.heartbeat, Heartbeat(0, [], []), name="s1")
        assert (tmp_path / f"controller{lead}.log").read_text().count("no longer leading") == 1


def test_without_etcd_both_are_standbys_and_say_so_until_it_is_back(tmp_path: Path,
                                                                    etcd: EtcdProcess) -> None:
    with ExitStack() as stack:
        pair = Pair(tmp_path, etcd, stack)
        pair.leader()
        etcd.signal(signal.SIGSTOP)
        stack.callback(etcd.signal, signal.SIGCONT)

        def both_standby() -> bool:
            views = [pair.view(i) for i in range(2)]
            return all(v is not None and v.state == "standby" and not v.etcd_reachable
                       and "etcd unreachable" in v.reason for v in views)
        pair.wait("both standby, etcd unreachable", both_standby, timeout=15)
        with pytest.raises(NotLeader):
            pair.api[0].call(REST.heartbeat, Heartbeat(0, [], []), name="s1")
        etcd.signal(signal.SIGCONT)
        pair.leader()
