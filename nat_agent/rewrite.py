"""The agent's MetaDataID rewrite: rules plus, in nfqueue mode, the queue worker.

    with Rewriter("kernel", DEFAULT_SPACE, "10.0.0.3", tag="metaflow-agent:s3"):
        ...  # requests to any mdid on :9000 reach 10.0.0.3:9000

`start` replaces whatever rules carry our tag (a previous run may have been
killed and left them), so restarting never duplicates rules; `stop` removes
exactly the rules with our tag, and is safe to call twice. In ``local``
mode the same goes for the route and policy rules that make the space
local (`nat_agent.anyip`), found again by the table the tag names. Mode
``none`` touches nothing, so it works without root or iptables.
"""

from __future__ import annotations

from types import TracebackType

from client_lib.cidr import Block
from client_lib.constants import METAFLOW_PORT
from nat_agent import anyip, iptables
from nat_agent.anyip_plan import anyip_plan
from nat_agent.nfqueue import NfqueueWorker
from nat_agent.rules import DEFAULT_QUEUE_NUM, DEFAULT_TAG, rewrite_rules


class Rewriter:
    """Installs the rewrite for `mode` and removes it again.

    Arguments are checked here, before anything is touched. In nfqueue mode
    the worker binds the queue before our rules exist, so no request is
    queued while nobody reads the queue.
    """

    def __init__(self, mode: str, space: Block, own_ip: str | None,
                 port: int = METAFLOW_PORT, queue_num: int = DEFAULT_QUEUE_NUM,
                 tag: str = DEFAULT_TAG, interface: str | None = None) -> None:
        self.mode = mode
        self.rules = rewrite_rules(mode, space, own_ip, port, queue_num, tag)
        self.tag = tag
        self._anyip = None
        if mode == "local":
            if interface is None:
                raise ValueError("local mode needs the data interface the requests arrive on")
            self._anyip = anyip_plan(space, interface, port, tag)
        # own_ip is an IPv4 address in nfqueue mode: rewrite_rules refused anything else
        self._worker = (NfqueueWorker(space, own_ip, port, queue_num)
                        if mode == "nfqueue" and own_ip is not None else None)
        self._installed = False

    def start(self) -> None:
        """Install the rewrite (replacing rules left with our tag); call once.
        On failure nothing of ours is left installed or running."""
        if self.mode == "none":
            return
        # A killed predecessor's rules would feed the queue before our worker
        # has configured it; install() below would replace them anyway.
        iptables.remove(self.tag)
        if self._worker is not None:
            self._worker.start()
        try:
            if self._anyip is not None:
                anyip.install(self._anyip)
            iptables.install(self.rules, self.tag)
        except BaseException:
            if self._worker is not None:
                self._worker.stop()
            if self._anyip is not None:
                anyip.remove(self._anyip)
            raise
        self._installed = True

    def stop(self) -> None:
        """Remove our rules first (nothing new is queued), then stop the worker."""
        if self.mode == "none":
            return
        try:
            iptables.remove(self.tag)
            if self._anyip is not None:
                anyip.remove(self._anyip)
            self._installed = False
        finally:
            if self._worker is not None:
                self._worker.stop()

    def stats(self) -> dict[str, object]:
        """Mode, installed rule count (iptables and, in local mode, policy
        rules) and, in nfqueue mode, the worker's
        counters (`nat_agent.nfqueue.COUNTERS`, `alive`, `us_per_packet`)."""
        installed = len(self.rules) + (len(self._anyip.rules()) if self._anyip else 0)
        stats: dict[str, object] = {"mode": self.mode, "rules": installed if self._installed else 0}
        if self._worker is not None:
            stats.update(self._worker.stats())
        return stats

    def __enter__(self) -> Rewriter:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
