"""The indexes that keep the decision thread's per-event work independent
of the fabric's size (issue 26, docs/decision-thread.md) answer exactly what
the straightforward scans they replaced answered, after any history."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.api.rest import Registration
from client_lib.cidr import Block
from client_lib.errors import Conflict
from controller.inventory import Host, Inventory
from controller.registry import Registry

SPACE = Block.parse("100.64.0.0/10")
DPIDS = st.integers(1, 4)
PORTS = st.integers(1, 4)
IPS = st.sampled_from([f"10.0.0.{i}" for i in range(1, 7)])

inventory_ops = st.one_of(
    st.tuples(st.just("switch_up"), DPIDS),
    st.tuples(st.just("switch_down"), DPIDS),
    st.tuples(st.just("link_up"), DPIDS, PORTS, DPIDS, PORTS),
    st.tuples(st.just("link_down"), DPIDS, PORTS, DPIDS, PORTS),
    st.tuples(st.just("learn"), IPS, DPIDS, PORTS),
    st.tuples(st.just("forget"), DPIDS, PORTS),
    st.tuples(st.just("port_down"), DPIDS, PORTS),
    st.tuples(st.just("port_up"), DPIDS, PORTS),
)


def _apply(inv: Inventory, op: tuple[object, ...]) -> object:
    name, *args = op
    if name == "switch_up":
        return inv.switch_up(args[0], ports=(1, 2, 3, 4))  # type: ignore[arg-type]
    if name == "learn":
        ip, dpid, port = args
        return inv.learn(ip, "02:00:00:00:00:01", dpid, port)  # type: ignore[arg-type]
    if name == "forget":
        return inv.forget_hosts_at((tuple(args),))  # type: ignore[arg-type]
    return getattr(inv, name)(*args)


def _host_at(inv: Inventory, dpid: int, port: int) -> Host | None:
    return next((h for h in inv.hosts.values() if (h.dpid, h.port) == (dpid, port)), None)


def _is_link_port(inv: Inventory, dpid: int, port: int) -> bool:
    return any((dpid, port) in ((a, pa), (b, pb)) for a, pa, b, pb in inv.links)


def _fabric(inv: Inventory) -> tuple[object, ...]:
    return frozenset(inv.dpids), frozenset(inv.links), tuple(sorted(inv.hosts.items()))


@settings(max_examples=150, deadline=None)
@given(st.lists(inventory_ops, max_size=40))
def test_the_inventory_indexes_agree_with_a_scan_after_any_history(ops: list[tuple[object, ...]]) -> None:
    inv = Inventory(SPACE, "10.255.255.254")
    for op in ops:
        before, version = _fabric(inv), inv.version
        if op[0] == "forget":
            expected = [h for h in inv.hosts.values() if (h.dpid, h.port) == op[1:]]
            assert _apply(inv, op) == expected
        else:
            _apply(inv, op)
        # what the core's graph is made of never changes without the version
        # (a change of nothing may move it too: the core then only recomputes more)
        assert inv.version != version or _fabric(inv) == before
        if op[0] in ("learn", "forget", "link_up", "link_down", "port_down", "port_up"):
            assert (inv.version != version) == (_fabric(inv) != before)
        for dpid in range(1, 5):
            for port in range(1, 5):
                assert inv.host_at(dpid, port) == _host_at(inv, dpid, port)
                assert inv.is_link_port(dpid, port) == _is_link_port(inv, dpid, port)
        skip = inv.down_ports | {end for a, pa, b, pb in inv.links for end in ((a, pa), (b, pb))}
        assert inv.edge_ports() == sorted((d, p) for d in inv.dpids for p in inv.ports.get(d, ())
                                          if (d, p) not in skip)


def _registration(name: str, ip: str, url: str) -> Registration:
    return Registration(name, ip, "02:00:00:00:00:01", 9000, url, "fake", 100, SPACE, [], "")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), IPS, st.sampled_from(["u1", "u2", "u3"])), max_size=20))
def test_the_registry_finds_a_server_by_address_and_refuses_a_taken_one_as_a_scan_would(
        regs: list[tuple[str, str, str]]) -> None:
    registry = Registry(SPACE)
    for name, ip, url in regs:
        owner = next((s.name for s in registry.servers.values()
                      if s.name != name and (s.data_ip == ip or s.admin_url == url)), None)
        known = registry.servers.get(name)
        try:
            registry.register(_registration(name, ip, url), 0.0)
        except Conflict as refused:
            assert (known is not None and known.identity()[::2] != (ip, url)) or \
                (owner is not None and str(refused).endswith(f"belongs to {owner}"))
        else:
            assert owner is None
        for address in {ip for _, ip, _ in regs}:
            found = registry.by_ip(address)
            assert found == next((s for s in registry.servers.values() if s.data_ip == address), None)
