"""Signals an export attempt sends as it goes: for metrics, logging and fault-injection tests.

Receivers run inside the body, on the worker: keep them quick (they delay the stream).
"""

from __future__ import annotations

from django.dispatch import Signal

# After each batch is written: export_id, attempt, batch (1-based), rows and bytes so far.
export_batch = Signal()

# At each step: export_id, attempt and phase, one of
#   "streaming"       the temporary object is open and the COPY is running;
#   "stopped"         told to stop at a batch boundary (cancelled, lease lost, stop pause);
#   "staged"          the temporary object is complete, synced and named on the export row;
#   "object_written"  the final object exists; the ledger has not recorded it yet;
#   "published"       the ledger recorded the publish;
#   "completed"       the export row says succeeded.
export_phase = Signal()
