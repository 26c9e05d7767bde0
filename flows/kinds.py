"""``flow.start``: a job that starts a run of a workflow definition.

What lets anything that enqueues jobs start runs without importing this app: a schedule whose
kind is ``flow.start`` starts a run of its workflow at every slot (docs/schedules.md), a
``koala_enqueue`` or a job call does it once. Input: ``workflow`` (the definition's name), and
optionally ``version`` (the newest when absent) and ``input`` (the run's input, ``{}`` when absent).

The run is started with the idempotency key ``flow.start:job:<job id>``: an attempt that ran
again after a crash between the run's commit and its own completion finds the run its earlier
attempt started (``created`` False) instead of starting a second one.
"""

from __future__ import annotations

from typing import Any

from flows import services
from flows.errors import FlowError
from workers import JobContext, TerminalFailure, job_kind


def _validate(data: dict[str, Any]) -> None:
    unknown = set(data) - {"workflow", "version", "input"}
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}: flow.start takes workflow, version and input")
    if not isinstance(data.get("input", {}), dict):
        raise ValueError("'input' must be an object (the run's input)")
    version = data.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise ValueError("'version' must be an integer")
    try:
        services.definition_of(data["workflow"], version).check_input(data.get("input", {}))
    except FlowError as exc:  # an unknown workflow or version
        raise ValueError(str(exc)) from None
    # The definition's own check of the run's input raises a ValueError (BadRunInput) saying what is wrong.


@job_kind(
    "flow.start", version=1, queue="default", max_attempts=5, timeout_seconds=60, required_fields={"workflow"}, validate=_validate
)
def start(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    try:
        started = services.start_run(
            definition=data["workflow"],
            version=data.get("version"),
            input=data.get("input", {}),
            idempotency_key=f"flow.start:job:{ctx.job_id}",
            actor=f"job:{ctx.job_id}",
        )
    except FlowError as exc:  # the definition went away (or changed its input) since the job was enqueued
        raise TerminalFailure(str(exc), code="flow_refused") from None
    return {"run_id": started.run.id, "created": started.created}
