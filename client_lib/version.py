"""The installed version of MetaFlow, for every command's ``--version``."""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTION = "metaflow-sdn"


def version() -> str:
    """The distribution's version, or "unknown" when run from a tree that was
    never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print "<prog> <version>" and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
