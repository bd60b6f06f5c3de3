"""Client library: what a DFS imports to turn a path into a MetaDataID and talk to its owner."""

from client_lib.cidr import Block
from client_lib.mdid import DEFAULT_SPACE, mdid, normalize_path

__all__ = ["DEFAULT_SPACE", "Block", "mdid", "normalize_path"]
