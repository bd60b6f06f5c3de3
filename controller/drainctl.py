"""`metaflowctl drain SERVER` and `metaflowctl undrain SERVER`.

`drain` asks the controller to move everything SERVER holds to others
(`POST /metaflow/servers/SERVER/drain`, answered at once), then polls
`GET /metaflow/drains` and prints a line each time its progress changes,
until the server is drained (exit 0: it may be stopped) or the drain stops
short (exit 1, with the controller's reason). A refusal (unknown server,
failed, busy, already draining) or an unreachable controller exits 2.
`undrain` returns a drained server to the idle pool. Standard library only,
as `status`: it belongs to the client role.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from client_lib.api.rest import REST, DrainInfo
from client_lib.errors import MetaFlowError
from controller.status import add_controller_arguments, controller_client, failed

POLL_S = 1.0


def add_arguments(p: argparse.ArgumentParser, undrain: bool) -> Callable[[argparse.Namespace], int]:
    """The arguments of `drain` (or `undrain`), and the function that runs it."""
    p.add_argument("server", help="the drained server's name" if undrain
                   else "the storage server's name, as it registered")
    add_controller_arguments(p)
    if undrain:
        return run_undrain
    p.add_argument("--poll", type=float, default=POLL_S, metavar="S",
                   help=f"seconds between progress reads (default {POLL_S:g})")
    p.add_argument("--no-wait", action="store_true", help="start the drain and return at once")
    return run_drain


def progress(name: str, info: DrainInfo) -> str:
    """One line of a drain's progress."""
    line = (f"{name}: {info.state}, {info.blocks_left} blocks and {info.backups_left} backup copies left; "
            f"{info.moves} moves ({info.keys_moved} keys) and {info.backups_moved} copies moved "
            f"in {info.seconds:.1f} s")
    return line + (f" [{info.step}]" if info.step else "")


def run_drain(args: argparse.Namespace) -> int:
    name = args.server
    try:
        client = controller_client(args)
        started = client.call(REST.drain, name=name)
        print(f"draining {name}: {started.detail.get('blocks', 0)} blocks as primary, "
              f"{started.detail.get('backups', 0)} backup copies", flush=True)
        if args.no_wait:
            return 0
        last = ""
        while True:
            info = client.call(REST.drains).drains.get(name)
            if info is None:
                print(f"metaflowctl drain: the controller has no drain of {name} (it restarted?); "
                      "a drain is not resumed: run it again", file=sys.stderr)
                return 1
            line = progress(name, info)
            if line != last:
                print(line, flush=True)
                last = line
            if info.state == "drained":
                print(f"{name} is drained: it holds nothing and may be stopped; "
                      f"`metaflowctl undrain {name}` returns it to the idle pool")
                return 0
            if info.state == "stopped":
                print(f"metaflowctl drain: the drain of {name} stopped: {info.reason}", file=sys.stderr)
                return 1
            time.sleep(args.poll)
    except MetaFlowError as exc:
        return failed("drain", args, exc)


def run_undrain(args: argparse.Namespace) -> int:
    try:
        outcome = controller_client(args).call(REST.undrain, name=args.server)
    except MetaFlowError as exc:
        return failed("undrain", args, exc)
    print(f"{outcome.server}: {outcome.detail.get('note', outcome.operation)}")
    return 0
