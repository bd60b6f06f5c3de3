"""`metaflowctl`: the operator's command-line tool (Open vSwitch style naming).

    metaflowctl status [--controller URL] [--secret-file FILE] [--json]
    metaflowctl drain|undrain SERVER [--controller URL] [--secret-file FILE]
    metaflowctl get|put|del|stat PATH [--via HOST[:PORT]]
    metaflowctl secret [FILE]
    metaflowctl check-config [--role controller|agent|fs] FILE [-- FLAG...]
    metaflowctl snapshot|restore DIR --secret-file FILE [--controller URL]
    metaflowctl plan [...]     metaflowctl bench [...]

Each subcommand lives next to what it drives (`controller.status`,
`client_lib.ctl`); this module only names its own. Other packages contribute
theirs through the entry-point group `COMMAND_GROUP` (the benchmarks' plan
and bench: `benchmarks.ctl`, declared in pyproject.toml), so the controller
names no package above it. A subcommand's module is imported only when that
subcommand is chosen, and contributed ones are looked up only when the
chosen command is not one of metaflowctl's own: status, drain, undrain,
get/put/del/stat, secret, snapshot and restore run with the client role alone (the standard library), and only
plan and bench bring in the pure core, numpy and Mininet.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from client_lib.version import add_version_flag

Runner = Callable[[argparse.Namespace], int]
Setup = Callable[[argparse.ArgumentParser], Runner]
"""Adds a subcommand's arguments (importing what it needs) and returns how to run it."""


COMMAND_GROUP = "metaflowctl.commands"
"""The entry-point group through which a package adds subcommands: each entry
is named after its subcommand and refers to a `Command`."""


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, how it sets up its arguments, and a
    longer description for its own --help (the help line if none)."""

    help: str
    setup: Setup
    description: str | None = None


def _status(p: argparse.ArgumentParser) -> Runner:
    from controller.status import add_arguments, run

    add_arguments(p)
    return run


def _drain_command(undrain: bool) -> Setup:
    def setup(p: argparse.ArgumentParser) -> Runner:
        from controller.drainctl import add_arguments

        return add_arguments(p, undrain)

    return setup


def _key_command(put: bool) -> Setup:
    def setup(p: argparse.ArgumentParser) -> Runner:
        from client_lib.ctl import add_common, add_put_options, run

        add_common(p)
        if put:
            add_put_options(p)
        return run

    return setup


def _secret(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("file", nargs="?", type=Path, default=None,
                   help="write it here with mode 0600 (refused if the file exists) instead of printing it")
    return _run_secret


def _check_config(p: argparse.ArgumentParser) -> Runner:
    from client_lib.config import add_check_arguments, check_file

    add_check_arguments(p)
    return check_file


def _backup(command: str) -> Setup:
    def setup(p: argparse.ArgumentParser) -> Runner:
        from controller.backup import add_arguments

        return add_arguments(p, command)

    return setup


def _run_secret(args: argparse.Namespace) -> int:
    from client_lib.api.auth import new_secret, write_secret

    if args.file is None:
        print(new_secret())
        return 0
    if args.file.exists():
        # Replacing a live secret would lock every agent out of the controller.
        raise ValueError(f"{args.file} exists; remove it first to replace the cluster's secret")
    write_secret(args.file)
    print(f"wrote a new secret to {args.file} (mode 0600)", file=sys.stderr)
    return 0


COMMANDS: dict[str, Command] = {
    "status": Command("the controller's tree, servers, flow tables and recent events", _status,
                      "Read every view of the controller's REST API and print a summary (or JSON)."),
    "drain": Command("move everything a server holds to others, then keep it out of service",
                     _drain_command(undrain=False),
                     "Start draining SERVER and print its progress until it holds nothing (it may then "
                     "be stopped with nothing lost and no fail-over), or until the drain stops short."),
    "undrain": Command("return a drained server to the idle pool", _drain_command(undrain=True)),
    "get": Command("print the value stored for a path", _key_command(put=False)),
    "put": Command("store metadata (or --value) for a path", _key_command(put=True)),
    "del": Command("delete a path's metadata", _key_command(put=False)),
    "stat": Command("print a path's metadata as fields", _key_command(put=False)),
    "secret": Command("make a new cluster secret (for every --secret-file)", _secret,
                      "Print a new random secret, or write it to FILE readable by its owner only."),
    "check-config": Command("validate a daemon's TOML file and print its effective settings", _check_config,
                            "Check a configuration file of metaflow-controller, metaflow-agent or "
                            "metaflow-fs as the daemon would at start (exit 2 if it would refuse it), "
                            "and print every setting with where it comes from: the file, a flag given "
                            "after --, or the default. Needs the daemon's extra installed."),
    "snapshot": Command("write a copy of every block's records to a new directory", _backup("snapshot"),
                        "Read every block from its primary at one epoch (a block that moves meanwhile "
                        "is read again) into DIR: one file per block and a manifest with epochs, "
                        "counts and SHA-256 checksums (docs/backup.md)."),
    "restore": Command("load a snapshot into an empty cluster", _backup("restore"),
                       "Check every file of the snapshot in DIR, then write its records to the "
                       "primaries of their MetaDataIDs, replicated, and check the counts per block. "
                       "Refuses a cluster that holds records unless --force."),
}


def every_command() -> dict[str, Command]:
    """metaflowctl's own subcommands, then those installed packages declare in
    `COMMAND_GROUP` (one of its own names is not theirs to take)."""
    contributed = {entry.name: entry.load() for entry in metadata.entry_points(group=COMMAND_GROUP)
                   if entry.name not in COMMANDS}
    return {**COMMANDS, **contributed}


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    """The parser, with the arguments of the `chosen` subcommand only (the
    others are listed by name and help, without importing what they run;
    the contributed ones only if `chosen` is not one of metaflowctl's own)."""
    parser = argparse.ArgumentParser(
        prog="metaflowctl", description="The operator's tool: a cluster's status, metadata by path, "
                                        "secrets, the planner and the benchmark.")
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = COMMANDS if chosen in COMMANDS else every_command()
    for name, command in commands.items():
        p = sub.add_parser(name, help=command.help, description=command.description or command.help)
        if name == chosen:
            p.set_defaults(func=command.setup(p))
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The first word that is not an option: metaflowctl's own options
    (--help, --version) take no value, so that is the subcommand."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(chosen_command(args_list))
    args = parser.parse_args(args_list)
    try:
        code: int = args.func(args)
    except ValueError as err:
        parser.exit(2, f"metaflowctl {args.command}: error: {err}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
