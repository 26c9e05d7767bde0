"""The SDK's backoff after a server restart or a network blip: exponential, jittered, capped."""

from __future__ import annotations

import random

import pytest
from koala_worker import backoff_delay


@pytest.mark.parametrize("failures", [1, 2, 3, 5, 8, 20, 100, 10_000])
def test_every_delay_is_within_half_a_step_and_the_cap(failures: int) -> None:
    step = min(10.0, 0.2 * 2 ** (failures - 1)) if failures < 64 else 10.0
    assert backoff_delay(failures, rand=lambda: 0.0) == pytest.approx(step / 2)
    assert backoff_delay(failures, rand=lambda: 1.0) == pytest.approx(step)
    rng = random.Random(failures)
    for _ in range(200):
        assert step / 2 <= backoff_delay(failures, rand=rng.random) <= step <= 10.0


def test_delays_double_until_the_cap() -> None:
    top = [backoff_delay(n, rand=lambda: 1.0) for n in range(1, 10)]
    assert top[:6] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4])
    assert top[6:] == pytest.approx([10.0, 10.0, 10.0])


def test_jitter_spreads_a_fleet() -> None:
    rng = random.Random(7)
    assert len({round(backoff_delay(4, rand=rng.random), 6) for _ in range(50)}) > 40
