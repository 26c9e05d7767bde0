"""A workflow's step bodies on the worker's side: ``Workflow(name, version)`` and ``@wf.step(name)``.

The definition itself (its steps, their order and policies, waits) lives on the server
(``workers.workflow`` with ``remote_step``); a worker holds bodies for the steps it serves and
registers them as ``{"name": <workflow>, "version": …, "steps": [...]}``. Each step's body is
``body(ctx, input)``: ``ctx.step``, ``ctx.steps`` (earlier steps' outputs by name), ``ctx.state``
(the run's state as the step became due), ``ctx.run``; ``ctx.set_state(**delta)`` is merged into
the run's state on completion (top-level keys replaced); the return value is the step's output.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Body = Callable[[Any, Any], Any]
_NAME = re.compile(r"[a-z0-9_-]{1,60}")


class Workflow:
    """``support = Workflow("support_ticket", version=1)``; ``@support.step("draft")`` per step served."""

    def __init__(self, name: str, version: int = 1) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"a workflow's name is 1 to 60 of a-z, 0-9, _ and -, not {name!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version must be a whole number from 1, not {version!r}")
        self.name = name
        self.version = version
        self.bodies: dict[str, Body] = {}

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def __repr__(self) -> str:
        return f"<Workflow {self.key}: {', '.join(self.bodies)}>"

    def step(self, name: str, body: Body | None = None) -> Any:
        """``@wf.step("draft")`` decorates the body of step ``draft``; ``wf.step("draft", fn)``
        adds it and returns the workflow, for chaining."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"a step's name is 1 to 60 of a-z, 0-9, _ and -, not {name!r}")
        if name in self.bodies:
            raise ValueError(f"{self.key}: step {name!r} has a body already")
        if body is None:

            def decorator(fn: Body) -> Body:
                self.step(name, fn)
                return fn

            return decorator
        self.bodies[name] = body
        return self

    def body_for(self, kind: str, step: str | None) -> Body | None:
        """The body of a lease's step (its kind is ``<workflow>.<step>``), or None."""
        if step is None or kind != f"{self.name}.{step}":
            return None
        return self.bodies.get(step)

    def payload(self) -> dict[str, Any]:
        """What register sends for it."""
        return {"name": self.name, "version": self.version, "steps": list(self.bodies)}
