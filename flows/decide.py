"""What a run does next, decided as a pure value from its definition and its steps' states.

The services (flows.services) persist the decision with conditional UPDATEs: a step becomes due
only by ``pending -> queued|waiting`` on its own row, so however often this is decided (a parent's
completion repeated, two hooks in a row), each step is started at most once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.definitions import OnParentFailure, Workflow

PENDING, QUEUED, PARKED, WAITING = "pending", "queued", "parked", "waiting"
SUCCEEDED, FAILED, SKIPPED, CANCELLED = "succeeded", "failed", "skipped", "cancelled"
DONE = frozenset({SUCCEEDED, FAILED, SKIPPED, CANCELLED})


@dataclass(frozen=True)
class Next:
    """The run's next moves: steps to start (in definition order), steps to skip, and the run's
    state after them (``running``, ``waiting``, ``succeeded`` or ``failed``; ``failed_by`` the step
    whose failure failed it)."""

    due: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    run_state: str = "running"
    failed_by: str = ""


def next_moves(definition: Workflow, states: Mapping[str, str]) -> Next:
    """Decide from ``states`` ({step: state}); steps the definition has and ``states`` lacks are pending."""
    now = {name: states.get(name, PENDING) for name in definition.steps}
    # A failure fails the run when an edge out of it says so, or when nothing follows it (a
    # failed leaf is the run's failure).
    for name, state in now.items():
        if state not in (FAILED, CANCELLED):
            continue
        dependants = definition.dependants(name)
        if not dependants or any(d.policy_for(name) == OnParentFailure.FAIL for d in dependants):
            return Next(run_state="failed", failed_by=name)
    due: list[str] = []
    skip: list[str] = []
    for name, step in definition.steps.items():  # declaration order is a topological order
        if now[name] != PENDING:
            continue
        parents = step.parents
        if any(now[p] not in DONE for p in parents):
            continue
        skipped = False
        for parent, policy in step.after:
            parent_state = now[parent]
            if parent_state == SUCCEEDED or policy == OnParentFailure.CONTINUE:
                continue
            skipped = True  # a failed parent under "skip" (a "fail" edge failed the run above), or a skipped one
        if skipped:
            now[name] = SKIPPED
            skip.append(name)
        else:
            due.append(name)
    if due or any(state in (QUEUED,) for state in now.values()):
        return Next(due=due, skip=skip, run_state="running")
    if any(state in (WAITING, PARKED) for state in now.values()):
        return Next(skip=skip, run_state="waiting")
    if all(state in DONE for state in now.values()):
        return Next(skip=skip, run_state="succeeded")
    return Next(skip=skip, run_state="running")  # not reached for a DAG: something is always due or done


def parent_outputs(definition: Workflow, name: str, outputs: Mapping[str, Any], states: Mapping[str, str]) -> dict[str, Any]:
    """What step ``name`` sees as ``ctx.steps``: each earlier step's output, or what became of it."""
    seen: dict[str, Any] = {}
    ancestors = _ancestors(definition, name)
    for parent in definition.steps:
        if parent not in ancestors:
            continue
        state = states.get(parent, PENDING)
        if state == SUCCEEDED:
            seen[parent] = outputs.get(parent)
        elif state == SKIPPED:
            seen[parent] = {"skipped": True}
        elif state in (FAILED, CANCELLED):
            seen[parent] = {"failed": True, **({"error": outputs[parent]} if outputs.get(parent) else {})}
    return seen


def _ancestors(definition: Workflow, name: str) -> set[str]:
    found: set[str] = set()
    todo = list(definition.steps[name].parents)
    while todo:
        parent = todo.pop()
        if parent not in found:
            found.add(parent)
            todo.extend(definition.steps[parent].parents)
    return found


def merged_state(state: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    """A step's delta merged into the run's state: its top-level keys replace the run's."""
    return {**state, **delta}
