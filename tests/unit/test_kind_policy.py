"""A job kind's policy and the checks enqueue makes before it touches the database."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from workers import job_kind, kinds
from workers.errors import EnqueueError
from workers.kinds import MAX_INPUT_BYTES, JobKind, register, unregister
from workers.models import Delivery
from workers.services.jobs import JobSpec, enqueue_many, input_fingerprint


def body(ctx, data):  # type: ignore[no-untyped-def]
    return None


@pytest.fixture
def registered() -> Iterator[list[tuple[str, int]]]:
    """Kinds a test registers; unregistered afterwards so the registry stays as the suite expects."""
    made: list[tuple[str, int]] = []
    yield made
    for name, version in made:
        unregister(name, version)


def test_critical_rules_always_a_threshold_or_a_callable() -> None:
    kind = JobKind(
        name="unit.crit",
        version=1,
        body=body,
        critical={
            "wire": "always",
            "charge": {"above_minor": 5000},
            "refund": lambda params, amount: params.get("to") == "elsewhere",
        },
    )
    assert kind.is_critical("wire", {}, None)
    assert not kind.is_critical("charge", {}, 5000)  # the threshold itself is not above it
    assert kind.is_critical("charge", {}, 5001)
    assert not kind.is_critical("charge", {}, None)  # no amount: a threshold cannot apply
    assert kind.is_critical("refund", {"to": "elsewhere"}, 1)
    assert not kind.is_critical("refund", {"to": "card"}, 10**9)
    assert not kind.is_critical("email", {}, 10**9)  # no rule: never critical


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"delivery": "sometimes"}, "delivery must be one of"),
        ({"max_attempts": 0}, "max_attempts must be at least 1"),
        *[({"max_input_bytes": value}, "max_input_bytes must be a whole number") for value in (0, 1.5, True, "16k")],
        ({"critical": {"charge": {"below_minor": 5}}}, "critical rule for 'charge'"),
        ({"critical": {"charge": "never"}}, "critical rule for 'charge'"),
        ({"delivery": Delivery.AT_MOST_ONCE, "max_attempts": 2}, "at_most_once kinds must have max_attempts=1"),
    ],
)
def test_register_refuses_a_policy_the_engine_cannot_honour(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        register(JobKind(name="unit.bad", version=1, body=body, **policy))
    assert kinds.get("unit.bad", 1) is None


def test_registering_the_same_body_again_is_harmless(registered: list[tuple[str, int]]) -> None:
    kind = JobKind(name="unit.again", version=1, body=body, delivery=Delivery.AT_MOST_ONCE, max_attempts=1)
    registered.append(("unit.again", 1))
    assert register(kind) is kind
    assert register(kind) is kind  # a module imported twice (autoreload, tests)
    assert kinds.get("unit.again", 1) is kind


def test_the_decorator_registers_with_frozen_field_sets(registered: list[tuple[str, int]]) -> None:
    registered.append(("unit.deco", 3))

    @job_kind("unit.deco", version=3, queue="bulk", sensitive_fields=["card"], required_fields=["to"])
    def deco(ctx, data):  # type: ignore[no-untyped-def]
        return data

    kind = kinds.get("unit.deco", 3)
    assert kind is not None and deco.kind is kind and kind.body is deco.__wrapped__
    assert (kind.key, kind.queue, kind.sensitive_fields, kind.required_fields) == (
        "unit.deco@3",
        "bulk",
        frozenset({"card"}),
        frozenset({"to"}),
    )


def test_latest_is_the_highest_version_and_an_unknown_name_lists_the_known(registered: list[tuple[str, int]]) -> None:
    for version in (2, 10, 1):
        registered.append(("unit.multi", version))
        register(JobKind(name="unit.multi", version=version, body=body))
    assert kinds.latest("unit.multi").version == 10
    with pytest.raises(EnqueueError, match=r"unknown job kind 'unit.nope'; known: [a-z_.]+, .+ \(\d+ in all\)"):
        kinds.latest("unit.nope")
    served = [(k.name, k.version) for k in kinds.served() if k.name == "unit.multi"]
    assert served == [("unit.multi", 1), ("unit.multi", 2), ("unit.multi", 10)]


def test_input_checks_name_the_kind_and_the_problem() -> None:
    def positive(data: dict[str, Any]) -> None:
        data["mutated"] = True  # the validator gets a copy
        if data["n"] <= 0:
            raise ValueError("n must be positive")
        if not isinstance(data["n"], int):
            raise TypeError("n must be an integer")

    kind = JobKind(name="unit.in", version=2, body=body, required_fields=frozenset({"n", "b", "a"}), validate=positive)
    with pytest.raises(EnqueueError, match=r"unit\.in@2 must be a JSON object, not list"):
        kind.check_input([1])
    with pytest.raises(EnqueueError, match=r"missing required field\(s\): a, b\.$"):
        kind.check_input({"n": 1})
    with pytest.raises(EnqueueError, match=r"unit\.in@2 is invalid: n must be positive"):
        kind.check_input({"n": 0, "a": 1, "b": 1})
    with pytest.raises(EnqueueError, match="n must be an integer"):
        kind.check_input({"n": 1.5, "a": 1, "b": 1})
    data = {"n": 1, "a": 1, "b": 1}
    kind.check_input(data)
    assert "mutated" not in data


def test_backoff_grows_from_the_first_retry_and_never_overflows() -> None:
    kind = JobKind(name="unit.b", version=1, body=body, backoff_base=0.5, backoff_cap=60.0)
    rng = random.Random(3)
    assert all(0 <= kind.backoff_seconds(0, rng=rng) <= 0.5 for _ in range(200))  # no attempt used yet: the base
    assert all(0 <= kind.backoff_seconds(10_000, rng=rng) <= 60.0 for _ in range(200))  # 2**9999 is capped, not computed
    same = [kind.backoff_seconds(4, rng=random.Random(11)) for _ in range(2)]
    assert same[0] == same[1] and 0 <= same[0] <= 4.0


def test_the_input_fingerprint_ignores_key_order_and_names_kind_and_version() -> None:
    a = input_fingerprint("k", 1, {"x": 1, "y": [1, 2]})
    assert a == input_fingerprint("k", 1, {"y": [1, 2], "x": 1})
    assert len({a, input_fingerprint("k", 2, {"x": 1, "y": [1, 2]}), input_fingerprint("j", 1, {"x": 1, "y": [1, 2]})}) == 3
    assert a != input_fingerprint("k", 1, {"x": 1, "y": [2, 1]})  # lists keep their order


def test_enqueueing_nothing_does_nothing() -> None:
    assert enqueue_many(specs=[]) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (JobSpec(kind="noop", priority=32768), "priority must fit in a smallint"),
        (JobSpec(kind="noop", priority=-32769), "priority must fit in a smallint"),
        (JobSpec(kind="noop", idempotency_key="k" * 201), "idempotency_key must be 1-200 characters"),
        (JobSpec(kind="noop", idempotency_key=""), "idempotency_key must be 1-200 characters"),
        (JobSpec(kind="noop", input={"when": object()}), "is not storable JSON"),
        (JobSpec(kind="noop", input={"blob": "x" * MAX_INPUT_BYTES}), f"the limit for noop@1 is {MAX_INPUT_BYTES:,} bytes"),
        (JobSpec(kind="noop", delay_seconds=-0.001), "delay_seconds cannot be negative"),
        (JobSpec(kind="noop", version=42), "has no version 42"),
        (JobSpec(kind="unit.never-registered"), "unknown job kind"),
    ],
)
def test_enqueue_refuses_bad_specs_before_any_database_work(spec: JobSpec, message: str) -> None:
    # The whole batch is checked first: a valid spec ahead of the bad one is not written either
    # (the unit tier's guard would fail this test if anything reached the database).
    with pytest.raises(EnqueueError, match=message):
        enqueue_many(specs=[JobSpec(kind="noop", input={"n": 1}), spec])


def test_a_batch_may_not_give_one_key_two_inputs() -> None:
    specs = [JobSpec(kind="noop", input={"n": 1}, idempotency_key="k"), JobSpec(kind="noop", input={"n": 2}, idempotency_key="k")]
    with pytest.raises(EnqueueError, match="appears twice in the batch with different input"):
        enqueue_many(specs=specs)
