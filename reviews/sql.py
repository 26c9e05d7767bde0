"""The reviews app's own hand-written SQL: statements that touch only ``reviews_reviewrequest``.

A statement that reads or writes an engine table (``workers_*``), even together with this app's
table, lives in ``workers/sql.py`` (``LOCK_JOB_OF_REVIEW``); everything else is the ORM. The
rules are ``workers/sql.py``'s: a named constant with a one-line purpose and the why of its
shape, values always bound parameters. ``tests/unit/test_sql_home.py`` checks that these
statements name no other table.
"""

from __future__ import annotations

# -- the gate (reviews.services.consume_approval, inside the job body's transaction) -------------

# Use the approval of exactly this action (params: job id, operation key, digest) if it is
# approved and not expired; returns its id. The conditional UPDATE is the decision: an approval
# is used once.
USE_APPROVAL = (
    "UPDATE reviews_reviewrequest SET state = 'used', used_at = now() "
    "WHERE job_id = %s AND operation_key = %s AND digest = %s AND state = 'approved' AND expires_at > now() "
    "RETURNING id"
)

# Whether an approval of this very action (params: job id, operation key, digest) was already
# used: a re-send under the same key is the same action.
APPROVAL_USED = "SELECT 1 FROM reviews_reviewrequest WHERE job_id = %s AND operation_key = %s AND digest = %s AND state = 'used'"
