"""Fault hooks for export tests, loaded into worker subprocesses through KOALA_JOB_KIND_MODULES.

They connect to the export signals (exports.signals), which the body sends between batches
and at each step, and follow a JSON instruction file named by KOALA_TEST_EXPORT_FAULTS:

    {"log": "/tmp/…/export-effects.log",      # one line per batch and per phase (the outside record)
     "throttle_seconds": 0.05,                # sleep after every batch (slows the stream down)
     "throttle_attempts": [1],                # … only on these attempts (default: all)
     "pause_at": "published",                 # sleep at this phase …
     "pause_attempts": [1],                   # … on these attempts (default: all)
     "pause_seconds": 60}

The file is read at every signal, so a test can change the instructions while a worker runs.
Nothing here changes what the body does; it only delays it at the points the body announces.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from exports.signals import export_batch, export_phase
from tests.kinds import effect

ENV = "KOALA_TEST_EXPORT_FAULTS"


def instructions() -> dict[str, Any]:
    path = os.environ.get(ENV)
    if not path:
        return {}
    try:
        with open(path) as handle:
            return dict(json.load(handle))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _applies(config: dict[str, Any], key: str, attempt: int) -> bool:
    attempts = config.get(key)
    return attempts is None or attempt in attempts


def on_batch(sender: object, *, export_id: int, attempt: int, batch: int, rows: int, **extra: Any) -> None:
    config = instructions()
    if config.get("log"):
        line = f"batch {export_id} {attempt} {batch} {rows} {extra['bytes']} {time.time():.3f} {os.getpid()}"
        effect(config["log"], line)
    if config.get("throttle_seconds") and _applies(config, "throttle_attempts", attempt):
        time.sleep(float(config["throttle_seconds"]))


def on_phase(sender: object, *, export_id: int, attempt: int, phase: str, **_: Any) -> None:
    config = instructions()
    if config.get("log"):
        effect(config["log"], f"phase {export_id} {attempt} {phase} {time.time():.3f} {os.getpid()}")
    if config.get("pause_at") == phase and _applies(config, "pause_attempts", attempt):
        time.sleep(float(config.get("pause_seconds", 60)))


export_batch.connect(on_batch, dispatch_uid="tests.support.export_faults.batch")
export_phase.connect(on_phase, dispatch_uid="tests.support.export_faults.phase")
