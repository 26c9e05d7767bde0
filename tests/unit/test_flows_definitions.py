"""Workflow definitions (workers.definitions) and the pure decision of a run's next moves (flows.decide)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flows import decide
from workers import (
    MAX_PENDING_SIGNALS,
    MAX_RUN_STATE_BYTES,
    MAX_SIGNAL_PAYLOAD_BYTES,
    MAX_STEPS,
    DefinitionError,
    kinds,
    workflow,
)
from workers import definitions as d


def body(ctx: object, data: object) -> None:
    return None


@pytest.fixture
def fresh() -> Iterator[d.Workflow]:
    w = workflow("unit_flow", version=1)
    yield w
    d.forget("unit_flow", 1)


def test_the_limits_are_published() -> None:
    assert (MAX_STEPS, MAX_RUN_STATE_BYTES, MAX_SIGNAL_PAYLOAD_BYTES, MAX_PENDING_SIGNALS) == (50, 65_536, 16_384, 100)


def test_a_step_is_a_kind_of_the_definitions_version_with_its_own_policy(fresh: d.Workflow) -> None:
    handle = fresh.step("classify", max_attempts=4, timeout_seconds=60)(body)
    assert (handle.name, handle.version) == ("unit_flow.classify", 1)
    kind = kinds.get("unit_flow.classify", 1)
    assert kind is not None and (kind.max_attempts, kind.timeout_seconds) == (4, 60)
    remote = fresh.remote_step("draft", after=["classify"], critical={"send": "always"})
    assert kinds.get("unit_flow.draft", 1).remote and remote.name == "unit_flow.draft"  # type: ignore[union-attr]
    wait = fresh.wait("approval", event="reviewer.approved", after=["draft"], timeout_seconds=60)
    assert wait.wait is not None and wait.wait.on_timeout == "continue" and not wait.kind
    assert fresh.kind_keys() == ["unit_flow.classify@1", "unit_flow.draft@1"]
    assert d.is_step_kind("unit_flow.classify") and not d.is_step_kind("unit_flow.approval")
    assert [s.name for s in fresh.roots()] == ["classify"] and [s.name for s in fresh.dependants("draft")] == ["approval"]


@pytest.mark.parametrize(
    ("declare", "error", "says"),
    [
        (lambda w: w.step("b", after=["nope"])(body), d.UnknownStep, "'nope', which is not a step declared before it"),
        (lambda w: w.step("a")(body), d.DuplicateStep, "declared twice"),
        (lambda w: w.step("Bad Name")(body), DefinitionError, "a step's name"),
        (lambda w: w.step("b", after={"a": "explode"})(body), DefinitionError, "the policy for 'a'"),
        (lambda w: w.wait("w", event="", after=["a"]), DefinitionError, "event name"),
        (lambda w: w.wait("w", event="e", timeout_seconds=-1), DefinitionError, "timeout_seconds"),
        (lambda w: w.wait("w", event="e", on_timeout="maybe"), DefinitionError, "on_timeout"),
    ],
)
def test_a_definition_declared_wrongly_is_refused_at_declaration(fresh: d.Workflow, declare, error, says) -> None:
    fresh.step("a")(body)
    with pytest.raises(error, match=says):
        declare(fresh)
    assert list(fresh.steps) == ["a"]


def test_a_definition_has_at_most_max_steps(fresh: d.Workflow) -> None:
    for n in range(MAX_STEPS):
        fresh.wait(f"w{n}", event="e")
    with pytest.raises(d.TooManySteps):
        fresh.wait("one_more", event="e")


def test_a_definition_is_declared_once_per_version() -> None:
    workflow("unit_twice", version=1)
    try:
        with pytest.raises(d.DuplicateDefinition):
            workflow("unit_twice", version=1)
        with pytest.raises(DefinitionError):
            workflow("unit_twice", version=0)
    finally:
        d.forget("unit_twice", 1)


def test_check_graph_names_unknown_steps_cycles_and_duplicates() -> None:
    assert d.check_graph({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}) == ["a", "b", "c", "d"]
    with pytest.raises(d.CycleInDefinition, match=r"a -> b -> a|b -> a -> b"):
        d.check_graph({"a": ["b"], "b": ["a"]})
    with pytest.raises(d.UnknownStep):
        d.check_graph({"a": ["x"]})
    with pytest.raises(d.DuplicateStep):
        d.check_graph({"a": [], "b": ["a", "a"]})
    with pytest.raises(d.TooManySteps):
        d.check_graph({f"s{n}": [] for n in range(MAX_STEPS + 1)})


def test_the_input_is_checked_against_the_definition() -> None:
    w = workflow("unit_input", version=1, required_fields={"ticket"}, max_input_bytes=100)
    try:
        w.check_input({"ticket": 1})
        for bad, says in [
            ([], "JSON object"),
            ({}, "missing"),
            ({"ticket": "x" * 200}, "limit"),
            ({"ticket": float("inf")}, "JSON"),
        ]:
            with pytest.raises(d.BadRunInput, match=says):
                w.check_input(bad)
    finally:
        d.forget("unit_input", 1)


@pytest.fixture
def fan() -> Iterator[d.Workflow]:
    w = workflow("unit_fan", version=1)
    w.step("a")(body)
    w.step("b", after=["a"])(body)
    w.step("c", after={"a": "skip"})(body)
    w.step("d", after={"b": "continue", "c": "continue"})(body)
    yield w
    d.forget("unit_fan", 1)


def test_next_moves_sequence_fan_out_and_fan_in(fan: d.Workflow) -> None:
    assert decide.next_moves(fan, {}).due == ["a"]
    assert decide.next_moves(fan, {"a": "queued"}) == decide.Next(run_state="running")
    assert decide.next_moves(fan, {"a": "succeeded"}).due == ["b", "c"]
    assert decide.next_moves(fan, {"a": "succeeded", "b": "succeeded", "c": "queued"}).due == []  # the fan-in waits
    assert decide.next_moves(fan, {"a": "succeeded", "b": "succeeded", "c": "succeeded"}).due == ["d"]
    everything = dict.fromkeys("abcd", "succeeded")
    assert decide.next_moves(fan, everything).run_state == "succeeded"


def test_next_moves_follow_each_edges_failure_policy(fan: d.Workflow) -> None:
    # a fails: b's edge says fail (the default) -> the run fails.
    assert decide.next_moves(fan, {"a": "failed"}) == decide.Next(run_state="failed", failed_by="a")
    # b fails: d continues after it; c still runs.
    moves = decide.next_moves(fan, {"a": "succeeded", "b": "failed", "c": "succeeded"})
    assert moves.due == ["d"] and moves.run_state == "running"
    # a skipped (say a wait skipped on timeout): b (fail edge) is skipped too, c skipped, d continues.
    moves = decide.next_moves(fan, {"a": "skipped"})
    assert moves.skip == ["b", "c"] and moves.due == ["d"]
    # A failed leaf fails the run.
    assert decide.next_moves(fan, {"a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "failed"}).run_state == "failed"


def test_a_run_waits_while_only_waits_or_parked_steps_are_pending(fan: d.Workflow) -> None:
    assert decide.next_moves(fan, {"a": "parked"}).run_state == "waiting"
    assert decide.next_moves(fan, {"a": "succeeded", "b": "waiting", "c": "queued"}).run_state == "running"


def test_a_step_sees_its_ancestors_outputs_and_what_became_of_the_others(fan: d.Workflow) -> None:
    states = {"a": "succeeded", "b": "failed", "c": "skipped"}
    seen = decide.parent_outputs(fan, "d", {"a": {"x": 1}, "b": "boom"}, states)
    assert seen == {"a": {"x": 1}, "b": {"failed": True, "error": "boom"}, "c": {"skipped": True}}
    assert decide.merged_state({"a": 1, "b": {"x": 1}}, {"b": 2, "c": 3}) == {"a": 1, "b": 2, "c": 3}
