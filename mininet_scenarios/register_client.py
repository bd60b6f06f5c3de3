"""A nemesis client: reads and writes registers through the fabric, recording every operation.

Runs inside a Mininet client host for `mininet_scenarios.nemesis`, from the
start of the run to its end, while servers die around it. Two kinds of key:

* hot keys (``/nemesis/hot/<i>``), the same for every client: workers pick
  one at random and read it or write it, so each key sees concurrent writers
  and readers from several hosts; the linearizability check
  (`mininet_scenarios.linearizability`) judges their histories afterwards;
* unique keys (``/nemesis/<client>/u<i>``), this client's alone: workers
  rewrite them in turn; on ``verify`` each is read back and must hold its
  last acknowledged value.

Every value is unique (``<client>-<n>``). Every attempt is one operation in
the history (`Recorder`, JSON lines, invocation before the request is sent,
completion after the reply), with a fresh value for a write: the client
library's own retries would send one value twice, and a write applied twice
around another client's write is not one register operation. So each call
makes exactly one attempt (`RetryPolicy(attempts=1)`), and the worker is
the retry loop. How an attempt ended (`outcome`):

* ``ok``: the reply;
* ``fail``: a refusal known to have changed nothing: MOVED (not the
  primary), a TRYAGAIN the agent answers before touching the store (block
  frozen, not serving, fenced, degraded, suspended, too many clients), a
  refused connection;
* ``unknown``: anything else, a timeout above all, and a TRYAGAIN for a
  write the replica set did not acknowledge (the primary applied it).

Commands on stdin, one per line; each answer is one JSON line on stdout:

* ``verify``: pause the workers (operations under way finish), read back
  every unique key and every hot key (with retries: the cluster has
  settled), count what is wrong, resume; answers the counts;
* ``stop``: stop the workers; answers the summary and exits.

    python -m mininet_scenarios.register_client --client c1 --history /tmp/x/c1.history
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from client_lib.client import AsyncMetaFlowClient, RetryPolicy
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.errors import MetaFlowError, Unavailable
from mininet_scenarios.linearizability import Kind, Outcome, Recorder, Value

HOT_PREFIX = "/nemesis/hot/"


def hot_keys(count: int) -> list[str]:
    return [f"{HOT_PREFIX}{i}" for i in range(count)]


def unique_keys(client: str, count: int) -> list[str]:
    return [f"/nemesis/{client}/u{i}" for i in range(count)]


# A TRYAGAIN the agent answers from its ownership check, before any store
# work: `nat_agent.service` ("TRYAGAIN <addr> block <block> <reason>") and
# the connection limit. The one TRYAGAIN after store work says "write not
# acknowledged" (and "store unavailable" may come mid-write).
_REFUSED_BEFORE_WORK = ("max number of clients",)
_MAYBE_APPLIED = ("not acknowledged", "store unavailable")


def outcome(exc: MetaFlowError) -> Outcome:
    """What a failed single attempt says about its effect (module docstring)."""
    if not isinstance(exc, Unavailable):
        return "unknown"   # ServerError (-ERR), BadReply: when in doubt, unknown
    reason = exc.reason
    code = reason.split(" ", 1)[0]
    if code == "MOVED":
        return "fail"
    if code == "TRYAGAIN":
        if any(m in reason for m in _MAYBE_APPLIED):
            return "unknown"
        if " block " in reason or any(m in reason for m in _REFUSED_BEFORE_WORK):
            return "fail"
        return "unknown"
    if "Connect call failed" in reason or "Connection refused" in reason:
        return "fail"   # nothing was sent
    return "unknown"


def why(exc: MetaFlowError) -> str:
    """A failed attempt's reason, short enough to count: the reply's code and
    the agent's reason for a TRYAGAIN, or the kind of network failure."""
    if not isinstance(exc, Unavailable):
        return type(exc).__name__
    reason = exc.reason
    code = reason.split(" ", 1)[0]
    if code == "TRYAGAIN":
        held = re.search(r" block \S+ (.*)", reason)
        detail = held.group(1) if held else reason.split(" ", 2)[-1]
        return f"TRYAGAIN {detail[:40]}"
    if code == "MOVED" or reason.startswith("timeout"):
        return code
    return f"connection: {reason.rsplit(': ', 1)[-1].split(' (')[0][:40]}"   # not the address


@dataclass
class UniqueKey:
    """What this client knows of one of its own keys: the value of the last
    acknowledged write, and the values of writes of unknown outcome (any of
    which may have taken effect, at any time after it was sent)."""

    acked: str | None = None
    unknown: set[str] = field(default_factory=set)

    def acceptable(self) -> set[str | None]:
        return {self.acked, *self.unknown} if self.acked is not None else {None, *self.unknown}


class RegisterClient:
    """The workers, the history, and the verify/stop protocol (module docstring)."""

    def __init__(self, client: AsyncMetaFlowClient, verifier: AsyncMetaFlowClient, name: str,
                 history: TextIO, hot: list[str], unique: list[str], think: float, seed: int) -> None:
        self.client = client
        self.verifier = verifier
        self.name = name
        self.recorder = Recorder(history, name)
        self.hot = hot
        self.unique = {key: UniqueKey() for key in unique}
        self.think = think
        self.rng = random.Random(seed)
        self.counter = 0
        self.counts: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.running = asyncio.Event()
        self.running.set()
        self.stopping = False
        self.busy = 0
        self.idle = asyncio.Condition()

    def _value(self) -> str:
        self.counter += 1
        return f"{self.name}-{self.counter}"

    async def _attempt(self, key: str, write: str | None) -> tuple[Outcome, Value]:
        """One recorded attempt: a write of `write`, or a read (None)."""
        kind: Kind = "read" if write is None else "write"
        seq = self.recorder.invoke(key, kind, write, time.monotonic())
        value: Value = None
        try:
            if write is None:
                raw = await self.client.get(key)
                value = raw.decode() if raw is not None else None
            else:
                await self.client.put(key, write.encode())
            result: Outcome = "ok"
        except MetaFlowError as exc:
            result = outcome(exc)
            self.reasons[f"{kind} {result}: {why(exc)}"] += 1
        self.recorder.complete(seq, result, time.monotonic(), value if kind == "read" else None)
        self.counts[f"{kind}_{result}"] += 1
        return result, value

    async def hot_worker(self) -> None:
        while await self._may_run():
            try:
                key = self.rng.choice(self.hot)
                await self._attempt(key, self._value() if self.rng.random() < 0.5 else None)
            finally:
                await self._done()
            await asyncio.sleep(self.think)

    async def unique_worker(self, keys: list[str]) -> None:
        """Rewrites `keys` in turn; no other worker writes them, so "the last
        acknowledged value" is this worker's."""
        turn = 0
        while await self._may_run():
            try:
                key = keys[turn % len(keys)]
                turn += 1
                value = self._value()
                result, _ = await self._attempt(key, value)
                if result == "ok":
                    self.unique[key].acked = value
                elif result == "unknown":
                    self.unique[key].unknown.add(value)
            finally:
                await self._done()
            await asyncio.sleep(self.think)

    async def _may_run(self) -> bool:
        await self.running.wait()
        if self.stopping:
            return False
        self.busy += 1
        return True

    async def _done(self) -> None:
        self.busy -= 1
        async with self.idle:
            self.idle.notify_all()

    async def pause(self) -> None:
        """Stop starting operations, and wait for those under way to end."""
        self.running.clear()
        async with self.idle:
            await self.idle.wait_for(lambda: self.busy == 0)

    async def verify(self, concurrency: int = 16) -> dict[str, object]:
        """Read back every key (workers paused); count what breaks the contract."""
        await self.pause()
        lost: list[str] = []
        unreadable: list[str] = []
        keys = [*self.unique, *self.hot]
        queue: asyncio.Queue[str] = asyncio.Queue()
        for key in keys:
            queue.put_nowait(key)

        async def reader() -> None:
            while not queue.empty():
                key = queue.get_nowait()
                seq = self.recorder.invoke(key, "read", None, time.monotonic())
                try:
                    raw = await self.verifier.get(key)
                except MetaFlowError as exc:
                    self.recorder.complete(seq, "unknown", time.monotonic())
                    unreadable.append(f"{key}: {exc}")
                    continue
                value = raw.decode() if raw is not None else None
                self.recorder.complete(seq, "ok", time.monotonic(), value)
                mine = self.unique.get(key)
                if mine is not None and value not in mine.acceptable():
                    lost.append(f"{key}: read {value!r}, last acknowledged {mine.acked!r}")

        started = time.monotonic()
        await asyncio.gather(*(reader() for _ in range(concurrency)))
        self.running.set()
        return {"client": self.name, "checked": len(keys),
                "acked_keys": sum(k.acked is not None for k in self.unique.values()),
                "lost": len(lost), "unreadable": len(unreadable), "sample": (lost + unreadable)[:5],
                "seconds": round(time.monotonic() - started, 2)}

    async def stop(self) -> dict[str, object]:
        await self.pause()
        self.stopping = True
        self.running.set()
        return {"client": self.name, "operations": dict(self.counts), "reasons": dict(self.reasons),
                "acked_unique_keys": sum(k.acked is not None for k in self.unique.values())}


async def run(args: argparse.Namespace) -> None:
    # One attempt per call, short: the workers retry; the verifier rides out a slow reply.
    single = RetryPolicy(attempts=1)
    patient = RetryPolicy(attempts=50, base=0.02, cap=0.5)
    with open(args.history, "a") as history:
        async with (AsyncMetaFlowClient(space=args.space, timeout=args.timeout, deadline=args.timeout,
                                        retry=single) as client,
                    AsyncMetaFlowClient(space=args.space, timeout=2.0, deadline=args.verify_deadline,
                                        retry=patient) as verifier):
            rc = RegisterClient(client, verifier, args.client, history, hot_keys(args.hot),
                                unique_keys(args.client, args.unique), args.think, args.seed)
            mine = list(rc.unique)
            workers = [*(rc.hot_worker() for _ in range(args.hot_workers)),
                       *(rc.unique_worker(mine[w::args.unique_workers]) for w in range(args.unique_workers))]
            tasks = [asyncio.create_task(w) for w in workers]
            print(json.dumps({"ready": True}), flush=True)
            loop = asyncio.get_running_loop()
            while True:
                line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
                if line == "verify":
                    print(json.dumps(await rc.verify()), flush=True)
                elif line in ("stop", ""):   # "": the nemesis went away
                    summary = await rc.stop()
                    await asyncio.gather(*tasks)
                    print(json.dumps(summary), flush=True)
                    return
                else:
                    print(json.dumps({"error": f"unknown command {line!r}"}), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client", required=True, help="this client's name (in its keys and values)")
    p.add_argument("--history", required=True, help="append every operation here (JSON lines)")
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR)
    p.add_argument("--hot", type=int, default=16, help="hot keys, shared by every client")
    p.add_argument("--unique", type=int, default=200, help="keys of this client alone")
    p.add_argument("--hot-workers", type=int, default=2)
    p.add_argument("--unique-workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=0.5, help="seconds per attempt")
    p.add_argument("--verify-deadline", type=float, default=15.0, help="seconds per read-back on verify")
    p.add_argument("--think", type=float, default=0.01, help="seconds between a worker's operations")
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
