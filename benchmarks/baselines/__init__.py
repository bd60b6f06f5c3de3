"""The lookup schemes MetaFlow is compared with (issue 5).

Each scheme is first pure placement and lookup logic here (who owns a key,
which servers a lookup visits), so it can be tested exhaustively and used by
the simulator; the networked services that run these lookups on the storage
servers build on it.
"""
