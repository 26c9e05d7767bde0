"""The benchmark's peers (bench/compare.py): one driver module per system, run as
``python -m bench.peers.NAME ROLE ...`` from the repository root by the peers' own virtualenv
(.venv-peers) or, for the raw PostgreSQL floor, by any Python with psycopg and redis.

A driver imports only the standard library at module level (so Koala's venv can import it to
test its argument parsing and verification logic), and only celery, procrastinate, redis and
psycopg inside its functions: never Koala (an import-linter contract in pyproject.toml).
"""
