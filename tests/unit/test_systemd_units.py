"""The systemd units of deploy/systemd/: `systemd-analyze verify` accepts each,
and each says what docs/systemd.md promises (notify, reload, restart, hardening).

`systemd-analyze verify` wants every ExecStart program to exist, and the units
name them where the docs install them (/opt/metaflow/bin). The test verifies
a copy whose program paths point at this venv's console scripts, the same
programs under another prefix; templates are verified as an instance. It
exits 0 on unknown keys and values it cannot parse (it only warns), so any
output at all fails the test.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
PREFIX = "/opt/metaflow/bin/"
"""Where docs/systemd.md installs the programs the units start."""
CONFIG = {"metaflow-controller.service": "/etc/metaflow/controller.toml",
          "metaflow-agent@.service": "/etc/metaflow/agent-%i.toml",
          "metaflow-fs@.service": "/etc/metaflow/fs-%i.toml",
          "metaflow-site-sync@.service": "/etc/metaflow/site-sync-%i.toml"}
"""The file each unit's daemon reads its settings from (``--config``)."""
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _sections(unit: Path) -> dict[str, dict[str, list[str]]]:
    """A unit's settings by section (a key may repeat, as ExecStartPre does)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def _service(name: str) -> dict[str, list[str]]:
    return _sections(ROOT / "deploy" / "systemd" / name)["Service"]


def test_there_is_a_unit_per_daemon() -> None:
    assert [u.name for u in UNITS] == sorted(CONFIG)


def test_systemd_analyze_verify_accepts_every_unit(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: the Makefile's APT_PACKAGES installs it (package systemd)"
    scripts = Path(sysconfig.get_path("scripts"))
    names = []
    for unit in UNITS:
        text = unit.read_text().replace(PREFIX, f"{scripts}/")
        name = unit.name.replace("@.", "@verify.")   # a template is verified as an instance
        (tmp_path / name).write_text(text)
        names.append(f"./{name}")
    out = subprocess.run([tool, "verify", "--man=no", *names], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout and not out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("unit", [u.name for u in UNITS])
def test_each_unit_notifies_reloads_restarts_and_is_hardened(unit: str) -> None:
    service = _service(unit)
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["Restart"] == ["on-failure"]
    assert service["NoNewPrivileges"] == ["yes"]
    program, *args = service["ExecStart"][0].split()
    assert program.startswith(PREFIX) and program.removeprefix(PREFIX) in SCRIPTS
    assert args[:2] == ["--config", CONFIG[unit]]


@pytest.mark.parametrize("unit", ["metaflow-controller.service", "metaflow-agent@.service"])
def test_the_daemons_see_a_read_only_system_and_a_private_tmp(unit: str) -> None:
    service = _service(unit)
    assert service["ProtectSystem"] == ["strict"] and service["PrivateTmp"] == ["yes"]


def test_the_agent_holds_only_the_network_capabilities_and_its_state() -> None:
    service = _service("metaflow-agent@.service")
    assert service["CapabilityBoundingSet"] == service["AmbientCapabilities"] == ["CAP_NET_ADMIN CAP_NET_RAW"]
    assert service["StateDirectory"] == ["metaflow/agent-%i"]
    assert service["WorkingDirectory"] == ["%S/metaflow/agent-%i"]
    assert _service("metaflow-controller.service")["CapabilityBoundingSet"] == [""]


def test_the_mount_stays_in_the_machines_mount_namespace() -> None:
    """Any option that gives the service a mount namespace of its own would
    hide the FUSE mount from everyone else: none of them, /dev/fuse alone."""
    service = _service("metaflow-fs@.service")
    namespaced = {"ProtectSystem", "PrivateTmp", "ProtectHome", "PrivateDevices", "ReadWritePaths",
                  "ReadOnlyPaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths",
                  "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups", "PrivateMounts",
                  "StateDirectory", "RuntimeDirectory"}
    assert not namespaced & service.keys()
    assert service["DevicePolicy"] == ["closed"] and service["DeviceAllow"] == ["/dev/fuse rw"]
    assert service["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
