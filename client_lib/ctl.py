"""`metaflowctl get|put|del|stat PATH`: the client library from a shell.

Without `--via`, a request goes where a file system's would: to the path's
MetaDataID on port 9000, routed by the switches. `--via HOST[:PORT]` sends
it to one agent directly (a standalone agent on loopback, say).

Exit status: 0 done, 1 the path does not exist, 2 an error (printed as
"metaflowctl COMMAND: message", from the client's one error family).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from client_lib.cidr import Block
from client_lib.client import DEFAULT_DEADLINE, DEFAULT_TIMEOUT, MetaFlowClient, RetryPolicy
from client_lib.constants import DEFAULT_SPACE_CIDR, METAFLOW_PORT
from client_lib.errors import InvalidArgument, MetadataFormatError, MetaFlowError
from client_lib.metadata import FileMetadata
from client_lib.routes import parse_route, static_route

__all__ = ["add_common", "add_connection", "add_put_options", "client_from", "run"]


def add_common(p: argparse.ArgumentParser) -> None:
    """The arguments of every get/put/del/stat command."""
    p.add_argument("path", help="absolute path of the file or directory")
    add_connection(p)


def add_connection(p: argparse.ArgumentParser) -> None:
    """How a command reaches the service (`client_from`): shared by every
    command-line client, metaflow-fs included."""
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR, help="MetaDataID space (CIDR)")
    p.add_argument("--port", type=int, default=METAFLOW_PORT, help="metadata service port")
    p.add_argument("--via", default=None, metavar="HOST[:PORT]",
                   help="send to this agent instead of the MetaDataID address")
    p.add_argument("--route", action="append", default=None, metavar="CIDR=HOST[:PORT]",
                   help="send the IDs of CIDR to the agent at HOST:PORT, as the switches would (repeatable; "
                        "the longest prefix wins; together the routes cover --space): agents that split "
                        "the space without a fabric")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per attempt")
    p.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE,
                   help="seconds for the whole request, retries included")
    p.add_argument("--attempts", type=int, default=RetryPolicy.attempts,
                   help="attempts per request at most (the deadline bounds them too)")


def add_put_options(p: argparse.ArgumentParser) -> None:
    """What `put` stores: file metadata (default), directory metadata or raw text."""
    what = p.add_mutually_exclusive_group()
    what.add_argument("--value", default=None, help="store this text as the value")
    what.add_argument("--dir", action="store_true", help="store directory metadata")
    p.add_argument("--size", type=int, default=0, help="file size in bytes (file metadata)")


def _show(value: bytes) -> str:
    """Metadata as indented fields; any other value as text."""
    try:
        return json.dumps(dataclasses.asdict(FileMetadata.from_bytes(value)), indent=2)
    except MetadataFormatError:
        return value.decode("utf-8", "backslashreplace")


def _put(client: MetaFlowClient, args: argparse.Namespace) -> None:
    now = int(time.time() * 1000)
    if args.value is not None:
        client.put(args.path, args.value.encode("utf-8", "surrogateescape"))
    elif args.dir:
        client.put(args.path, FileMetadata.new_dir(args.path, now))
    else:
        client.put(args.path, FileMetadata.new_file(args.path, args.size, now))


def _execute(client: MetaFlowClient, args: argparse.Namespace) -> int:
    where = f"{args.path} -> {client.address(args.path)}"
    if args.command == "put":
        _put(client, args)
        print(f"stored {where}")
        return 0
    if args.command == "del":
        found = client.delete(args.path)
        print(f"{'deleted' if found else 'not found'}: {where}")
        return 0 if found else 1
    if args.command == "stat":
        meta = client.stat(args.path)
        if meta is None:
            print(f"not found: {where}", file=sys.stderr)
            return 1
        print(f"# {where}")
        print(json.dumps(dataclasses.asdict(meta), indent=2))
        return 0
    value = client.get(args.path)
    if value is None:
        print(f"not found: {where}", file=sys.stderr)
        return 1
    print(_show(value))
    return 0


def client_from(args: argparse.Namespace) -> MetaFlowClient:
    """The client `add_connection`'s arguments describe."""
    return MetaFlowClient(args.space, **connection_options(args))


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """`add_connection`'s arguments as any client class's keyword arguments
    (the mount also makes a `TrioMetaFlowClient` of them); `InvalidArgument`
    for a bad ``--route`` table."""
    options: dict[str, Any] = {"port": args.port, "timeout": args.timeout, "deadline": args.deadline,
                               "retry": RetryPolicy(args.attempts)}
    if args.route:
        if args.via is not None:
            raise InvalidArgument("give --via or --route, not both")
        try:
            space = Block.parse(args.space)
        except ValueError as exc:
            raise InvalidArgument(f"--space {args.space!r}: {exc}") from None
        options["route"] = static_route([parse_route(text, args.port) for text in args.route], space)
    else:
        options["via"] = args.via
    return options


def run(args: argparse.Namespace) -> int:
    """Run one of get/put/del/stat (`args.command`) with `add_common`'s arguments."""
    try:
        with client_from(args) as client:
            return _execute(client, args)
    except MetaFlowError as exc:
        print(f"metaflowctl {args.command}: {exc}", file=sys.stderr)
        return 2
