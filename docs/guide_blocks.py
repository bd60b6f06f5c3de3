"""The runnable blocks of a walkthrough page: the guide is the test.

docs/deploy.md's section "Walkthrough: a fabric by hand" is a sequence of
shell blocks a reader runs in order. tests/e2e/test_deploy_guide.py takes
them from the page and runs them, so a command that changes in the page is
the command that is tested, and one that stops working fails the tests.

Each runnable block is a fenced ``bash`` block preceded by a marker comment
(invisible in the rendered page)::

    <!-- guide: variables -->      the names every later block uses; once
    <!-- guide: step NAME -->      one step, run in a shell of its own
    <!-- guide: cleanup -->        the clean-up, always run at the end; once

A step's shell first runs the variables block, so a reader who runs every
block in one terminal and the test that runs each in its own shell see the
same values. Inside the section every ``bash`` fence must be marked (a
command shown but not run would drift); output is shown in ``text`` fences.
Pure: no I/O, so its rules are unit-tested (tests/unit/test_guide_blocks.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEPLOY_PAGE = Path(__file__).parent / "deploy.md"
WALKTHROUGH = "## Walkthrough: a fabric by hand"
"""The page and the heading of the section that is run."""

VARIABLES = "variables"
STEP = "step"
CLEANUP = "cleanup"
KINDS = (VARIABLES, STEP, CLEANUP)

_MARKER = re.compile(r"^<!--\s*guide:\s*(?P<kind>\S+)(?:\s+(?P<name>\S+))?\s*-->\s*$")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^\s`]*)")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
SHELL_PRELUDE = "set -euo pipefail"
"""Every block runs under it: a failing command fails its step, as a reader would want to know."""


class GuideError(ValueError):
    """The page's markers or fences break the rules above; the message names the line."""


@dataclass(frozen=True)
class Block:
    """One marked block: its kind, its name (a step's; the kind for the others), its code,
    and the page line of its marker."""

    kind: str
    name: str
    code: str
    line: int


@dataclass(frozen=True)
class Guide:
    """A walkthrough's blocks, in page order."""

    variables: Block
    steps: tuple[Block, ...]
    cleanup: Block

    def step(self, name: str) -> Block:
        """The step called `name`; a KeyError names the steps the page has."""
        for block in self.steps:
            if block.name == name:
                return block
        raise KeyError(f"the page has no step {name!r}; it has {[b.name for b in self.steps]}")

    def script(self, block: Block) -> str:
        """What one shell runs for `block`: the prelude, the variables, the block."""
        parts = [SHELL_PRELUDE, self.variables.code]
        if block is not self.variables:
            parts.append(block.code)
        return "\n".join(parts) + "\n"


def section(text: str, heading: str) -> tuple[str, int]:
    """The part of `text` under the heading line `heading` (up to the next heading of the
    same or a higher level), and the page line it starts on (1-based)."""
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    if not level or heading[level:level + 1] != " ":
        raise GuideError(f"{heading!r} is not a Markdown heading")
    try:
        start = lines.index(heading)
    except ValueError:
        raise GuideError(f"the page has no heading {heading!r}") from None
    end = len(lines)
    in_fence = False
    for i in range(start + 1, len(lines)):
        if _FENCE.match(lines[i]):
            in_fence = not in_fence
        elif not in_fence and re.match(rf"^#{{1,{level}}} ", lines[i]):
            end = i
            break
    return "\n".join(lines[start:end]) + "\n", start + 1


def parse(text: str, first_line: int = 1) -> Guide:
    """Every marked block of `text` (a section, starting at page line `first_line`)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        line, number = lines[i], first_line + i
        marker = _MARKER.match(line)
        fence = _FENCE.match(line)
        if marker:
            if pending is not None:
                raise GuideError(f"line {pending[2]}: marker not followed by a bash block")
            pending = _marker(marker, number)
        elif fence:
            end = _closing(lines, i, fence.group("fence"), first_line)
            if fence.group("info") == "bash":
                if pending is None:
                    raise GuideError(f"line {number}: a bash block without a guide marker "
                                     "(show output in a text block)")
                kind, name, at = pending
                blocks.append(Block(kind, name, "\n".join(lines[i + 1:end]), at))
            elif pending is not None:
                raise GuideError(f"line {pending[2]}: marker followed by a "
                                 f"{fence.group('info') or 'plain'} block, not bash")
            pending = None
            i = end
        elif line.strip() and pending is not None:
            raise GuideError(f"line {pending[2]}: marker not followed by a bash block")
        i += 1
    if pending is not None:
        raise GuideError(f"line {pending[2]}: marker not followed by a bash block")
    return _guide(blocks)


def _marker(match: re.Match[str], number: int) -> tuple[str, str, int]:
    kind, name = match.group("kind"), match.group("name")
    if kind not in KINDS:
        raise GuideError(f"line {number}: unknown guide marker {kind!r} (one of {', '.join(KINDS)})")
    if kind == STEP:
        if name is None or not _NAME.match(name):
            raise GuideError(f"line {number}: a step needs a name of lowercase letters, digits "
                             f"and dashes, not {name!r}")
        return kind, name, number
    if name is not None:
        raise GuideError(f"line {number}: a {kind} marker takes no name")
    return kind, kind, number


def _closing(lines: list[str], opening: int, fence: str, first_line: int) -> int:
    for j in range(opening + 1, len(lines)):
        if lines[j].strip() == fence:
            return j
    raise GuideError(f"line {first_line + opening}: code block never closed")


def _guide(blocks: list[Block]) -> Guide:
    by_kind = {kind: [b for b in blocks if b.kind == kind] for kind in KINDS}
    for kind in (VARIABLES, CLEANUP):
        if len(by_kind[kind]) != 1:
            raise GuideError(f"the walkthrough needs exactly one {kind} block, found "
                             f"{len(by_kind[kind])}")
    variables, cleanup = by_kind[VARIABLES][0], by_kind[CLEANUP][0]
    if blocks[0] is not variables:
        raise GuideError(f"line {variables.line}: the variables block must come first")
    if blocks[-1] is not cleanup:
        raise GuideError(f"line {cleanup.line}: the cleanup block must come last")
    seen: dict[str, int] = {}
    for block in by_kind[STEP]:
        if block.name in seen:
            raise GuideError(f"line {block.line}: step {block.name!r} again (first at line "
                             f"{seen[block.name]})")
        seen[block.name] = block.line
    if not seen:
        raise GuideError("the walkthrough has no step")
    return Guide(variables, tuple(by_kind[STEP]), cleanup)


def deploy_walkthrough(page: str) -> Guide:
    """The walkthrough of docs/deploy.md, given the page's text."""
    return parse(*section(page, WALKTHROUGH))
