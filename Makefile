# Two entry points: `make demo` and `make test`. Each builds the virtualenvs it needs.
#
# make demo   a fresh venv with the package alone (no extras), then `sqlalchemy-tickets demo` on SQLite.
# make test   1. mypy;
#             2. the package as a user gets it: build the sdist and, from it, the wheel; `twine check`;
#                install the wheel without extras in a fresh venv and run tests/install/smoke.py there;
#             3. the whole suite in .venv: the newest Python here and the newest releases of
#                everything (target `suite`);
#             4. in .venv-lowest, the lowest Python and the lowest version of every dependency
#                and extra that pyproject.toml declares (target `lowest`, tests/install/lowest.py):
#                the tests of what those versions decide (LOWEST_TESTS: the ORM and Core
#                integration, Alembic, connections, drivers and timeouts, the compiled SQL, the
#                unit, install and docs tests), without the long scenarios marked `slow`; the
#                library's own logic above them (tiers, caches, the command line, faults) is
#                the same on every version, and 3 runs it.
#             3 runs as two processes, by test file (targets `suite-1`, `suite-2`: the second takes
#             every file the first does not, new folders included); 1 and 2 (target `checks`), 3
#             and 4 run side by side, three at a time (SUITE_JOBS=1 runs them one after the
#             other): most of a run is spent waiting on servers and subprocesses, so three runs
#             share two cores well.
# Every backend must answer (TICKETS_TEST_REQUIRE_ALL=1): a missing server fails the run.
# PYTEST_ARGS narrows the suite runs when working locally (then 3 is one process, `suite`);
# .ci/run never sets it.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LOWEST_VENV ?= .venv-lowest
DEMO_VENV ?= .venv-demo
DIST ?= dist
PYTEST_ARGS ?=
SUITE_JOBS ?= 3
# The newest run's first half, by file; `suite-2` runs the rest.
SUITE_1_FILES = $(sort $(wildcard tests/backend/test_[a-l]*.py))
SUITE_RUNS = $(if $(strip $(PYTEST_ARGS)),suite,suite-1 suite-2)
# What the lowest versions run (PYTEST_ARGS, when set, replaces it).
LOWEST_TESTS = tests/unit tests/compile tests/install tests/docs $(addprefix tests/backend/test_,\
	alembic.py alembic_plugin.py app_suites.py app_types.py connections.py drivers.py \
	insert_forms.py least_privilege.py nothing_left_behind.py reaping.py sqlmodel.py \
	ticket_id.py timeouts.py urls.py)
export TICKETS_TEST_REQUIRE_ALL ?= 1
# The suites start hundreds of interpreters (the command line, Alembic, worker processes): the
# packages are compiled once when a venv is made (--compile-bytecode) and the project's own
# modules by the first interpreter that imports them, whatever PYTHONDONTWRITEBYTECODE says
# (each interpreter would otherwise compile everything again, about a second each).
unexport PYTHONDONTWRITEBYTECODE

# The newest Python here (python3.N on PATH, or installed by pyenv): the newest-versions run,
# in .venv, uses it; the lowest-versions run uses the lowest that requires-python allows.
NEWEST_PYTHON ?= $(shell for v in 3.14 3.13 3.12 3.11 3.10; do \
	for p in python$$v $(HOME)/.pyenv/versions/$$v.*/bin/python3; do \
	"$$p" -c 'import sys' 2>/dev/null && { echo "$$p"; exit 0; }; done; done; echo $(PYTHON))

# uv with the indexes pip is configured with (uv does not read pip's configuration).
UV_PIP = $(BIN)/python tests/install/uv_pip.py
# The lowest Python that requires-python allows: on PATH, or installed by pyenv.
LOWEST_PYTHON_VERSION ?= $(shell $(PYTHON) tests/install/lowest.py python)
LOWEST_PYTHON ?= $(shell for p in python$(LOWEST_PYTHON_VERSION) \
	$(wildcard $(HOME)/.pyenv/versions/$(LOWEST_PYTHON_VERSION).*/bin/python3); do \
	"$$p" -c 'import sys; assert sys.version.startswith("$(LOWEST_PYTHON_VERSION).")' \
	2>/dev/null && { echo "$$p"; break; }; done)

.PHONY: demo test checks installed suite suite-1 suite-2 lowest pgbouncer galera zookeeper patroni driver-deps lint bench clean

$(BIN)/activate: pyproject.toml | driver-deps
	$(NEWEST_PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv
	$(UV_PIP) install --quiet --upgrade --compile-bytecode --python $(BIN)/python -e '.[dev]'
	touch $(BIN)/activate

demo:
	rm -rf $(DEMO_VENV)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet .
	cd $(CURDIR) && $(DEMO_VENV)/bin/sqlalchemy-tickets demo

test: $(BIN)/activate pgbouncer galera zookeeper patroni driver-deps
	$(MAKE) --no-print-directory --jobs=$(SUITE_JOBS) --output-sync=target checks $(SUITE_RUNS) \
	  lowest

# 1 and 2, in the first of the SUITE_JOBS slots (the lowest run starts in it when they are done).
checks: $(BIN)/activate
	$(BIN)/mypy
	$(MAKE) --no-print-directory installed

suite: $(BIN)/activate
	$(BIN)/pytest $(PYTEST_ARGS)

suite-1: $(BIN)/activate
	$(BIN)/pytest -p no:cacheprovider $(SUITE_1_FILES)

suite-2: $(BIN)/activate
	$(BIN)/pytest -p no:cacheprovider $(addprefix --ignore=,$(SUITE_1_FILES))

# The built package, installed as a user installs it: nothing from this tree but the wheel.
installed: $(BIN)/activate
	rm -rf $(DIST)
	$(BIN)/python -m build --installer uv --outdir $(DIST) .
	$(BIN)/twine check --strict $(DIST)/*
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/pip" install --quiet $(DIST)/*.whl && \
	cd "$$tmp" && "$$tmp/venv/bin/python" $(CURDIR)/tests/install/smoke.py

$(LOWEST_VENV)/bin/activate: pyproject.toml | $(BIN)/activate driver-deps
	@test -n "$(LOWEST_PYTHON)" || { echo "Python $(LOWEST_PYTHON_VERSION), the lowest that" \
	  "pyproject.toml declares, was not found: install it or set LOWEST_PYTHON=/path/to/python"; \
	  exit 1; }
	rm -rf $(LOWEST_VENV)
	$(BIN)/python -m uv venv --quiet --python $(LOWEST_PYTHON) $(LOWEST_VENV)
	$(BIN)/python tests/install/lowest.py constraints > $(LOWEST_VENV)/constraints.txt
	$(UV_PIP) install --quiet --compile-bytecode --python $(LOWEST_VENV)/bin/python -e '.[dev]' \
	  --constraint $(LOWEST_VENV)/constraints.txt
	touch $(LOWEST_VENV)/bin/activate

lowest: $(LOWEST_VENV)/bin/activate
	$(LOWEST_VENV)/bin/python tests/install/lowest.py check $(LOWEST_VENV)/constraints.txt
	$(LOWEST_VENV)/bin/pytest -o cache_dir=$(LOWEST_VENV)/.pytest_cache -m "not slow" \
	  $(if $(strip $(PYTEST_ARGS)),$(PYTEST_ARGS),$(LOWEST_TESTS))

# The PgBouncer tests start $TICKETS_PGBOUNCER, else /usr/sbin/pgbouncer: Debian's package provides it.
pgbouncer:
	@test -n "$$TICKETS_PGBOUNCER" || command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || { \
	  echo "installing PgBouncer (Debian package pgbouncer) for the PgBouncer tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq pgbouncer; }

# The Galera tests start a 3-node MariaDB cluster: its provider (galera-4) and what its rsync state
# transfer runs (rsync, and ss from iproute2), from Debian's packages.
galera:
	@{ test -n "$$TICKETS_GALERA_PROVIDER" || test -e /usr/lib/galera/libgalera_smm.so; } && \
	  command -v rsync >/dev/null && command -v ss >/dev/null || { \
	  echo "installing Galera (Debian packages galera-4 rsync iproute2) for the Galera tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq galera-4 rsync iproute2; }

# The ZooKeeper tests start a 3-server ensemble from Debian's package (ZooKeeper 3.8, which
# brings a JRE): $TICKETS_ZOOKEEPER_JAR, else /usr/share/java/zookeeper.jar.
zookeeper:
	@{ test -n "$$TICKETS_ZOOKEEPER_JAR" || test -e /usr/share/java/zookeeper.jar; } && \
	  command -v java >/dev/null || { \
	  echo "installing ZooKeeper (Debian package zookeeper) for the ZooKeeper tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq zookeeper; }

# The Patroni test fails a PostgreSQL pair over with Patroni 3.0 on a one-member etcd 3.4, from
# Debian's packages: $TICKETS_PATRONI and $TICKETS_ETCD, else patroni and etcd on PATH. The test
# starts an etcd of its own on free ports, so a packaged etcd service, where one runs, is no bother.
patroni:
	@{ test -n "$$TICKETS_PATRONI" || command -v patroni >/dev/null; } && \
	  { test -n "$$TICKETS_ETCD" || command -v etcd >/dev/null; } || { \
	  echo "installing Patroni and etcd (Debian packages patroni etcd-server) for the Patroni test"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq patroni etcd-server; }

# mysqlclient, a test dependency, compiles against the MariaDB client library, which it finds
# through pkg-config: Debian's packages libmariadb-dev and pkg-config.
driver-deps:
	@pkg-config --exists libmariadb 2>/dev/null || { \
	  echo "installing the MariaDB client library (Debian packages libmariadb-dev pkg-config) for mysqlclient"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq libmariadb-dev pkg-config; }

lint: $(BIN)/activate
	$(BIN)/ruff check src tests benchmarks

bench: $(BIN)/activate
	$(BIN)/python benchmarks/bench_flush.py
	$(BIN)/python benchmarks/bench_roundtrip.py
	$(BIN)/python benchmarks/bench_zookeeper.py

clean:
	rm -rf $(VENV) $(LOWEST_VENV) $(DEMO_VENV) build $(DIST) *.egg-info tickets-demo.db*
