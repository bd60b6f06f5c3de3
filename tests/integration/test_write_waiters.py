"""Found by the nemesis (`mininet_scenarios.nemesis`): a client that hangs up
while its request waits for another client's write wedges the key.

A read (or a write) of a key with a write under way waits for that write's
end (`MetadataService._settled` awaits the write's `done` future). When the
waiting client closes its connection, the agent cancels the connection's
command, and cancelling a task cancels the future it awaits: the shared
`done` of the *other* client's write. `Replicator.finish` then finds the
future done and returns before removing the key from `writing`, so the
cancelled write stays there for good: every later request for the key awaits
a cancelled future and gets its connection closed, whatever the controller
does, until the agent restarts. In the nemesis, hot keys (several clients,
0.5 s attempts) stayed unreadable for rounds after a fail-over.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from client_lib.api.admin import Member
from client_lib.api.auth import load_secret
from client_lib.errors import MetaFlowError
from client_lib.resp import encode_command
from tests.integration.test_replication import _agents, _assign, _client, _until, silent_replica


def test_a_waiting_client_that_hangs_up_does_not_wedge_the_key(tmp_path: Path, cluster_secret: Path) -> None:
    sent: list[list[bytes]] = []
    with silent_replica(load_secret(cluster_secret), sent) as silent, \
            _agents(tmp_path, cluster_secret, "a", extra=("--replication-timeout", "2")) as (a,):
        with _client(a) as client:
            client.put("/wedge/x", b"old")
        _assign(a, 1, [a.member(), Member("hung", silent.via)])

        def write() -> None:
            try:
                with _client(a) as client:
                    client.put("/wedge/x", b"new")
            except MetaFlowError:
                pass   # not acknowledged: the backup never answers

        writing = threading.Thread(target=write)
        writing.start()
        _until(lambda: any(c[0] in (b"RSET", b"RMSET") for c in sent))   # the write waits for the hung backup
        with socket.create_connection((a.host, a.port)) as reader:
            reader.sendall(encode_command(b"GET", b"/wedge/x"))
            time.sleep(0.3)   # the read waits for the write; then its client gives up
        writing.join(10)
        # The controller re-syncs under a newer epoch (the hung member dropped):
        # the block serves again, and so must the key.
        _assign(a, 2, [a.member()])
        with _client(a, attempts=5) as client:
            assert client.get("/wedge/x") in (b"old", b"new")


def test_a_writer_that_hangs_up_does_not_wedge_the_key(tmp_path: Path, cluster_secret: Path) -> None:
    """The same with the writer itself: its connection's command awaits its
    own write's `done` (`Replicator.acknowledged`)."""
    sent: list[list[bytes]] = []
    with silent_replica(load_secret(cluster_secret), sent) as silent, \
            _agents(tmp_path, cluster_secret, "a", extra=("--replication-timeout", "2")) as (a,):
        with _client(a) as client:
            client.put("/wedge/y", b"old")
        _assign(a, 1, [a.member(), Member("hung", silent.via)])
        with socket.create_connection((a.host, a.port)) as writer:
            writer.sendall(encode_command(b"SET", b"/wedge/y", b"new"))
            _until(lambda: any(c[0] in (b"RSET", b"RMSET") for c in sent))   # waits for the hung backup
        time.sleep(2.5)   # past the replication timeout: the write has ended either way
        _assign(a, 2, [a.member()])
        with _client(a, attempts=5) as client:
            assert client.get("/wedge/y") in (b"old", b"new")
