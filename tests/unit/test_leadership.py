"""Leadership without etcd: the clock bound that gates every step, the term
in epochs, the role requests. Pure: the clock is a variable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from os_ken.ofproto import ofproto_common
from os_ken.ofproto import ofproto_v1_0 as ofp
from os_ken.ofproto import ofproto_v1_0_parser as parser

from btree.replicas import Replicas
from btree.tree import LogicalBTree
from client_lib.api.auth import write_secret
from client_lib.cidr import Block
from client_lib.errors import InvalidArgument
from controller import settings as controller_settings
from controller.core import MetaFlowCore
from controller.leadership import MAX_TERM, TERM_SHIFT, Leadership, State, epoch_floor, term_of
from controller.ofmsgs import async_config, refused_as_slave, refuses_role, role_request
from controller.settings import Settings
from controller.steps import FabricSeen, LinkUp, SwitchUp


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_controller_without_etcd_always_leads_at_term_0() -> None:
    alone = Leadership.alone()
    assert alone.leads() and alone.state is State.LEADER and alone.term == 0 and not alone.coordinated


def test_a_leader_leads_until_its_last_accepted_keepalive_plus_ttl_less_the_margin() -> None:
    clock = Clock()
    lead = Leadership(2.0, clock, margin_s=0.5)
    assert not lead.leads() and lead.state is State.STANDBY
    lead.elected(7, sent_at=100.0, url="http://c1:8080")
    assert lead.leads() and lead.term == 7 and lead.takeovers == 1
    clock.now = 101.49
    assert lead.leads()
    clock.now = 101.5   # 100 + 2 - 0.5
    assert not lead.leads()


def test_a_renewal_counts_from_when_it_was_sent_not_when_its_answer_came() -> None:
    clock = Clock()
    lead = Leadership(3.0, clock, margin_s=0.0)
    lead.elected(1, 100.0, "u")
    # Sent at 101, answered (say after a pause) at 110: the bound is 104, long gone.
    clock.now = 110.0
    lead.renewed(sent_at=101.0)
    assert not lead.leads()


def test_a_late_answer_to_an_older_keepalive_never_shortens_the_bound() -> None:
    clock = Clock()
    lead = Leadership(3.0, clock, margin_s=0.0)
    lead.elected(1, 100.0, "u")
    lead.renewed(102.0)
    lead.renewed(101.0)
    clock.now = 104.9
    assert lead.leads()


def test_a_paused_leader_that_wakes_finds_it_leads_no_more_before_anything_else() -> None:
    clock = Clock()
    lead = Leadership(1.0, clock)
    lead.elected(3, 100.0, "u")
    assert lead.reason == ""
    clock.now = 130.0   # SIGSTOP for half a minute
    assert not lead.leads() and lead.reason == "the lease ran out on this controller's clock"
    lead.lost("the lease ran out")
    lead.renewed(130.0)   # a renewal of a lost lease does not bring it back
    assert not lead.leads() and lead.reason == "the lease ran out"


def test_etcd_unreachable_is_said_by_a_standby_and_not_hidden_by_a_leader() -> None:
    clock = Clock()
    lead = Leadership(2.0, clock)
    lead.unreachable("connection refused")
    assert not lead.etcd_reachable and "etcd unreachable: connection refused" in lead.reason
    lead.elected(4, 100.0, "u")
    lead.unreachable("timeout")
    assert lead.leads() and not lead.etcd_reachable   # until its bound, then standby
    clock.now = 102.0
    assert not lead.leads()


def test_a_standby_follows_the_leader_it_read() -> None:
    lead = Leadership(2.0, Clock())
    lead.follow("http://c2:8080")
    assert lead.leader_url == "http://c2:8080" and lead.etcd_reachable and not lead.leads()
    lead.follow(None)
    assert "campaigning" in lead.reason


@pytest.mark.parametrize(("ttl", "margin"), [(0.0, None), (-1.0, None), (1.0, 1.0), (1.0, -0.1)])
def test_bad_ttl_or_margin_is_refused(ttl: float, margin: float | None) -> None:
    with pytest.raises(ValueError, match="TTL|margin"):
        Leadership(ttl, Clock(), margin_s=margin)


def test_the_term_is_the_high_half_of_every_epoch() -> None:
    assert epoch_floor(0) == 0 and epoch_floor(5) == 5 << TERM_SHIFT
    assert term_of(epoch_floor(5) + 17) == 5 and term_of(12) == 0
    assert epoch_floor(MAX_TERM) < 2 ** 63
    for bad in (-1, MAX_TERM + 1):
        with pytest.raises(ValueError, match="term"):
            epoch_floor(bad)
    with pytest.raises(ValueError, match="term"):
        Leadership(1.0, Clock()).elected(MAX_TERM + 1, 100.0, "u")


def _tree() -> LogicalBTree:
    return LogicalBTree(Block.parse("100.64.0.0/10"), "root", {"root": ["e1"], "e1": ["a", "b"]})


def test_a_new_leaders_epochs_are_above_every_epoch_of_an_older_one() -> None:
    old = Replicas(_tree(), 1)
    for _ in range(1000):
        old.next_epoch()
    assert term_of(old.epoch) == 0
    new = Replicas(_tree(), 1, floor=epoch_floor(2))
    first = new.next_epoch()
    assert first == (2 << TERM_SHIFT) + 1 and first > old.epoch and term_of(first) == 2


def test_a_rebuild_keeps_the_higher_of_the_claims_and_the_floor() -> None:
    replicas = Replicas(_tree(), 1, floor=epoch_floor(3))
    replicas.continue_from(epoch_floor(2) + 40)   # claims of an older leader
    assert replicas.next_epoch() == epoch_floor(3) + 1
    replicas.continue_from(epoch_floor(4) + 9)    # a claim above the floor (a later leader's) wins
    assert replicas.next_epoch() == epoch_floor(4) + 10
    with pytest.raises(ValueError, match="floor"):
        Replicas(_tree(), 1, floor=-1)


def test_the_role_requests_are_nicira_master_and_slave_on_the_wire() -> None:
    for leading, role in ((True, ofp.NX_ROLE_MASTER), (False, ofp.NX_ROLE_SLAVE)):
        msg = role_request(leading)
        assert isinstance(msg, parser.NXTRoleRequest) and msg.role == role
        msg.datapath = SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=1)
        msg.set_xid(9)
        msg.serialize()
        wire = bytes(msg.buf)
        assert wire[1] == ofp.OFPT_VENDOR
        assert int.from_bytes(wire[8:12], "big") == ofproto_common.NX_EXPERIMENTER_ID
        assert int.from_bytes(wire[-4:], "big") == role


def test_a_switch_without_the_nicira_extension_is_told_from_other_errors() -> None:
    request = bytes([1, ofp.OFPT_VENDOR, 0, 20])
    assert refuses_role(ofp.OFPET_BAD_REQUEST, request)
    assert not refuses_role(ofp.OFPET_FLOW_MOD_FAILED, request)
    assert not refuses_role(ofp.OFPET_BAD_REQUEST, bytes([1, ofp.OFPT_FLOW_MOD, 0, 72]))
    assert not refuses_role(ofp.OFPET_BAD_REQUEST, b"")


def test_a_slave_hears_packet_ins_and_port_status_but_no_flow_removals() -> None:
    msg = async_config()
    assert isinstance(msg, parser.NXTSetAsyncConfig)
    both = (1 << ofp.OFPR_NO_MATCH) | (1 << ofp.OFPR_ACTION)
    assert msg.packet_in_mask == [both, both] and msg.flow_removed_mask[1] == 0
    assert msg.port_status_mask[1] == 0b111
    msg.datapath = SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=1)
    msg.set_xid(3)
    msg.serialize()
    assert bytes(msg.buf)[1] == ofp.OFPT_VENDOR
    assert refused_as_slave(ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_EPERM)
    assert not refused_as_slave(ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPBRC_EPERM)


def test_a_successor_core_keeps_the_fabric_forgets_the_decisions_and_waits_for_the_agents() -> None:
    clock = Clock()
    old = MetaFlowCore(Settings(heartbeat_timeout_s=1.5), clock)
    old.handle(SwitchUp(1))
    old.handle(LinkUp(1, 1, 2, 1))
    ids_before = old.next_id()
    clock.now = 200.0
    new = old.successor(term=6)
    assert new.inventory is old.inventory and 1 in new.inventory.dpids and new.inventory.links
    assert new.world.term == 6 and new.registry.servers == {} and new.tree is None
    assert new.last_change == old.last_change and new.build_after == 201.5
    assert new.next_id() > ids_before


def test_a_standby_takes_the_leaders_hosts_and_links_where_it_has_none_of_its_own() -> None:
    clock = Clock()
    core = MetaFlowCore(Settings(), clock)
    for dpid in (3, 4):
        core.handle(SwitchUp(dpid))
    core.inventory.learn("10.0.0.1", "00:00:00:00:00:01", 3, 1)   # heard its ARP itself
    before = core.last_change
    clock.now = 150.0
    seen = FabricSeen((("10.0.0.1", "00:00:00:00:00:01", 9, 9), ("10.0.0.2", "00:00:00:00:00:02", 4, 2)),
                      ((3, 5, 4, 5), (3, 6, 7, 1)))   # switch 7 has not connected here: not taken
    assert core.handle(seen) == []
    assert core.inventory.hosts["10.0.0.1"].dpid == 3 and core.inventory.hosts["10.0.0.2"].port == 2
    assert core.inventory.links == {(3, 5, 4, 5)}
    core.handle(SwitchUp(7))   # connects later: its link is taken then
    assert core.inventory.links == {(3, 5, 4, 5), (3, 6, 7, 1)}
    assert core.last_change == 150.0 > before
    assert core.fabric_seen() == FabricSeen((("10.0.0.1", "00:00:00:00:00:01", 3, 1),
                                             ("10.0.0.2", "00:00:00:00:00:02", 4, 2)),
                                            ((3, 5, 4, 5), (3, 6, 7, 1)))
    assert FabricSeen.from_json(seen.to_json()) == seen
    named = FabricSeen(seen.hosts, seen.links, ("p0e0h0", "p0e0h1"))
    assert FabricSeen.from_json(named.to_json()) == named
    assert FabricSeen.from_json('{"hosts": [], "links": []}').servers == ()   # an older leader's
    with pytest.raises(TypeError):
        FabricSeen.from_json('{"hosts": [], "links": [], "servers": "p0e0h0"}')
    for bad in ('[]', '{"hosts": [["10.0.0.2", "m", 4]], "links": []}', '{"hosts": []}', 'nope'):
        with pytest.raises((ValueError, TypeError, KeyError)):
            FabricSeen.from_json(bad)
    clock.now = 160.0
    core.handle(seen)   # nothing new: the topology stays settled
    assert core.last_change == 150.0


def test_the_leadership_flags_are_checked_and_the_advertised_url_defaults_to_the_rest_address(
        tmp_path: Path) -> None:
    secret = str(write_secret(tmp_path / "secret"))

    def parse(*flags: str) -> Settings:
        argv = ["--secret-file", secret, "--rest-host", "10.0.0.9", *flags]
        args = controller_settings.parser().parse_args(argv)
        return controller_settings.from_args(args)

    alone = parse()
    assert alone.etcd == () and alone.rest_url == "http://10.0.0.9:8080"
    ha = parse("--etcd", "http://a:2379, http://b:2379/", "--etcd-prefix", "/mf/", "--advertise-url",
               "http://c1:8080/")
    assert ha.etcd == ("http://a:2379", "http://b:2379") and ha.etcd_prefix == "/mf"
    assert ha.rest_url == "http://c1:8080" and ha.lease_ttl_s == 1
    bad = [(("--etcd", "a:2379"), "--etcd"), (("--etcd", "http://a:2379", "--lease-ttl", "0"), "--lease-ttl"),
           (("--etcd-prefix", "metaflow"), "--etcd-prefix"), (("--etcd-prefix", "/"), "--etcd-prefix"),
           (("--advertise-url", "https://c1:8080"), "--advertise-url")]
    for flags, named in bad:
        with pytest.raises(InvalidArgument, match=named):
            parse(*flags)
