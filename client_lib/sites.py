"""Several sites (datacenters), each a MetaFlow fabric, sharing one ID space
(issue 29), and where each of the multi-site paper's four strategies puts an
entry. Pure data and arithmetic: no I/O.

**The layout.** Every site owns one CIDR block of the MetaDataID space, its
*prefix*; the prefixes are disjoint and cover the space. Inside a site its
fabric routes its prefix as a single-site deployment routes the whole space;
its border routes every other site's prefix out of its WAN link, so a
request for an ID homed elsewhere is carried there by the network, with no
lookup. Sites of equal weight split the space by the ID's top bits
(`SiteLayout.equal`); unequal ones give a table (``NAME=CIDR`` each,
`parse_site`), a site's share of the entries being its prefix's share of
the space, since an entry's ID is a uniform hash of its name.

**An entry's ID in a site** (`SiteLayout.id_in`) is the hash of its key
over that site's prefix (`client_lib.mdid.mdid_of_key`). In its *home*, the
site whose prefix holds its global ID (the hash over the whole space), the
two are the same ID: a prefix is an aligned block, so the global hash's low
bits are the site's. So a site's agents run with the site's prefix as their
``--space`` and compute every copy's ID themselves, as a single site does:
every copy of an entry is one record at one ID, served and replicated
inside its site as any record is.

**The strategies** (`place`; Pineda-Morales et al., the multi-site workflow
paper, section IV):

* ``centralized``: every entry in one site (`central`), read and written
  there from everywhere. One copy: what a reader sees is what a single
  MetaFlow fabric shows (linearizable), at a WAN round trip from other sites.
* ``replicated``: written in the writer's site only and propagated lazily to
  every other site by an agent, in order per key; read in the reader's
  site. A reader sees its own site's writes at once and another site's
  after the propagation delay: eventual consistency, with no write lost
  while a WAN link is down (they wait in the writer's site).
* ``decentralized``: at its home, by hash, for reads and writes: one copy,
  linearizable, remote for all but 1/n of the entries.
* ``local-replication``: written in the writer's site first, then at home
  (once, if that is the writer's site); read in the reader's site first,
  then at home. A reader in the writer's site, or at home, sees the write
  once it returned; one elsewhere finds it at home. A later write from
  another site updates home and that site, not the first writer's local
  copy, which that site's readers keep seeing until it is replaced: as in
  the paper, entries are written once and read many times.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from client_lib.cidr import Block
from client_lib.client import Destination, host_port
from client_lib.constants import SITE_SYNC_PORT
from client_lib.errors import InvalidArgument
from client_lib.mdid import mdid_of_key, normalize_path

SITE_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
"""A site's name: what configuration files, metrics and logs call it."""


@dataclass(frozen=True)
class Site:
    """One site: its name, the block of the ID space it is home to, and
    where its propagation agent listens (needed by ``replicated`` only)."""

    name: str
    prefix: Block
    sync: Destination | None = None


def parse_site(text: str) -> Site:
    """``NAME=CIDR`` (``--site``): one row of a layout's table."""
    name, sep, cidr = text.partition("=")
    if not sep:
        raise InvalidArgument(f"a site is NAME=CIDR, not {text!r}")
    name = name.strip()
    if not SITE_NAME.fullmatch(name):
        raise InvalidArgument(f"site name {name!r}: lower-case letters, digits and dashes, "
                              "starting with a letter, at most 32")
    try:
        prefix = Block.parse(cidr.strip())
    except ValueError as exc:
        raise InvalidArgument(f"site {name}: {exc}") from None
    return Site(name, prefix)


@dataclass(frozen=True)
class SiteLayout:
    """The sites of one deployment, checked: names unique, prefixes inside
    `space`, disjoint and covering it."""

    space: Block
    sites: tuple[Site, ...]

    def __post_init__(self) -> None:
        if not self.sites:
            raise InvalidArgument("a layout needs at least one site")
        names = [site.name for site in self.sites]
        if len(set(names)) != len(names):
            twice = sorted(n for n in names if names.count(n) > 1)[0]
            raise InvalidArgument(f"a site is named twice: {twice}")
        ordered = sorted(self.sites, key=lambda site: site.prefix.first)
        for site in ordered:
            if not self.space.covers(site.prefix) or site.prefix.width != self.space.width:
                raise InvalidArgument(f"site {site.name}'s prefix {site.prefix} is not inside the space "
                                      f"{self.space}")
        expected = self.space.first   # the first ID no site before this one holds
        for site in ordered:
            if site.prefix.first < expected:
                raise InvalidArgument(f"site {site.name}'s prefix {site.prefix} overlaps another's")
            if site.prefix.first > expected:
                break
            expected = site.prefix.last + 1
        if expected != self.space.last + 1:
            raise InvalidArgument(f"the sites leave part of the space {self.space} to no site "
                                  f"(from {self.space.address(expected)})")
        object.__setattr__(self, "sites", tuple(ordered))

    @classmethod
    def equal(cls, space: Block, names: Sequence[str]) -> SiteLayout:
        """`names` in order, each home to an equal part of `space`, split by
        the ID's top bits: their number must be a power of two (else give a
        table of prefixes)."""
        count = len(names)
        bits = count.bit_length() - 1
        if count == 0 or count != 1 << bits:
            raise InvalidArgument(f"{count} sites cannot split the space equally by its top bits: "
                                  "give each site's prefix (NAME=CIDR)")
        if space.plen + bits > space.width:
            raise InvalidArgument(f"the space {space} is too small for {count} sites")
        blocks = [space]
        for _ in range(bits):
            blocks = [half for block in blocks for half in block.halves()]
        sites = (parse_site(f"{name}={block}") for name, block in zip(names, blocks, strict=True))
        return cls(space, tuple(sites))

    def named(self, name: str) -> Site:
        for site in self.sites:
            if site.name == name:
                return site
        raise InvalidArgument(f"no site named {name!r} (the sites: {', '.join(s.name for s in self.sites)})")

    def site_of(self, ident: int) -> Site:
        """The site whose prefix holds the ID."""
        for site in self.sites:
            if site.prefix.contains(ident):
                return site
        raise InvalidArgument(f"{ident} is not in the space {self.space}")

    def home_of(self, key: bytes) -> tuple[Site, int]:
        """A normalized key's home site and global ID."""
        ident = mdid_of_key(key, self.space)
        return self.site_of(ident), ident

    @staticmethod
    def id_in(key: bytes, site: Site) -> int:
        """The ID of a normalized key's copy in `site` (at home: its global ID)."""
        return mdid_of_key(key, site.prefix)


def layout_from_table(table: Mapping[str, Any]) -> SiteLayout:
    """A layout as a configuration file gives it (`client_lib.site_client.read_layout`)::

        space = "100.64.0.0/10"
        [[site]]
        name = "east"
        prefix = "100.64.0.0/11"
        sync = "10.1.0.9"          # HOST[:PORT] of its propagation agent; optional

    `InvalidArgument` naming the row and the key for anything wrong."""
    unknown = set(table) - {"space", "site"}
    if unknown:
        raise InvalidArgument(f"unknown key {sorted(unknown)[0]!r} (a layout has space and [[site]] rows)")
    try:
        space = Block.parse(str(table["space"]))
    except KeyError:
        raise InvalidArgument("a layout needs its space") from None
    except ValueError as exc:
        raise InvalidArgument(f"space: {exc}") from None
    rows = table.get("site")
    if not isinstance(rows, list) or not all(isinstance(row, Mapping) for row in rows):
        raise InvalidArgument("a layout lists its sites as [[site]] tables")
    sites = []
    for number, row in enumerate(rows, 1):
        extra = set(row) - {"name", "prefix", "sync"}
        if extra or "name" not in row or "prefix" not in row:
            what = f"unknown key {sorted(extra)[0]!r}" if extra else "needs a name and a prefix"
            raise InvalidArgument(f"site {number}: {what}")
        site = parse_site(f"{row['name']}={row['prefix']}")
        sync = row.get("sync")
        if sync is not None:
            try:
                site = Site(site.name, site.prefix, host_port(sync, SITE_SYNC_PORT))
            except InvalidArgument as exc:
                raise InvalidArgument(f"site {site.name}'s sync: {exc}") from None
        sites.append(site)
    return SiteLayout(space, tuple(sites))


class Strategy(enum.Enum):
    """The paper's four strategies (see the module's docstring)."""

    CENTRALIZED = "centralized"
    REPLICATED = "replicated"
    DECENTRALIZED = "decentralized"
    LOCAL_REPLICATION = "local-replication"


@dataclass(frozen=True)
class Strategies:
    """A strategy per namespace prefix: an entry takes the rule of the
    longest prefix of its path (whole components: ``/scratch`` covers
    ``/scratch/a`` and not ``/scratchpad``); ``/`` is the default and must
    be given. ``Strategies.parse(["/=decentralized", "/scratch=local-replication"])``."""

    rules: tuple[tuple[bytes, Strategy], ...]

    def __post_init__(self) -> None:
        prefixes = [prefix for prefix, _ in self.rules]
        if b"/" not in prefixes:
            raise InvalidArgument("the strategies need a default, a rule for /")
        if len(set(prefixes)) != len(prefixes):
            twice = sorted(p for p in prefixes if prefixes.count(p) > 1)[0]
            raise InvalidArgument(f"two strategies for {twice.decode(errors='replace')}")
        object.__setattr__(self, "rules", tuple(sorted(self.rules, key=lambda rule: -len(rule[0]))))

    @classmethod
    def single(cls, strategy: Strategy) -> Strategies:
        return cls(((b"/", strategy),))

    @classmethod
    def parse(cls, texts: Sequence[str]) -> Strategies:
        """``PREFIX=STRATEGY`` each (a prefix is an absolute path)."""
        rules = []
        for text in texts:
            prefix, sep, name = text.partition("=")
            if not sep or not prefix.startswith("/"):
                raise InvalidArgument(f"a strategy rule is /PREFIX=STRATEGY, not {text!r}")
            try:
                strategy = Strategy(name.strip())
            except ValueError:
                raise InvalidArgument(f"no strategy {name.strip()!r} (the strategies: "
                                      f"{', '.join(s.value for s in Strategy)})") from None
            rules.append((normalize_path(prefix.strip()), strategy))
        return cls(tuple(rules))

    def of(self, key: bytes) -> Strategy:
        """The strategy of a normalized key."""
        for prefix, strategy in self.rules:
            if prefix == b"/" or key == prefix or key.startswith(prefix + b"/"):
                return strategy
        raise AssertionError("unreachable: / matches every key")

    def uses(self, strategy: Strategy) -> bool:
        return any(s is strategy for _, s in self.rules)


Copy = tuple[str, int]
"""A copy of an entry: the site's name and the entry's ID there."""


@dataclass(frozen=True)
class Placement:
    """Where one entry goes under a strategy, for one client's site: the
    copies a write makes (in order, each before the write returns), the
    copies a read tries (in order; the first that holds the entry answers),
    and the copies the sites' agent writes later (``replicated``)."""

    writes: tuple[Copy, ...]
    reads: tuple[Copy, ...]
    propagated: tuple[Copy, ...] = ()


def place(layout: SiteLayout, strategy: Strategy, key: bytes, local: str,
          central: str | None = None) -> Placement:
    """Where `key` (normalized) goes for a client in site `local`; `central`
    names the site of ``centralized`` (required for it, ignored otherwise)."""
    here = layout.named(local)
    if strategy is Strategy.CENTRALIZED:
        if central is None:
            raise InvalidArgument("the centralized strategy needs its site")
        site = layout.named(central)
        only = ((site.name, layout.id_in(key, site)),)
        return Placement(only, only)
    if strategy is Strategy.REPLICATED:
        mine = ((here.name, layout.id_in(key, here)),)
        others = tuple((site.name, layout.id_in(key, site)) for site in layout.sites if site != here)
        return Placement(mine, mine, others)
    home, ident = layout.home_of(key)
    at_home = (home.name, ident)
    if strategy is Strategy.DECENTRALIZED or home == here:
        return Placement((at_home,), (at_home,))
    local_copy = (here.name, layout.id_in(key, here))
    return Placement((local_copy, at_home), (local_copy, at_home))
