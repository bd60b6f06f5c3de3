"""Configuration files: one TOML file per daemon, read against its flags.

Every setting of `metaflow-controller`, `metaflow-agent` and `metaflow-fs`
is declared once, as an argparse argument; a file named by ``--config FILE``
may give any of them as a top-level key, so nothing is declared twice. A key
is the flag's long name without its leading dashes, dashes kept
(``secret-file``, ``of-port``); a positional argument's key is its name
(``mountpoint``). Its value's type comes from the flag: a switch
(``--open-reads``) is a boolean, true meaning the flag is given; ``type=int``
an integer; ``type=float`` a number; anything else a string, converted by the
flag's own type function; a repeatable flag (``--own``) or one taking several
values a list; ``choices`` are checked. One more key, ``role``, names the
daemon the file is for and is refused by the others.

Precedence, lowest first: the flag's default, the file, the command line (a
list given on the command line replaces the file's). The daemon's own checks
(`from_args` of each role's module) run on the result, and a refusal that
names a flag the file set names the file and its key too. Anything wrong
exits 2 before the daemon opens a socket or a store.

The roles are named by module (`ROLES`), not imported: this module is
standard-library only, and each role's parser needs that role's extra.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from client_lib.errors import InvalidArgument

T = TypeVar("T")

CONFIG_FLAG = "--config"
ROLE_KEY = "role"
Source = Literal["default", "file", "command line"]
_UNSET = object()
"""A setting the command line did not give (`layer`)."""


@dataclass(frozen=True)
class Role:
    """A daemon that reads a configuration file: its `module` has ``parser()``
    (every flag) and ``from_args(args)`` (its checks, raising InvalidArgument
    that names the flag), and needs the `extra` installed to be imported."""

    name: str
    program: str
    module: str
    extra: str

    def _module(self) -> Any:
        try:
            return importlib.import_module(self.module)
        except ImportError as exc:
            raise InvalidArgument(f"the {self.name}'s settings need the {self.extra} extra "
                                  f"(pip install 'metaflow-sdn[{self.extra}]'): {exc}") from None

    def parser(self) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = self._module().parser()
        return made

    def check(self, args: argparse.Namespace) -> object:
        return self._module().from_args(args)


ROLES: dict[str, Role] = {role.name: role for role in (
    Role("controller", "metaflow-controller", "controller.settings", "controller"),
    Role("agent", "metaflow-agent", "nat_agent.daemon", "agent"),
    Role("fs", "metaflow-fs", "client_lib.fs.mount", "fs"),
    Role("site-sync", "metaflow-site-sync", "nat_agent.site_sync", "agent"),
)}


class ConfigError(InvalidArgument):
    """A file that cannot configure its daemon; the message names the file and the key."""

    def __init__(self, path: Path | str, what: str, key: str | None = None) -> None:
        where = f"{path}: key '{key}'" if key is not None else str(path)
        super().__init__(f"{where}: {what}")
        self.path, self.key = Path(path), key


def checked(flag: str, parse: Callable[[str], T], text: str) -> T:
    """`parse(text)` for a daemon's check (``from_args``), its refusal (a
    ValueError) naming `flag`, so that `Layered.blame` can name the file's key."""
    try:
        return parse(text)
    except ValueError as exc:
        raise InvalidArgument(f"{flag}: {exc}") from None


def add_config_flag(p: argparse.ArgumentParser) -> None:
    """``--config FILE``: every daemon's, so its --help and flag table show it."""
    p.add_argument(CONFIG_FLAG, metavar="FILE", default=None,
                   help="read settings from this TOML file (keys: the flags' long names without their "
                        "leading --; flags on the command line override it)")


def key_of(action: argparse.Action) -> str:
    long = [name for name in action.option_strings if name.startswith("--")]
    return long[0][2:] if long else action.dest


def keys(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every key a file may set for the parser's daemon, in declaration order:
    each argument but --help, --version and --config."""
    return {key_of(action): action for action in p._actions   # argparse has no public list of them
            if not isinstance(action, argparse._HelpAction | argparse._VersionAction)
            and CONFIG_FLAG not in action.option_strings}


def is_switch(action: argparse.Action) -> bool:
    return action.nargs == 0


def is_list(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+") or \
        isinstance(action.nargs, int)


def type_name(action: argparse.Action) -> str:
    """The key's TOML type, as the reference shows it."""
    if is_switch(action):
        return "boolean"
    if action.choices is not None:
        one = " | ".join(json.dumps(choice) for choice in action.choices)
    elif action.type is int:
        one = "integer"
    elif action.type is float:
        one = "number"
    else:
        one = "string" if action.metavar is None else f"string ({action.metavar})"
    return f"list of {one}" if is_list(action) else one


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a table"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), type(value).__name__)


def _scalar(action: argparse.Action, value: object) -> object:
    """One value of a key, as its flag's parser would have made it; ValueError says what is wrong."""
    if action.type is int or action.type is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                (action.type is int and isinstance(value, float)):
            want = "an integer" if action.type is int else "a number"
            raise ValueError(f"must be {want}, not {_toml_type(value)} ({value!r})")
        converted: object = action.type(value)
    elif not isinstance(value, str):
        raise ValueError(f"must be a string, not {_toml_type(value)} ({value!r})")
    elif action.type is None:
        converted = value
    else:
        convert: Callable[[str], object] = action.type   # type: ignore[assignment]
        try:
            converted = convert(value)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise ValueError(f"{value!r}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"must be one of {', '.join(map(repr, action.choices))}, not {converted!r}")
    return converted


def convert(action: argparse.Action, value: object) -> object:
    """A file's value for `action`, checked and converted as its flag's would be."""
    if is_switch(action):
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {_toml_type(value)} ({value!r})")
        return action.const if value else action.default
    if not is_list(action):
        return _scalar(action, value)
    if not isinstance(value, list):
        raise ValueError(f"must be a list, not {_toml_type(value)} ({value!r})")
    if isinstance(action.nargs, int) and len(value) != action.nargs:
        raise ValueError(f"must hold {action.nargs} values, not {len(value)}")
    if action.nargs == "+" and not value:
        raise ValueError("must hold at least one value")
    return [_scalar(action, item) for item in value]


def load(path: Path | str) -> dict[str, Any]:
    """The file's table; ConfigError if it cannot be read or is not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(path, f"cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, f"not TOML: {exc}") from None


def read(path: Path | str, role: Role, p: argparse.ArgumentParser) -> dict[str, object]:
    """A file's settings for `role` (parser `p`), by argparse dest; ConfigError
    names the file and the key of the first thing wrong."""
    table = load(path)
    known = keys(p)
    out: dict[str, object] = {}
    for key, value in table.items():
        if key == ROLE_KEY:
            if value != role.name:
                raise ConfigError(path, f"this file is for {value!r}, not the {role.name} "
                                        f"({role.program})", key)
            continue
        action = known.get(key)
        if action is None:
            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ConfigError(path, f"unknown key: {role.program} has no such setting{hint}", key)
        try:
            out[action.dest] = convert(action, value)
        except ValueError as exc:
            raise ConfigError(path, str(exc), key) from None
    return out


def config_path(argv: Sequence[str]) -> str | None:
    """The ``--config`` of a command line, found before the full parse (which needs the file)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(CONFIG_FLAG, default=None)
    found: str | None = pre.parse_known_args(argv)[0].config
    return found


@dataclass(frozen=True)
class Layered:
    """A command line laid over a file laid over the defaults: the values (by
    dest) and where each came from."""

    args: argparse.Namespace
    sources: dict[str, Source]
    path: str | None

    def blame(self, message: str, p: argparse.ArgumentParser) -> str:
        """`message` (a check's refusal naming a flag), naming the file and key
        when the refused flag's value came from the file."""
        for key, action in keys(p).items():
            if self.sources.get(action.dest) == "file" and \
                    re.search(rf"(?<![\w-])--{re.escape(key)}(?![\w-])", message):
                return str(ConfigError(self.path or "", message, key))
        return message


def layer(role: Role, p: argparse.ArgumentParser, argv: Sequence[str]) -> Layered:
    """Parse `argv` with `p` over the file its ``--config`` names. A file's
    error is raised (ConfigError); a command line's is argparse's own exit."""
    path = config_path(argv)
    from_file = read(path, role, p) if path is not None else {}
    for action in keys(p).values():
        if action.dest in from_file:      # the file gives it: neither required nor positional-only
            action.required = False
            if not action.option_strings:
                action.nargs = "?"
    base = p.parse_args(argv)
    # Again with every default withheld (the parser's own, from set_defaults,
    # by a placeholder already there): what is left is what the command line said.
    saved = {action: action.default for action in keys(p).values()}
    unset = argparse.Namespace(**{action.dest: _UNSET for action in saved if not is_list(action)})
    for action in saved:
        action.default = argparse.SUPPRESS
    try:
        parsed = vars(p.parse_args(argv, unset))
        given = {dest: value for dest, value in parsed.items() if value is not _UNSET}
    finally:
        for action, default in saved.items():
            action.default = default
    sources: dict[str, Source] = {}
    for action in keys(p).values():
        dest = action.dest
        if dest in given:
            setattr(base, dest, given[dest])
            sources[dest] = "command line"
        elif dest in from_file:
            setattr(base, dest, from_file[dest])
            sources[dest] = "file"
        else:
            sources[dest] = "default"
    return Layered(base, sources, path)


def parse(role: Role, p: argparse.ArgumentParser, argv: Sequence[str] | None,
          check: Callable[[argparse.Namespace], T]) -> tuple[argparse.Namespace, T]:
    """A daemon's settings from its command line and ``--config`` file, checked
    by `check`: anything wrong exits 2 (argparse's error) naming the file and
    key where the value came from the file."""
    try:
        layered = layer(role, p, sys.argv[1:] if argv is None else list(argv))
    except InvalidArgument as exc:
        p.error(str(exc))
    try:
        return layered.args, check(layered.args)
    except InvalidArgument as exc:
        p.error(layered.blame(str(exc), p))


def rereader(role: Role, make_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None,
             check: Callable[[argparse.Namespace], object]) -> Callable[[], argparse.Namespace] | None:
    """What a daemon's SIGHUP re-reads: its command line (which cannot change)
    over its ``--config`` file as the file is now, checked by `check` (the
    daemon's own checks, run for their refusals). None when the command line
    names no file: there is nothing to re-read. Unlike `parse`, a refusal
    raises InvalidArgument (naming the file and key) instead of exiting: the
    daemon is running, and a bad edit must leave it running as it was."""
    line = list(sys.argv[1:] if argv is None else argv)
    if config_path(line) is None:
        return None

    def reread() -> argparse.Namespace:
        p = make_parser()   # `layer` relaxes the parser it is given: a fresh one each time
        try:
            layered = layer(role, p, line)
        except SystemExit:
            raise InvalidArgument("the command line no longer parses over the file "
                                  "(a required setting left it?)") from None
        try:
            check(layered.args)
        except InvalidArgument as exc:
            raise InvalidArgument(layered.blame(str(exc), p)) from None
        return layered.args
    return reread


def toml_value(value: object) -> str | None:
    """A setting as a TOML value (None: TOML has no null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        items = [toml_value(item) for item in value]
        return "[" + ", ".join(item for item in items if item is not None) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def effective(role: Role, layered: Layered, p: argparse.ArgumentParser) -> str:
    """The settings as a TOML file, each with where it came from (`check-config`'s output):
    the file's own values as written (a flag's type function may have made another
    kind of value of one), the others as parsed."""
    table = load(layered.path) if layered.path is not None else {}
    lines = [f'{ROLE_KEY} = "{role.name}"']
    for key, action in keys(p).items():
        source = layered.sources[action.dest]
        value = toml_value(table[key] if source == "file" else getattr(layered.args, action.dest))
        lines.append(f"# {key}: not set ({source})" if value is None else f"{key} = {value}  # {source}")
    return "\n".join(lines)


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    """`metaflowctl check-config`'s arguments."""
    p.add_argument("file", help="the TOML file to check")
    p.add_argument("--role", choices=tuple(ROLES), default=None,
                   help="the daemon it is for (default: the file's role key, else guessed from its keys)")
    p.add_argument("flags", nargs=argparse.REMAINDER, metavar="FLAG",
                   help="after --: flags the daemon would be given too (they override the file)")


def guess_role(path: str) -> Role:
    """The file's ``role`` key, else the one role whose keys hold all the file's."""
    table = load(path)
    if ROLE_KEY in table:
        named = table[ROLE_KEY]
        if not isinstance(named, str) or named not in ROLES:
            raise ConfigError(path, f"must be one of {', '.join(map(repr, ROLES))}, not {named!r}",
                              ROLE_KEY)
        return ROLES[named]
    fits = [role for role in ROLES.values() if _holds(role, set(table))]
    if len(fits) != 1:
        which = " or ".join(role.name for role in fits) if fits else "no daemon"
        raise ConfigError(path, f"its keys fit {which}; add a role key (role = \"agent\") or give --role")
    return fits[0]


def _holds(role: Role, names: set[str]) -> bool:
    try:
        return names <= set(keys(role.parser()))
    except InvalidArgument:   # that role's extra is not installed here
        return False


def check_file(args: argparse.Namespace) -> int:
    """Validate a file for its daemon and print the effective settings; 0 good, 2 refused."""
    try:
        role = ROLES[args.role] if args.role else guess_role(args.file)
        flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags   # argparse may keep the --
        if "--role" in flags:
            raise InvalidArgument("give --role before FILE (what follows FILE is the daemon's flags)")
        p = role.parser()
        layered = layer(role, p, [*flags, CONFIG_FLAG, args.file])
        try:
            role.check(argparse.Namespace(**vars(layered.args)))   # a check may convert values in place
        except InvalidArgument as exc:
            raise InvalidArgument(layered.blame(str(exc), p)) from None
    except InvalidArgument as exc:
        print(f"metaflowctl check-config: {exc}", file=sys.stderr)
        return 2
    print(f"# {role.program}: the settings of {args.file}, each with where it comes from")
    print(effective(role, layered, p))
    return 0

