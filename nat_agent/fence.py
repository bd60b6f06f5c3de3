"""The agent's term fence: no change from an older leader controller.

With several controllers (one leader, elected through etcd) a leader that
lost its lease without knowing it yet (paused, partitioned) may still call
an agent. Every call of a leader carries its term, signed
(`client_lib.api.auth.TERM_HEADER`), and so does its answer to a
registration (`Registered.term`). The agent keeps the highest term it has
seen and refuses anything carrying a lower one: 409 Conflict, changing
nothing. A higher term raises the kept one, which the agent persists in its
state document before it acts on the call, so a restarted agent still
refuses the old leader.

Term 0, or no term at all, is the one controller without a coordination
service, and `metaflowctl`: never fenced, and it raises nothing (elected
terms start at 1). Pure: the caller persists.
"""

from __future__ import annotations

from client_lib.errors import Conflict


class StaleTerm(Conflict):
    """409: a call or a registration answer from an older leader."""


class TermFence:
    """The highest leadership term seen, and the check of a new one against it."""

    def __init__(self, term: int = 0) -> None:
        if term < 0:
            raise ValueError(f"a term is a non-negative integer, not {term}")
        self.term = term

    def admit(self, term: int | None, what: str) -> bool:
        """Let `what` (a call, an answer) carrying `term` through, or raise
        StaleTerm if an older leader sent it. True when it raised the kept
        term, which the caller must then persist before acting on `what`."""
        if not term:
            return False
        if term < self.term:
            raise StaleTerm(f"{what}: from an older leader: term {term} < {self.term}", 409)
        raised = term > self.term
        self.term = term
        return raised
