"""The numbers every MetaFlow process must agree on, defined once.

Anything that crosses a process boundary and is a plain constant lives
here: the ports, the default MetaDataID space and gateway, the request
limits of port 9000, and the OpenFlow layout (priorities and cookies) that
the controller installs and that tools and tests read back from the
switches. Changing one of them changes the wire contract.
"""

from __future__ import annotations

from typing import Final

# -- ports ---------------------------------------------------------------------

METAFLOW_PORT: Final = 9000
"""Metadata requests (RESP), destination address = a MetaDataID. Reserved:
no other traffic may use it as a destination port."""

ADMIN_PORT: Final = 9001
"""The agent's admin API (HTTP+JSON) on the management address."""

REST_PORT: Final = 8080
"""The controller's REST API (HTTP+JSON)."""

LIVENESS_PORT: Final = REST_PORT
"""The controller's UDP port for agents' liveness datagrams
(`client_lib.liveness`): the REST API's number, in UDP. A controller's
``--liveness-port`` follows its ``--rest-port`` unless given, so controllers
that share a host (tests, benchmarks) never collide on it; agents learn it
from the answer to their registration (`Registered.liveness_port`)."""

OPENFLOW_PORT: Final = 6653
"""Where switches reach the controller (OpenFlow 1.0)."""

REPLICATION_PORT: Final = 9002
"""Replication between agents (RESP, authenticated with the cluster's
secret), on the management address: a primary streams every write to its
backups here before it acknowledges it."""

DEFAULT_REPLICAS: Final = 2
"""Copies of every block (the controller's --replicas); 1 is no replication."""

SITE_SYNC_PORT: Final = 9004
"""A site's propagation agent (`metaflow-site-sync`, the ``replicated``
strategy of several sites): its site's writers queue their updates here
(RESP). Not 9003, where the deployment examples put an agent's metrics."""

TCP_FASTOPEN_CONNECT: Final = 30
"""The socket option of <linux/tcp.h> that sends a connection's first write
in its SYN (the socket module does not name it): a client's ``fast_open``."""

LOOKUP_PORT: Final = 9100
"""The baselines' lookup daemon (`metaflow-lookupd`), benchmarks only."""

# -- addresses -----------------------------------------------------------------

DEFAULT_SPACE_CIDR: Final = "100.64.0.0/10"
"""The default MetaDataID space: RFC 6598 shared address space, so a client
host needs one route for every ID."""

DEFAULT_GATEWAY: Final = "10.255.255.254"
"""The virtual gateway clients route the space to; only the controller
answers its ARP."""

# -- port 9000 limits ----------------------------------------------------------

MAX_KEY: Final = 4096
"""Bytes in a key after normalization (Linux PATH_MAX). The service also
refuses a key header announcing more, before reading the key."""

MAX_VALUE: Final = 1 << 20
"""Default bytes in one value (the agent's --max-value)."""

ELIST_DEFAULT: Final = 100
ELIST_MAX: Final = 1000
"""Entries in one page of ``ELIST`` (a directory listing): by default, and
at most, so that one reply stays bounded."""

# -- the OpenFlow 1.0 table (ARCHITECTURE.md, "Flow table layout") -------------

METAFLOW_BASE_PRIORITY: Final = 2000
"""A MetaFlow prefix entry has this plus its prefix length, so that
priorities give longest-prefix match on OF1.0."""

UPRULE_PRIORITY: Final = 1999
"""Port 9000 traffic for an ID outside a switch's subtree goes up."""

HOST_ROUTE_PRIORITY: Final = 1000
ARP_PRIORITY: Final = 900
TABLE_MISS_PRIORITY: Final = 0
"""Full mode: drop; hybrid mode: NORMAL (the switch's own forwarding)."""
LLDP_PRIORITY: Final = 0xFFFF

COOKIE_METAFLOW: Final = 0x4D46
""""MF": MetaFlow prefix and up-rule entries."""
COOKIE_ROUTE: Final = 0x4D52
""""MR": host routes for physical addresses."""
COOKIE_BASE: Final = 0x4D42
""""MB": LLDP, ARP and (full mode) the drop-all entry."""
COOKIE_NORMAL: Final = 0x4D4E
""""MN": hybrid mode's lowest-priority entry, everything else to NORMAL; its
own cookie, so a switch's refusal of NORMAL is recognized in the error."""
