# Koala developer tasks. `make` alone lists them.
#
# Everything runs from the project virtualenv .venv (created by scripts/bootstrap from the
# hash-pinned requirements/*.txt). When DATABASE_URL / REDIS_URL are unset, `run`, `test` and
# `bench` start embedded PostgreSQL / Redis under .koala-data/ (KOALA_DATA_DIR) for the
# duration of the command; when they are set, those services are used instead.

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        := .venv
PY          := $(VENV)/bin/python
WITH_SERVICES := $(PY) -m devtools.embedded --
PYTEST_ARGS ?=
# Parallel test workers (pytest-xdist). More than the 2 cores pay: most slow tests wait on leases
# and timers. Each worker has its own test database and Redis database (tests/parallel.py), so
# at most 16 minus REDIS_URL's database number; TEST_WORKERS=0 runs the suite serially in one process.
# --dist load --maxschedchunk 2: tests are handed out two at a time in tests/parallel.py's order
# (slow ones first), so no worker is left with a queue of long tests while the others idle.
TEST_WORKERS ?= 4
XDIST       := -n $(TEST_WORKERS) --dist load --maxschedchunk 2
RUN_ARGS    ?=
ARGS        ?=
BENCH_ARGS  ?=
PIP_COMPILE := $(VENV)/bin/pip-compile --strip-extras --generate-hashes --allow-unsafe --no-emit-index-url --no-emit-find-links

.PHONY: help bootstrap run manage test test-fast test-services unit lint format typecheck bench bench-peers bench-peers-env bench-exports bench-capacity bench-scale bench-prune bench-metrics bench-flat bench-pgbouncer bench-api bench-api-start bench-multihost bench-resources requirements clean

help: ## Show this help
	@echo "Koala make targets:"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  make %-15s %s\n", $$1, $$2}'
	@echo
	@echo "Variables: PYTEST_ARGS='-k name -x'  TEST_WORKERS=4 (0: serial)  RUN_ARGS='--port 8001'  ARGS='koala_jobs'  BENCH_ARGS=...  KOALA_PYTHON=/path/python3.12"
	@echo "Services:  DATABASE_URL / REDIS_URL; unset => embedded PostgreSQL/Redis in KOALA_DATA_DIR (.koala-data/)"

bootstrap: ## Create/refresh .venv from requirements/*.txt (Python >= 3.12)
	@scripts/bootstrap

# --role run: commands beside it (make manage, scripts/manage) join its database and Redis db.
run: bootstrap ## Migrate, seed the demo, serve http://127.0.0.1:8000/admin/ + a worker + the beat (dispatcher, reaper)
	$(PY) -m devtools.embedded --role run -- $(PY) manage.py koala_run $(RUN_ARGS)

manage: bootstrap ## A management command beside make run: its database, Redis db, dev settings (ARGS="koala_jobs")
	@scripts/manage $(ARGS)

# KOALA_EMBEDDED_REDIS_DBS: with the embedded services, one Redis database per worker is reserved,
# so a `make run` beside the tests keeps a database of its own.
test: bootstrap ## Run the whole suite, TEST_WORKERS (4) in parallel (PYTEST_ARGS=... passes options; TEST_WORKERS=0: serial)
	KOALA_EMBEDDED_REDIS_DBS=$(TEST_WORKERS) $(WITH_SERVICES) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: bootstrap ## Every test that starts no process (-m "not slow": the unit tier and most of integration), in parallel
	KOALA_EMBEDDED_REDIS_DBS=$(TEST_WORKERS) $(WITH_SERVICES) $(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

test-services: bootstrap ## Only the tests that depend on where PostgreSQL/Redis come from (-m services: CI's services pass)
	KOALA_EMBEDDED_REDIS_DBS=$(TEST_WORKERS) $(WITH_SERVICES) $(PY) -m pytest $(XDIST) -m services $(PYTEST_ARGS)

# The unit tier needs no database or Redis (tests/unit/conftest.py refuses any test that asks
# for one); the settings only need well-formed URLs, so placeholders do when they are unset.
unit: bootstrap ## Run the database-free unit tier (tests/unit)
	DATABASE_URL="$${DATABASE_URL:-postgres://localhost/unit-tests-use-no-database}" REDIS_URL="$${REDIS_URL:-redis://localhost:6379/0}" \
		$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: bootstrap ## ruff check + ruff format --check + lint-imports (the import direction, docs/architecture.md)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: bootstrap ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# mypy's Django plugin imports koala.settings, which refuses to load without the URLs;
# nothing connects, so placeholders do when they are unset.
typecheck: bootstrap ## mypy
	DATABASE_URL="$${DATABASE_URL:-postgres://localhost/typecheck}" REDIS_URL="$${REDIS_URL:-redis://localhost:6379/0}" \
		$(VENV)/bin/mypy .

# The bench TRUNCATEs/FLUSHDBs what it is pointed at; embedded, it gets its own database and
# Redis db (it refuses names without "bench" and Redis db 0), leaving make run's demo data alone.
# The schema is migrated first (a fresh bench database has none).
bench: bootstrap ## Throughput benchmark (bench/throughput.py; BENCH_ARGS=...)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.throughput "$$@"' \
		$(PY) $(BENCH_ARGS)

# Koala against Celery, Procrastinate, raw RQ and the raw PostgreSQL floor in one run
# (bench/compare.py). The peers run in a virtualenv of their own, .venv-peers (scripts/bootstrap-peers,
# from the hash-pinned requirements/bench-peers.txt): Koala's .venv never gets celery or procrastinate.
bench-peers: bootstrap bench-peers-env ## Koala vs Celery, Procrastinate, RQ and the PostgreSQL floor, one run (bench/compare.py; builds .venv-peers)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.compare "$$@"' \
		$(PY) $(BENCH_ARGS)

bench-peers-env: ## Create/refresh .venv-peers (Celery, Procrastinate) from requirements/bench-peers.txt
	@scripts/bootstrap-peers

bench-exports: bootstrap ## Export benchmark vs plain COPY (bench/export_bench.py; BENCH_ARGS=...)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.export_bench "$$@"' \
		$(PY) $(BENCH_ARGS)

# Export concurrency 1, 2, 4 (worker processes and the exports budget's limit) under the same
# backlog, small jobs and HTTP traffic; about 4 minutes (BENCH_ARGS="--duration 90", "--quick").
bench-capacity: bootstrap ## Capacity experiment: export concurrency 1/2/4 under one load, where it stops paying (bench/capacity.py)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.capacity "$$@"' \
		$(PY) $(BENCH_ARGS)

# Seeds 1M jobs into koala_bench (about 1.5 min, reused while the count matches) and times the
# engine's statements and the console's pages; BENCH_ARGS="--jobs 20000" is the CI smoke size.
bench-scale: bootstrap ## Scale benchmark: queries on a 1M-job table (bench/scale.py; BENCH_ARGS=--jobs 20000)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.scale "$$@"' \
		$(PY) $(BENCH_ARGS)

bench-prune: bootstrap ## Retention benchmark: prune a 1M-job backlog beside a live worker (bench/prune.py; BENCH_ARGS=--jobs 20000)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.prune "$$@"' \
		$(PY) $(BENCH_ARGS)

# Seeds 1M jobs into koala_bench (reused while the count matches), folds them and times GET /metrics
# against a SELECT 1 and the dashboard selector in the same run; BENCH_ARGS="--jobs 20000" is the smoke size.
bench-metrics: bootstrap ## Metrics scrape benchmark: GET /metrics p50/p95 at 1M jobs (bench/metrics_scrape.py; BENCH_ARGS=--jobs 20000)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.metrics_scrape "$$@"' \
		$(PY) $(BENCH_ARGS)

bench-pgbouncer: bootstrap ## Drain rate direct vs direct without prepared statements vs through PgBouncer (transaction mode), one run (bench/pgbouncer.py)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.pgbouncer "$$@"' \
		$(PY) $(BENCH_ARGS)

bench-flat: bootstrap ## Flat-cost benchmark: drain rate, claim/complete latency, worker RSS at 10k/100k/1M finished jobs (bench/flat.py)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.flat "$$@"' \
		$(PY) $(BENCH_ARGS)

# Workers on two network-namespace hosts against a database host, beside the same count on the
# database host, 2 -> 4 -> 8 processes (bench/multihost.py). Needs root: it builds its own hosts,
# PostgreSQL cluster and Redis (tests/support/netns.py) and deletes them; about 3 minutes.
bench-multihost: bootstrap ## Throughput across hosts: workers on 2 namespace hosts vs the db host, 2/4/8 processes (bench/multihost.py)
	$(PY) -m bench.multihost $(BENCH_ARGS)

# One uvicorn process serving koala.asgi: an idle long-polling fleet's cost, wake-up latency, and
# an HTTP worker's jobs/s against the RQ runtime's (bench/worker_api.py; BENCH_ARGS=...).
bench-api: bootstrap ## Worker API benchmark: idle fleet, wake-up latency, HTTP vs RQ jobs/s (bench/worker_api.py)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.worker_api "$$@"' \
		$(PY) $(BENCH_ARGS)

# Memory per process (worker classes idle and during one 1M-row export, beat, web) and log bytes per
# 1,000 jobs in plain and JSON (bench/resources.py; about 2 minutes; BENCH_ARGS="--rows 100000").
bench-resources: bootstrap ## Resource benchmark: RSS/PSS/USS per worker class idle and per active export, beat, web; log bytes per 1,000 jobs (bench/resources.py)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.resources "$$@"' \
		$(PY) $(BENCH_ARGS)

bench-api-start: bootstrap ## Starting a job over HTTP (POST /api/v1/jobs, 2 uvicorn processes) vs in-process enqueue() (bench/http_start.py)
	KOALA_EMBEDDED_DATABASE=koala_bench KOALA_EMBEDDED_REDIS_DB=5 $(WITH_SERVICES) \
		sh -c '"$$0" manage.py migrate --noinput --skip-checks -v 0 && exec "$$0" -m bench.http_start "$$@"' \
		$(PY) $(BENCH_ARGS)

requirements: ## Recompile requirements/*.txt from requirements/*.in with hashes
	@test -x $(VENV)/bin/pip-compile || scripts/bootstrap
	cd requirements && ../$(PIP_COMPILE) --output-file=base.txt base.in
	cd requirements && ../$(PIP_COMPILE) --output-file=dev.txt dev.in
	cd requirements && ../$(PIP_COMPILE) --output-file=bench-peers.txt bench-peers.in

clean: ## Remove .venv, caches and the embedded data (.koala-data/: database, Redis, demo login)
	@for pidfile in .koala-data/postgres/postmaster.pid .koala-data/redis/redis.pid; do \
		pid=$$(head -n1 $$pidfile 2>/dev/null || true); \
		if [ -n "$$pid" ] && ps -p "$$pid" -o comm= 2>/dev/null | grep -qE 'postgres|redis'; then \
			echo "clean: an embedded service is running (pid $$pid from $$pidfile); stop make run/test first" >&2; \
			exit 1; \
		fi; \
	done
	rm -rf $(VENV) .venv-peers .koala-data .pytest_cache .mypy_cache .ruff_cache .import_linter_cache bench/results
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
