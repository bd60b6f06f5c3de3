"""Which sockets listen on a port, from a ``/proc/net/tcp`` text (the
agent's check that no other process shares its workers' port)."""

from __future__ import annotations

import socket

from nat_agent.port_sharing import foreign_listeners, listeners

TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 111 1 0 100 0 0 10 0
   1: 0100007F:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 222 1 0 100 0 0 10 0
   2: 0100007F:2328 0100007F:D431 01 00000000:00000000 00:00000000 00000000 0 0 333 1 0 20 4 30 10 -1
   3: 0100007F:2329 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 444 1 0 100 0 0 10 0
"""


def test_only_listeners_on_the_port_at_an_overlapping_address_count() -> None:
    assert listeners(TABLE, "127.0.0.1", 9000) == {111, 222}   # its own address, and the wildcard
    assert listeners(TABLE, "10.0.0.2", 9000) == {111}          # the wildcard only
    assert listeners(TABLE, "0.0.0.0", 9000) == {111, 222}
    assert listeners(TABLE, "127.0.0.1", 9001) == {444}
    assert listeners(TABLE, "10.0.0.2", 9001) == set()
    assert listeners(TABLE, "127.0.0.1", 9002) == set()
    assert listeners("  sl  local_address\n", "127.0.0.1", 9000) == set()


def test_a_listener_of_our_own_is_not_foreign_and_another_one_is() -> None:
    with socket.socket() as mine, socket.socket() as other:
        for sock in (mine, other):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        mine.bind(("127.0.0.1", 0))
        port = mine.getsockname()[1]
        other.bind(("127.0.0.1", port))
        mine.listen()
        assert foreign_listeners("127.0.0.1", port, [mine]) == set()
        other.listen()
        assert len(foreign_listeners("127.0.0.1", port, [mine])) == 1
        assert foreign_listeners("127.0.0.1", port, [mine, other]) == set()
