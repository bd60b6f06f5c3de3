"""Store specs (``leveldb:DIR``, ``redis://...``, ``redis-server:DIR``, ...) and `open_store`.

Apart from `nat_agent.store` so that the store interface does not import
its own implementations: this module depends on both stores, and they on
the interface, with no cycle.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from nat_agent.leveldb_store import LevelDBStore
from nat_agent.redis_store import RedisStore
from nat_agent.store import DEFAULT_FSYNC, FsyncMode, Store, check_fsync, check_width, encode_path

__all__ = ["open_store"]

_SPEC_HELP = (
    "expected leveldb:PATH, redis://HOST[:PORT][/DB][?prefix=P], "
    "unix:///SOCKET[?db=N&prefix=P] or redis-server:DIR"
)


def open_store(spec: str, width: int, fsync: FsyncMode = DEFAULT_FSYNC) -> Store:
    """Open the store a spec names; ``ValueError`` for a spec that names none.

    ``fsync`` is what a write waits for (``nat_agent.store`` says what each
    mode promises, and each store how it keeps the promise).

    Specs:

    * ``leveldb:PATH`` -- a LevelDB directory, created if missing.
    * ``redis://HOST[:PORT][/DB][?prefix=P]`` -- an existing redis-server over
      TCP (port 6379 and database 0 by default; ``[::1]`` for IPv6 hosts).
    * ``unix:///path/to/sock[?db=N][&prefix=P]`` -- an existing redis-server
      on a unix socket.
    * ``redis-server:DIR`` -- start our own redis-server with its unix socket
      ``DIR/redis.sock`` (no TCP port) and append-only persistence in DIR,
      restart it if it dies (see `RedisStore.with_own_server`), and stop it
      when the store is closed. This blocks until the server answers, so call
      it before serving.

    ``prefix`` (URL-encoded if it holds ``&``, ``#`` or ``%``) is prepended
    to every Redis key the store uses, so several agents can share one
    redis-server, e.g. ``redis://127.0.0.1:6379/0?prefix=agent1:``.

    The Redis client connects lazily, and again whenever its connection was
    lost; open Redis stores inside the event loop that will use them.
    """
    check_width(width)
    check_fsync(fsync)
    scheme, sep, rest = spec.partition(":")
    if not sep:
        raise ValueError(f"store spec {spec!r} has no scheme; {_SPEC_HELP}")
    if scheme == "leveldb":
        if not rest:
            raise ValueError(f"store spec {spec!r} names no directory; {_SPEC_HELP}")
        return LevelDBStore(rest, width, fsync)
    if scheme == "redis-server":
        if not rest:
            raise ValueError(f"store spec {spec!r} names no directory; {_SPEC_HELP}")
        return RedisStore.with_own_server(Path(rest), width, fsync=fsync)
    if scheme in ("redis", "unix"):
        return _open_redis_url(spec, width, fsync)
    raise ValueError(f"unknown store kind {scheme!r} in {spec!r}; {_SPEC_HELP}")


def _open_redis_url(spec: str, width: int, fsync: FsyncMode) -> Store:
    """``redis://`` and ``unix://`` specs: a client of an existing redis-server."""
    url = urlsplit(spec)
    if url.fragment or url.username is not None or url.password is not None:
        raise ValueError(f"store spec {spec!r}: credentials and fragments are not supported")
    try:
        pairs = parse_qsl(url.query, keep_blank_values=True, strict_parsing=bool(url.query))
    except ValueError as exc:
        raise ValueError(f"store spec {spec!r} has a malformed query: {exc}") from None
    options = dict(pairs)
    allowed = {"prefix"} if url.scheme == "redis" else {"prefix", "db"}
    unknown = [name for name, _ in pairs if name not in allowed]
    if unknown or len(options) != len(pairs):
        raise ValueError(
            f"store spec {spec!r}: options must be distinct and among {sorted(allowed)}"
        )
    prefix = encode_path(options.get("prefix", ""))

    if url.scheme == "unix":
        if url.netloc or not url.path:
            raise ValueError(f"store spec {spec!r}: write unix:///absolute/path/to/socket")
        db = _parse_db(options.get("db", "0"), spec)
        return RedisStore.connect(width, unix_socket=url.path, db=db, prefix=prefix, fsync=fsync)

    if not url.hostname:
        raise ValueError(f"store spec {spec!r} names no host; {_SPEC_HELP}")
    try:
        port = 6379 if url.port is None else url.port
    except ValueError:
        raise ValueError(f"store spec {spec!r} has a bad port; {_SPEC_HELP}") from None
    db = _parse_db(url.path.lstrip("/") or "0", spec)
    return RedisStore.connect(width, host=url.hostname, port=port, db=db, prefix=prefix, fsync=fsync)


def _parse_db(text: str, spec: str) -> int:
    if not text.isdigit():
        raise ValueError(f"store spec {spec!r}: database must be a number, not {text!r}")
    return int(text)
