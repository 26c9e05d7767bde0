"""Exponential backoff with jitter, for a server that restarts or a network that blips."""

from __future__ import annotations

import random
from collections.abc import Callable

BASE_SECONDS = 0.2
CAP_SECONDS = 10.0


def backoff_delay(
    failures: int, *, base: float = BASE_SECONDS, cap: float = CAP_SECONDS, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait after ``failures`` consecutive failures (1 = the first).

    "Equal jitter": half of the exponential step is kept, the other half is random, so a fleet
    that lost the server together does not come back together, and no wait is ever zero.
    Always within ``[base / 2, cap]``.
    """
    step = min(cap, base * (2 ** max(0, min(failures - 1, 32))))
    return step / 2 + rand() * step / 2
