"""Workflows declared in code (``from workers import workflow``): a named, versioned graph of steps.

    from workers import workflow

    support = workflow("support_ticket", version=1, required_fields={"ticket"})

    @support.step("classify", max_attempts=3, timeout_seconds=60)
    def classify(ctx, data):                  # data: the run's input
        ctx.set_state(priority="high")         # top-level keys merged into the run's state
        return {"label": "billing"}            # the step's output: later steps' ctx.steps["classify"]

    support.remote_step("draft", after=["classify"])                  # served by HTTP workers
    support.wait("approval", event="reviewer.approved", after=["draft"], timeout_seconds=3600, on_timeout="continue")

    @support.step("send", after=["approval"])
    def send(ctx, data):
        approval = ctx.steps["approval"]       # the signal's payload, or {"timed_out": True}
        ...

A step is a job kind ``<workflow>.<step>`` at the definition's version, with its own policy (the
``job_kind`` policy: ``max_attempts``, ``timeout_seconds``, ``delivery``, ``critical`` …), so each of
its attempts is an ordinary Koala attempt: the same lease, fence, ledger, budgets, pauses and review
gate. Its body gets the context of any kind plus ``ctx.step`` (its name), ``ctx.steps`` (the outputs
of the steps before it, by name), ``ctx.run_id`` and ``ctx.run_state`` (the run's state as the step
became due). **One way to change the state: ``ctx.set_state(key=value)``**; the return value is the
step's output, nothing else.

Dependencies are ``after=``: a sequence, a fan-out (several steps after one) and a fan-in (one step
after several). A list applies ``on_parent_failure`` to every edge; a mapping names a policy per
edge (``after={"a": "skip", "b": "fail"}``): ``fail`` (the default) fails the run when that parent
fails, ``skip`` skips the dependant (and, unless they ``continue``, its own dependants), ``continue``
runs it anyway (``ctx.steps[parent]`` is then ``{"failed": True, …}`` or ``{"skipped": True}``).

A step may only follow steps declared before it, so a definition is acyclic by construction;
``check_graph`` validates any graph given as a mapping (unknown names, cycles, duplicates, size).
The limits are published here and enforced with named errors: ``MAX_STEPS`` per definition,
``MAX_RUN_STATE_BYTES`` (the run's state, as JSON), ``MAX_SIGNAL_PAYLOAD_BYTES``,
``MAX_PENDING_SIGNALS`` (buffered signals of one run). Runs themselves live in the ``flows`` app.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Unpack

from workers import kinds
from workers.handles import KindHandle
from workers.kinds import Body, InputValidator, KindPolicy

MAX_STEPS = 50
MAX_RUN_STATE_BYTES = 65_536
MAX_SIGNAL_PAYLOAD_BYTES = 16_384
MAX_PENDING_SIGNALS = 100
MAX_RUN_INPUT_BYTES = 16_384

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-")


class OnParentFailure(StrEnum):
    FAIL = "fail"  # the run fails when this parent fails
    SKIP = "skip"  # the dependant is skipped
    CONTINUE = "continue"  # the dependant runs, seeing the parent's failure or skip


class OnTimeout(StrEnum):
    FAIL = "fail"  # the wait fails (and, under its dependants' policies, the run)
    SKIP = "skip"  # the wait is skipped: its dependants follow their skip policies
    CONTINUE = "continue"  # the wait resolves to {"timed_out": True}, which the next step sees


class DefinitionError(ValueError):
    """A workflow declared wrongly: raised at import, where the definition is."""

    code = "bad_definition"


class UnknownStep(DefinitionError):
    code = "unknown_step"


class DuplicateStep(DefinitionError):
    code = "duplicate_step"


class CycleInDefinition(DefinitionError):
    code = "cycle"


class TooManySteps(DefinitionError):
    code = "too_many_steps"


class DuplicateDefinition(DefinitionError):
    code = "duplicate_definition"


@dataclass(frozen=True)
class Wait:
    """A wait step: resolved by a signal named ``event`` (or by its timeout), never by a worker."""

    event: str
    timeout_seconds: float | None
    on_timeout: OnTimeout


@dataclass(frozen=True)
class Step:
    """One step of a definition: a kind's step (``kind`` set) or a wait (``wait`` set)."""

    name: str
    after: tuple[tuple[str, OnParentFailure], ...]
    kind: str = ""  # "<workflow>.<step>"; "" for a wait
    remote: bool = False
    wait: Wait | None = None

    @property
    def parents(self) -> tuple[str, ...]:
        return tuple(parent for parent, _ in self.after)

    def policy_for(self, parent: str) -> OnParentFailure:
        return dict(self.after)[parent]


@dataclass
class Workflow:
    """A named, versioned definition: its steps in declaration order (a topological order)."""

    name: str
    version: int
    required_fields: frozenset[str] = frozenset()
    validate: InputValidator | None = None
    max_input_bytes: int = MAX_RUN_INPUT_BYTES
    steps: dict[str, Step] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def __repr__(self) -> str:
        return f"<Workflow {self.key}: {', '.join(self.steps)}>"

    # -- declaring ---------------------------------------------------------------------------------------

    def step(
        self,
        name: str,
        *,
        after: Sequence[str] | Mapping[str, str] = (),
        on_parent_failure: str = OnParentFailure.FAIL,
        **policy: Unpack[KindPolicy],
    ) -> Callable[[Body], KindHandle]:
        """Declare step ``name`` whose body is the decorated function (a kind ``<workflow>.<name>``)."""
        edges = self._edges(name, after, on_parent_failure)

        def decorate(body: Body) -> KindHandle:
            handle = KindHandle(kinds.declare(f"{self.name}.{name}", self.version, body, policy))
            self._add(Step(name=name, after=edges, kind=handle.name))
            return handle

        return decorate

    def remote_step(
        self,
        name: str,
        *,
        after: Sequence[str] | Mapping[str, str] = (),
        on_parent_failure: str = OnParentFailure.FAIL,
        **policy: Unpack[KindPolicy],
    ) -> KindHandle:
        """Declare step ``name`` served by HTTP workers (``remote_kind``): its contract, no body here."""
        edges = self._edges(name, after, on_parent_failure)
        handle = KindHandle(kinds.declare_remote(f"{self.name}.{name}", self.version, policy))
        self._add(Step(name=name, after=edges, kind=handle.name, remote=True))
        return handle

    def wait(
        self,
        name: str,
        *,
        event: str,
        after: Sequence[str] | Mapping[str, str] = (),
        timeout_seconds: float | None = None,
        on_timeout: str = OnTimeout.CONTINUE,
        on_parent_failure: str = OnParentFailure.FAIL,
    ) -> Step:
        """Declare a wait for the signal ``event``: its output is the signal's payload, or
        ``{"timed_out": True}`` after ``timeout_seconds`` (``on_timeout="continue"``)."""
        edges = self._edges(name, after, on_parent_failure)
        if not isinstance(event, str) or not 0 < len(event) <= 100:
            raise DefinitionError(f"{self.key}: wait {name!r} needs an event name of 1 to 100 characters")
        if timeout_seconds is not None and not (isinstance(timeout_seconds, int | float) and timeout_seconds > 0):
            raise DefinitionError(f"{self.key}: wait {name!r}: timeout_seconds must be a positive number of seconds")
        try:
            policy = OnTimeout(on_timeout)
        except ValueError:
            raise DefinitionError(
                f"{self.key}: wait {name!r}: on_timeout must be one of {', '.join(OnTimeout)}, not {on_timeout!r}"
            ) from None
        step = Step(name=name, after=edges, wait=Wait(event=event, timeout_seconds=timeout_seconds, on_timeout=policy))
        self._add(step)
        return step

    def _edges(
        self, name: str, after: Sequence[str] | Mapping[str, str], default: str
    ) -> tuple[tuple[str, OnParentFailure], ...]:
        if not isinstance(name, str) or not 0 < len(name) <= 60 or not set(name) <= _NAME_CHARS:
            raise DefinitionError(f"{self.key}: a step's name is 1 to 60 of a-z, 0-9, _ and -, not {name!r}")
        if name in self.steps:
            raise DuplicateStep(f"{self.key}: step {name!r} is declared twice")
        if len(self.steps) >= MAX_STEPS:
            raise TooManySteps(f"{self.key}: a definition has at most {MAX_STEPS} steps (MAX_STEPS)")
        if isinstance(after, str):
            after = [after]
        pairs = list(after.items()) if isinstance(after, Mapping) else [(parent, default) for parent in after]
        edges: list[tuple[str, OnParentFailure]] = []
        for parent, policy in pairs:
            if parent not in self.steps:
                raise UnknownStep(
                    f"{self.key}: step {name!r} follows {parent!r}, which is not a step declared before it "
                    f"(declared: {', '.join(self.steps) or 'none'}); a step follows only earlier ones, so no cycle can form"
                )
            try:
                edges.append((parent, OnParentFailure(policy)))
            except ValueError:
                raise DefinitionError(
                    f"{self.key}: step {name!r}: the policy for {parent!r} is one of {', '.join(OnParentFailure)}, not {policy!r}"
                ) from None
        if len({parent for parent, _ in edges}) != len(edges):
            raise DuplicateStep(f"{self.key}: step {name!r} names a parent twice in after=")
        return tuple(edges)

    def _add(self, step: Step) -> None:
        self.steps[step.name] = step
        if step.kind:
            _step_kinds.add(step.kind)

    # -- reading ---------------------------------------------------------------------------------------------

    def roots(self) -> list[Step]:
        return [step for step in self.steps.values() if not step.after]

    def dependants(self, name: str) -> list[Step]:
        return [step for step in self.steps.values() if name in step.parents]

    def kind_keys(self) -> list[str]:
        """The "kind@version" pairs a worker must serve to run this definition's steps."""
        return [f"{step.kind}@{self.version}" for step in self.steps.values() if step.kind]

    def check_input(self, data: Any) -> None:
        """Raise BadRunInput (a ValueError) saying what is wrong with a run's input."""
        if not isinstance(data, dict):
            raise BadRunInput(f"the input of {self.key} must be a JSON object, not {type(data).__name__}")
        missing = sorted(self.required_fields - data.keys())
        if missing:
            raise BadRunInput(f"the input of {self.key} is missing required field(s): {', '.join(missing)}")
        try:
            size = json_size(data)
        except (TypeError, ValueError) as exc:
            raise BadRunInput(f"the input of {self.key} is not storable JSON: {exc}") from None
        if size > self.max_input_bytes:
            raise BadRunInput(f"the input of {self.key} is {size:,} bytes of JSON; the limit is {self.max_input_bytes:,}")
        if self.validate is not None:
            try:
                self.validate(data)
            except (TypeError, ValueError) as exc:
                raise BadRunInput(f"the input of {self.key} is invalid: {exc}") from None


class BadRunInput(ValueError):
    code = "bad_input"


def json_size(value: Any) -> int:
    """The size of ``value`` as compact JSON in UTF-8 bytes (how every limit here is measured)."""
    return len(json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode())


def check_graph(steps: Mapping[str, Iterable[str]], *, limit: int = MAX_STEPS) -> list[str]:
    """A graph given as {step: parents}, checked: its steps in a topological order, or UnknownStep,
    CycleInDefinition, DuplicateStep or TooManySteps saying what is wrong."""
    if len(steps) > limit:
        raise TooManySteps(f"{len(steps)} steps; a definition has at most {limit} (MAX_STEPS)")
    graph = {name: list(parents) for name, parents in steps.items()}
    for name, parents in graph.items():
        if len(set(parents)) != len(parents):
            raise DuplicateStep(f"step {name!r} names a parent twice")
        for parent in parents:
            if parent not in graph:
                raise UnknownStep(f"step {name!r} follows {parent!r}, which is not a step of the definition")
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            raise CycleInDefinition(f"the steps form a cycle: {' -> '.join(cycle)}")
        state[name] = 1
        for parent in graph[name]:
            visit(parent, [*path, name])
        state[name] = 2
        order.append(name)

    for name in graph:
        visit(name, [])
    return order


# -- the registry -------------------------------------------------------------------------------------------

_definitions: dict[tuple[str, int], Workflow] = {}
_step_kinds: set[str] = set()


def workflow(
    name: str,
    *,
    version: int = 1,
    required_fields: Collection[str] = (),
    validate: InputValidator | None = None,
    max_input_bytes: int = MAX_RUN_INPUT_BYTES,
) -> Workflow:
    """Declare the definition ``name@version`` (then its steps, on the object returned)."""
    if not isinstance(name, str) or not 0 < len(name) <= 60 or not set(name) <= _NAME_CHARS:
        raise DefinitionError(f"a workflow's name is 1 to 60 of a-z, 0-9, _ and -, not {name!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DefinitionError(f"{name}: version must be a whole number from 1, not {version!r}")
    if (name, version) in _definitions:
        raise DuplicateDefinition(f"workflow {name}@{version} is declared twice")
    definition = Workflow(
        name=name,
        version=version,
        required_fields=frozenset(required_fields),
        validate=validate,
        max_input_bytes=max_input_bytes,
    )
    _definitions[(name, version)] = definition
    return definition


def get(name: str, version: int) -> Workflow | None:
    return _definitions.get((name, version))


def versions(name: str) -> list[int]:
    return sorted(v for n, v in _definitions if n == name)


def definitions() -> list[Workflow]:
    return sorted(_definitions.values(), key=lambda d: (d.name, d.version))


def is_step_kind(kind: str) -> bool:
    """Whether ``kind`` is some definition's step (the on-transition hook's test, per change)."""
    return kind in _step_kinds


def step_kinds() -> frozenset[str]:
    """Every step's kind name (the on-transition hook's cheap test of "is this a step's job?")."""
    return frozenset(_step_kinds)


def forget(name: str, version: int) -> None:
    """Drop a definition and its steps' kinds (tests that declare throwaway definitions)."""
    definition = _definitions.pop((name, version), None)
    if definition is not None:
        for step in definition.steps.values():
            if step.kind:
                kinds.unregister(step.kind, version)
        _step_kinds.clear()
        _step_kinds.update(s.kind for d in _definitions.values() for s in d.steps.values() if s.kind)
