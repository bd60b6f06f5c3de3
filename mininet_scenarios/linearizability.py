"""Is a history of reads and writes linearizable? Per-key registers, Jepsen's method.

The nemesis test's clients record every operation they make (`Recorder`, as
JSON lines); afterwards `check` decides whether some single order of the
operations explains every result while respecting real time: an operation
that completed before another was invoked comes first. That is what
"reads are linearizable" means for a client of MetaFlow, whatever servers
were killed meanwhile.

The model is one register per key, initially absent (None): ``write(v)``
sets it (``v`` None is a delete), ``read`` returns it. Keys are independent
registers, and linearizability is compositional (Herlihy and Wing), so each
key's sub-history is checked alone: the search is exponential in the
concurrency of one key, not of the whole history.

Outcomes, as Jepsen's ``:ok``, ``:fail`` and ``:info``:

* ``ok``: took effect once, between its invocation and its completion;
* ``fail``: definitely did not take effect (the server refused it before
  doing anything) and is dropped;
* ``unknown`` (a timeout, a connection cut, a crash): may or may not have
  taken effect, at any time after its invocation, even after its client
  went on: its completion is +infinity. A read of unknown outcome tells
  nothing and is dropped, and so is an unknown write whose value no read
  returned (if it took effect, nothing saw it: leaving it out changes no
  result; this keeps timeouts from widening the search).

The search is Wing and Gong's, with Lowe's memoization as Knossos and
Porcupine use it: walk the invocations and completions in time order;
linearize a pending operation whenever the register allows it, and go back
when a completion comes whose operation is not linearized yet; a
configuration (set of linearized operations, register value) already seen
is not explored twice.

Clock. Timestamps of all clients must come from one clock:
``time.monotonic()`` is CLOCK_MONOTONIC, one per kernel, so it is shared by
every process on a host, Mininet hosts included (they are network namespaces
of that kernel). Record the invocation before the request is sent and the
completion after its reply has arrived. Histories from several machines
would need each clock's error added to every interval; this module does not.

Equal timestamps count as concurrent (the more permissive reading).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TextIO, cast

__all__ = ["Kind", "Op", "Outcome", "Recorder", "Result", "Value", "check", "check_key", "parse_history"]

Value = str | int | None
"""A register's value: a JSON scalar; None is absent (never written, or deleted)."""

Kind = Literal["read", "write"]
"""What an operation does to its key's register."""
Outcome = Literal["ok", "fail", "unknown"]
"""How it ended: took effect, did not, or cannot be known (see the module docstring)."""
_KINDS: tuple[Kind, ...] = ("read", "write")
_OUTCOMES: tuple[Outcome, ...] = ("ok", "fail", "unknown")


@dataclass(frozen=True)
class Op:
    """One operation as a client saw it.

    ``value`` is what a write wrote, or what a read returned (when ``ok``).
    ``complete`` is +inf when the outcome is unknown.
    """

    client: str
    key: str
    kind: Kind
    value: Value
    invoke: float
    complete: float
    outcome: Outcome = "ok"

    def __post_init__(self) -> None:
        if self.kind not in _KINDS or self.outcome not in _OUTCOMES:
            raise ValueError(f"bad operation {self!r}: kind must be read or write, "
                             "outcome ok, fail or unknown")
        if self.outcome == "unknown":
            object.__setattr__(self, "complete", math.inf)
        if not self.invoke <= self.complete:
            raise ValueError(f"operation completes before it is invoked: {self!r}")

    def __str__(self) -> str:
        what = f"write({self.value!r})" if self.kind == "write" else f"read() -> {self.value!r}"
        end = "?" if math.isinf(self.complete) else f"{self.complete:.6f}"
        return f"{self.client} {what} on {self.key!r} [{self.invoke:.6f}, {end}] {self.outcome}"


@dataclass(frozen=True)
class Result:
    """The verdict. When not ``ok``: the first key (in sorted order) whose
    history is not linearizable, and a counterexample from the deepest point
    the search reached: the longest linearization it found (``prefix``), the
    register's value after it (``state``), and the operation that could not
    be placed next (``stuck``: it completed, and no order of the operations
    still pending lets it take effect)."""

    ok: bool
    keys: int
    key: str | None = None
    stuck: Op | None = None
    prefix: tuple[Op, ...] = ()
    state: Value = None
    pending: tuple[Op, ...] = field(default=())
    """The operations that were concurrent with ``stuck`` and not yet placed."""

    def explain(self) -> str:
        """A few lines for a test failure or a log."""
        if self.ok:
            return f"linearizable ({self.keys} keys)"
        last = "\n  ".join(map(str, self.prefix[-5:])) or "(nothing)"
        pending = "\n  ".join(map(str, self.pending)) or "(nothing)"
        return (f"key {self.key!r} is not linearizable.\n"
                f"Longest linearization found ({len(self.prefix)} operations) ends with:\n  {last}\n"
                f"leaving the register at {self.state!r}; then this operation cannot take effect:\n"
                f"  {self.stuck}\nwhatever the order of those still pending:\n  {pending}")


def _relevant(ops: list[Op]) -> list[Op]:
    """Drop what constrains nothing: failed operations, reads of unknown
    outcome, and unknown writes whose value no read returned."""
    read_values = {op.value for op in ops if op.kind == "read" and op.outcome == "ok"}
    return [op for op in ops if op.outcome == "ok"
            or (op.outcome == "unknown" and op.kind == "write" and op.value in read_values)]


def _step(state: Value, op: Op) -> tuple[bool, Value]:
    """The register: may ``op`` take effect in ``state``, and the state after."""
    if op.kind == "write":
        return True, op.value
    return op.value == state, state


def check_key(key: str, ops: Iterable[Op], initial: Value = None) -> Result:
    """Whether one key's operations are linearizable (the other keys' are ignored)."""
    history = _relevant([op for op in ops if op.key == key])
    count = len(history)
    # Entries 1..2n of a doubly linked list in time order (0 is its head):
    # entry 2i+1 invokes operation i, 2i+2 completes it. At equal times an
    # invocation comes first: touching intervals overlap.
    order = sorted(range(1, 2 * count + 1),
                   key=lambda e: (history[(e - 1) // 2].invoke if e % 2 else history[(e - 1) // 2].complete,
                                  e % 2 == 0))
    nxt = [0] * (2 * count + 2)
    prv = [0] * (2 * count + 2)
    end = 2 * count + 1  # past the last entry
    chain = [0, *order, end]
    for left, right in zip(chain, chain[1:], strict=False):
        nxt[left], prv[right] = right, left

    def lift(call: int) -> None:
        for entry in (call, call + 1):
            nxt[prv[entry]], prv[nxt[entry]] = nxt[entry], prv[entry]

    def unlift(call: int) -> None:
        for entry in (call + 1, call):
            nxt[prv[entry]] = prv[nxt[entry]] = entry

    seen: set[tuple[int, Value]] = set()
    placed: list[tuple[int, Value]] = []  # (invocation entry, state before it)
    state, linearized = initial, 0
    deepest: tuple[tuple[int, ...], Value, int] = ((), initial, -1)  # placed operations, state, stuck
    entry = nxt[0]
    while nxt[0] != end:
        op_index = (entry - 1) // 2
        if entry % 2:  # an invocation: try to linearize its operation here
            op = history[op_index]
            fits, after = _step(state, op)
            if fits:
                bits = linearized | 1 << op_index
                if (bits, after) not in seen:
                    seen.add((bits, after))
                    placed.append((entry, state))
                    state, linearized = after, bits
                    lift(entry)
                    entry = nxt[0]
                    continue
            if not (fits and op.kind == "read"):
                entry = nxt[entry]
                continue
            # A read that fits, in a configuration already explored: this one fails too (below).
        else:  # a completion whose operation is not linearized: undo the last choice
            if len(placed) > len(deepest[0]) or deepest[2] < 0:
                deepest = (tuple((e - 1) // 2 for e, _ in placed), state, op_index)
        while True:
            if not placed:
                return _counterexample(key, history, *deepest)
            entry, state = placed.pop()
            undone = (entry - 1) // 2
            linearized &= ~(1 << undone)
            unlift(entry)
            # A read was placed because it fitted, and one that fits may always
            # be placed at once (it changes nothing, everything that must come
            # before it is placed, nothing that must come after it is): if no
            # order worked with it there, none works without it. Undo further.
            if history[undone].kind == "write":
                break
        entry = nxt[entry]
    return Result(True, 1)


def _counterexample(key: str, history: list[Op], placed: tuple[int, ...], state: Value,
                    stuck: int) -> Result:
    """The deepest point of a failed search as a `Result`: pending are the
    operations not placed that were invoked before ``stuck`` completed."""
    done = {*placed, stuck}
    pending = tuple(op for i, op in enumerate(history)
                    if i not in done and op.invoke <= history[stuck].complete)
    return Result(False, 1, key, history[stuck], tuple(history[i] for i in placed), state, pending)


def check(history: Iterable[Op], initial: Value = None) -> Result:
    """Whether every key's register history is linearizable; stops at the
    first key (in sorted order) that is not, and returns its counterexample."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    for key in sorted(by_key):
        verdict = check_key(key, by_key[key], initial)
        if not verdict.ok:
            return Result(False, len(by_key), key, verdict.stuck, verdict.prefix, verdict.state,
                          verdict.pending)
    return Result(True, len(by_key))


# -- the history file: JSON lines ----------------------------------------------------
#
# One object per event, appended as it happens, so that a client that dies
# mid-operation still leaves its invocation behind (its outcome: unknown):
#   {"event": "invoke", "client": "c1", "seq": 7, "key": "/k", "kind": "write", "value": "c1-7", "time": 12.5}
#   {"event": "ok", "client": "c1", "seq": 7, "time": 12.6}            a write's completion
#   {"event": "ok", "client": "c1", "seq": 8, "time": 13.0, "value": "c1-7"}   a read's, with its value
#   {"event": "fail" | "unknown", "client": "c1", "seq": 9, "time": 13.2}
# ``seq`` numbers one client's operations; (client, seq) pairs an invocation
# with its completion. A client may run several operations at once.


class Recorder:
    """Appends one client's events to ``sink`` (a text file opened for
    appending; one file per client, or one shared file with line buffering),
    flushing each line so that a crash loses no event already made."""

    def __init__(self, sink: TextIO, client: str) -> None:
        self._sink = sink
        self.client = client
        self._seq = 0

    def _emit(self, event: dict[str, object]) -> None:
        self._sink.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._sink.flush()

    def invoke(self, key: str, kind: Kind, value: Value, time: float) -> int:
        """Record an invocation (before the request is sent); returns its ``seq``."""
        if kind not in _KINDS:
            raise ValueError(f"kind must be read or write, not {kind!r}")
        self._seq += 1
        self._emit({"event": "invoke", "client": self.client, "seq": self._seq, "key": key,
                    "kind": kind, "value": value if kind == "write" else None, "time": time})
        return self._seq

    def complete(self, seq: int, outcome: Outcome, time: float, value: Value = None) -> None:
        """Record how operation ``seq`` ended (after the reply); ``value`` is what a read returned."""
        if outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be ok, fail or unknown, not {outcome!r}")
        event: dict[str, object] = {"event": outcome, "client": self.client, "seq": seq, "time": time}
        if value is not None:
            event["value"] = value
        self._emit(event)


def parse_history(lines: Iterable[str]) -> list[Op]:
    """The operations of JSON-lines events (from one or several files, in any
    order). An invocation without a completion is an operation of unknown
    outcome. A malformed event, a completion without its invocation, or an
    event seen twice is a ``ValueError`` naming the line."""
    invoked: dict[tuple[str, int], tuple[dict[str, object], int]] = {}
    done: dict[tuple[str, int], tuple[dict[str, object], int]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            ident = (str(event["client"]), int(event["seq"]))
            name = event["event"]
            if name not in ("invoke", *_OUTCOMES):
                raise ValueError(f"unknown event {name!r}")
            float(event["time"])
            if name == "invoke" and event["kind"] not in _KINDS:
                raise ValueError(f"kind must be read or write, not {event['kind']!r}")
            value = event.get("value")
            if isinstance(value, bool) or not isinstance(value, str | int | None):
                raise ValueError(f"a value must be a string, an integer or null, not {value!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"history line {number}: {exc}: {line.strip()[:200]}") from None
        events = invoked if name == "invoke" else done
        if ident in events:
            raise ValueError(f"history line {number}: {ident[0]} #{ident[1]} has a second {name} event")
        events[ident] = (event, number)
    for ident, (_, number) in done.items():
        if ident not in invoked:
            raise ValueError(f"history line {number}: {ident[0]} #{ident[1]} completes but was never invoked")
    ops = []
    for ident, (start, number) in invoked.items():
        finish = done.get(ident, ({"event": "unknown", "time": math.inf}, 0))[0]
        kind = cast(Kind, start["kind"])
        try:
            ops.append(Op(ident[0], str(start["key"]), kind,
                          cast(Value, start.get("value") if kind == "write" else finish.get("value")),
                          float(cast(float, start["time"])), float(cast(float, finish["time"])),
                          cast(Outcome, finish["event"])))
        except (ValueError, KeyError) as exc:
            raise ValueError(f"history line {number}: {exc}") from None
    return ops
