"""The MetaFlow client library: what a distributed file system imports.

    from client_lib import FileMetadata, MetaFlowClient, MetaFlowError

`MetaFlowClient` (blocking, thread-safe) and `AsyncMetaFlowClient` (asyncio)
send each request to the path's MetaDataID and let the switches deliver it;
`client_lib.client` documents the contract, retries, the per-call deadline,
pooling, the standalone route (``via=``) and the errors. Every error is a
`MetaFlowError`. The package is the standard library only.
"""

from client_lib.cidr import Block
from client_lib.client import (
    DEFAULT_DEADLINE,
    DEFAULT_TIMEOUT,
    AsyncMetaFlowClient,
    ClientStats,
    MetaFlowClient,
    RetryPolicy,
)
from client_lib.errors import (
    ApiError,
    AuthError,
    BadReply,
    Conflict,
    InvalidArgument,
    InvalidPath,
    MetadataFormatError,
    MetaFlowError,
    NamespaceError,
    NotFound,
    ServerError,
    Unavailable,
)
from client_lib.mdid import DEFAULT_SPACE, entry_key, mdid, mdid_address, normalize_path
from client_lib.metadata import FileMetadata
from client_lib.version import version

__version__ = version()

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_SPACE",
    "DEFAULT_TIMEOUT",
    "ApiError",
    "AsyncMetaFlowClient",
    "AuthError",
    "BadReply",
    "Block",
    "ClientStats",
    "Conflict",
    "FileMetadata",
    "InvalidArgument",
    "InvalidPath",
    "MetaFlowClient",
    "MetaFlowError",
    "MetadataFormatError",
    "NamespaceError",
    "NotFound",
    "RetryPolicy",
    "ServerError",
    "Unavailable",
    "__version__",
    "entry_key",
    "mdid",
    "mdid_address",
    "normalize_path",
]
