"""`client_lib.config`: a daemon's TOML file read against its argparse flags.

The loader on a toy parser (every kind of flag: int, float, string, choices,
a switch, a repeatable flag, one of fixed arity, a type function, a required
flag, a positional, a parser-level default), then the three real daemons'
parsers, the example files in deploy/examples/, and `metaflowctl
check-config`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from client_lib.api.auth import write_secret
from client_lib.config import (
    ROLES,
    ConfigError,
    Layered,
    Role,
    add_config_flag,
    keys,
    layer,
    parse,
    read,
)
from client_lib.errors import InvalidArgument
from controller.ctl import main as metaflowctl
from nat_agent.daemon import parse_args as parse_agent_args

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
TOY = Role("toy", "toy-daemon", __name__, "toy")


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"no port {port}")
    return port


def parser() -> argparse.ArgumentParser:
    """The toy daemon's flags: one of every kind the daemons use."""
    p = argparse.ArgumentParser(prog="toy-daemon")
    p.add_argument("target", help="where to")
    p.add_argument("--secret-file", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rate", type=float, default=2.5)
    p.add_argument("--name", default=None)
    p.add_argument("--mode", choices=("fast", "safe"), default="safe")
    p.add_argument("--open-reads", action="store_true")
    p.add_argument("--no-merge", dest="merge", action="store_false")
    p.add_argument("--own", action="append", default=None)
    p.add_argument("--pair", nargs=2, type=int, default=None)
    p.add_argument("--port", type=_port, default=80)
    p.add_argument("--deadline", type=float, default=10.0)
    p.set_defaults(deadline=30.0)   # as metaflow-fs does for the mount's connection flags
    p.add_argument("--version", action="version", version="1")
    add_config_flag(p)
    return p


def from_args(args: argparse.Namespace) -> argparse.Namespace:
    """The toy daemon's own check, naming its flag as the daemons' checks do."""
    if args.workers > 64:
        raise InvalidArgument(f"--workers must be at most 64, not {args.workers}")
    return args


def _file(tmp_path: Path, text: str, name: str = "toy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _refusal(tmp_path: Path, text: str) -> str:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        read(path, TOY, parser())
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and caught.value.path == path
    assert caught.value.key is None or message.startswith(f"{path}: key '{caught.value.key}': ")
    return message


def test_keys_are_the_long_flag_names_and_the_positional_without_help_version_or_config() -> None:
    assert list(keys(parser())) == ["target", "secret-file", "workers", "rate", "name", "mode", "open-reads",
                                    "no-merge", "own", "pair", "port", "deadline"]


def test_every_kind_of_value_is_converted_as_its_flag_would_be(tmp_path: Path) -> None:
    path = _file(tmp_path, 'target = "t"\nworkers = 3\nrate = 4\nname = "n"\nmode = "fast"\n'
                           'open-reads = true\nno-merge = true\nown = ["a", "b"]\npair = [1, 2]\n'
                           'port = "8080"\n')
    assert read(path, TOY, parser()) == {
        "target": "t", "workers": 3, "rate": 4.0, "name": "n", "mode": "fast", "open_reads": True,
        "merge": False, "own": ["a", "b"], "pair": [1, 2], "port": 8080}
    assert isinstance(read(path, TOY, parser())["rate"], float)


def test_a_switch_set_false_is_the_flag_not_given(tmp_path: Path) -> None:
    path = _file(tmp_path, "open-reads = false\nno-merge = false\n")
    assert read(path, TOY, parser()) == {"open_reads": False, "merge": True}


@pytest.mark.parametrize(("text", "key", "what"), [
    ('workers = "3"', "workers", "must be an integer, not a string ('3')"),
    ("workers = true", "workers", "must be an integer, not a boolean"),
    ("workers = 2.5", "workers", "must be an integer, not a number"),
    ('rate = "fast"', "rate", "must be a number, not a string"),
    ("name = 7", "name", "must be a string, not an integer"),
    ('open-reads = "yes"', "open-reads", "must be true or false, not a string"),
    ('mode = "slow"', "mode", "must be one of 'fast', 'safe', not 'slow'"),
    ('own = "a"', "own", "must be a list, not a string"),
    ("own = [1]", "own", "must be a string, not an integer"),
    ("pair = [1, 2, 3]", "pair", "must hold 2 values, not 3"),
    ('port = "70000"', "port", "'70000': no port 70000"),
    ('port = "http"', "port", "'http': invalid literal"),
    ("workers = {a = 1}", "workers", "must be an integer, not a table"),
])
def test_a_wrong_value_is_refused_naming_the_file_the_key_and_what_is_wrong(
        tmp_path: Path, text: str, key: str, what: str) -> None:
    message = _refusal(tmp_path, text + "\n")
    assert f"key '{key}': {what}" in message


def test_an_unknown_key_is_refused_with_the_nearest_real_one(tmp_path: Path) -> None:
    assert "key 'secret_file': unknown key: toy-daemon has no such setting (did you mean 'secret-file'?)" \
        in _refusal(tmp_path, 'secret_file = "s"\n')
    for not_a_key in ("help", "version", "config"):
        assert f"key '{not_a_key}': unknown key" in _refusal(tmp_path, f'{not_a_key} = "x"\n')


def test_a_file_for_another_role_or_not_toml_or_missing_is_refused(tmp_path: Path) -> None:
    assert "key 'role': this file is for 'agent', not the toy (toy-daemon)" in \
        _refusal(tmp_path, 'role = "agent"\n')
    assert read(_file(tmp_path, 'role = "toy"\n'), TOY, parser()) == {}
    assert ": not TOML: " in _refusal(tmp_path, "workers = \n")
    with pytest.raises(ConfigError, match="nowhere.toml: cannot read it: No such file"):
        read(tmp_path / "nowhere.toml", TOY, parser())


def _layer(tmp_path: Path, text: str, *argv: str) -> Layered:
    return layer(TOY, parser(), [*argv, "--config", str(_file(tmp_path, text))])


def test_the_command_line_overrides_the_file_which_overrides_the_defaults(tmp_path: Path) -> None:
    layered = _layer(tmp_path, 'target = "t"\nsecret-file = "s"\nworkers = 5\nrate = 9.0\nown = ["a"]\n',
                     "--workers", "1", "--own", "b", "--own", "c", "--open-reads")
    args = layered.args
    assert (args.target, args.secret_file, args.workers, args.rate) == ("t", "s", 1, 9.0)
    assert args.own == ["b", "c"]      # the command line's list replaces the file's
    assert (args.open_reads, args.merge, args.mode, args.deadline) == (True, True, "safe", 30.0)
    sources = {dest: source for dest, source in layered.sources.items() if source != "default"}
    # --workers 1 is the default's value, but the command line gave it
    assert sources == {"target": "file", "secret_file": "file", "workers": "command line", "rate": "file",
                       "own": "command line", "open_reads": "command line"}


def test_without_a_file_the_flags_parse_as_before(tmp_path: Path) -> None:
    layered = layer(TOY, parser(), ["there", "--secret-file", "s", "--deadline", "5"])
    assert vars(layered.args) == vars(parser().parse_args(["there", "--secret-file", "s", "--deadline", "5"]))
    assert layered.path is None and layered.sources["deadline"] == "command line"
    assert layered.sources["workers"] == "default"


def test_a_required_flag_or_positional_missing_from_both_is_refused_by_argparse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        _layer(tmp_path, 'target = "t"\n')
    assert caught.value.code == 2 and "required: --secret-file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        _layer(tmp_path, 'secret-file = "s"\n')
    assert caught.value.code == 2 and "required: target" in capsys.readouterr().err


def test_parse_names_the_file_and_key_when_the_check_refuses_a_value_from_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, 'target = "t"\nsecret-file = "s"\nworkers = 99\n')
    with pytest.raises(SystemExit) as caught:
        parse(TOY, parser(), ["--config", str(path)], from_args)
    assert caught.value.code == 2
    assert f"toy-daemon: error: {path}: key 'workers': --workers must be at most 64, not 99" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):    # the command line's value is its own: no file, no key named
        parse(TOY, parser(), ["--config", str(path), "--workers", "70"], from_args)
    err = capsys.readouterr().err
    assert "toy-daemon: error: --workers must be at most 64, not 70" in err and "key" not in err
    args, checked = parse(TOY, parser(), ["--config", str(path), "--workers", "7"], from_args)
    assert checked is args and args.workers == 7


def test_parse_refuses_a_bad_file_with_argparse_s_exit(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, 'target = "t"\nsecret-file = "s"\nrate = "x"\n')
    with pytest.raises(SystemExit) as caught:
        parse(TOY, parser(), ["--config", str(path)], from_args)
    assert caught.value.code == 2
    assert f"toy-daemon: error: {path}: key 'rate': must be a number" in capsys.readouterr().err


# -- the three daemons ----------------------------------------------------------------------------


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "secret")


@pytest.mark.parametrize("role", ROLES.values(), ids=lambda role: role.name)
def test_every_flag_of_every_daemon_is_a_key(role: Role) -> None:
    p = role.parser()
    flags = {name[2:] for action in p._actions for name in action.option_strings if name.startswith("--")}
    assert flags - set(keys(p)) <= {"help", "version", "config"} and {"help", "config"} <= flags
    assert p.prog == role.program


@pytest.mark.parametrize("role", ROLES.values(), ids=lambda role: role.name)
def test_the_example_file_validates_and_every_key_in_it_is_real(role: Role, secret: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / f"{role.name}.toml"
    table = tomllib.loads(path.read_text())
    assert table.pop("role") == role.name
    assert set(table) <= set(keys(role.parser())) and len(table) >= 5
    extra = ["--", "--secret-file", str(secret)] if "secret-file" in table else []
    if "layout" in table:   # the example layout, where the file names where it is installed
        extra = ["--", "--layout", str(EXAMPLES / "sites.toml")]
    assert metaflowctl(["check-config", str(path), *extra]) == 0
    shown = tomllib.loads(capsys.readouterr().out)   # the effective settings are a TOML file themselves
    assert shown["role"] == role.name
    for key, value in table.items():
        assert shown[key] == value or key in ("secret-file", "layout"), key


def test_check_config_shows_every_setting_with_its_source(tmp_path: Path, secret: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, f'secret-file = "{secret}"\nworkers = 2\nmax-clients = 10\n', "agent.toml")
    assert metaflowctl(["check-config", "--role", "agent", str(path), "--", "--workers", "3"]) == 0
    out = capsys.readouterr().out
    assert "\nworkers = 3  # command line\n" in out and "\nmax-clients = 10  # file\n" in out
    assert "\nfsync = \"batch\"  # default\n" in out and "\n# name: not set (default)\n" in out
    unset = {"name", "data-ip", "own", "controller", "replication"}   # None: no TOML value
    assert set(tomllib.loads(out)) == {"role"} | set(keys(ROLES["agent"].parser())) - unset


def test_check_config_shows_the_file_s_values_as_written(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, 'mountpoint = "/mnt"\ncentral-redis = "127.0.0.1:6400"\n', "fs.toml")
    assert metaflowctl(["check-config", "--role", "fs", str(path)]) == 0   # its type function makes a pair
    assert '\ncentral-redis = "127.0.0.1:6400"  # file\n' in capsys.readouterr().out


def test_several_controllers_are_one_string_separated_by_commas(tmp_path: Path, secret: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    urls = "http://10.255.0.1:8080,http://10.255.0.2:8080"
    path = _file(tmp_path, f'role = "agent"\nsecret-file = "{secret}"\ncontroller = "{urls}"\n')
    assert metaflowctl(["check-config", str(path)]) == 0
    assert f'\ncontroller = "{urls}"  # file\n' in capsys.readouterr().out
    args = parse_agent_args(["--secret-file", str(secret), "--controller", f"{urls}/,http://10.255.0.1:8080"])
    assert args.controller == urls.split(",")


@pytest.mark.parametrize(("text", "argv", "message"), [
    ('of-port = "x"\n', [], "key 'of-port': must be an integer"),              # guessed: the controller's
    ('secret-file = "{secret}"\nheartbeat-timeout = 0\n', [],
     "key 'heartbeat-timeout': --heartbeat-timeout must be positive"),
    ('role = "agent"\nworkers = 65\nsecret-file = "{secret}"\n', [],
     "key 'workers': --workers must be between 0 and 64"),
    ('role = "fs"\nmountpoint = "/mnt"\nroot = 0\n', [], "key 'root': --root must be 1 or"),
    ('role = "agent"\nsecret-file = "{secret}"\ncontroller = "http://10.0.0.1:8080,10.0.0.2:8080"\n', [],
     "key 'controller': --controller: '10.0.0.2:8080' is not a controller URL"),
    ('role = "fs"\nmountpoint = "/mnt"\nattr-timeout = -1\n', [], "key 'attr-timeout': --attr-timeout must"),
    ('role = "agent"\n', ["--role", "fs"], "key 'role': this file is for 'agent', not the fs"),
    ('role = "router"\n', [],
     "key 'role': must be one of 'controller', 'agent', 'fs', 'site-sync', not 'router'"),
    ('log-level = "DEBUG"\n', [], "its keys fit controller or agent or site-sync; add a role key"),
    ('colour = "blue"\n', [], "its keys fit no daemon"),
])
def test_check_config_refuses_what_the_daemon_would(tmp_path: Path, secret: Path, text: str,
                                                    argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, text.format(secret=secret))
    assert metaflowctl(["check-config", *argv, str(path)]) == 2
    assert f"metaflowctl check-config: {path}: {message}" in capsys.readouterr().err


def test_check_config_wants_its_role_before_the_file(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, 'role = "fs"\nmountpoint = "/mnt"\n')
    assert metaflowctl(["check-config", str(path), "--role", "fs"]) == 2
    assert "give --role before FILE" in capsys.readouterr().err


def test_check_config_without_the_role_s_extra_says_which_to_install(tmp_path: Path) -> None:
    """The client-only install: metaflowctl and the file's reading are the
    standard library; the agent's and the mount's parsers need their extras,
    and check-config names the extra instead of failing with a traceback."""
    for package in ("client_lib", "controller", "nat_agent"):
        shutil.copytree(ROOT / package, tmp_path / "src" / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "fastpath"))
    for role in ("agent", "fs"):
        path = _file(tmp_path, f'role = "{role}"\n', f"{role}.toml")
        probe = ("import sys; sys.path.insert(0, sys.argv[1]); from controller.ctl import main; "
                 "sys.exit(main(['check-config', sys.argv[2]]))")
        out = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(tmp_path / "src"), str(path)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 2, out.stderr
        assert f"metaflowctl check-config: the {role}'s settings need the {role} extra " \
               f"(pip install 'metaflow-sdn[{role}]'): No module named" in out.stderr
