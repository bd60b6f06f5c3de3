# MetaFlow: one entry point for setting up, testing, and running.
# Every target installs what it needs, idempotently, so a fresh machine only
# needs `make test` or `make demo`.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages the code needs: the Redis store, iptables/conntrack and
# libnetfilter-queue for the agent's rewrite, redis-cli as a debugging
# client, a C toolchain for NetfilterQueue's extension, and Mininet with
# Open vSwitch (and ping, which Mininet hosts use) for the emulated fabrics
# (mininet_scenarios/).
APT_PACKAGES := redis-server redis-tools iptables conntrack iproute2 ethtool \
                libnetfilter-queue-dev libnetfilter-queue1 build-essential \
                mininet openvswitch-switch iputils-ping
# Debian's Mininet is a package of the system python3 only. The venv gets a
# symlink to that one package, not a .pth line for the whole dist-packages
# directory: a .pth would let every Debian module (an older cryptography,
# yaml, ovs, ...) stand in silently for anything missing from the venv.
MININET_SRC  := /usr/lib/python3/dist-packages/mininet
SITE_PACKAGES = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

.PHONY: setup apt mininet-link ovs test unit demo bench bench-quick bench-flowtables bench-agent plan clean

setup: apt $(STAMP) mininet-link ovs

# Open vSwitch's daemons (userspace datapath: this kernel has no openvswitch
# module). Started only when not already answering; never restarted, since
# other users' bridges may live in them.
ovs: apt
	@ovs-vsctl --timeout=3 show >/dev/null 2>&1 || \
	  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null

mininet-link: $(STAMP)
	@test -e $(SITE_PACKAGES)/mininet || ln -s $(MININET_SRC) $(SITE_PACKAGES)/mininet

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,plots]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q tests

unit: setup
	$(PY) -m pytest -q tests/unit

# The main job: MetaFlow end to end in Mininet (k=4 fat-tree, 8 servers,
# 8 clients, 20,000 files, splits and a server failure), about 1.5 minutes.
# DEMO_ARGS=--store redis for Redis stores.
demo: setup
	$(PY) -m mininet_scenarios.demo $(DEMO_ARGS)

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

# Flow-table sizes beside the paper's Fig. 17 (24 plans, about 20 minutes).
bench-flowtables: setup
	$(PY) -m benchmarks.flowtables --out benchmarks/results

# The agent's costs alone (rewrite modes, service vs raw redis): a few minutes.
bench-agent: setup
	$(PY) -m benchmarks.agent_bench --out benchmarks/results

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
