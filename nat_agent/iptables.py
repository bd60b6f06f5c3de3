"""Install and remove tagged rule lists with the `iptables` command.

Every rule an agent installs carries its tag as an iptables comment, so the
agent can find its own rules again, in every table, without having kept any
state: after a crash (SIGKILL, power loss) the next start purges what the
previous run left and appends a fresh set, and several agents with
different tags can share one network namespace without touching each
other's rules. Rules are deleted by specification (the `iptables-save` line
with ``-A`` turned into ``-D``), not by number, so a concurrent change to the
same chain by someone else cannot make us delete the wrong rule.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence

from nat_agent.rules import Rule, check_tag


class IptablesError(RuntimeError):
    """An iptables command failed; the message carries its stderr."""

    def __init__(self, command: Sequence[str], stderr: str) -> None:
        super().__init__(f"{shlex.join(command)}: {stderr.strip() or 'failed'}")
        self.command = list(command)
        self.stderr = stderr


def _run(command: list[str]) -> str:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise IptablesError(command, proc.stderr)
    return proc.stdout


def tagged_rules(tag: str) -> list[tuple[str, list[str]]]:
    """(table, rule specification after ``-A``) of every rule whose comment is
    exactly `tag`, in `iptables-save` order; a rule present twice is listed twice."""
    check_tag(tag)
    found: list[tuple[str, list[str]]] = []
    table = ""
    for line in _run(["iptables-save"]).splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith("-A "):
            words = shlex.split(line)
            if _comment(words) == tag:
                found.append((table, words[1:]))
    return found


def _comment(words: list[str]) -> str | None:
    """The argument of the rule's ``--comment``, if it has one."""
    for i, word in enumerate(words[:-1]):
        if word == "--comment":
            return words[i + 1]
    return None


def remove(tag: str) -> int:
    """Delete every rule tagged exactly `tag`, in every table; return how many."""
    doomed = tagged_rules(tag)
    for table, spec in doomed:
        _run(["iptables", "-w", "-t", table, "-D", *spec])
    return len(doomed)


def install(rules: Sequence[Rule], tag: str) -> None:
    """Replace whatever rules carry `tag` by `rules` (idempotent).

    Every rule must carry ``--comment <tag>``: a rule without it could never
    be found again to be removed. If one rule fails, the ones already
    appended are removed again before the error is raised, so a failed
    install leaves no half-working rewrite behind.
    """
    for rule in rules:
        if _comment(list(rule.args)) != tag:
            raise ValueError(f"rule {rule} does not carry the comment {tag!r}")
    remove(tag)
    try:
        for rule in rules:
            _run(["iptables", "-w", "-t", rule.table, "-A", rule.chain, *rule.args])
    except IptablesError:
        remove(tag)
        raise
