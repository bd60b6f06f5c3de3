"""systemd's notify protocol (`client_lib.sdnotify`) against a real datagram
socket, named by a path and in the abstract namespace, as systemd names it;
and the SIGHUP reload every daemon shares (`client_lib.reload`)."""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_lib import sdnotify
from client_lib.errors import InvalidArgument
from client_lib.reload import Outcome, Reloader, compare


@pytest.fixture(params=["path", "abstract"])
def manager(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A socket standing in for systemd's, named in NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify")
        sock.bind(name)
    else:
        name = f"@metaflow-test-{secrets.token_hex(8)}"
        sock.bind("\0" + name[1:])
    sock.settimeout(5)
    monkeypatch.setenv(sdnotify.ENV, name)
    yield sock
    sock.close()


def _fields(sock: socket.socket) -> dict[str, str]:
    return dict(line.split("=", 1) for line in sock.recv(4096).decode().split("\n"))


def test_each_state_reaches_the_manager(manager: socket.socket) -> None:
    assert sdnotify.ready("serving on 127.0.0.1:9000")
    assert _fields(manager) == {"READY": "1", "STATUS": "serving on 127.0.0.1:9000"}
    assert sdnotify.stopping()
    assert _fields(manager) == {"STOPPING": "1"}
    assert sdnotify.status("waiting for\nthe controller")   # one line, whatever it is given
    assert _fields(manager) == {"STATUS": "waiting for the controller"}
    assert sdnotify.reloading()
    reloading = _fields(manager)
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0


def test_without_a_manager_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sdnotify.ENV, raising=False)
    assert not sdnotify.ready()


def test_a_manager_that_is_gone_is_logged_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(sdnotify.ENV, str(tmp_path / "nobody"))
    assert not sdnotify.stopping()
    assert "cannot notify the service manager" in caplog.text


def test_compare_splits_what_changed_into_live_and_restart() -> None:
    old = {"log_level": "INFO", "heartbeat": 0.25, "listen": ("0.0.0.0", 9000), "secret": b"a"}
    new = {"log_level": "DEBUG", "heartbeat": 0.25, "listen": ("0.0.0.0", 9001), "secret": b"b",
           "config": "x.toml"}
    outcome = compare(old, new, live={"log_level", "heartbeat", "config"})
    assert outcome.applied == {"log_level": ("INFO", "DEBUG")}
    assert outcome.restart == ["config", "listen", "secret"]   # a name new to the settings: a restart
    assert compare(old, dict(old), live=set()) == Outcome()


def test_the_report_names_secrets_but_never_shows_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    compare({"log_level": "INFO", "secret": b"old-secret"}, {"log_level": "DEBUG", "secret": b"new-secret"},
            {"log_level"}).report(logging.getLogger("test"))
    assert "applied log_level 'INFO' -> 'DEBUG'" in caplog.text
    assert "only applied by a restart (the running values stay): secret" in caplog.text
    assert "old-secret" not in caplog.text and "new-secret" not in caplog.text


def test_a_reload_tells_the_manager_and_reports(manager: socket.socket,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    running = {"level": "INFO"}

    def apply(new: dict[str, str]) -> Outcome:
        outcome = compare(running, new, {"level"})
        running.update(new)
        return outcome

    outcome = Reloader(logging.getLogger("test"), lambda: {"level": "DEBUG"}, apply)()
    assert outcome is not None and outcome.applied == {"level": ("INFO", "DEBUG")}
    assert running == {"level": "DEBUG"}
    assert "RELOADING" in _fields(manager) and _fields(manager)["READY"] == "1"
    assert "applied level 'INFO' -> 'DEBUG'" in caplog.text


def test_a_refused_reread_keeps_the_running_settings(manager: socket.socket,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    applied: list[object] = []

    def reread() -> dict[str, str]:
        raise InvalidArgument("agent.toml: heartbeat: must be positive, not -1")

    assert Reloader(logging.getLogger("test"), reread, applied.append)() is None  # type: ignore[arg-type]
    assert applied == []
    assert "reload refused, the running settings stay: agent.toml: heartbeat" in caplog.text
    assert "RELOADING" in _fields(manager) and _fields(manager)["READY"] == "1"   # back to ready


def test_without_a_file_there_is_nothing_to_reread(manager: socket.socket,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    assert Reloader(logging.getLogger("test"), None, lambda new: Outcome())() is None
    assert "nothing to re-read" in caplog.text
    manager.settimeout(0.2)
    with pytest.raises(TimeoutError):   # no RELOADING for a reload that never happens
        manager.recv(4096)
