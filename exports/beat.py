"""The exports app's share of each beat tick (registered in ExportsConfig.ready through workers.hooks).

Outcomes the engine decided alone (reaper, cancel) reach their export records every tick; dead
attempts' temporary files go about once a minute (per beat process).
"""

from __future__ import annotations

import time
from datetime import timedelta

from exports.services import housekeeping
from workers.hooks import TickLease

TEMP_SWEEP_SECONDS = 60.0

_next_temp_sweep = 0.0


def tick() -> dict[str, int]:
    global _next_temp_sweep
    sweep = time.monotonic() >= _next_temp_sweep
    settled, removed = housekeeping(clean_temp=sweep)
    if sweep:
        _next_temp_sweep = time.monotonic() + TEMP_SWEEP_SECONDS
    return {"settled": settled, "temp_objects_removed": removed}


# koala_tick export-cleanup looks this far back (the beat's own sweep, an hour).
CLEANUP_DAYS = 7


def cleanup_tick(lease: TickLease) -> dict[str, int]:
    """The timer-started sweep (workers.hooks.register_tick_task): one bounded pass over the
    exports that ended in the last CLEANUP_DAYS days; ``lease`` is the run's (checked first)."""
    lease.hold()
    settled, removed = housekeeping(clean_temp=True, since=timedelta(days=CLEANUP_DAYS))
    return {"settled": settled, "temp_objects_removed": removed}
