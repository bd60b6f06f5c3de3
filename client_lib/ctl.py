"""`metaflowctl get|put|del|stat PATH`: the client library from a shell.

Without `--via`, a request goes where a file system's would: to the path's
MetaDataID on port 9000, routed by the switches. `--via HOST[:PORT]` sends
it to one agent directly (a standalone agent on loopback, say).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from client_lib.client import MetaFlowClient, MetaFlowError
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.metadata import FileMetadata, MetadataFormatError


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="absolute path of the file or directory")
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR, help="MetaDataID space (CIDR)")
    p.add_argument("--port", type=int, default=9000, help="metadata service port")
    p.add_argument("--via", default=None, metavar="HOST[:PORT]",
                   help="send to this agent instead of the MetaDataID address")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds per attempt")


def add_put_options(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--value", default=None, help="store this text as the value")
    what.add_argument("--dir", action="store_true", help="store directory metadata")
    p.add_argument("--size", type=int, default=0, help="file size in bytes (file metadata)")


def _client(args: argparse.Namespace) -> MetaFlowClient:
    route = None
    if args.via:
        host, _, port = args.via.partition(":")
        target = (host, int(port) if port else args.port)
        route = lambda _address: target  # noqa: E731 - one fixed destination
    return MetaFlowClient(space=args.space, port=args.port, timeout=args.timeout, route=route)


def _show(value: bytes) -> str:
    try:
        return json.dumps(dataclasses.asdict(FileMetadata.from_bytes(value)), indent=2)
    except MetadataFormatError:
        return value.decode("utf-8", "backslashreplace")


def run(args: argparse.Namespace) -> int:
    """Run one of get/put/del/stat; exit 1 when the path does not exist."""
    try:
        with _client(args) as client:
            where = f"{args.path} -> {client.address(args.path)}"
            if args.command == "put":
                now = int(time.time() * 1000)
                if args.value is not None:
                    value: bytes | FileMetadata = args.value.encode()
                elif args.dir:
                    value = FileMetadata.new_dir(args.path, now)
                else:
                    value = FileMetadata.new_file(args.path, args.size, now)
                client.put(args.path, value)
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
    except (MetaFlowError, MetadataFormatError) as exc:
        print(f"metaflowctl {args.command}: {exc}", file=sys.stderr)
        return 2
