"""The flag tables of docs/reference/flags.md, and the configuration keys of
docs/reference/configuration.md, against the parsers they come from.

Each command's flags are declared once, in its argparse parser; the pages'
tables are generated from them (`python -m docs.flag_tables`, run by `make
docs`). A flag added, removed, renamed, re-described or given another default
in the code must fail here until the pages are regenerated.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from client_lib.api.metrics import Family
from client_lib.config import ROLES, Role, add_config_flag
from docs.flag_tables import (
    COMMANDS,
    CONFIG,
    CONFIG_PAGE,
    METRICS,
    METRICS_PAGE,
    PAGE,
    Command,
    begin_marker,
    blocks,
    current,
    current_metrics,
    end_marker,
    main,
    render,
    render_families,
    render_keys,
    update,
)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_the_page_shows_what_the_parser_declares(command: Command) -> None:
    committed = blocks(PAGE.read_text(), [command.name])[command.name]
    assert committed == render(command.parser()), (
        f"the flags of {command.name} in {PAGE} differ from its parser: run `python -m docs.flag_tables`")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_every_flag_of_the_parser_has_a_row(command: Command) -> None:
    table = render(command.parser())
    for action in command.parser()._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}`" in table


def _toy() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toy")
    p.add_argument("target", help="where to")
    p.add_argument("--mode", choices=("a", "b"), default="a", help="a | b, <chosen>")
    p.add_argument("--rate", type=float, default=2.5, metavar="R", help="%(prog)s's rate")
    p.add_argument("--secret-file", required=True, help="the secret")
    p.add_argument("--quiet", action="store_true", help="say less")
    p.add_argument("--name", default=None)
    return p


def test_rows_say_flag_default_and_meaning() -> None:
    assert render(_toy()).splitlines() == [
        "| flag | default | meaning |",
        "|---|---|---|",
        "| `TARGET` | (positional) | where to |",
        "| `--mode` `{a,b}` | `a` | a \\| b, &lt;chosen&gt; |",
        "| `--rate` `R` | `2.5` | toy's rate |",
        "| `--secret-file` `SECRET_FILE` | required | the secret |",
        "| `--quiet` | off | say less |",
        "| `--name` `NAME` | none |  |",
    ]


def test_a_changed_parser_makes_the_committed_table_stale() -> None:
    toy = Command("toy", __name__, "_toy")  # its parser is the one loaded below
    page = f"# Flags\n\n{begin_marker('toy')}\n{render(_toy())}\n{end_marker('toy')}\n\nafter\n"
    changed = _toy()
    changed.add_argument("--new", type=int, default=7, help="a flag added in the code")
    fresh = current([toy], load=lambda _: changed)
    assert blocks(page, ["toy"])["toy"] != fresh["toy"]
    rewritten = update(page, fresh)
    assert blocks(rewritten, ["toy"]) == fresh
    assert rewritten.startswith("# Flags\n\n") and rewritten.endswith("\n\nafter\n")


def test_a_page_without_a_command_s_markers_is_refused() -> None:
    with pytest.raises(KeyError, match="toy"):
        update("# Flags\n", {"toy": render(_toy())})


@pytest.mark.parametrize("role", ROLES.values(), ids=lambda role: role.name)
def test_the_configuration_page_shows_the_keys_the_parser_declares(role: Role) -> None:
    committed = blocks(CONFIG_PAGE.read_text(), [role.program], CONFIG)[role.program]
    assert committed == render_keys(role.parser()), (
        f"the keys of {role.program} in {CONFIG_PAGE} differ from its parser: "
        "run `python -m docs.flag_tables`")


def test_key_rows_say_key_type_default_and_meaning() -> None:
    p = _toy()
    p.add_argument("--own", action="append", metavar="CIDR", help="repeatable")
    add_config_flag(p)
    assert render_keys(p).splitlines() == [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
        "| `target` | string | required | where to |",
        '| `mode` | "a" \\| "b" | `"a"` | a \\| b, &lt;chosen&gt; |',
        "| `rate` | number | `2.5` | toy's rate |",
        "| `secret-file` | string | required | the secret |",
        "| `quiet` | boolean | `false` | say less |",
        "| `name` | string | none |  |",
        "| `own` | list of string (CIDR) | none | repeatable |",
    ]


def test_the_check_names_a_stale_configuration_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Copies of both pages, one of them made stale: --check names it, a run rewrites it."""
    stale, flags = tmp_path / "configuration.md", tmp_path / "flags.md"
    flags.write_text(PAGE.read_text())
    page = CONFIG_PAGE.read_text()
    agent = blocks(page, ["metaflow-agent"], CONFIG)["metaflow-agent"]
    renamed = agent.replace("| `workers` |", "| `threads` |")
    assert renamed != agent
    stale.write_text(update(page, {"metaflow-agent": renamed}, CONFIG))
    monkeypatch.setattr("docs.flag_tables.CONFIG_PAGE", stale)
    monkeypatch.setattr("docs.flag_tables.PAGE", flags)
    assert main(["--check"]) == 1
    assert capsys.readouterr().err.strip() == f"{stale}: the config of metaflow-agent differ from its parser"
    main([])
    assert stale.read_text() == page and main(["--check"]) == 0


@pytest.mark.parametrize("program", ["metaflow-controller", "metaflow-agent"])
def test_the_metrics_page_shows_what_the_exporters_declare(program: str) -> None:
    committed = blocks(METRICS_PAGE.read_text(), [program], METRICS)[program]
    assert committed == current_metrics()[program], (
        f"the metrics of {program} in {METRICS_PAGE} differ from client_lib.api.metrics: "
        "run `python -m docs.flag_tables`")


def test_a_family_added_to_the_declaration_shows_up_in_its_table() -> None:
    extra = Family("metaflow_test_things_total", "counter", "things | counted", ("switch",))
    table = render_families([extra])
    assert "| `metaflow_test_things_total` | counter | `switch` | things \\| counted |" in table
