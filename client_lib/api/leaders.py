"""Several controllers, one leader: which one to talk to. Pure, no I/O.

With two or more controllers (elected through etcd) only the leader
serves; a standby answers every changing call 503 `NotLeader`, naming the
leader's REST URL when it knows it. A caller given several controller URLs
(``--controller http://c1:8080,http://c2:8080``) talks to one at a time,
and moves on when that one fails it: to the leader a `NotLeader` names,
else to the next URL in the order given (wrapping around). Only the
failures that say "not here" move it: no answer at all (refused, timed
out, a broken connection) or `NotLeader`; any other refusal (401, 409, ...)
is an answer from the right place.

One URL is today's single controller: moving on leads back to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from client_lib.errors import ApiError, InvalidArgument, NotLeader


def controller_urls(text: str | Sequence[str], flag: str = "--controller") -> list[str]:
    """The controller base URLs of a flag: one, or several separated by
    commas (or a list of them, from a configuration file), each
    ``http://HOST[:PORT]``, without repeats; InvalidArgument names `flag`."""
    items = text.split(",") if isinstance(text, str) else [u for item in text for u in item.split(",")]
    urls: list[str] = []
    for item in (i.strip().rstrip("/") for i in items):
        url = urlsplit(item)
        if url.scheme != "http" or not url.hostname:
            raise InvalidArgument(f"{flag}: {item!r} is not a controller URL; want http://HOST:PORT "
                                  "(several separated by commas)")
        if item not in urls:
            urls.append(item)
    if not urls:
        raise InvalidArgument(f"{flag}: no controller URL given")
    return urls


def moves_on(exc: ApiError) -> bool:
    """Whether `exc` from the current controller means: try another one."""
    return isinstance(exc, NotLeader) or exc.status is None


class Leaders:
    """The controller URLs given, and the one to talk to now (`current`)."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise InvalidArgument("at least one controller URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self._at = 0                       # where in `urls` we are (or were, when following)
        self._followed: str | None = None  # a leader named by NotLeader that is not among `urls`

    @property
    def current(self) -> str:
        return self._followed or self.urls[self._at]

    @property
    def several(self) -> bool:
        return len(self.urls) > 1

    def move(self, leader: str | None = None) -> str:
        """Leave `current` (it failed): for `leader` if one is named and is
        not `current` itself, else for the next URL given. Returns the new
        `current`."""
        named = leader.rstrip("/") if leader else None
        if named is not None and named != self.current:
            if named in self.urls:
                self._at, self._followed = self.urls.index(named), None
            else:
                self._followed = named
        else:   # after a followed leader, the URL after the one that named it
            self._followed = None
            self._at = (self._at + 1) % len(self.urls)
        return self.current
