"""Port 9000 as real Redis tools see it: redis-py 8 (RESP3 by default) and redis-cli.

Where Redis semantics apply (SET's options), the agent's replies are checked
against a real redis-server's for the same commands.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib.api.admin import ADMIN, DisownRequest
from client_lib.cidr import Block
from client_lib.constants import METAFLOW_PORT
from client_lib.mdid import mdid
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.netns_pair import NetnsPair

SPACE = Block.parse("100.64.0.0/10")
LOWER, UPPER = "100.64.0.0/11", "100.96.0.0/11"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is installed by make setup"),
]


@pytest.fixture(params=["leveldb", "redis"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "leveldb":
        return f"leveldb:{tmp_path / 'db'}"
    url = request.getfixturevalue("redis_server")
    return f"{url}/0?prefix={request.getfixturevalue('redis_prefix')}"


@pytest.fixture
def agent(store_spec: str, tmp_path: Path) -> Iterator[AgentProcess]:
    with AgentProcess(store_spec, own=[str(SPACE)], log_path=tmp_path / "agent.log") as proc:
        yield proc


def cli(agent: AgentProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["redis-cli", "-h", agent.host, "-p", str(agent.port), *args],
                          input=stdin, capture_output=True, text=True, timeout=20)


def path_in(block: str, stem: str = "/k") -> str:
    """A path whose MetaDataID falls in `block`."""
    inside = Block.parse(block)
    return next(p for i in range(10_000) if inside.contains(mdid(p := f"{stem}{i}", SPACE)))


def test_redis_py_works_in_its_default_configuration(agent: AgentProcess) -> None:
    """Found: redis-py 8 failed every call (it opens with HELLO 3)."""
    with redis.Redis(agent.host, agent.port) as r:
        assert r.set("/a/b", b"v") is True
        assert r.get("/a/b") == b"v"
        assert r.get("/missing") is None  # RESP3 null
        assert r.exists("/a/b", "/missing") == 1
        assert r.echo("hi") == b"hi" and r.ping() is True
        assert r.delete("/a/b") == 1
        conn = r.connection_pool.get_connection()
        try:
            meta = conn.handshake_metadata
        finally:
            r.connection_pool.release(conn)
        assert meta[b"proto"] == 3 and meta[b"server"] == b"metaflow" and meta[b"modules"] == []
        assert r.client_setname("dfs-node-1") is True
    with redis.Redis(agent.host, agent.port, protocol=2) as r2:
        assert r2.set("/two", b"2") is True and r2.get("/two") == b"2" and r2.get("/none") is None


def test_hello_answers_per_protocol_and_refuses_unknown_versions(agent: AgentProcess) -> None:
    with socket.create_connection((agent.host, agent.port), timeout=5) as sock:
        sock.sendall(b"HELLO 4\r\nGET /none\r\nHELLO 3\r\nGET /none\r\nHELLO 2\r\nGET /none\r\n")
        out = b""
        while out.count(b"$-1\r\n") < 2:
            out += sock.recv(65536)
    assert out.startswith(b"-NOPROTO unsupported protocol version\r\n$-1\r\n%7\r\n$6\r\nserver\r\n")
    assert b"$5\r\nproto\r\n:3\r\n" in out and out.count(b"\r\n_\r\n") == 1  # RESP3 null, once
    assert b"*14\r\n$6\r\nserver\r\n" in out and b"$5\r\nproto\r\n:2\r\n" in out
    assert out.endswith(b"\r\n$-1\r\n")  # back to RESP2


set_ops = st.lists(st.tuples(
    st.sampled_from(["a", "b"]),
    st.sampled_from([(), ("NX",), ("XX",), ("GET",), ("NX", "GET"), ("XX", "GET"), ("GET", "XX")]),
    st.binary(min_size=0, max_size=3)), min_size=1, max_size=12)


@given(ops=set_ops)
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_set_options_answer_exactly_as_redis_does(
        agent: AgentProcess, redis_server: str, redis_prefix: str,
        ops: list[tuple[str, tuple[str, ...], bytes]]) -> None:
    run = redis_prefix.replace(":", "")
    with redis.Redis.from_url(redis_server, protocol=3) as real, redis.Redis(agent.host, agent.port) as ours:
        for name, options, value in ops:
            key = f"/{run}/{len(ops)}/{hash(tuple(ops))}/{name}"
            expected = real.execute_command("SET", key, value, *options)
            assert ours.execute_command("SET", key, value, *options) == expected, (name, options)
            assert ours.get(key) == real.get(key)


@pytest.mark.parametrize("command, error", [
    (("SET", "/k", "v", "EX", "10"), "keeps metadata until it is deleted"),
    (("SET", "/k", "v", "NX", "XX"), "syntax error"),
    (("SET", "/k", "v", "BOGUS"), "syntax error"),
    (("MULTI",), "does not support 'multi': no transactions"),
    (("EXEC",), "does not support 'exec'"),
    (("WATCH", "/k"), "does not support 'watch'"),
    (("SUBSCRIBE", "ch"), "does not support 'subscribe': no publish/subscribe"),
    (("SELECT", "1"), "only SELECT 0"),
    (("CLIENT", "KILL", "x"), "supports only CLIENT"),
    (("AUTH", "pw"), "does not support 'auth'"),
])
def test_what_does_not_fit_is_a_clear_error_and_the_connection_stays_usable(
        agent: AgentProcess, command: tuple[str, ...], error: str) -> None:
    with redis.Redis(agent.host, agent.port, single_connection_client=True) as r:
        with pytest.raises(redis.ResponseError, match=error):
            r.execute_command(*command)
        assert r.execute_command("SELECT", "0") is True  # redis-py reads +OK as True
        assert r.set("/still", b"ok") and r.get("/still") == b"ok"


def test_redis_cli_pipe_mode_exits_0(agent: AgentProcess) -> None:
    """Found: `redis-cli --pipe` exited 1 on the blank lines in its input."""
    lines = "".join(f"SET /pipe/{i} v{i}\r\n\r\n" for i in range(100))
    done = cli(agent, "--pipe", stdin=lines + "\r\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "errors: 0, replies: 100" in done.stdout
    assert cli(agent, "GET", "/pipe/99").stdout.strip() == "v99"


def test_moved_is_what_redis_py_parses(tmp_path: Path) -> None:
    """Found: `-MOVED <mdid-ip>` made redis-py raise ValueError."""
    unhinted, hinted = path_in("100.96.0.0/12", "/u"), path_in("100.112.0.0/12", "/h")
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", own=[str(SPACE)], log_path=tmp_path / "a.log") as agent, \
            redis.Redis(agent.host, agent.port) as r:
        agent.call(ADMIN.disown, DisownRequest([Block.parse("100.96.0.0/12")]))
        agent.call(ADMIN.disown, DisownRequest([Block.parse("100.112.0.0/12")], moved_to="10.0.0.7:9000"))
        with pytest.raises(redis.exceptions.MovedError) as moved:
            r.get(unhinted)
        # Nobody said where it went: the MetaDataID itself, which the switches route.
        ident = mdid(unhinted, SPACE)
        assert (moved.value.slot_id, moved.value.host, moved.value.port) == (
            ident, SPACE.address(ident), METAFLOW_PORT)
        with pytest.raises(redis.exceptions.MovedError) as moved:
            r.set(hinted, b"v")
        assert (moved.value.slot_id, moved.value.host, moved.value.port) == (
            mdid(hinted, SPACE), "10.0.0.7", 9000)


def test_redis_cli_cluster_mode_follows_moved_to_the_owner(tmp_path: Path) -> None:
    """Found: `redis-cli -c` crashed (exit 139) on MOVED. Two agents on
    loopback: A hands the upper half to B and says so; redis-cli asked A
    about a key of B's is redirected and gets B's answer."""
    path = path_in(UPPER)
    with AgentProcess(f"leveldb:{tmp_path / 'b'}", own=[UPPER], log_path=tmp_path / "b.log") as b, \
            AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(SPACE)], log_path=tmp_path / "a.log") as a:
        a.call(ADMIN.disown, DisownRequest([Block.parse(UPPER)], moved_to=f"{b.host}:{b.port}"))
        done = cli(a, "-c", "SET", path, "via-a")
        assert done.returncode == 0 and done.stdout.strip() == "OK", done
        assert cli(b, "GET", path).stdout.strip() == "via-a"
        done = cli(a, "-c", "GET", path)
        assert done.returncode == 0 and done.stdout.strip() == "via-a", done


def test_redis_cli_follows_moved_to_the_metadataid_itself(tmp_path: Path) -> None:
    """Found: `redis-cli -c` crashed (exit 139) on the old `-MOVED <mdid-ip>`.
    With no hint, MOVED names the MetaDataID on port 9000, and the network
    delivers that to the owner: here a client namespace routes the space to a
    server namespace whose agent owns it all (local mode), while the agent
    asked first, in the client namespace, owns only the lower half."""
    path = path_in(UPPER)
    with NetnsPair(prefix="mfh1") as net:
        owner = AgentProcess(f"leveldb:{tmp_path / 'owner'}", own=[net.space], rewrite="local",
                             host="0.0.0.0", port=METAFLOW_PORT, netns=net.server,
                             log_path=tmp_path / "owner.log")
        owner.argv += ["--data-ip", net.server_ip]
        stale = AgentProcess(f"leveldb:{tmp_path / 'stale'}", own=[LOWER], netns=net.client,
                             log_path=tmp_path / "stale.log")
        with owner, stale:
            def cli_in_client(*args: str) -> subprocess.CompletedProcess[str]:
                return net.client.run("redis-cli", *args, check=False, timeout=20)

            done = cli_in_client("-p", str(stale.port), "-c", "SET", path, "routed")
            assert done.returncode == 0 and done.stdout.strip() == "OK", done
            address = SPACE.address(mdid(path, SPACE))
            direct = cli_in_client("-h", address, "-p", str(METAFLOW_PORT), "GET", path)
            assert direct.stdout.strip() == "routed"
