"""A route of an HTTP+JSON API, declared once: method, path, body types, and
whether it changes anything.

`client_lib.api.admin` (the agent's admin API) and `client_lib.api.rest`
(the controller's REST API) are lists of these. The servers dispatch by
them (`client_lib.server.api`), and the clients build requests from them
(`client_lib.api.clients`), so no route or body is ever spelled out twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from urllib.parse import quote, unquote

from client_lib.errors import InvalidArgument

Req = TypeVar("Req")
Resp = TypeVar("Resp")

_PARAM = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True, eq=False)
class Route(Generic[Req, Resp]):
    """`request` None: the route takes no body. `changes` False: a read,
    which a server may leave open to unauthenticated callers by a flag;
    everything that changes state always needs the cluster's signature.
    `waits`: the call may take long (a split, a migration's copy) and the
    client should allow for it. `private`: a read that hands out the
    records themselves (a snapshot's), which stays signed even where the
    reads are open."""

    method: str
    template: str
    request: type[Req] | None
    response: type[Resp]
    changes: bool
    summary: str
    waits: bool = False
    private: bool = False
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _PARAM.split(self.template)   # literal, name, literal, name, ...
        regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)"
                        for i, part in enumerate(parts))
        object.__setattr__(self, "_pattern", re.compile(f"^{regex}$"))

    @property
    def params(self) -> list[str]:
        return _PARAM.findall(self.template)

    def path(self, **params: str) -> str:
        """The path with its parameters filled in (percent-encoded). A
        parameter may not hold "/": servers match decoded paths."""
        missing = set(self.params) - set(params)
        extra = set(params) - set(self.params)
        if missing or extra:
            raise TypeError(f"{self.template} takes {self.params}, got {sorted(params)}")
        bad = [value for value in params.values() if "/" in str(value) or not str(value)]
        if bad:
            raise InvalidArgument(f"{self.template}: {bad[0]!r} cannot be a path parameter")
        return _PARAM.sub(lambda m: quote(str(params[m.group(1)]), safe=""), self.template)

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """The path parameters if `method path` is this route, else None."""
        if method != self.method:
            return None
        found = self._pattern.match(path)
        return None if found is None else {k: unquote(v) for k, v in found.groupdict().items()}

    def __str__(self) -> str:
        return f"{self.method} {self.template}"
