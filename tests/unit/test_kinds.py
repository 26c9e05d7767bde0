from __future__ import annotations

import random

import pytest

from workers.kinds import JobKind, register, unregister
from workers.models import Delivery


def body(ctx, data):  # type: ignore[no-untyped-def]
    return None


def test_at_most_once_cannot_have_retries() -> None:
    with pytest.raises(ValueError, match="at_most_once"):
        register(JobKind(name="t.once", version=1, body=body, delivery=Delivery.AT_MOST_ONCE, max_attempts=3))


def test_same_name_and_version_with_another_body_is_refused() -> None:
    register(JobKind(name="t.dup", version=1, body=body))
    try:
        with pytest.raises(ValueError, match="registered twice"):
            register(JobKind(name="t.dup", version=1, body=lambda c, d: None))
    finally:
        unregister("t.dup", 1)


def test_backoff_is_full_jitter_under_the_cap() -> None:
    kind = JobKind(name="t.b", version=1, body=body, backoff_base=2.0, backoff_cap=10.0)
    rng = random.Random(7)
    for attempts_used, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (60, 10.0)]:
        values = [kind.backoff_seconds(attempts_used, rng=rng) for _ in range(300)]
        assert all(0.0 <= v <= ceiling for v in values)
        assert max(values) > 0.8 * ceiling
