"""Primary-backup replication, the primary's side: every write reaches the
block's replica set before the client hears it succeeded.

Why primary-backup and not a chain: the primary is the only server the
switches route a block's IDs to, so it already sees every write and every
read; sending a write to all backups at once costs one round trip however
many there are (a chain costs one per member), and a read is answered by
the primary alone, which is linearizable as long as the primary never shows
a value the set does not hold (below). Replication never touches the flow
tables: only the primary is in them.

The wire (RESP over TCP, one connection per backup, pipelined, replies in
order), to the backup's listener (`nat_agent.replica`, ``--replication``):

* ``AUTH <authority> <authorization> <name>`` first, signed as an admin
  request is (`client_lib.api.auth`: the method ``REPLICATE``, the path
  ``/<name>``, the listener's host:port, a timestamp and a nonce, so a
  stranger cannot stream and a captured handshake cannot be replayed). The
  answer ``+sig=<hex>`` is the listener's signature over the nonce: records
  go only to a holder of the cluster's secret, and nothing is sent before it;
* ``RSET <block> <epoch> <mdid> <path> <value>`` and ``RDEL <block> <epoch>
  <mdid> <path>``: a write. A backup applies it only if it holds `block` as a
  backup at exactly `epoch` with the sender as its primary; otherwise it
  answers ``-STALE <its epoch>`` (or ``-NOTHELD``, ``-SUSPENDED``, ``-ERR``).
  A synced member not yet at the write's epoch (older, or not holding the
  block) is sent it again shortly (`RESEND_S`) until the write's timeout; an
  unsynced one is not: its sync, which can begin only once it holds the
  block, copies the record;
* ``RMSET <block> <epoch> <mdid> <path> <value> [<mdid> <path> <value> ...]``:
  several SETs of one block as one write (a worker thread's turn, below),
  applied all or none, in one store batch and one sync, answered once;
* ``RBEGIN``, ``RCOPY``, ``REND``: the catch-up copy of a sync (`nat_agent.syncs`).

What a write does at a primary (`MetadataService` calls `begin`, applies
the write to its own store, `stream`, then awaits `acknowledged`):

* The key is marked as being written (`writing`) before the store is
  touched: a read of it, or another write, waits until this one has ended.
  A read thus never returns a value that may not survive.
* The write goes to every member still streamed; the client's reply waits
  for every *synced* member's ``+OK`` (unsynced ones catch up through their
  sync and are not waited for).
* A member that answers ``-STALE`` with an epoch newer than ours means this
  agent was deposed: the block is *fenced* (`Ownership.fence`) and serves
  nothing more until the controller reassigns it.
* A synced member that refuses, cannot be reached, or says nothing within
  ``--replication-timeout``: the write is not acknowledged (TRYAGAIN; the
  client retries) and the block is *degraded* (`Ownership.degrade`): the
  primary now holds a value that a member may lack, so it answers nothing
  for the block until the controller re-syncs the members under a newer
  epoch. Heartbeats report it. A silent member's connection is dropped, and
  with it every write waiting on it.

A worker thread's turn (`nat_agent._fastpath.ServiceLoop`, issue 27): the
plain SETs a worker answers in one turn of its loop to blocks with members
are kept with its turn's other writes. When the turn ends, the worker
registers their keys here (`begin_turn`, under the GIL: from then on a read
of one waits, on either path), writes the batch to this store, and posts the
stream to the event loop (`TurnWrites.landed`), which sends each block's
records as one ``RMSET`` per member and, once each is settled as any write
is, tells the worker (`Acknowledgement.done`); the worker sends the turn's
replies only then. A path a write of the event loop's holds already makes
the whole turn fail (TRYAGAIN): two writes of one key are never under way
at once, so they reach the members in the order they reached this store.

Because the workers register keys from their threads, `writing` is only
ever read here whole by a copy (`list(...)`, which the GIL makes atomic),
never iterated while another thread may add to it.

A set of one (r=1) costs nothing of this: the service sees a held block
without peers and never calls here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from client_lib.api.auth import AUTH_HEADER, SIGNATURE_HEADER, Signer, Verifier
from client_lib.cidr import Block
from client_lib.errors import AuthError
from client_lib.resp import (
    OK,
    ErrorReply,
    ProtocolError,
    Reply,
    RespParser,
    SimpleString,
    encode_command,
)
from nat_agent.ownership import Held, Ownership, Peer, Verdict
from nat_agent.store import encode_path

log = logging.getLogger("metaflow.agent.replication")

METHOD = "REPLICATE"
"""What the handshake signs as the request method: no admin route has it, so
a signature of one protocol is never valid in the other."""

DEFAULT_TIMEOUT = 1.0
"""Seconds a synced member may take to acknowledge a write (``--replication-timeout``)."""

RESEND_S = 0.005
"""A synced member that does not hold the block at the write's epoch yet
(``-STALE`` with an older epoch, ``-NOTHELD``) is sent the write again this
much later, until the write's timeout: the controller assigns the members
of a new epoch in parallel, and the primary may start using it first."""

TURN_RECORDS = 128
"""Records of one ``RMSET``, at most (a worker's turn to one block is sent
as several beyond this); the listener's parser takes this many."""

TURN_BYTES = 1 << 20
"""Bytes of values of one ``RMSET``, at most, beyond which a turn's records
to one block go in several."""

MemberFailure = Callable[[Block, int, str, str], None]
"""``(block, epoch, member, why)``: an unsynced member failed a write streamed to it."""


# -- the handshake ---------------------------------------------------------------


def hello(signer: Signer, name: str, authority: str) -> tuple[bytes, str]:
    """The AUTH command a sender named `name` opens a connection to the
    listener at `authority` (host:port) with, and the nonce its answer must sign."""
    headers, nonce = signer.sign(authority, METHOD, "/" + name, "", b"")
    return encode_command(b"AUTH", authority, headers[AUTH_HEADER], name), nonce


def check_hello(verifier: Verifier, args: list[bytes]) -> tuple[str, SimpleString]:
    """The sender's name and the answer to send, for the arguments of an AUTH
    command; `AuthError` if it is not signed with the cluster's secret, is
    stale, replayed, or addressed to another listener."""
    if len(args) != 3:
        raise AuthError("AUTH needs <authority> <authorization> <name>", 401)
    authority, authorization, name = (a.decode("utf-8", "replace") for a in args)
    nonce = verifier.check(METHOD, "/" + name, "", {"Host": authority, AUTH_HEADER: authorization}, b"")
    return name, SimpleString(verifier.response_headers(nonce, 200, b"")[SIGNATURE_HEADER])


def check_welcome(signer: Signer, nonce: str, reply: Reply, authority: str) -> None:
    """Raise `AuthError` unless `reply` is the listener's signature over `nonce`."""
    answer = reply.value if isinstance(reply, SimpleString) else ""
    signer.check_response(nonce, 200, b"", {SIGNATURE_HEADER: answer}, f"replication listener {authority}")


def stale_epoch(reply: Reply | BaseException) -> int | None:
    """The epoch a ``-STALE <epoch>`` answer names (None for any other answer)."""
    if isinstance(reply, ErrorReply) and reply.code == "STALE" and reply.detail.isdigit():
        return int(reply.detail)
    return None


def _behind(reply: Reply | BaseException, stale: int | None, epoch: int) -> bool:
    """Whether a member refused a command only because it does not hold the
    block at `epoch` yet (its assignment is on its way)."""
    if stale is not None:
        return stale < epoch
    return isinstance(reply, ErrorReply) and reply.code == "NOTHELD"


def describe(reply: Reply | BaseException) -> str:
    if isinstance(reply, ErrorReply):
        return reply.message
    if isinstance(reply, BaseException):
        return str(reply) or type(reply).__name__
    return f"unexpected answer {reply!r:.100}"


# -- connections to members --------------------------------------------------------


class Waiter(Protocol):
    """Whoever waits for the answer to one command sent on a link."""

    def settle(self, tag: object, reply: Reply | BaseException) -> None: ...


def _endpoint(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConnectionError(f"member address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class Link:
    """The connection to one member's listener, opened when first needed and
    again after it broke. Every command's answer goes to its waiter, in order;
    a broken connection answers each outstanding command with the error."""

    def __init__(self, address: str, sender: str, signer: Signer, timeout: float) -> None:
        self.address = address
        self.sender = sender   # this agent's name, as the handshake gives it
        self.signer = signer
        self.timeout = timeout
        self.connection: _Connection | None = None

    def send(self, payload: bytes, waiter: Waiter, tag: object = None) -> None:
        connection = self.connection
        if connection is None:
            connection = self.connection = _Connection(self)
        connection.send(payload, waiter, tag)

    def reset(self, why: str) -> None:
        """Drop the connection: everything outstanding on it fails with `why`."""
        if self.connection is not None:
            self.connection.fail(ConnectionError(why))


class _Connection(asyncio.Protocol):
    """Commands are gathered and written once per turn of the event loop: under
    load, the writes of many clients go out (and are answered) in one
    system call each way instead of one per write; alone, a write waits
    for nothing but the rest of the current turn."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.waiters: deque[tuple[Waiter, object, float]] = deque()
        """Who waits for each command sent and not answered yet, in order, with
        the loop's time it was sent at (the oldest's age is the member's lag)."""
        self.outbox: list[bytes] = []
        self.ready = False          # the listener proved it holds the secret: the outbox may go
        self.flushing = False       # a flush is scheduled for the end of this turn
        self.transport: asyncio.Transport | None = None
        self.parser = RespParser()
        self.nonce = ""
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.opening = self.loop.create_task(self._open(), name=f"link-{link.address}")

    def send(self, payload: bytes, waiter: Waiter, tag: object) -> None:
        self.waiters.append((waiter, tag, self.loop.time()))
        self.outbox.append(payload)
        if self.ready and not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        if self.outbox and not self.closed:
            assert self.transport is not None
            self.transport.write(b"".join(self.outbox))
            self.outbox.clear()

    async def _open(self) -> None:
        link = self.link
        try:
            host, port = _endpoint(link.address)
            async with asyncio.timeout(link.timeout):
                transport, _ = await asyncio.get_running_loop().create_connection(lambda: self, host, port)
        except (OSError, TimeoutError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else describe(exc)
            self.fail(ConnectionError(f"cannot reach the member at {link.address}: {why}"))
            return
        if self.closed:
            transport.abort()
            return
        payload, self.nonce = hello(link.signer, link.sender, link.address)
        transport.write(payload)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's too)

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        while not self.closed:
            try:
                complete, reply = self.parser.next_reply()
            except ProtocolError as exc:
                self.fail(ConnectionError(f"the member at {self.link.address} broke the protocol: {exc}"))
                return
            if not complete:
                return
            if not self.ready:
                self._welcome(reply)
            elif self.waiters:
                waiter, tag, _ = self.waiters.popleft()
                waiter.settle(tag, reply)
            else:
                self.fail(ConnectionError(f"{self.link.address} answered a command never sent"))

    def _welcome(self, reply: Reply) -> None:
        """The listener's answer to AUTH: send what waited for it, or give up."""
        try:
            check_welcome(self.link.signer, self.nonce, reply, self.link.address)
        except AuthError as exc:
            log.error("replication to the member at %s refused: %s (%s)", self.link.address, exc,
                      describe(reply))
            self.fail(exc)
            return
        self.ready = True
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionError(f"connection to the member at {self.link.address} lost"))

    def fail(self, exc: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        if self.link.connection is self:
            self.link.connection = None
        if self.transport is not None:
            self.transport.abort()
        if not self.opening.done() and self.opening is not asyncio.current_task():
            self.opening.cancel()
        waiters, self.waiters = self.waiters, deque()
        for waiter, tag, _ in waiters:
            waiter.settle(tag, exc)


# -- writes ------------------------------------------------------------------------------


class NotReplicated(Exception):
    """A write the replica set did not acknowledge (the client gets TRYAGAIN)."""


class Write:
    """One write at this primary (the records of one command: a key's SET or
    DEL, or a turn's SETs to one block), from before it touches the store
    until every synced member acknowledged it or one failed. `done` is
    resolved then; `failure` says why it failed (None: acknowledged)."""

    __slots__ = ("idents", "paths", "held", "owed", "acked", "failure", "done", "timer", "streamed", "local",
                 "payload", "owner", "turn")

    def __init__(self, owner: Replicator, idents: Sequence[int], paths: Sequence[str],
                 turn: TurnWrites | None = None) -> None:
        self.owner = owner
        self.idents = idents
        self.paths = paths
        self.turn = turn                     # the worker's turn it is a part of, if any
        self.held: Held | None = None        # the role it was streamed under
        self.owed: set[str] = set()          # synced members yet to acknowledge
        self.acked: set[str] = set()
        self.failure: str | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.timer: asyncio.TimerHandle | None = None
        self.streamed = False
        self.local = turn is None   # this store's part is under way (the members' may end first)
        self.payload = b""  # the command streamed, for a member that was not ready for it

    @property
    def ident(self) -> int:
        """An ID of the write, whose held block is every one's."""
        return self.idents[0]

    def settle(self, tag: object, reply: Reply | BaseException) -> None:
        assert isinstance(tag, Peer)
        owner = self.owner
        if reply == OK:
            if tag.name in self.owed:
                self.owed.discard(tag.name)
                self.acked.add(tag.name)
                if not self.owed:
                    if self.timer is not None:
                        self.timer.cancel()   # the members are done; this store's part may not be
                        self.timer = None
                    if not self.local:
                        owner.finish(self, None)
            return
        held = self.held
        assert held is not None
        epoch = stale_epoch(reply)
        if epoch is not None and epoch > held.epoch:
            owner.fenced(held, tag.name, epoch)
        elif tag.name in self.owed and not self.done.done() and _behind(reply, epoch, held.epoch):
            owner.stats["resent"] += 1   # not applied there: sending it again changes nothing else
            asyncio.get_running_loop().call_later(RESEND_S, self.resend, tag)
            return
        why = f"{tag.name} did not acknowledge: {describe(reply)}"
        if tag.name in self.owed:
            owner.finish(self, why)
        elif tag.required:
            return
        elif _behind(reply, epoch, held.epoch):
            # A new member that has not heard of the set yet: the controller assigns the
            # members in parallel, and this primary streamed to it first. Nothing is lost:
            # its sync begins only once it holds the block (RBEGIN is refused before), and
            # then wipes and copies the whole block, this record included. Once the sync
            # has begun, the member holds the block at this epoch, so a refusal of this kind
            # means it was dropped from the set, which the sync's next command finds.
            owner.stats["behind_unsynced"] += 1
        else:
            owner.member_failed(held, tag.name, why)

    def resend(self, peer: Peer) -> None:
        if not self.done.done() and peer.name in self.owed:
            self.owner.link(peer).send(self.payload, self, peer)

    def expire(self) -> None:
        self.timer = None
        if self.done.done():
            return
        late = [p for p in self.held.peers if p.name in self.owed] if self.held else []
        self.owner.finish(self, f"{', '.join(p.name for p in late)} did not acknowledge within "
                                f"{self.owner.timeout:g} s")
        for peer in late:  # a silent member: whatever waits on its connection fails now
            self.owner.link(peer).reset(f"no answer from {peer.name} within {self.owner.timeout:g} s")


class Backlog(NamedTuple):
    """What a member's listener has not answered yet (`Replicator.queues`)."""

    waiting: int
    oldest_s: float


class Replicator:
    """This agent's streams to the members of the sets it is the primary of."""

    def __init__(self, ownership: Ownership, name: str, secret: bytes,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.ownership = ownership
        self.name = name
        self.timeout = timeout
        self.signer = Signer(secret)
        self.writing: dict[str, Write | TurnWrites] = {}
        """Keys with a write under way, by path: a read of one waits for it.
        Worker threads add to it (`begin_turn`): read it whole only by a copy."""
        self.stats: Counter[str] = Counter()
        self.on_member_failure: MemberFailure | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop, for the workers' turns (set by the service's lane)."""
        self.closed = False
        self._links: dict[str, Link] = {}

    def queues(self) -> dict[str, Backlog]:
        """Per member's listener (by address): the commands sent to it not
        answered yet, and for how long the oldest of them has waited (the
        member's lag, 0 when nothing waits). Read at scrape time, on the loop."""
        now = asyncio.get_running_loop().time()
        out = {}
        for address, link in self._links.items():
            waiters = link.connection.waiters if link.connection is not None else None
            out[address] = Backlog(len(waiters), now - waiters[0][2]) if waiters else Backlog(0, 0.0)
        return out

    def link(self, peer: Peer) -> Link:
        link = self._links.get(peer.address)
        if link is None:
            link = self._links[peer.address] = Link(peer.address, self.name, self.signer, self.timeout)
        return link

    # -- a write, step by step ------------------------------------------------------

    def begin(self, ident: int, path: str) -> Write | None:
        """Mark `path` as being written; call before the store is touched.
        None if a write of it is under way already (a worker's turn took it
        since the caller looked): wait for that one, then begin again."""
        write = Write(self, (ident,), (path,))
        if self.writing.setdefault(path, write) is not write:
            return None
        return write

    def stream(self, write: Write, value: bytes | None) -> None:
        """Send the write (a value, or None for a delete) to the set of the
        block as it is held now (if this store was updated first, the role
        may have changed while it was)."""
        held = self.ownership.held_at(write.ident)
        write.streamed = True
        if held is None or not held.role.primary:
            self.finish(write, "the block was reassigned during the write")
            return
        block, epoch, path = held.label, held.epoch, encode_path(write.paths[0])
        self._send(write, held, encode_command(b"RSET", block, epoch, write.ident, path, value)
                   if value is not None else encode_command(b"RDEL", block, epoch, write.ident, path))

    def _send(self, write: Write, held: Held, payload: bytes) -> None:
        """Send `payload` (the write's command) to every member of `held` still streamed."""
        write.held = held
        write.payload = payload
        for peer in held.peers:
            if peer.streamed:  # a required member is always streamed (`Ownership.update_peer`)
                if peer.required:
                    write.owed.add(peer.name)
                self.link(peer).send(payload, write, peer)
        self.stats["streamed"] += 1
        if write.owed:
            write.timer = asyncio.get_running_loop().call_later(self.timeout, write.expire)
        elif not write.local:
            self.finish(write, None)

    def failed_here(self, write: Write, exc: BaseException) -> None:
        """The store failed the write after it was streamed: the members may
        hold what this store does not, so the write fails (and with it the
        block, held back until the members are re-synced)."""
        if write.streamed:
            self.finish(write, f"this agent's store failed the write: {describe(exc)}")

    def sent(self, write: Write) -> None:
        """This store's part of the write is over: the write ends here if it
        streamed nothing (a conditional write that changed nothing) or every
        synced member has acknowledged it already."""
        write.local = False
        if not write.streamed or not write.owed:
            self.finish(write, None)

    async def acknowledged(self, write: Write) -> None:
        """Wait for the write's end; `NotReplicated` if the set did not take it."""
        if not write.done.done():
            # Shielded: if the writer's client hangs up, its command is cancelled,
            # and the write must still end (and leave `writing`) on its own.
            await asyncio.shield(write.done)
        if write.failure is not None:
            raise NotReplicated(write.failure)

    def finish(self, write: Write, failure: str | None) -> None:
        if write.done.done():
            return
        write.failure = failure
        if write.timer is not None:
            write.timer.cancel()
            write.timer = None
        if write.held is not None:
            # Before the keys are let go: no read may see what the set may lack
            # before the block is held back.
            self._consequences(write)
        for path in write.paths:
            if self.writing.get(path) is write:
                del self.writing[path]
        self.stats["acknowledged" if failure is None else "not_acknowledged"] += 1
        write.done.set_result(None)
        if write.turn is not None:
            write.turn.part_ended(failure)

    def _consequences(self, write: Write) -> None:
        """Whether the block must be held back: the write failed in the epoch
        it was sent in, or the block moved to a newer epoch meanwhile and a
        member synced in it did not acknowledge the write."""
        sent = write.held
        assert sent is not None
        current = self.ownership.held_at(write.ident)
        if current is None or not current.role.primary:
            return
        if current.epoch == sent.epoch:
            if write.failure is not None:
                self._degrade(sent.block, sent.epoch, write.failure)
        elif any(p.required and p.name not in write.acked for p in current.peers):
            self._degrade(current.block, current.epoch, write.failure or
                          "a write sent in the previous epoch lacks a member's acknowledgement")

    def _degrade(self, block: Block, epoch: int, why: str) -> None:
        for part in self.ownership.degrade(block, epoch):
            self.stats["degraded"] += 1
            log.warning("%s (epoch %d) degraded: %s; it answers TRYAGAIN until the controller "
                        "re-syncs its members under a newer epoch", part, epoch, why)

    def fenced(self, held: Held, member: str, newer: int) -> None:
        for part in self.ownership.fence(held.block, newer):
            self.stats["fenced"] += 1
            log.warning("%s fenced: %s holds it at epoch %d, newer than ours (%d); this agent no "
                        "longer serves it", part, member, newer, held.epoch)

    def member_failed(self, held: Held, member: str, why: str) -> None:
        if self.on_member_failure is not None:
            self.on_member_failure(held.block, held.epoch, member, why)

    async def quiesce(self, blocks: Iterable[Block]) -> None:
        """Wait until no write to `blocks` is under way (each ends within the timeout)."""
        blocks = list(blocks)
        while True:
            busy = {w for w in list(self.writing.values())
                    if any(block.contains(ident) for block in blocks for ident in w.idents)}
            if not busy:
                return
            await asyncio.wait([w.done for w in busy])

    # -- requests with a plain answer (syncs) --------------------------------------------

    async def call(self, held: Held, peer: Peer, payloads: list[bytes], timeout: float) -> None:
        """Send commands about `held` to a member and wait for all their
        answers; `NotReplicated` if one is not ``+OK`` (and the block is fenced
        if the member holds it at a newer epoch)."""
        replies = _Replies(len(payloads))
        link = self.link(peer)
        for payload in payloads:
            link.send(payload, replies)
        try:
            async with asyncio.timeout(timeout):
                await replies.done
        except TimeoutError:
            link.reset(f"no answer from {peer.name} within {timeout:g} s")
            raise NotReplicated(f"{peer.name} did not answer within {timeout:g} s") from None
        if replies.error is not None:
            newer = stale_epoch(replies.error)
            if newer is not None and newer > held.epoch:
                self.fenced(held, peer.name, newer)
            raise NotReplicated(f"{peer.name}: {describe(replies.error)}")

    async def close(self) -> None:
        self.closed = True
        for link in self._links.values():
            link.reset("the agent is shutting down")
        for write in set(list(self.writing.values())):
            if isinstance(write, TurnWrites):
                write.end("the agent is shutting down")
            else:
                self.finish(write, "the agent is shutting down")

    # -- a worker thread's turn ---------------------------------------------------------

    def begin_turn(self, records: list[tuple[int, bytes, bytes]], ack: Acknowledgement) -> TurnWrites | None:
        """On a worker thread, before its turn's batch is written: register
        the turn's replicated SETs (``(ident, path, value)``); None, and
        nothing registered, if a write of one of the paths is under way (the
        turn then fails with TRYAGAIN)."""
        turn = TurnWrites(self, records, ack)
        for taken, path in enumerate(turn.paths):
            # One atomic step per key (the event loop may run between two): a
            # key taken meanwhile undoes the turn's, and ends it on the loop
            # for whoever saw one of its keys and waits for it.
            if self.writing.setdefault(path, turn) is not turn:
                for mine in turn.paths[:taken]:
                    if self.writing.get(mine) is turn:
                        del self.writing[mine]
                turn.loop.call_soon_threadsafe(turn.end, "a write of one of its keys was under way")
                return None
        return turn

    def stream_turn(self, turn: TurnWrites) -> None:
        """On the event loop: send a turn's records, one ``RMSET`` per block
        (and per `TURN_RECORDS`) to each of its members; the turn fails
        whole, nothing sent, if one of its blocks is no longer served here."""
        if self.closed:
            turn.end("the agent is shutting down")
            return
        groups: dict[int, tuple[Held, list[int]]] = {}
        for index, ident in enumerate(turn.idents):
            held = self.ownership.held_at(ident)
            if held is None or not held.role.primary or held.decision.verdict is not Verdict.SERVE:
                why = held.decision.reason if held is not None and held.role.primary else "reassigned"
                turn.end(f"the block of {ident} changed during the write: {why or 'not served here'}")
                return
            groups.setdefault(id(held), (held, []))[1].append(index)
        turn.left = 1   # the turn ends only after every part was sent, even if one ends at once
        self.stats["worker_records"] += len(turn.idents)
        for held, indices in groups.values():
            for chunk in _chunks(indices, turn.values):
                write = Write(self, [turn.idents[i] for i in chunk], [turn.paths[i] for i in chunk], turn)
                turn.left += 1
                write.streamed = True
                records = [part for i in chunk
                           for part in (turn.idents[i], encode_path(turn.paths[i]), turn.values[i])]
                self._send(write, held, encode_command(b"RMSET", held.label, held.epoch, *records))
        turn.part_ended(None)


class Acknowledgement(Protocol):
    """What a worker waits on for its turn (`nat_agent._fastpath.Acknowledgement`)."""

    def done(self, failure: str | None) -> None: ...


class TurnWrites:
    """A worker thread's turn of SETs to blocks with members (`begin_turn`):
    registered under each of its paths in `Replicator.writing` from the
    worker's thread, streamed and settled on the event loop as writes
    (one per block and chunk), and ended once all of those are: then the
    keys are let go and the worker is told (`ack`)."""

    __slots__ = ("owner", "idents", "paths", "values", "ack", "done", "left", "failure", "loop")

    def __init__(self, owner: Replicator, records: list[tuple[int, bytes, bytes]],
                 ack: Acknowledgement) -> None:
        assert owner.loop is not None, "the service's lane starts the replicator on its loop"
        self.owner = owner
        self.loop = owner.loop
        self.idents = [ident for ident, _, _ in records]
        self.paths = [path.decode("utf-8") for _, path, _ in records]
        self.values = [value for _, _, value in records]
        self.ack = ack
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.left = 0
        self.failure: str | None = None

    def landed(self, error: str | None) -> None:
        """On the worker thread, once the batch is written (or failed: then
        the turn ends unstreamed): its stream goes to the event loop."""
        if error is None:
            self.loop.call_soon_threadsafe(self.owner.stream_turn, self)
        else:
            self.loop.call_soon_threadsafe(self.end, f"this agent's store failed the write: {error}")

    def part_ended(self, failure: str | None) -> None:
        if failure is not None and self.failure is None:
            self.failure = failure
        self.left -= 1
        if self.left == 0:
            self.end(self.failure)

    def end(self, failure: str | None) -> None:
        """Let the keys go and tell the worker (on the event loop)."""
        if self.done.done():
            return
        writing = self.owner.writing
        for path in self.paths:
            if writing.get(path) is self:
                del writing[path]
        self.done.set_result(None)
        self.ack.done(failure)


def _chunks(indices: list[int], values: list[bytes]) -> Iterator[list[int]]:
    """`indices` in runs of at most `TURN_RECORDS` records and about `TURN_BYTES` of values."""
    chunk: list[int] = []
    size = 0
    for index in indices:
        if chunk and (len(chunk) == TURN_RECORDS or size + len(values[index]) > TURN_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(index)
        size += len(values[index])
    if chunk:
        yield chunk


class _Replies:
    """Waits for `count` answers; remembers the first that was not ``+OK``."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.error: Reply | BaseException | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if count == 0:
            self.done.set_result(None)

    def settle(self, tag: object, reply: Reply | BaseException) -> None:
        if reply != OK and self.error is None:
            self.error = reply
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)
