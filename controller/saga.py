"""Multi-step operations as generators: each yields the steps it needs and
gets their results back; a failed step is raised at the yield that asked
for it, so the compensation is written next to its step, once.

    def split(op, ...):
        migration = yield CallAgent(...)          # result comes back here
        try:
            yield [SendFlows(...), SendFlows(...)] # several at once: a list of results
        except StepError as failed:
            ... put the flows back ...             # compensation beside the step
            return Outcome(...)

An operation never waits inside the core: `Operations` issues its steps and
returns them to the core, which hands them to the shim; the results arrive
later as events. Many operations run at once; an operation on a server that
fails meanwhile is cancelled (`Cancelled` is raised at its current yield)
and compensates in the same way. Results of steps issued before a
cancellation are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.steps import Step

log = logging.getLogger("metaflow.controller.saga")

Yielded = Step | Sequence[Step]
Saga = Generator[Yielded, Any, Any]


class StepError(Exception):
    """One or more steps of a group failed. `errors` maps the failed steps'
    positions in the group to their reasons; `results` holds the results of
    the ones that succeeded (None where failed)."""

    def __init__(self, errors: dict[int, str], results: list[object]) -> None:
        super().__init__("; ".join(errors.values()))
        self.errors = errors
        self.results = results


class Cancelled(Exception):
    """The operation was overtaken: a server it involves failed."""


@dataclass(frozen=True)
class Round:
    """One group of steps an operation yielded and waited for: what they
    were, how many, and how long until the last result (the account of a
    slow operation, such as a rebuild at k=32)."""

    what: str
    steps: int
    seconds: float


@dataclass
class Operation:
    """One running saga, with what the REST views show of it."""

    id: str
    kind: str
    server: str
    involves: set[str]
    """Servers it must hold exclusively (its source and target)."""
    started: float
    saga: Saga | None = None
    step: str = "starting"
    on_done: Callable[[object], list[Step]] | None = None
    cancelled: str | None = None
    _waiting: dict[int, int] = field(default_factory=dict)   # step id -> position in group
    _results: list[object] = field(default_factory=list)
    _errors: dict[int, str] = field(default_factory=dict)
    _single: bool = True
    rounds: list[Round] = field(default_factory=list)
    """Its groups of steps so far, each once its last result came."""
    _round: tuple[str, int, float] = ("", 0, 0.0)   # the group waited for: what, steps, issued at


class Operations:
    """The running sagas. `issue` numbers a step (and remembers it is pending)."""

    def __init__(self, issue: Callable[[Step], int], clock: Callable[[], float]) -> None:
        self._issue = issue
        self._clock = clock
        self.running: dict[str, Operation] = {}
        self._by_step: dict[int, Operation] = {}

    def involving(self, server: str) -> list[Operation]:
        return [op for op in self.running.values() if server in op.involves]

    def reserved(self) -> set[str]:
        return {name for op in self.running.values() for name in op.involves}

    def start(self, op: Operation, saga: Saga) -> list[Step]:
        op.saga = saga
        self.running[op.id] = op
        return self._advance(op, lambda: saga.send(None))

    def result(self, step: int, ok: bool, value: object) -> list[Step]:
        """A step's outcome arrived; resume its operation once its group is complete."""
        op = self._by_step.pop(step, None)
        if op is None:
            return []   # not ours, or its operation was cancelled or has finished
        position = op._waiting.pop(step)
        if ok:
            op._results[position] = value
        else:
            op._errors[position] = str(value)
        if op._waiting:
            return []
        what, count, issued = op._round
        op.rounds.append(Round(what, count, self._clock() - issued))
        assert op.saga is not None
        saga, results, errors = op.saga, op._results, op._errors
        if errors:
            failure = StepError(errors, results)
            return self._advance(op, lambda: saga.throw(failure))
        value = results[0] if op._single else results
        return self._advance(op, lambda: saga.send(value))

    def cancel(self, op: Operation, reason: str) -> list[Step]:
        """Raise `Cancelled` in the operation at its current step."""
        if op.id not in self.running or op.saga is None:
            return []
        op.cancelled = reason
        for step in op._waiting:
            self._by_step.pop(step, None)
        op._waiting.clear()
        saga = op.saga
        return self._advance(op, lambda: saga.throw(Cancelled(reason)))

    def _advance(self, op: Operation, resume: Callable[[], Yielded]) -> list[Step]:
        out: list[Step] = []
        while True:
            try:
                wanted = resume()
            except StopIteration as done:
                return out + self._finish(op, done.value)
            except Cancelled:
                return out + self._finish(op, None)
            op._single = isinstance(wanted, Step)
            steps = [wanted] if isinstance(wanted, Step) else list(wanted)
            if not steps:
                resume = _resumer(op, [])
                continue
            op._results = [None] * len(steps)
            op._errors = {}
            op._round = (describe(steps), len(steps), self._clock())
            for position, step in enumerate(steps):
                ident = self._issue(step)
                op._waiting[ident] = position
                self._by_step[ident] = op
            return out + steps

    def _finish(self, op: Operation, outcome: object) -> list[Step]:
        self.running.pop(op.id, None)
        for step in op._waiting:
            self._by_step.pop(step, None)
        op._waiting.clear()
        return op.on_done(outcome) if op.on_done is not None else []


def describe(steps: Sequence[Step]) -> str:
    """The kinds of steps in a group, as a round names them ("CallAgent /assign")."""
    kinds = {type(step).__name__ + (f" {route.template}" if (route := getattr(step, "route", None)) else "")
             for step in steps}
    return ", ".join(sorted(kinds))


def _resumer(op: Operation, value: object) -> Callable[[], Yielded]:
    saga = op.saga
    assert saga is not None
    return lambda: saga.send(value)
