"""The controller's side of the agents' admin API (see `nat_agent/admin.py`).

Plain blocking urllib: the controller's worker thread makes one call at a
time, in the order its decisions need them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class AgentError(RuntimeError):
    """An agent refused a request or could not be reached."""


class HttpAgent:
    def __init__(self, admin_url: str, timeout: float = 30.0) -> None:
        self.base = admin_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise AgentError(f"{method} {self.base}{path}: HTTP {err.code}: {detail}") from None
        except (OSError, ValueError) as exc:
            raise AgentError(f"{method} {self.base}{path}: {exc}") from None

    def health(self) -> dict:
        return self._call("GET", "/health")

    def count(self, first: int, last: int) -> int:
        return self._call("GET", f"/count?first={first}&last={last}")["keys"]

    def own(self, blocks: list[str], migration: str | None = None) -> dict:
        return self._call("POST", "/own", {"blocks": blocks, "migration": migration})

    def migrate(self, blocks: list[str], target: str) -> dict:
        return self._call("POST", "/migrations", {"blocks": blocks, "target": target})

    def commit(self, migration: str) -> dict:
        return self._call("POST", f"/migrations/{migration}/commit")

    def abort(self, migration: str) -> dict:
        return self._call("POST", f"/migrations/{migration}/abort")
