"""Leadership through etcd (v3, over its HTTP gateway with `etcd3gw`): the
one thread of a controller that talks to the coordination service.

- A standby reads `PREFIX/leader` every tenth of the TTL (a takeover is
  the key's expiry plus at most this). While it exists,
  its value is the leader's REST URL (what a standby's 503 names); when it
  is gone, the standby campaigns: it takes a lease of `--lease-ttl` seconds
  and, in one transaction, creates the key on that lease only if it does not
  exist. The one whose transaction succeeds leads; its term is the
  transaction's revision (etcd's revision grows with every write, so every
  later leader has a higher term).
- The leader renews the lease every third of the TTL, noting when each
  keepalive was *sent* (`Leadership.renewed`): its clock, not etcd's answer,
  bounds how long it leads. A keepalive that finds the lease gone, or that
  comes back after the bound passed, ends the leadership (the lease is
  revoked, so a standby need not wait for it to expire).
- etcd unreachable: each URL is tried in turn; the controller stays or
  becomes a standby (its bound runs out) and says so, and keeps retrying.

- The leader also keeps `PREFIX/fabric` (the hosts it located, the
  links it found and the servers in service: JSON ``{"hosts": [[ip, mac,
  dpid, port], ...], "links": [[dpid, port, dpid, port], ...], "servers":
  [name, ...]}``) current, written only while the
  leader key is still its own (a transaction on the key's create revision,
  which is the term); a standby hands what it reads (`FabricSeen`) to
  `fabric_seen`, since it hears no ARP a host sent before it started.

No protocol of ours: the key, the lease and the transaction are etcd's
own election recipe. `changed` is called after every change of leadership
(the shim wakes its decision thread to act on it).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import requests

from controller.leadership import Leadership
from controller.settings import etcd_endpoint
from controller.steps import FabricSeen

with warnings.catch_warnings():
    # etcd3gw's futurist imports eventlet if it is installed (os-ken's dependency),
    # and eventlet warns on import that it is deprecated: a line on every daemon's
    # stderr (`metaflow-controller --version` too) about threads neither we nor
    # etcd3gw's calls use.
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    from etcd3gw.client import Etcd3Client
    from etcd3gw.exceptions import Etcd3Exception
    from etcd3gw.lease import Lease

log = logging.getLogger("metaflow.controller.etcd")

API_PATH = "/v3/"
"""etcd 3.4's gateway path (given, so no discovery request is needed)."""
MIN_REQUEST_TIMEOUT_S = 0.3
STANDBY_READS = 10
"""A standby reads the leader key this many times per TTL."""


class EtcdElection:
    def __init__(self, endpoints: tuple[str, ...], prefix: str, ttl_s: int, url: str,
                 leadership: Leadership, changed: Callable[[], None],
                 fabric_seen: Callable[[FabricSeen], None] = lambda seen: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not endpoints:
            raise ValueError("an election needs at least one etcd URL")
        self.key, self.fabric_key = f"{prefix}/leader", f"{prefix}/fabric"
        self.fabric_seen = fabric_seen
        self._to_publish: FabricSeen | None = None
        self._published: FabricSeen | None = None
        self._seen_revision = 0
        self.ttl_s, self.url, self.leadership = ttl_s, url, leadership
        self.changed, self.clock = changed, clock
        self.period_s = ttl_s / 3
        """Between a leader's keepalives."""
        self.read_s = ttl_s / STANDBY_READS
        """Between a standby's reads of the leader key."""
        timeout = max(MIN_REQUEST_TIMEOUT_S, self.period_s)
        self._clients = [Etcd3Client(*etcd_endpoint(u), timeout=timeout, api_path=API_PATH)
                         for u in endpoints]
        self._at = 0
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop campaigning; a leader gives its lease back, so a standby takes over at once."""
        self._stop.set()
        self._thread.join(timeout=2 * self.period_s + 1)
        if self._lease is not None:
            self._give_up("stopping")

    def publish(self, seen: FabricSeen) -> None:
        """The leader's hosts and links, written at its next renewal if they changed."""
        self._to_publish = seen

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except (Etcd3Exception, requests.RequestException, ValueError, KeyError) as exc:
                self._unreachable(exc)
            self._stop.wait(self.period_s if self._lease is not None else self.read_s)

    def _round(self) -> None:
        client = self._clients[self._at]
        if self._lease is not None:
            self._renew(self._lease)
            if self._lease is not None:
                self._publish(client)
            return
        self._read_fabric(client)
        found = client.get(self.key)
        if found:
            leader = _text(found[0])
            if leader != self.leadership.leader_url or not self.leadership.etcd_reachable:
                log.info("standby: the leader is %s", leader)
            self.leadership.follow(leader)
            return
        self.leadership.follow(None)
        sent = self.clock()
        lease = client.lease(self.ttl_s)
        key = _encode(self.key)
        answer: dict[str, Any] = dict(client.transaction({
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": _encode(self.url), "lease": lease.id}}],
            "failure": []}))
        if not answer.get("succeeded"):
            lease.revoke()   # another controller was quicker: follow it next round
            return
        term = int(answer["header"]["revision"])
        self._lease = lease
        self.leadership.elected(term, sent, self.url)
        log.warning("leading at term %d (lease %x, TTL %d s)", term, lease.id, self.ttl_s)
        self.changed()

    def _publish(self, client: Etcd3Client) -> None:
        seen = self._to_publish
        if seen is None or seen == self._published:
            return
        key = _encode(self.key)
        answer: dict[str, Any] = dict(client.transaction({
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE",
                         "create_revision": self.leadership.term}],
            "success": [{"request_put": {"key": _encode(self.fabric_key), "value": _encode(seen.to_json())}}],
            "failure": []}))
        if answer.get("succeeded"):
            self._published = seen

    def _read_fabric(self, client: Etcd3Client) -> None:
        found = client.get(self.fabric_key, metadata=True)
        if not found:
            return
        value, meta = found[0]
        revision = int(meta.get("mod_revision", 0))
        if revision == self._seen_revision:
            return
        self._seen_revision = revision
        try:
            self.fabric_seen(FabricSeen.from_json(_text(value)))
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("%s: not {hosts: [[ip, mac, dpid, port]...], links: [[dpid, port, dpid, port]...]} "
                        "(%s); ignored", self.fabric_key, exc)

    def _renew(self, lease: Lease) -> None:
        sent = self.clock()
        left = lease.refresh()
        if left <= 0:
            self._lose("etcd says the lease expired")
        elif not self.leadership.leads():
            # Answered only after our bound passed (a pause, a slow etcd): etcd may
            # still hold the key, but we may no longer act; give it back.
            self._give_up("the lease ran out on this controller's clock before etcd renewed it")
        else:
            self.leadership.renewed(sent)

    def _give_up(self, why: str) -> None:
        lease = self._lease
        if lease is not None:
            try:
                lease.revoke()
            except (Etcd3Exception, requests.RequestException) as exc:
                log.info("could not revoke the lease (it expires by itself): %s", exc)
        self._lose(why)

    def _lose(self, why: str) -> None:
        self._lease = None
        self.leadership.lost(why)
        log.warning("no longer leading: %s", why)
        self.changed()

    def _unreachable(self, exc: Exception) -> None:
        where = self._clients[self._at]
        self._at = (self._at + 1) % len(self._clients)
        was = self.leadership.etcd_reachable
        self.leadership.unreachable(f"{where.host}:{where.port}: {type(exc).__name__}")
        if was:
            log.warning("etcd at %s:%d unreachable (%s: %s); %s", where.host, where.port,
                        type(exc).__name__, exc,
                        "leading until the lease runs out" if self.leadership.leads() else "standby")
        if self._lease is not None and not self.leadership.leads():
            self._lose("the lease ran out while etcd was unreachable")
        else:
            self.changed()


def _encode(text: str) -> str:
    """A key or value as the gateway's JSON carries it (base64)."""
    return base64.b64encode(text.encode()).decode()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
