"""The traces app's own hand-written SQL: statements that touch only ``traces_span``.

A statement that reads an engine table (``workers_*``) lives in ``workers/sql.py``
(``INSERT_ATTEMPT_SPANS``); everything else is the ORM. The rules are ``workers/sql.py``'s: a
named constant with a one-line purpose and the why of its shape, values always bound parameters.
"""

from __future__ import annotations

# -- the exporter (traces.services.export_spans) ------------------------------------------------

# The oldest %s spans not exported yet, locked until the export's transaction ends. SKIP LOCKED:
# a second beat replica exporting at the same time takes the next ones instead of the same ones
# (each span is sent by one exporter at a time), and never waits behind a slow receiver.
NEXT_UNEXPORTED = (
    "SELECT id, trace_id, span_id, parent_id, kind, name, started_at, ended_at, attributes, usage, error, job_id "
    "FROM traces_span WHERE exported_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)

# Mark the spans in %s exported, once: the conditional UPDATE's row count is how many this export
# settled (a span another exporter already marked is not counted twice).
MARK_EXPORTED = "UPDATE traces_span SET exported_at = now() WHERE id = ANY(%s) AND exported_at IS NULL"
