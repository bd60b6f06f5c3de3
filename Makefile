# MetaFlow: one entry point for setting up, testing, and running.
# Every target installs what it needs, idempotently, so a fresh machine only
# needs `make test` or `make demo`.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages the code needs: the Redis store, iptables/conntrack and
# libnetfilter-queue for the agent's rewrite, redis-cli as a debugging
# client, and a C toolchain for NetfilterQueue's extension.
APT_PACKAGES := redis-server redis-tools iptables conntrack iproute2 ethtool \
                libnetfilter-queue-dev libnetfilter-queue1 build-essential

.PHONY: setup apt test unit demo bench bench-agent plan clean

setup: apt $(STAMP)

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

# The main job on the embedded default. Until the controller and Mininet
# scenarios land, this is the pure-core planner on the paper's fat-tree.
demo: setup
	$(VENV)/bin/metaflowctl plan --topology fattree --k 32 --servers 2000

plan: demo

bench: setup
	$(PY) -m benchmarks.flowtables --out benchmarks/results
	$(PY) -m benchmarks.agent_bench --out benchmarks/results

# The agent's costs alone (rewrite modes, service vs raw redis): a few minutes.
bench-agent: setup
	$(PY) -m benchmarks.agent_bench --out benchmarks/results

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
