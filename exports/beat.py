"""The exports app's share of each beat tick (registered in ExportsConfig.ready through workers.hooks).

Outcomes the engine decided alone (reaper, cancel) reach their export records every tick; dead
attempts' temporary files go about once a minute (per beat process).
"""

from __future__ import annotations

import time

from exports.services import housekeeping

TEMP_SWEEP_SECONDS = 60.0

_next_temp_sweep = 0.0


def tick() -> dict[str, int]:
    global _next_temp_sweep
    sweep = time.monotonic() >= _next_temp_sweep
    settled, removed = housekeeping(clean_temp=sweep)
    if sweep:
        _next_temp_sweep = time.monotonic() + TEMP_SWEEP_SECONDS
    return {"settled": settled, "temp_objects_removed": removed}
