"""Sites and the four strategies (`client_lib.sites`, issue 29): layouts are
checked, every copy of an entry lies in its site's prefix, and a reader in
any site finds what a writer in any site wrote, without a lookup (after
the propagation, for ``replicated``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_lib.cidr import Block
from client_lib.constants import SITE_SYNC_PORT
from client_lib.errors import InvalidArgument
from client_lib.mdid import mdid_of_key
from client_lib.sites import Site, SiteLayout, Strategies, Strategy, layout_from_table, parse_site, place

SPACE = Block.parse("100.64.0.0/10")


@st.composite
def layouts(draw: st.DrawFn) -> SiteLayout:
    """The space cut into 1 to 8 prefixes of any sizes, named in a random order."""
    blocks = [SPACE]
    for _ in range(draw(st.integers(0, 7))):
        block = blocks.pop(draw(st.integers(0, len(blocks) - 1)))
        blocks += block.halves()
    order = draw(st.permutations(range(len(blocks))))
    return SiteLayout(SPACE, tuple(Site(f"s{i}", block) for i, block in zip(order, blocks, strict=True)))


keys = st.binary(min_size=1, max_size=40).map(lambda raw: b"/" + raw.replace(b"\0", b"_"))


def test_a_site_is_a_name_and_a_prefix() -> None:
    assert parse_site("eu-north=100.64.0.0/12") == Site("eu-north", Block.parse("100.64.0.0/12"))
    for bad, why in (("eu-north", "NAME=CIDR"), ("EU=100.64.0.0/12", "site name"),
                     ("=100.64.0.0/12", "site name"), ("eu=100.64.0.1/12", "eu"), ("eu=nowhere", "eu")):
        with pytest.raises(InvalidArgument, match=why):
            parse_site(bad)


def test_a_layout_covers_the_space_once_with_unique_names() -> None:
    low, high = SPACE.halves()
    quarter = high.halves()[0]
    cases = [((), "at least one site"),
             ((Site("a", low), Site("a", high)), "named twice: a"),
             ((Site("a", low), Site("b", SPACE)), "overlaps"),
             ((Site("a", low),), "to no site \\(from 100.96.0.0\\)"),
             ((Site("a", high),), "to no site \\(from 100.64.0.0\\)"),
             ((Site("a", low), Site("b", quarter)), "to no site \\(from 100.112.0.0\\)"),
             ((Site("a", Block.parse("10.0.0.0/10")),), "not inside the space")]
    for sites, why in cases:
        with pytest.raises(InvalidArgument, match=why):
            SiteLayout(SPACE, sites)
    layout = SiteLayout(SPACE, (Site("b", high), Site("a", low)))
    assert [s.name for s in layout.sites] == ["a", "b"] and layout.named("b").prefix == high
    with pytest.raises(InvalidArgument, match="no site named 'c'"):
        layout.named("c")


def test_equal_sites_split_the_space_by_its_top_bits() -> None:
    layout = SiteLayout.equal(SPACE, ["ne", "we", "scus", "eus"])
    assert [str(s.prefix) for s in layout.sites] == ["100.64.0.0/12", "100.80.0.0/12", "100.96.0.0/12",
                                                     "100.112.0.0/12"]
    assert [s.name for s in layout.sites] == ["ne", "we", "scus", "eus"]
    assert SiteLayout.equal(SPACE, ["only"]).sites == (Site("only", SPACE),)
    for names in ([], ["a", "b", "c"]):
        with pytest.raises(InvalidArgument, match="cannot split the space equally"):
            SiteLayout.equal(SPACE, names)
    with pytest.raises(InvalidArgument, match="too small"):
        SiteLayout.equal(Block.parse("10.0.0.0/31"), ["a", "b", "c", "d"])


@given(layout=layouts(), key=keys)
def test_an_entry_has_one_home_and_one_id_in_every_site(layout: SiteLayout, key: bytes) -> None:
    home, ident = layout.home_of(key)
    assert ident == mdid_of_key(key, SPACE) and home.prefix.contains(ident)
    for site in layout.sites:
        assert site.prefix.contains(layout.id_in(key, site))
    assert layout.id_in(key, home) == ident


@given(layout=layouts(), key=keys, data=st.data())
def test_every_copy_is_in_its_site_and_every_reader_finds_every_writer(layout: SiteLayout, key: bytes,
                                                                      data: st.DataObject) -> None:
    names = [site.name for site in layout.sites]
    central = data.draw(st.sampled_from(names))
    home, ident = layout.home_of(key)
    for strategy in Strategy:
        plans = {name: place(layout, strategy, key, name, central) for name in names}
        for name, plan in plans.items():
            copies = plan.writes + plan.reads + plan.propagated
            assert all(layout.named(site).prefix.contains(at) for site, at in copies)
            assert len({site for site, _ in plan.writes}) == len(plan.writes)   # one copy per site
            if strategy is Strategy.CENTRALIZED:
                assert plan.writes == plan.reads == ((central, layout.id_in(key, layout.named(central))),)
            elif strategy is Strategy.REPLICATED:
                assert plan.writes == plan.reads and [s for s, _ in plan.writes] == [name]
                assert sorted(s for s, _ in plan.writes + plan.propagated) == sorted(names)
            elif strategy is Strategy.DECENTRALIZED:
                assert plan.writes == plan.reads == ((home.name, ident),)
            else:
                assert plan.writes[-1] == plan.reads[-1] == (home.name, ident)   # home last
                assert plan.reads[0][0] == name                                   # local first
                assert len(plan.writes) == (1 if name == home.name else 2)
        for writer in names:
            written = set(plans[writer].writes) | set(plans[writer].propagated)
            for reader in names:
                assert written & set(plans[reader].reads), (strategy, writer, reader)


def test_the_centralized_strategy_needs_its_site() -> None:
    layout = SiteLayout.equal(SPACE, ["a", "b"])
    with pytest.raises(InvalidArgument, match="needs its site"):
        place(layout, Strategy.CENTRALIZED, b"/x", "a")
    with pytest.raises(InvalidArgument, match="no site named 'z'"):
        place(layout, Strategy.DECENTRALIZED, b"/x", "z")


@given(key=keys)
def test_at_home_the_sites_own_hash_is_the_global_one_in_a_128_bit_space_too(key: bytes) -> None:
    space = Block.parse("fd00::/8")
    layout = SiteLayout.equal(space, ["a", "b", "c", "d", "e", "f", "g", "h"])
    home, ident = layout.home_of(key)
    assert layout.id_in(key, home) == ident == mdid_of_key(key, space)


def test_a_layout_table_gives_the_sites_and_their_agents_or_says_what_is_wrong() -> None:
    table = {"space": str(SPACE), "site": [
        {"name": "west", "prefix": "100.96.0.0/11", "sync": "10.0.0.9:7000"},
        {"name": "east", "prefix": "100.64.0.0/11"}]}
    layout = layout_from_table(table)
    assert [site.name for site in layout.sites] == ["east", "west"]
    assert layout.named("west").sync == ("10.0.0.9", 7000) and layout.named("east").sync is None
    assert layout_from_table({**table, "site": [{"name": "w", "prefix": "100.64.0.0/10",
                                                   "sync": "h"}]}).named("w").sync == ("h", SITE_SYNC_PORT)
    for bad, why in (({"site": []}, "needs its space"),
                     ({**table, "space": "nowhere"}, "space"),
                     ({**table, "sites": []}, "unknown key 'sites'"),
                     ({**table, "site": {"name": "east"}}, r"\[\[site\]\] tables"),
                     ({**table, "site": [{"name": "east"}]}, "site 1: needs a name and a prefix"),
                     ({**table, "site": [{"name": "e", "prefix": str(SPACE), "port": 1}]},
                      "unknown key 'port'"),
                     ({**table, "site": [{"name": "e", "prefix": str(SPACE), "sync": "h:0"}]}, "e's sync"),
                     ({**table, "site": table["site"][:1]}, "leave part of the space")):
        with pytest.raises(InvalidArgument, match=why):
            layout_from_table(bad)


def test_strategies_by_prefix_take_the_longest_whole_component_match() -> None:
    rules = Strategies.parse(["/=decentralized", "/scratch=local-replication", "/scratch/shared=centralized"])
    assert rules.of(b"/a/b") is Strategy.DECENTRALIZED
    assert rules.of(b"/scratch") is Strategy.LOCAL_REPLICATION
    assert rules.of(b"/scratch/x") is Strategy.LOCAL_REPLICATION
    assert rules.of(b"/scratchpad/x") is Strategy.DECENTRALIZED
    assert rules.of(b"/scratch/shared/y") is Strategy.CENTRALIZED
    assert rules.uses(Strategy.CENTRALIZED) and not rules.uses(Strategy.REPLICATED)
    for bad, why in ((["/scratch=decentralized"], "default"), (["/=decentralized", "/=centralized"], "two"),
                     (["/=nearby"], "no strategy 'nearby'"), (["scratch=decentralized"], "/PREFIX=STRATEGY")):
        with pytest.raises(InvalidArgument, match=why):
            Strategies.parse(bad)


@given(keys, st.sampled_from(list(Strategy)), st.sampled_from(list(Strategy)))
def test_a_key_takes_its_prefix_rule_or_the_default(key: bytes, inner: Strategy, default: Strategy) -> None:
    rules = Strategies(((b"/", default), (b"/p", inner)))
    under = key == b"/p" or key.startswith(b"/p/")
    assert rules.of(key) is (inner if under else default)
