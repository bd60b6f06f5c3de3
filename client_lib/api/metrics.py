"""The metric families the controller and every agent expose to Prometheus, declared once.

Each daemon serves its families on a port of its own (``--metrics-port``;
0, the default, serves none) in Prometheus' text format. The names follow
Prometheus' conventions (base units, ``_total`` for counters, ``_seconds``);
labels name a switch, a server, a command, an outcome or a kind of
operation, never a path or a MetaDataID, so a series' count stays bounded
by the cluster's size. The exporters (`controller.metrics`,
`nat_agent.metrics`) build every family from its declaration here, the
alert rules and the dashboard in deploy/ query these names, and
docs/reference/metrics.md is generated from them (`docs.metric_tables`).
The standard library only: a declaration, no exporter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Family:
    """One metric family: `name` as exposed (a counter's with ``_total``)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()


SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
"""Buckets of the controller's duration histograms: a barrier's milliseconds to a large move's minutes."""
REQUEST_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)
"""Buckets of an agent's request and disk sync seconds: tens of microseconds (a read) to the
replication timeout."""

# -- the controller --------------------------------------------------------------------

SWITCHES_CONNECTED = Family("metaflow_switches_connected", "gauge", "OpenFlow switches connected")
NETWORK_BUILT = Family("metaflow_network_built", "gauge", "1 once the fabric is mapped onto the tree")
REPLICAS = Family("metaflow_replicas_per_block", "gauge", "copies of every block the cluster keeps")
SWITCH_ENTRIES = Family("metaflow_switch_entries", "gauge",
                        "MetaFlow entries the controller keeps in the switch's table", ("switch",))
TABLE_BUDGET = Family("metaflow_switch_table_budget_entries", "gauge",
                      "MetaFlow entries any one switch may hold (absent: no limit)")
FLOW_MODS = Family("metaflow_flow_mods_sent_total", "counter",
                   "flow table changes sent to the switch", ("switch",))
FLOW_MODS_REFUSED = Family("metaflow_flow_mods_refused_total", "counter",
                           "OpenFlow error replies from the switch (a refused change)", ("switch",))
BARRIER_SECONDS = Family("metaflow_barrier_round_trip_seconds", "histogram",
                         "seconds from a barrier request to its reply", ("switch",))
SERVERS = Family("metaflow_servers", "gauge",
                 "registered servers by state (idle, busy, failed, unplaced)", ("state",))
SERVER_KEYS = Family("metaflow_server_keys", "gauge", "keys the server holds, by its last heartbeat",
                     ("server",))
SERVER_LOAD = Family("metaflow_server_packets_per_second", "gauge",
                     "requests (packets) a second toward the server, counted at its edge switch",
                     ("server",))
HEARTBEAT_AGE = Family("metaflow_server_heartbeat_age_seconds", "gauge",
                       "seconds since the server's last heartbeat", ("server",))
OLDEST_HEARTBEAT = Family("metaflow_oldest_heartbeat_age_seconds", "gauge",
                          "the oldest last heartbeat of a server in service, in seconds")
HEARTBEAT_TIMEOUT = Family("metaflow_heartbeat_timeout_seconds", "gauge",
                           "silence after which a server is failed over (--heartbeat-timeout)")
BLOCKS = Family("metaflow_blocks", "gauge", "blocks (replica sets) of the space")
BLOCKS_UNBACKED = Family("metaflow_blocks_without_live_backup", "gauge",
                         "blocks with no synced copy on a live server besides their primary")
BLOCKS_NOT_SERVING = Family("metaflow_blocks_not_serving", "gauge",
                            "blocks whose primary waits for its flows before serving")
IMBALANCE = Family("metaflow_imbalance_factor", "gauge",
                   "the load imbalance factor (Lunule's, in [0, 1]) over the servers owning blocks")
IMBALANCE_THRESHOLD = Family("metaflow_imbalance_threshold", "gauge",
                             "the imbalance factor above which load is moved (--imbalance-threshold)")
DATA_LOST = Family("metaflow_data_lost_total", "counter",
                   "DATA-LOST events: blocks whose every copy died, served empty since")
OPERATIONS = Family("metaflow_operations_total", "counter",
                    "operations ended, by kind (build, split, rebalance, failover, repair, ...) and result "
                    "(ok, failed: refused, aborted, cancelled or incomplete)", ("kind", "result"))
OPERATION_SECONDS = Family("metaflow_operation_seconds", "histogram", "seconds an operation ran",
                           ("kind",))
OPERATIONS_RUNNING = Family("metaflow_operations_running", "gauge", "operations running, by kind", ("kind",))
OPERATION_AGE = Family("metaflow_operation_oldest_age_seconds", "gauge",
                       "seconds the oldest running operation of the kind has run", ("kind",))
MIGRATION_LEASE = Family("metaflow_migration_lease_seconds", "gauge",
                         "how long a copied migration may wait for its commit (--migration-lease)")
LEADER = Family("metaflow_controller_leader", "gauge",
                "1 while this controller leads (always, without etcd), 0 while it is a standby")
TERM = Family("metaflow_controller_term", "gauge", "the term this controller leads or last led (0: never)")
TAKEOVERS = Family("metaflow_controller_takeovers_total", "counter",
                   "times this controller became the leader")
ETCD_REACHABLE = Family("metaflow_controller_etcd_reachable", "gauge",
                        "1 while etcd answers (always 0 without --etcd)")
MOVES = Family("metaflow_moves_total", "counter",
               "moves of blocks to a new replica set, by kind (split, merge, rebalance) and result",
               ("kind", "result"))
MOVE_SECONDS = Family("metaflow_move_seconds", "histogram", "seconds a move of blocks took", ("kind",))

LIVENESS_DATAGRAMS = Family("metaflow_liveness_datagrams_total", "counter",
                            "agents' liveness datagrams by outcome: taken (accepted; stale: alive, but "
                            "its state is newer than the last HTTP heartbeat's), nudged to send an HTTP "
                            "heartbeat (unknown name, failed server, standby controller) or refused "
                            "(oversized, malformed, signature, replay, skew)", ("outcome",))

DECISION_SECONDS = Family("metaflow_decision_event_seconds", "histogram",
                          "seconds the decision thread spent on one event: the core's decision and "
                          "sending the steps it returned, by the event's kind (Tick, Heartbeat, ArpIn, "
                          "StepDone, ...): what every other event waited behind", ("event",))
DECISION_BUCKETS = (0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
"""Buckets of the decision thread's per-event seconds: a heartbeat's tens of microseconds to a
k=32 build's tens of seconds (docs/decision-thread.md)."""

CONTROLLER: tuple[Family, ...] = (
    SWITCHES_CONNECTED, NETWORK_BUILT, REPLICAS, SWITCH_ENTRIES, TABLE_BUDGET, FLOW_MODS, FLOW_MODS_REFUSED,
    BARRIER_SECONDS, SERVERS, SERVER_KEYS, SERVER_LOAD, HEARTBEAT_AGE, OLDEST_HEARTBEAT, HEARTBEAT_TIMEOUT,
    BLOCKS, BLOCKS_UNBACKED, BLOCKS_NOT_SERVING, IMBALANCE, IMBALANCE_THRESHOLD, DATA_LOST, OPERATIONS,
    OPERATION_SECONDS, OPERATIONS_RUNNING, OPERATION_AGE, MIGRATION_LEASE, MOVES, MOVE_SECONDS,
    LEADER, TERM, TAKEOVERS, ETCD_REACHABLE, LIVENESS_DATAGRAMS, DECISION_SECONDS)

# -- an agent --------------------------------------------------------------------------

REQUESTS = Family("metaflow_agent_requests_total", "counter",
                  "requests by command and outcome (served, moved, tryagain, refused, error), on both "
                  "request paths", ("command", "outcome"))
COMPILED_REQUESTS = Family("metaflow_agent_compiled_requests_total", "counter",
                           "requests answered on the compiled path (the rest on the Python path)")
REQUEST_SECONDS = Family("metaflow_agent_request_seconds", "histogram",
                         "seconds a command took, from its parsing to its reply, on both request paths",
                         ("command",))
REJECTED = Family("metaflow_agent_rejected_requests_total", "counter",
                  "requests refused before any command ran, by reason (unknown_commands, "
                  "unsupported_commands, oversized_arguments, protocol_errors)", ("reason",))
CONNECTIONS_OPEN = Family("metaflow_agent_connections_open", "gauge", "client connections open")
CONNECTIONS = Family("metaflow_agent_connections_total", "counter",
                     "client connections by what happened (opened, refused at --max-clients, reclaimed at "
                     "--max-clients, timed out, dropped)", ("event",))
KEYS = Family("metaflow_agent_keys", "gauge", "records the store holds (primaries' and backups')")
STORE_BYTES = Family("metaflow_agent_store_bytes", "gauge",
                     "bytes the store takes: LevelDB, its files on disk; Redis, the redis-server's "
                     "used_memory (INFO memory: the data set it holds in memory, which maxmemory "
                     "limits; a shared server's other users included)")
BLOCKS_HELD = Family("metaflow_agent_blocks", "gauge", "blocks held, by role (primary, backup)", ("role",))
REPLICATION = Family("metaflow_agent_replication_writes_total", "counter",
                     "replicated writes by outcome (streamed, acknowledged, not_acknowledged, resent, "
                     "degraded, fenced; worker_records: the SETs of worker threads' turns, streamed "
                     "as one write per block)", ("outcome",))
REPLICATION_WRITING = Family("metaflow_agent_replication_writes_in_flight", "gauge",
                             "writes under way: streamed and not yet acknowledged by every synced member")
REPLICATION_QUEUE = Family("metaflow_agent_replication_queue", "gauge",
                           "commands sent to the backup not answered yet", ("backup",))
REPLICATION_LAG = Family("metaflow_agent_replication_lag_seconds", "gauge",
                         "seconds the oldest command sent to the backup (a write or a sync's copy) has "
                         "waited for its answer; 0 when none waits", ("backup",))
REPLICA_APPLIED = Family("metaflow_agent_replica_records_total", "counter",
                         "records this agent took as a backup, by how (applied, copied, copies_skipped)",
                         ("how",))
SYNCS = Family("metaflow_agent_syncs", "gauge", "catch-up syncs this primary runs or ran, by state",
               ("state",))
MIGRATIONS = Family("metaflow_agent_migrations", "gauge", "migrations this agent sends, by state",
                    ("state",))

DISK_SYNC_SECONDS = Family("metaflow_agent_disk_sync_seconds", "histogram",
                           "seconds a sync to disk shared by concurrent writes took (LevelDB, --fsync batch)")

# -- a site's propagation agent (metaflow-site-sync) ----------------------------------

SITE_QUEUED = Family("metaflow_site_updates_queued_total", "counter",
                     "updates this site's writers queued, on disk")
SITE_BACKLOG = Family("metaflow_site_backlog_updates", "gauge",
                      "queued updates the site has not applied yet", ("site",))
SITE_APPLIED = Family("metaflow_site_updates_applied_total", "counter",
                      "updates written into the site, by what they took: create, replace, or keep "
                      "(the site's copy was as new)", ("site", "step"))
SITE_PUSH_FAILURES = Family("metaflow_site_push_failures_total", "counter",
                            "batches that did not reach the site (retried with backoff)", ("site",))

SITE_SYNC: tuple[Family, ...] = (SITE_QUEUED, SITE_BACKLOG, SITE_APPLIED, SITE_PUSH_FAILURES)
"""Every family `metaflow-site-sync` exposes."""

AGENT: tuple[Family, ...] = (
    REQUESTS, COMPILED_REQUESTS, REQUEST_SECONDS, REJECTED, CONNECTIONS_OPEN, CONNECTIONS, KEYS, STORE_BYTES,
    BLOCKS_HELD, REPLICATION, REPLICATION_WRITING, REPLICATION_QUEUE, REPLICATION_LAG, REPLICA_APPLIED, SYNCS,
    MIGRATIONS, DISK_SYNC_SECONDS)
