"""Client library: what a DFS imports to turn a path into a MetaDataID and talk to its owner."""

from client_lib.mdid import DEFAULT_SPACE, MetaDataSpace, mdid, normalize_path

__all__ = ["DEFAULT_SPACE", "MetaDataSpace", "mdid", "normalize_path"]
