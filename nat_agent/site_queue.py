"""The propagation agent's durable queue (issue 29, ``replicated``): the
updates its site's writers handed it, kept until every site has applied
them, in SQLite.

Why SQLite: the queue must survive a crash of the agent and of the machine
(an update acknowledged to a writer is propagated even if the agent dies a
moment later), and SQLite with ``synchronous=FULL`` in WAL mode is a durable,
crash-safe log in the standard library.

Every site (this one too: it repairs a writer that died between queueing an
update and writing its own site's copy) has a cursor, the last update it
has applied; each is sent the rest in queue order. An update all cursors
passed is deleted. `due` hands out a batch with only the last update of
each key (an earlier one is superseded: stamps order a key's updates), so a
site that was cut off for a while catches up with one write per key.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

Update = tuple[int, bytes, bytes]
"""An update as queued: its sequence number, the entry's key and its stamped value."""


class SiteQueue:
    """Updates and one cursor per target site, in the SQLite file at `path`.
    Thread-safe: the agent's server appends while each site's pusher reads.
    Sequence numbers are never reused (``AUTOINCREMENT``): a cursor past
    every deleted update must not skip a later one."""

    def __init__(self, path: Path | str, targets: Sequence[str]) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("CREATE TABLE IF NOT EXISTS updates (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                             "key BLOB NOT NULL, value BLOB NOT NULL)")
            self._db.execute("CREATE TABLE IF NOT EXISTS cursors "
                             "(site TEXT PRIMARY KEY, done INTEGER NOT NULL)")
            self._db.executemany("INSERT OR IGNORE INTO cursors VALUES (?, 0)", [(t,) for t in targets])
        self.targets = tuple(targets)

    def append(self, updates: Sequence[tuple[bytes, bytes]]) -> int:
        """Queue (key, stamped value) pairs in one transaction, synced before
        it returns (a group commit of every writer waiting); the last seq."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT INTO updates (key, value) VALUES (?, ?)", updates)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            last = self._db.execute("SELECT MAX(seq) FROM updates").fetchone()[0]
            return int(last or 0)

    def due(self, target: str, limit: int) -> tuple[int, list[Update]]:
        """The next up to `limit` updates `target` has not applied, reduced to
        the last of each key (in order of those), and the seq to mark done
        once they are applied (0 with nothing due)."""
        with self._lock:
            done = self._cursor(target)
            rows = self._db.execute("SELECT seq, key, value FROM updates WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (done, limit)).fetchall()
        if not rows:
            return 0, []
        last: dict[bytes, Update] = {}
        for seq, key, value in rows:
            last.pop(key, None)
            last[key] = (seq, key, value)
        return rows[-1][0], list(last.values())

    def done(self, target: str, seq: int) -> None:
        """`target` has applied everything up to `seq`: move its cursor, and
        delete what every site has applied."""
        with self._lock:
            self._db.execute("UPDATE cursors SET done = MAX(done, ?) WHERE site = ?", (seq, target))
            low = min(self._cursor(t) for t in self.targets)
            self._db.execute("DELETE FROM updates WHERE seq <= ?", (low,))

    def backlog(self) -> dict[str, int]:
        """Per target site, how many queued updates it has not applied."""
        with self._lock:
            return {t: self._db.execute("SELECT COUNT(*) FROM updates WHERE seq > ?",
                                        (self._cursor(t),)).fetchone()[0] for t in self.targets}

    def _cursor(self, target: str) -> int:
        row = self._db.execute("SELECT done FROM cursors WHERE site = ?", (target,)).fetchone()
        if row is None:
            raise KeyError(f"no site {target!r} in this queue")
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
