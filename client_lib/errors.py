"""One exception family for everything the client side of MetaFlow raises.

A file system that imports `client_lib` catches `MetaFlowError` and knows it
has seen every failure: a bad path, a refusing or broken server, a metadata
object it cannot decode, an admin or REST API that said no or did not answer.
Errors that are the caller's own bad input are also `ValueError`s, so code
that validates with ``except ValueError`` keeps working.
"""

from __future__ import annotations


class MetaFlowError(Exception):
    """Base of every error the client library and the API clients raise."""


class InvalidArgument(MetaFlowError, ValueError):
    """An argument that cannot work: a malformed space, option or address."""


class InvalidPath(InvalidArgument):
    """The path cannot be a key: not absolute, NUL, too long, not a path."""


class MetadataFormatError(MetaFlowError, ValueError):
    """Bytes that do not decode to a FileMetadata of a known version."""


class ServerError(MetaFlowError):
    """The metadata service refused the request (``-ERR ...``); retrying would not help."""


class NamespaceError(ServerError):
    """The namespace said no, as a file system would: `errno` is the POSIX
    error (``errno.ENOENT``: no such directory; ``errno.ENOTEMPTY``: a
    directory that still has entries), for a FUSE layer to hand on."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno


class BadReply(MetaFlowError):
    """The peer's bytes are not the reply we expected (not a MetaFlow server?)."""


class Unavailable(MetaFlowError):
    """The call's deadline passed or its attempts ran out on retryable
    conditions (a moving block, a timeout, a lost connection); `reason` is
    the last of them."""

    def __init__(self, what: str, attempts: int, reason: str) -> None:
        super().__init__(f"{what}: gave up after {attempts} attempts: {reason}")
        self.what = what
        self.attempts = attempts
        self.reason = reason


class ApiError(MetaFlowError):
    """An admin or REST API call that did not succeed.

    `status` is the HTTP status the server answered, or None when there was
    no answer at all (refused, timed out, the connection broke)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthError(ApiError):
    """401/403: the request was not signed with the cluster's secret, or a
    response was not (the peer is not who the URL claims)."""


class NotFound(ApiError):
    """404: no such route, server, migration or import."""


class Conflict(ApiError):
    """409: the request contradicts the current state (ownership, a name
    registered to another server, a migration in another state)."""


class NotLeader(ApiError):
    """503: the controller asked is a standby (another controller holds the
    lease); `leader` is the REST URL of the one that does, when it knows it.
    A caller with several controller URLs moves there (or to the next URL)."""

    STATUS = 503

    def __init__(self, message: str, status: int | None = STATUS, leader: str | None = None) -> None:
        if leader and leader not in message:
            message = f"{message} (the leader is {leader})"
        super().__init__(message, status)
        self.leader = leader or None
