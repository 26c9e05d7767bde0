"""Prometheus metrics: ``GET /metrics``, Koala's truth read from PostgreSQL (docs/metrics.md).

- ``models.py``: the tallies that make the counters survive restarts and retention pruning;
- ``services.py``: the fold (a beat task), the retention hook and the rejection counter (writes);
- ``selectors.py``: one scrape's snapshot, read in one read-only REPEATABLE READ transaction;
- ``exposition.py``: the snapshot as metric families (pure), label bounding;
- ``auth.py``: who may scrape (pure); ``views.py``: the endpoint.
"""
