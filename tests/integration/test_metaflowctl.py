"""`metaflowctl` itself: `status` against a real HTTP server that serves the
declared REST views through the same `Dispatcher` the controller uses,
`secret`, and that the client's commands load no third-party
module."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from client_lib.api import codec
from client_lib.api.admin import ADMIN, OpsReport
from client_lib.api.auth import Verifier, load_secret, write_secret
from client_lib.api.rest import (
    REST,
    EventsView,
    FlowInfo,
    FlowsView,
    LeadershipView,
    LeafInfo,
    LoadView,
    OperationInfo,
    OperationsView,
    PrefixLoad,
    ServerInfo,
    ServersView,
    TreeView,
)
from client_lib.cidr import Block
from client_lib.errors import NotFound, NotLeader
from client_lib.server.api import Call, Dispatcher, wsgi_app
from controller.ctl import main
from controller.status import Status, format_status
from mininet_scenarios.daemons import ROOT
from nat_agent.ports import listen_port

SECRET = "0123456789abcdef0123456789abcdef"
B = Block.parse

STATUS = Status(
    tree=TreeView(
        built=True, missing_servers=[], root="core",
        inner={"core": ["pod1", "pod2"], "pod1": ["h1", "h2"], "pod2": ["h3", "h4"]},
        leaves={"h1": LeafInfo("busy", [B("100.64.0.0/11")], "pod1"),
                "h2": LeafInfo("busy", [B("100.96.0.0/11")], "pod1"),
                "h3": LeafInfo("idle", [], "pod2"),
                "h4": LeafInfo("failed", [], "pod2")}),
    servers=ServersView({
        "h1": ServerInfo("10.0.0.1", "http://10.255.0.1:9001", 512, 1000, None, "busy",
                         [B("100.64.0.0/11")], None, [B("100.96.0.0/11")]),
        "h2": ServerInfo("10.0.0.2", "http://10.255.0.2:9001", 900, 1000, None, "busy",
                         [B("100.96.0.0/11")], "split-7"),
        "h3": ServerInfo("10.0.0.3", "http://10.255.0.3:9001", 0, 1000, None, "idle", [], None),
        "h4": ServerInfo("10.0.0.4", "http://10.255.0.4:9001", 10, 1000, "heartbeat timeout", "failed",
                         [], None)}),
    load=LoadView(1.0, {"h1": 1234.4, "h2": 0.0},
                  {"2": [PrefixLoad(B("100.64.0.0/11"), 1, 1234.4), PrefixLoad(B("100.96.0.0/11"), 2, 0.0)]},
                  2.0, 0.0123),
    flows=FlowsView({
        "10": [FlowInfo(2011, B("100.64.0.0/11"), 3, None)],
        "2": [FlowInfo(2011, B("100.64.0.0/11"), 1, "02:00:00:00:00:01"),
              FlowInfo(2011, B("100.96.0.0/11"), 2, "02:00:00:00:00:02")]}),
    operations=OperationsView([OperationInfo("split-7", "split", "h2", "copying", 12.34)]),
    events=EventsView([{"t": 100.0 + i, "event": f"event-{i}", "server": "h2", "n": i} for i in range(12)]),
    leadership=LeadershipView("leader", 7, "http://10.255.0.254:8080", True, True),
)

VIEWS: dict[Any, object] = {REST.tree: STATUS.tree, REST.servers: STATUS.servers, REST.load: STATUS.load,
                            REST.flows: STATUS.flows,
                            REST.operations: STATUS.operations, REST.events: STATUS.events,
                            REST.leadership: STATUS.leadership}


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _view(call: Call) -> object:
    if call.route not in VIEWS:
        raise NotFound(f"{call.route} is not served by this test")
    return VIEWS[call.route]


@pytest.fixture
def controller(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a REST server holding `STATUS`; signed reads only unless the
    test is parametrized with open_reads=True."""
    yield from _serve(REST.ALL, _view, open_reads=getattr(request, "param", False))


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "secret", SECRET)


def _serve(routes: tuple[Any, ...], answer: Any, open_reads: bool = False) -> Iterator[str]:
    """A REST server of `routes`, answered by `answer(call)`: its URL."""
    dispatcher = Dispatcher(routes, Verifier(SECRET.encode()), open_reads=open_reads)
    httpd = make_server("127.0.0.1", 0, wsgi_app(dispatcher, answer), handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def agent() -> Iterator[str]:
    """An agent's admin API that has served 1,000 requests in each asked-for
    range over a 2 s window."""
    def answer(call: Call) -> object:
        assert call.route is ADMIN.ops
        return OpsReport([1000] * len(call.body.ranges), 2.0)
    yield from _serve(ADMIN.ALL, answer)


def _status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["status", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_status_summarizes_every_view(controller: str, secret_file: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _status(capsys, "--controller", controller, "--secret-file", str(secret_file))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"controller {controller}: leader, term 7"
    assert lines[1] == ("tree built (root core, 4 leaves); 4 servers (2 busy, 1 failed, 1 idle); "
                        "2 switches with 3 MetaFlow entries; 1 operation under way; "
                        "1 block without a live backup")
    assert lines[2] == "load 1234 packets/s to servers; max/mean 2.00, imbalance factor 0.012"
    rows = {line.split()[0]: line for line in lines if line.startswith("  h")}
    assert rows["h1"].split()[:8] == ["h1", "busy", "512", "1000", "51%", "10.0.0.1", "100.64.0.0/11",
                                      "100.96.0.0/11"]
    assert rows["h2"].split()[6:9] == ["100.96.0.0/11", "-", "0"]
    assert rows["h1"].split()[8] == "1234" and rows["h3"].split()[8] == "-"   # pkts/s, from the switches
    assert rows["h2"].endswith("in split-7")
    assert rows["h4"].split()[:2] == ["h4", "failed"] and rows["h4"].endswith("failed: heartbeat timeout")
    tree = lines[lines.index("tree") + 1:lines.index("tree") + 8]
    assert tree == ["  core", "    pod1", "      h1 (busy)", "      h2 (busy)",
                    "    pod2", "      h3 (idle)", "      h4 (failed)"]
    assert "  split-7  split  h2      copying  12.3 s" in lines
    # switches by number, not text: 2 before 10
    assert out.index("\n  2     2") < out.index("\n  10    1")
    events = [line for line in lines if "event-" in line]
    assert [e.split()[1] for e in events] == [f"event-{i}" for i in range(2, 12)]
    assert events[-1].split() == ["111.000", "event-11", "server=h2", "n=11"]
    assert "last 10 of 12 events" in out


def test_status_asks_the_agents_for_load_per_block_on_request(
        controller: str, agent: str, secret_file: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """h1's agent answers 1,000 requests in 2 s per block; h2's cannot be reached
    and shows '-'; the idle and the failed server are not asked."""
    servers = dict(STATUS.servers.servers)
    servers["h1"] = replace(servers["h1"], admin_url=agent)
    servers["h2"] = replace(servers["h2"], admin_url="http://127.0.0.1:1")
    monkeypatch.setitem(VIEWS, REST.servers, ServersView(servers))
    code, out, _ = _status(capsys, "--controller", controller, "--secret-file", str(secret_file),
                           "--blocks", "--timeout", "3")
    assert code == 0
    section = out.split("requests/s per block")[1].split("\n\n")[0]
    rows = [line.split() for line in section.splitlines()[2:]]
    assert rows == [["h1", "100.64.0.0/11", "500"], ["h2", "100.96.0.0/11", "-"]]
    code, out, _ = _status(capsys, "--controller", controller, "--secret-file", str(secret_file))
    assert "requests/s per block" not in out


def test_status_lists_flow_entries_on_request(controller: str, secret_file: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _status(capsys, "--controller", controller, "--secret-file", str(secret_file),
                           "--flows", "--events", "0")
    assert code == 0
    assert "  dpid 2: 2 entries\n    100.64.0.0/11      -> port 1, set dl_dst 02:00:00:00:00:01 " \
           "(priority 2011)\n" in out
    assert "event-" not in out


def test_status_json_round_trips(controller: str, secret_file: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _status(capsys, "--controller", controller, "--secret-file", str(secret_file), "--json")
    assert code == 0
    assert codec.from_json(Status, json.loads(out)) == STATUS


def test_status_with_a_wrong_secret_says_so(controller: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    wrong = write_secret(tmp_path / "wrong", "another secret of enough length")
    code, out, err = _status(capsys, "--controller", controller, "--secret-file", str(wrong))
    assert (code, out) == (2, "")
    assert "HTTP 401" in err and "bad signature" in err and "is --secret-file the cluster's secret?" in err


def test_status_without_a_secret(controller: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _status(capsys, "--controller", controller)
    assert (code, out) == (2, "")
    assert "not signed" in err and "pass --secret-file" in err


@pytest.mark.parametrize("controller", [True], indirect=True)
def test_status_without_a_secret_reads_open_views(controller: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _status(capsys, "--controller", controller)
    assert code == 0 and "4 servers" in out


def test_status_asks_the_leader_of_several_controllers(controller: str, secret_file: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--controller A,B,C``: a dead one is passed, a standby's NotLeader is
    followed to the leader it names (here not even among the URLs given)."""
    def standby(call: Call) -> object:
        raise NotLeader("this controller is a standby", leader=controller)

    dead = f"http://127.0.0.1:{listen_port()}"
    for other in _serve(REST.ALL, standby):
        code, out, err = _status(capsys, "--controller", f"{dead},{other}", "--secret-file", str(secret_file),
                                 "--timeout", "2")
        assert (code, err) == (0, "")
        assert out.splitlines()[0] == f"controller {controller}: leader, term 7" and "4 servers" in out
        code, _, err = _status(capsys, "--controller", f"{dead},{dead}/", "--timeout", "2")
        assert code == 2 and "connection refused" in err


def test_status_of_an_unreachable_or_unreadable_controller(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _status(capsys, "--controller", "http://127.0.0.1:1", "--timeout", "2")
    assert code == 2 and "connection refused" in err
    code, _, err = _status(capsys, "--controller", "ftp://x")
    assert code == 2 and "http://HOST:PORT" in err
    loose = tmp_path / "loose"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    code, _, err = _status(capsys, "--secret-file", str(loose))
    assert code == 2 and f"chmod 600 {loose}" in err


def test_secret_prints_or_writes_a_private_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    printed = []
    for _ in range(2):
        assert main(["secret"]) == 0
        printed.append(capsys.readouterr().out.strip())
    assert len(printed[0]) >= 32 and printed[0] != printed[1]
    path = tmp_path / "cluster.secret"
    assert main(["secret", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    written = load_secret(path)
    with pytest.raises(SystemExit) as refused:
        main(["secret", str(path)])
    assert refused.value.code == 2 and "exists" in capsys.readouterr().err
    assert load_secret(path) == written


def _run(*code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "\n".join(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_client_commands_load_no_third_party_module() -> None:
    """What the client extra (the standard library only) promises: status,
    get/put/del/stat and secret import nothing outside it."""
    probe = _run(
        "import sys",
        "from controller.ctl import main",
        "for argv in (['secret'], ['status', '--controller', 'http://127.0.0.1:1', '--timeout', '1'],",
        "             ['stat', '/a', '--via', '127.0.0.1:1', '--timeout', '0.2']):",
        "    main(argv)",
        "ours = ('btree', 'topology', 'controller', 'nat_agent', 'client_lib', 'benchmarks',",
        "        'mininet_scenarios')",
        "roots = {name.partition('.')[0] for name in sys.modules}",
        "print(' '.join(sorted(r for r in roots if r not in sys.stdlib_module_names and r not in ours",
        "                      and not r.startswith('_'))))",
        "print(' '.join(sorted(r for r in roots if r in ('btree', 'topology', 'benchmarks', 'nat_agent'))))",
    )
    assert probe.returncode == 0, probe.stderr
    third_party, heavy_ours = probe.stdout.splitlines()[-2:]
    assert third_party == "" and heavy_ours == ""


def test_the_benchmarks_subcommands_come_from_the_installed_entry_points() -> None:
    """plan and bench are listed and run as before, found through the installed
    distribution's `metaflowctl.commands` entry points (after `make setup`
    installed this pyproject.toml), with no import of the benchmarks by the
    controller's own code."""
    listed = _run("from controller.ctl import main", "main(['--help'])")
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.startswith("    ")}
    assert {"plan", "bench", "status", "secret"} <= names
    plan = _run("from controller.ctl import main",
                "import sys; sys.exit(main(['plan', '--topology', 'fattree', '--k', '4', '--servers', '8', "
                "'--keys', '2000', '--json']))")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout.splitlines()[-1])["verified"] is True
    for command, option in (("plan", "--table-budget"), ("bench", "--schemes")):
        helped = _run("from controller.ctl import main", f"main(['{command}', '--help'])")
        assert helped.returncode == 0 and option in helped.stdout, helped.stderr


def test_status_of_a_standby_says_so_and_names_the_leader() -> None:
    standby = Status(**{**vars(STATUS), "leadership": LeadershipView(
        "standby", 0, "http://10.255.0.2:8080", False, True, "etcd unreachable: 10.255.0.9:2379: timeout")})
    first = format_status(standby, "http://10.255.0.1:8080").splitlines()[0]
    assert first == ("controller http://10.255.0.1:8080: STANDBY (etcd unreachable: 10.255.0.9:2379: "
                     "timeout); the leader is http://10.255.0.2:8080")
    alone = Status(**{**vars(STATUS), "leadership": LeadershipView("leader", 0, None, False, False)})
    assert format_status(alone, "c").splitlines()[0] == "controller c"
