"""The serving side of the contract, for the daemons only.

The agent's admin API and the controller's REST API are served through the
same sans-I/O `api.Dispatcher`, built from the route declarations the
clients use (`client_lib.api`). It is standard library only and shared by
both daemons, so it lives beside the contract rather than in either daemon
(neither may import the other); but no module of the client library imports
this package (tests/unit/test_layers.py), so a client never loads a server.
"""
