# MetaFlow: one entry point for setting up, testing, and running.
# Every target installs what it needs, idempotently, so a fresh machine only
# needs `make test` or `make demo`.

# Independent set-up steps run side by side (the venv's pip install beside
# Open vSwitch, ruff beside mypy); `make test`'s own recipe runs its two
# pytest phases one after the other as always.
MAKEFLAGS += --jobs=2

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages the code needs: the Redis store, iptables/conntrack and
# libnetfilter-queue for the agent's rewrite, redis-cli as a debugging
# client, a C toolchain for NetfilterQueue's extension, Mininet with
# Open vSwitch (and ping, which Mininet hosts use) for the emulated fabrics
# (mininet_scenarios/), and strace and mkfs.ext4 for the durability tests
# (syscall counts, a disk whose power is cut), and for metaflow-fs fuse3
# (fusermount3 mounts and unmounts) and the tools the mount
# is tested with (rsync, postmark, fs_mark; git is there already), and
# systemd for `systemd-analyze verify` of deploy/systemd/'s units, and
# Prometheus, whose promtool checks the alert rules and scrape configuration
# in deploy/prometheus/, and LevelDB with its snappy as static libraries,
# which the extension carries (nat_agent/fastpath/build.rs).
APT_PACKAGES := redis-server redis-tools iptables conntrack iproute2 ethtool \
                libnetfilter-queue-dev libnetfilter-queue1 build-essential \
                mininet openvswitch-switch iputils-ping strace e2fsprogs \
                fuse3 pkg-config rsync postmark fsmark git systemd prometheus \
                etcd-server etcd-client libleveldb-dev libsnappy-dev procps
# Debian's Mininet is a package of the system python3 only. The venv gets a
# symlink to that one package, not a .pth line for the whole dist-packages
# directory: a .pth would let every Debian module (an older cryptography,
# yaml, ovs, ...) stand in silently for anything missing from the venv.
MININET_SRC  := /usr/lib/python3/dist-packages/mininet
# The agent's compiled request path (nat_agent/fastpath, Rust through PyO3)
# is part of the distribution (pyproject.toml, [tool.setuptools-rust]): the
# editable install builds it in place, as nat_agent/_fastpath.*.so, with the
# machine's cargo (rustup's, if it is not on PATH) from the locked crates,
# and installs again when the crate changes (cargo then rebuilds only what
# changed). Without it the agent would serve through Python (nat_agent/extension.py).
CARGO    ?= $(or $(shell command -v cargo 2>/dev/null),$(HOME)/.cargo/bin/cargo)
WITH_CARGO = PATH="$(dir $(CARGO)):$$PATH"
FASTPATH_CRATE := nat_agent/fastpath
FASTPATH_SOURCES := $(wildcard $(FASTPATH_CRATE)/src/*.rs) $(FASTPATH_CRATE)/build.rs \
                    $(FASTPATH_CRATE)/Cargo.toml $(FASTPATH_CRATE)/Cargo.lock
SITE_PACKAGES = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

.PHONY: setup apt mininet-link ovs fs-tools constraints test unit lint typecheck docs docs-check docs-serve check-install demo bench bench-quick \
        bench-flowtables bench-testbed bench-agent bench-failover bench-hotspot chaos chaos-ha bench-replication bench-sites bench-fs bench-fig20 plan clean \
        bench-scale bench-ovs-fit

setup: apt $(STAMP) mininet-link ovs

# Open vSwitch's daemons (userspace datapath: this kernel has no openvswitch
# module). Started only when not already answering; never restarted, since
# other users' bridges may live in them.
ovs: apt
	@ovs-vsctl --timeout=3 show >/dev/null 2>&1 || \
	  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null

mininet-link: $(STAMP)
	@test -e $(SITE_PACKAGES)/mininet || ln -s $(MININET_SRC) $(SITE_PACKAGES)/mininet

# $(call apt_install,PACKAGES): install those of PACKAGES that are missing.
define apt_install
@missing=""; for p in $(1); do \
  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
  echo "installing apt packages:$$missing"; \
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
fi
endef

apt:
	$(call apt_install,$(APT_PACKAGES))

# Every role's extra, so the venv runs every test, benchmark and check.
EXTRAS := agent,controller,bench,fs,test,dev,docs

# The third-party packages at the versions the tests last passed with
# (deploy/constraints.txt says why any is held back).
CONSTRAINTS := deploy/constraints.txt

# After apt (order only): NetfilterQueue builds against its
# libraries. Again when the crate changes: that is what rebuilds the extension.
$(STAMP): pyproject.toml $(CONSTRAINTS) $(FASTPATH_SOURCES) | apt
	@test -x "$(CARGO)" || { echo "make: cargo is needed to build $(FASTPATH_CRATE) (install Rust with rustup)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(WITH_CARGO) $(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $(STAMP)

# After upgrading packages in the venv and passing `make test` with them:
# write their versions into the constraints (its comment lines are kept).
constraints: $(STAMP)
	{ grep '^#' $(CONSTRAINTS); $(PY) -m pip freeze --exclude-editable; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	touch $(STAMP)

# ruff and mypy (pyproject.toml says what each checks), and the documentation
# built strictly, gate `make test`.
STATIC_CHECKS := lint typecheck docs-check

# The unit tests are pure and CPU-bound: both cores (pytest-xdist). The rest
# start daemons, networks and mounts whose timeouts assume a machine that is
# not saturated by the tests themselves: one at a time.
test: setup fs-tools $(STATIC_CHECKS)
	$(PY) -m pytest -q -n 2 tests/unit
	PATH="$(abspath $(FS_TOOLS))/bin:$$PATH" $(PY) -m pytest -q --durations=25 tests --ignore=tests/unit

# The file system's conformance suites, which nobody here wrote, pinned:
# pjdfstest (POSIX system calls; it runs some tests as the user `tests`,
# made here if missing) and fsx (the file system exerciser), both Rust, built
# once into .venv/tools/bin from crates.io (about 2 minutes the first time).
# tests/integration/test_fs_posix.py finds them on PATH.
FS_TOOLS := $(VENV)/tools
PJDFSTEST_VERSION := 0.2.2
FSX_VERSION := 0.3.2
FS_TOOL_STAMPS := $(FS_TOOLS)/.pjdfstest-$(PJDFSTEST_VERSION) $(FS_TOOLS)/.fsx-$(FSX_VERSION)

fs-tools: $(FS_TOOL_STAMPS)
	@id tests >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin tests

$(FS_TOOLS)/.%:
	@test -x "$(CARGO)" || { echo "make: cargo is needed to build the file system's test tools" >&2; exit 1; }
	$(WITH_CARGO) $(CARGO) install --quiet --locked --root $(FS_TOOLS) $(firstword $(subst -, ,$*)) \
	  --version $(lastword $(subst -, ,$*))
	@touch $@

lint: setup
	$(VENV)/bin/ruff check .

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q tests/unit

# The documentation site (mkdocs.yml, docs/). `docs` regenerates the flag tables
# from the parsers (docs/flag_tables.py) and builds the site into site/;
# `docs-check` builds it strictly into a throwaway directory, so a broken link or
# anchor, or a page missing from the navigation, fails `make test` (that the flag
# tables match the parsers is a unit test). `docs-serve` serves it while editing.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: setup
	$(PY) -m docs.flag_tables
	$(MKDOCS) build --strict --site-dir site

docs-check: setup
	@set -e; out=$$(mktemp -d /tmp/metaflow-site.XXXXXX); trap 'rm -rf "$$out"' EXIT; \
	$(MKDOCS) build --strict --site-dir "$$out"

docs-serve: setup
	$(MKDOCS) serve --strict

# The distribution as a user gets it: an sdist of this tree's non-ignored
# files, and the wheel `build` makes from that sdist (so the sdist's crate
# builds, with cargo --locked): one platform wheel, abi3, that carries the
# compiled extension for CPython 3.11 and later. Each role is installed
# alone from it, in throwaway venvs under /tmp, on every Python we claim
# (3.11, 3.12, 3.13; pyenv's when the system has none): the client extra
# must pull in no third-party package at all, and the agent and controller
# must import and start with their extras alone; and the installed
# metaflow-agent must serve a SET and a GET from redis-cli through the
# compiled lane, then, with the extension deleted from its venv, through
# Python (tests/install_check.py). plyvel has no wheel for 3.13 and builds
# against libleveldb-dev there, as the extension does everywhere. Not part of
# `make test`: it downloads and builds every dependency once per Python
# (about 5 minutes); tests/unit/test_packaging.py checks the build
# configuration there, and tests/integration/test_optional_extension.py
# the agent with and without the extension on the work tree.
CHECK_PYTHONS ?= $(PYTHON) $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) \
                 $(wildcard $(HOME)/.pyenv/versions/3.13.*/bin/python3.13)
check-install: apt
	@set -e; unset PYTHONPATH; work=$$(mktemp -d /tmp/metaflow-install.XXXXXX); trap 'rm -rf "$$work"' EXIT; \
	git ls-files -co --exclude-standard -z | xargs -0 tar -c | tar -x -C "$$work" --one-top-level=src; \
	$(PYTHON) -m venv "$$work/build"; "$$work/build/bin/pip" install -q build; \
	$(WITH_CARGO) "$$work/build/bin/python" -m build -q -o "$$work/dist" "$$work/src" >/dev/null; \
	sdist=$$(ls "$$work"/dist/metaflow_sdn-*.tar.gz); wheel=$$(ls "$$work"/dist/metaflow_sdn-*.whl); \
	echo "== built $$(basename $$sdist) and $$(basename $$wheel)"; \
	tar -tzf "$$sdist" | grep -q '/nat_agent/fastpath/Cargo.lock$$' || { echo "the sdist has no crate"; exit 1; }; \
	for py in $(CHECK_PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  echo "== Python $$v: client ($$py)"; \
	  $$py -m venv "$$work/client$$v"; c="$$work/client$$v/bin"; \
	  $$c/pip install -q "$$wheel[client]"; \
	  others=$$($$c/pip list --format=freeze --exclude pip --exclude setuptools --exclude metaflow-sdn); \
	  test -z "$$others" || { echo "the client extra pulled in: $$others"; exit 1; }; \
	  $$c/python -c 'import client_lib, client_lib.client, client_lib.api.clients, controller.status'; \
	  $$c/metaflowctl --version; $$c/metaflowctl secret >/dev/null; $$c/metaflowctl stat --help >/dev/null; \
	  echo "== Python $$v: agent and controller"; \
	  $$py -m venv "$$work/roles$$v"; r="$$work/roles$$v/bin"; \
	  $$r/pip install -q "$$wheel[agent,controller]"; \
	  $$r/python -c 'import nat_agent.daemon, nat_agent.leveldb_store, nat_agent.nfqueue, controller.launcher'; \
	  $$r/python -c 'import plyvel, sys; db = plyvel.DB(sys.argv[1], create_if_missing=True); \
	    db.put(b"k", b"v"); assert db.get(b"k") == b"v"' "$$work/leveldb$$v"; \
	  $$r/metaflow-agent --help >/dev/null; $$r/metaflow-controller --help >/dev/null; \
	  $$r/python "$$work/src/tests/install_check.py" "$$work/roles$$v"; \
	done; echo "check-install: passed on $(CHECK_PYTHONS)"

# The main job: MetaFlow end to end in Mininet (k=4 fat-tree, 8 servers,
# 8 clients, 20,000 files, splits and a server failure), about 1.5 minutes.
# DEMO_ARGS=--store redis for Redis stores. TOPOLOGY names another fabric:
# TOPOLOGY=testbed (the paper's: 200 servers under 13 switches, 10 clients;
# about 4 minutes, with DEMO_ARGS="--heartbeat 1 15": docs/testbed.md),
# TOPOLOGY=fat-tree:8 (128 servers), TOPOLOGY=testbed:servers_per_edge=4 (40).
demo: setup
	$(PY) -m mininet_scenarios.demo $(if $(TOPOLOGY),--topology $(TOPOLOGY)) $(DEMO_ARGS)

# Hybrid mode, two controllers on etcd, the leader (and a storage server) killed
# mid-run: the standby takes over and fails the server over (docs/ha.md).
demo-ha: setup
	$(PY) -m mininet_scenarios.demo_ha $(DEMO_HA_ARGS)

# The planner on the paper's simulation setting (no emulation).
plan: setup
	$(VENV)/bin/metaflowctl plan --topology fattree --k 32 --servers 2000

# MetaFlow against hash mapping, a central coordinator, One-Hop, Chord and
# G-HBA in one Mininet run (about 8 minutes), then the simulator at the
# paper's scale, calibrated from that run. bench-quick: the same in under 2
# minutes (results in bench-quick*, apart from the full run's).
bench: setup
	$(VENV)/bin/metaflowctl bench --out benchmarks/results $(BENCH_ARGS)
	$(PY) -m benchmarks.simulator --calibration benchmarks/results/bench.json --out benchmarks/results --window 64 --shared-cpu-cores 2 --rtt-us 50

bench-quick: setup
	$(VENV)/bin/metaflowctl bench --quick --out benchmarks/results $(BENCH_ARGS)

# Real agents in Mininet, up to the paper's testbed: memory per agent
# (RSS/PSS/USS), CPU at idle and under load, bring-up time, for 10, 30, 60 and
# 200 agents under the testbed's 13 switches and the k=8 fat-tree's 128
# (about 15 minutes; docs/testbed.md). BENCH_TESTBED_ARGS=--topology NAME ... for others.
bench-testbed: setup
	$(PY) -m benchmarks.testbed --out benchmarks/results $(BENCH_TESTBED_ARGS)

# Flow-table sizes beside the paper's Fig. 17 (24 plans, about 20 minutes).
bench-flowtables: setup
	$(PY) -m benchmarks.flowtables --out benchmarks/results

# The agent's costs alone (rewrite modes, service vs raw redis): a few minutes.
# The agent's request path (about 9 minutes), then durable and replicated
# writes against redis-server side by side (issue 27; about 2 minutes).
bench-agent: setup
	$(PY) -m benchmarks.agent_bench --out benchmarks/results
	$(PY) -m benchmarks.write_bench --out benchmarks/results

# What the second copy costs: write latency and throughput at r=2 against
# r=1 (side by side, with and without --fsync), and re-replication at three
# --sync-rate values after a kill -9 (about 10 minutes; --quick: about 2).
bench-replication: setup
	$(PY) -m benchmarks.replication --out benchmarks/results

# The multi-site paper's Figs. 5, 6, 7 and 10 on four sites in network
# namespaces, WAN links with the round trips of its Azure regions, the
# per-site registry baseline, and Fig. 5's largest run again on sites that are
# MetaFlow fabrics (docs/sites.md; about 20 minutes).
bench-sites: setup
	$(PY) -m benchmarks.sites_bench --out benchmarks/results

# The nemesis at length (`make test` runs 20 kills and 2 of each other kind):
# 200 kill -9s of storage servers (primaries, backups, in splits and
# fail-overs), edge links cut and controllers killed, 40 pauses (SIGSTOP of an
# agent or the controller), 24 cuts of the management network and 8 slow
# disks, while clients read and write; nothing acknowledged may be lost, no ID
# served twice, every history linearizable (about 33 minutes).
# CHAOS_ARGS=--seed N for another schedule, --store redis for Redis stores.
chaos: setup
	$(PY) -m mininet_scenarios.nemesis --kills 200 --pauses 40 --partitions 24 --slow-disks 8 $(CHAOS_ARGS)

# The nemesis with two controllers on one etcd (docs/ha.md): every kind above
# and the faults of the leader and of etcd: the leader and etcd paused, the
# leader cut from etcd while the standby reaches it, the standby cut from etcd
# while the leader keeps it, and the leader killed (it comes back as the
# standby); no takeover may remove a MetaFlow entry. `make test` runs one of
# each; CHAOS_ARGS as for `make chaos`.
chaos-ha: setup
	$(PY) -m mininet_scenarios.nemesis --controllers 2 --kills 40 --pauses 32 --partitions 32 --slow-disks 4 \
		--leader-kills 12 $(CHAOS_ARGS)

# Balance under a moving hot spot: Zipf 1.2 over paths, the hot spot moving
# every 30 s, with rebalancing and with --no-rebalance on fresh networks in
# one run; per-server load over time, plotted (about 5 minutes).
bench-hotspot: setup
	$(PY) -m benchmarks.hotspot --out benchmarks/results $(BENCH_HOTSPOT_ARGS)

# Time from kill -9 of a primary to the first successful write of each of its
# blocks, 20 kills detected by port-down and 20 by heartbeats (about 6 minutes);
# then two controllers on etcd, 10 times the leader and a primary killed at once:
# the new leader's fail-over decision and the blocks serving again (about 4 minutes).
bench-failover: setup
	$(PY) -m benchmarks.failover --out benchmarks/results
	$(PY) -m benchmarks.failover --leader-kill --kills 10 --out benchmarks/results

# Liveness at 200 and 2,000 servers (issue 26): a real controller, emulated
# servers registered through the signed route, beating at 4/s by datagram and
# then by HTTP; the controller's CPU and intake side by side (about 2 minutes).
.PHONY: bench-liveness
bench-liveness: setup
	$(PY) -m benchmarks.liveness --out benchmarks/results

# The file system: renaming a directory under full-path and inode keys, then
# metaflow-fs on one agent beside the same mount on one central redis-server
# (mdtest phases, tar x, git, fs_mark, postmark), 3 rounds (about 10 minutes;
# BENCH_FS_ARGS=--quick: about 2); then the same mount over the fabric (a k=4
# fat-tree in Mininet, 8 agents) beside a central redis-server in it (about 5
# minutes), and the requests each call costs through the mount (a minute).
bench-fs: setup
	$(PY) -m benchmarks.fs_bench --out benchmarks/results $(BENCH_FS_ARGS)
	$(PY) -m benchmarks.fs_fabric --out benchmarks/results
	$(PY) -m benchmarks.fs_requests --out benchmarks/results

# The paper's DFS experiment (Fig. 20) at this machine's scale: files of
# 64 KB to 64 MB written under a 20/80 metadata load, their metadata found
# through MetaFlow, hash mapping, One-Hop and Chord (about 15 minutes;
# BENCH_FIG20_ARGS=--quick: about 3).
bench-fig20: setup
	$(PY) -m benchmarks.fig20 --out benchmarks/results $(BENCH_FIG20_ARGS)

# Where the controller's decision thread spends its time at k=4, 8, 16 and 32
# (2,000 servers), on the in-memory fake world: per phase and per event type
# (docs/decision-thread.md; about 15 minutes, most of it k=32;
# PROFILE_ARGS="--k 32 --profile" for cProfile's top functions).
.PHONY: profile-decision
profile-decision: setup
	$(PY) -m tests.scale_profile --k 4,8,16,32 $(PROFILE_ARGS)

# The real controller against emulated fat-trees (benchmarks/ofemu.py: one
# OpenFlow 1.0 connection per switch; benchmarks/agentemu.py: the agents'
# signed registration, heartbeats and admin API), k = 4, 8, 16 and 32: switches
# connected, registration, the first build and a successor's rebuild, CPU and
# memory, flow mods per second, and the whole-fabric check (docs/scale.md).
# BENCH_SCALE_ARGS="--k 4 8" for the small sizes only (about a minute).
bench-scale: setup
	$(PY) -m benchmarks.scale --restart --out benchmarks/results $(BENCH_SCALE_ARGS)

# How many real Open vSwitch bridges fit: the switches of fat-trees k = 4, 8
# and 16 as userspace-datapath bridges wired by veth pairs, discovered by the
# real controller; ovs-vswitchd's CPU and memory at idle (docs/scale.md).
bench-ovs-fit: setup ovs
	$(PY) -m benchmarks.ovs_fit --out benchmarks/results $(BENCH_OVS_FIT_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build $(FASTPATH_CRATE)/target nat_agent/_fastpath*.so site
