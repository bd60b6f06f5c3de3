"""The walkthrough's blocks as docs/guide_blocks.py reads them from a page.

What is run must be exactly what the page shows, in its order, and a page
whose markers are wrong must be refused with the line, never half-run.
The real page is read too: its walkthrough must parse, which the e2e test
(tests/e2e/test_deploy_guide.py) then runs.
"""

from __future__ import annotations

import pytest

from docs.guide_blocks import (
    CLEANUP,
    DEPLOY_PAGE,
    SHELL_PRELUDE,
    STEP,
    VARIABLES,
    GuideError,
    deploy_walkthrough,
    parse,
    section,
)

PAGE = """# A page

## Before

```bash
echo not ours
```

## Walkthrough

Some words.

<!-- guide: variables -->

```bash
X=1
```

Output looks like:

```text
hello
```

<!-- guide: step make-it -->
```bash
echo "$X"
cat <<EOF
## not a heading
EOF
```

<!-- guide: cleanup -->

```bash
echo bye
```

## After

```bash
echo not ours either
```
"""


def test_the_section_is_cut_at_the_next_heading_of_its_level_not_inside_a_block():
    text, first = section(PAGE, "## Walkthrough")
    assert first == 9
    assert text.startswith("## Walkthrough\n") and "echo bye" in text
    assert "not ours" not in text
    assert "## not a heading" in text


def test_blocks_come_in_page_order_with_their_marker_lines():
    guide = parse(*section(PAGE, "## Walkthrough"))
    assert (guide.variables.kind, guide.variables.code, guide.variables.line) == (VARIABLES, "X=1", 13)
    (step,) = guide.steps
    assert (step.kind, step.name, step.line) == (STEP, "make-it", 25)
    assert step.code == 'echo "$X"\ncat <<EOF\n## not a heading\nEOF'
    assert (guide.cleanup.kind, guide.cleanup.code) == (CLEANUP, "echo bye")
    assert guide.step("make-it") is step


def test_a_script_is_the_prelude_the_variables_and_the_block():
    guide = parse(*section(PAGE, "## Walkthrough"))
    step = 'echo "$X"\ncat <<EOF\n## not a heading\nEOF'
    assert guide.script(guide.steps[0]) == f"{SHELL_PRELUDE}\nX=1\n{step}\n"
    assert guide.script(guide.variables) == f"{SHELL_PRELUDE}\nX=1\n"


def test_an_unknown_step_names_the_ones_there_are():
    guide = parse(*section(PAGE, "## Walkthrough"))
    with pytest.raises(KeyError, match="make-it"):
        guide.step("gone")


def _page(*blocks: str) -> str:
    return "\n\n".join(blocks) + "\n"


VARS = "<!-- guide: variables -->\n```bash\nX=1\n```"
STEP_A = "<!-- guide: step a -->\n```bash\ntrue\n```"
CLEAN = "<!-- guide: cleanup -->\n```bash\ntrue\n```"


@pytest.mark.parametrize(("text", "message"), [
    (_page(VARS, "```bash\nls\n```", STEP_A, CLEAN), "line 6: a bash block without a guide marker"),
    (_page(VARS, "<!-- guide: step a -->\n```sh\nls\n```", CLEAN), "line 6: marker followed by a sh block"),
    (_page(VARS, "<!-- guide: step a -->\nwords\n```bash\nls\n```", CLEAN), "line 6: marker not followed"),
    (_page(VARS, STEP_A, CLEAN, "<!-- guide: step b -->"), "marker not followed by a bash block"),
    (_page(VARS, "<!-- guide: step Bad_Name -->\n```bash\nls\n```", CLEAN), "needs a name"),
    (_page(VARS, "<!-- guide: step -->\n```bash\nls\n```", CLEAN), "needs a name"),
    (_page(VARS, "<!-- guide: cleanup now -->\n```bash\nls\n```"), "takes no name"),
    (_page(VARS, "<!-- guide: setup -->\n```bash\nls\n```", CLEAN), "unknown guide marker 'setup'"),
    (_page(VARS, STEP_A, STEP_A, CLEAN), "step 'a' again"),
    (_page(STEP_A, CLEAN), "exactly one variables block, found 0"),
    (_page(VARS, VARS, STEP_A, CLEAN), "exactly one variables block, found 2"),
    (_page(VARS, STEP_A), "exactly one cleanup block, found 0"),
    (_page(STEP_A, VARS, CLEAN), "the variables block must come first"),
    (_page(VARS, CLEAN, STEP_A), "the cleanup block must come last"),
    (_page(VARS, CLEAN), "no step"),
    (_page(VARS, "<!-- guide: step a -->\n```bash\nls\n"), "line 7: code block never closed"),
])
def test_a_page_that_breaks_the_rules_is_refused_with_its_line(text, message):
    with pytest.raises(GuideError, match=message):
        parse(text)


def test_a_missing_heading_or_a_heading_that_is_none_is_refused():
    with pytest.raises(GuideError, match="no heading"):
        section(PAGE, "## Elsewhere")
    with pytest.raises(GuideError, match="not a Markdown heading"):
        section(PAGE, "Walkthrough")


def test_the_deploy_page_walkthrough_parses():
    guide = deploy_walkthrough(DEPLOY_PAGE.read_text())
    assert len(guide.steps) >= 5
