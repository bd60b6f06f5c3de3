"""A file system on MetaFlow, kept apart from the client it is built on.

Its own subpackage so that the client library (`client_lib` outside this
folder: the wire contract and the client) stays what `btree/` and the
daemons stand on, with no file system in it; only this package imports
itself (tests/unit/test_layers.py). From the bottom up:

    records    the record store a namespace runs over, as a protocol
    inode      the records: attributes, directory entries, intents
    namespace  the POSIX-like operations over those records
    filedata   file contents in checksummed chunks
    core       the inode-numbered file system a FUSE mount serves
    central    the records in one central redis-server (the baseline)
    xattrs     extended attributes, one record per inode
    locks      flock and POSIX record locks, one leased record per inode
    fuse_protocol  FUSE's wire protocol, parsed and encoded without I/O
    fuse_session   the mount's FUSE session on trio (the ``fs`` extra)
    mount      the FUSE shim (the ``fs`` extra: trio)
    cli        the ``metaflow-fs`` command
"""
