"""Concurrent batch enqueues: overlapping idempotency keys in any order, from real processes."""

from __future__ import annotations

import random

import pytest

from tests.racers import race
from workers.models import Job
from workers.services.jobs import JobSpec, enqueue_many

# transaction=True: concurrent enqueues from other processes must see each other's commits.
pytestmark = pytest.mark.django_db(transaction=True)

RACERS = 8
ROUNDS = 30


def enqueue_keys(keys: list[str]) -> list[tuple[str, int]]:
    """One racer's call: a batch of noop jobs under ``keys``, in the order given."""
    results = enqueue_many(specs=[JobSpec(kind="noop", input={"key": key}, idempotency_key=key) for key in keys])
    return [(key, result.job_id) for key, result in zip(keys, results, strict=True)]


@pytest.mark.slow  # eight spawned processes, about 15 s
def test_overlapping_batches_in_any_order_all_succeed_with_one_job_per_key(redis_clean: None) -> None:
    rng = random.Random(9)
    # Each round: 12 keys; each racer takes 9 of them (so every pair overlaps) in its own order.
    payloads: list[list[list[str]]] = [[] for _ in range(RACERS)]
    for number in range(ROUNDS):
        pool = [f"r{number}-k{i}" for i in range(12)]
        for racer in range(RACERS):
            payloads[racer].append(rng.sample(pool, 9))
    outcomes = race(f"{__name__}:enqueue_keys", payloads)

    errors = sorted({o.error for o in outcomes if o.error})
    assert not errors, f"{sum(1 for o in outcomes if o.error)} of {len(outcomes)} calls failed: {errors[:3]}"
    # Every caller was told the same job for the same key, and it is the one job with that key.
    told: dict[str, set[int]] = {}
    for outcome in outcomes:
        for key, job_id in outcome.value:
            told.setdefault(key, set()).add(job_id)
    stored = dict(Job.objects.filter(kind="noop").values_list("idempotency_key", "id"))
    assert Job.objects.filter(kind="noop").count() == len(stored) == len(told)
    assert {key: ids for key, ids in told.items() if ids != {stored[key]}} == {}


def test_results_come_back_in_the_callers_order(redis_clean: None) -> None:
    keys = ["m", "c", "x", "a", "c"]
    first = enqueue_many(specs=[JobSpec(kind="noop", input={"k": k}, idempotency_key=k) for k in keys])
    by_key = dict(Job.objects.values_list("idempotency_key", "id"))
    assert [r.job_id for r in first] == [by_key[k] for k in keys]
    assert [r.created for r in first] == [True, True, True, True, False]
    mixed = enqueue_many(
        specs=[
            JobSpec(kind="noop", input={"k": "z"}, idempotency_key="z"),
            JobSpec(kind="noop", input={"free": 1}),
            JobSpec(kind="noop", input={"k": "a"}, idempotency_key="a"),
        ]
    )
    assert [r.created for r in mixed] == [True, True, False]
    assert mixed[2].job_id == by_key["a"]
    assert Job.objects.get(pk=mixed[1].job_id).input == {"free": 1}
