"""The job-kind registry: a kind is a Python body plus its policy.

A kind's author declares one through the public root (``from workers import job_kind``,
workers/__init__.py), whose handle (workers.handles) registers it here:

    @job_kind("send_welcome", version=1, queue="default", max_attempts=5)
    def send_welcome(ctx, input): ...

A worker serves exactly the (name, version) pairs registered in its process. A
job whose pair is missing is ``unservable`` there (R17): it goes back to the
queue for a worker that has it, without running the body or using an attempt.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import random
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings

from koala.redaction import Redactor
from workers import bounds
from workers.errors import EnqueueError, UnknownName
from workers.models import Delivery

if TYPE_CHECKING:
    from workers.context import JobContext
    from workers.models import Job

Body = Callable[["JobContext", dict[str, Any]], Any]
InputValidator = Callable[[dict[str, Any]], None]
# The most a job's input may hold unless its kind declares otherwise: UTF-8 bytes of its JSON
# (compact, no \u escapes, so a CJK character counts 3). Messages describe the work; customer data
# stays in the database. A kind whose input is one document (a prompt) declares its own limit.
MAX_INPUT_BYTES = 16_384
# When an operation is critical (needs a reviewer's approval): "always", {"above_minor": N},
# or a callable taking the operation's parameters (and amount) and returning a bool.
CriticalRule = str | Mapping[str, Any] | Callable[[dict[str, Any], "int | None"], bool]


@dataclass(frozen=True)
class JobKind:
    name: str
    version: int
    body: Body
    queue: str = "default"
    delivery: str = Delivery.AT_LEAST_ONCE
    max_attempts: int = 5
    timeout_seconds: float = 300.0
    deadline_seconds: float | None = None  # overall, from enqueue; None = no deadline
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    # Input fields whose values are secrets, short (a token, an account number) or long (a
    # prompt, a document): masked under their key, and wherever else they or any fragment of
    # them of koala.redaction.FRAGMENT_WINDOW characters turn up (docs/redaction.md).
    sensitive_fields: frozenset[str] = field(default_factory=frozenset)
    required_fields: frozenset[str] = field(default_factory=frozenset)
    validate: InputValidator | None = None
    # The most its input may hold, in UTF-8 bytes of JSON (workers.services.jobs measures it): a
    # kind that advertises a bigger field (a prompt of N characters) derives this from it.
    max_input_bytes: int = MAX_INPUT_BYTES
    critical: Mapping[str, CriticalRule] = field(default_factory=dict)  # operation name -> rule
    # Non-empty: an operator's retry of a finished job is refused with this advice (the kind has
    # its own way to try again, e.g. an export is requested anew).
    retry_instead: str = ""
    # Served by workers over HTTP (docs/worker-api.md): the server holds the contract (queue,
    # delivery, retries, time limits, sensitive fields, critical operations); the body lives in
    # the worker. An RQ worker never claims such a kind (``runnable``).
    remote: bool = False
    # Per-attempt ceilings (workers.bounds; enforced by the fork worker's work horse): MiB of memory
    # above what the horse holds when the attempt starts, and CPU seconds. None: the settings'
    # defaults (KOALA_ATTEMPT_MEMORY_LIMIT_MB, KOALA_ATTEMPT_CPU_LIMIT_SECONDS); 0: no ceiling.
    memory_limit_mb: int | None = None
    cpu_limit_seconds: int | None = None

    def is_critical(self, operation: str, params: dict[str, Any], amount_minor: int | None) -> bool:
        rule = self.critical.get(operation)
        if rule is None:
            return False
        if rule == "always":
            return True
        if isinstance(rule, Mapping):
            threshold = rule.get("above_minor")
            return amount_minor is not None and threshold is not None and amount_minor > int(threshold)
        if callable(rule):
            return bool(rule(params, amount_minor))
        raise ValueError(f"{self.key}: critical rule for {operation!r} must be 'always', {{'above_minor': N}} or a callable")

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def contract_digest(self) -> str:
        """A digest of the contract a host serves this kind@version under: its policy (queue,
        delivery, retries, time limits, input fields, size, critical operations, ceilings) and the
        names of its validator and critical rules' callables. Two hosts that loaded different kind
        modules for one kind@version show different digests (``contracts_of``; the worker page)."""

        def named(value: Any) -> Any:
            if callable(value):
                return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
            if isinstance(value, Mapping):
                return {str(k): named(v) for k, v in sorted(value.items(), key=lambda item: str(item[0]))}
            if isinstance(value, frozenset | set):
                return sorted(value)
            return value

        facts = {
            "queue": self.queue,
            "delivery": str(self.delivery),
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
            "deadline_seconds": self.deadline_seconds,
            "backoff": [self.backoff_base, self.backoff_cap],
            "sensitive_fields": named(self.sensitive_fields),
            "required_fields": named(self.required_fields),
            "validate": named(self.validate),
            "max_input_bytes": self.max_input_bytes,
            "critical": named(self.critical),
            "retry_instead": self.retry_instead,
            "remote": self.remote,
            "limits": [self.memory_limit_mb, self.cpu_limit_seconds],
        }
        text = json.dumps(facts, sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def redactor(self, data: Any) -> Redactor:
        """The redaction context of a job of this kind with input ``data``."""
        return Redactor.of(data, sensitive=self.sensitive_fields)

    def backoff_seconds(self, attempts_used: int, *, rng: random.Random | None = None) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**n)], n = attempts used so far - 1."""
        exponent = max(attempts_used - 1, 0)
        ceiling = min(self.backoff_cap, self.backoff_base * (2 ** min(exponent, 62)))
        return (rng or random).uniform(0, ceiling)

    def check_input(self, data: Any) -> None:
        if not isinstance(data, Mapping):
            raise EnqueueError(f"input for {self.key} must be a JSON object, not {type(data).__name__}.")
        missing = sorted(self.required_fields - set(data))
        if missing:
            raise EnqueueError(f"input for {self.key} is missing required field(s): {', '.join(missing)}.")
        if self.validate is not None:
            try:
                self.validate(dict(data))
            except (ValueError, TypeError) as exc:
                raise EnqueueError(f"input for {self.key} is invalid: {exc}") from None


_registry: dict[tuple[str, int], JobKind] = {}


def register(kind: JobKind) -> JobKind:
    if kind.delivery not in Delivery.values:
        raise ValueError(f"{kind.key}: delivery must be one of {Delivery.values}")
    if kind.max_attempts < 1:
        raise ValueError(f"{kind.key}: max_attempts must be at least 1")
    if isinstance(kind.max_input_bytes, bool) or not isinstance(kind.max_input_bytes, int) or kind.max_input_bytes < 2:
        raise ValueError(f"{kind.key}: max_input_bytes must be a whole number of bytes, at least 2 (the empty input, {{}})")
    for name in ("memory_limit_mb", "cpu_limit_seconds"):
        bounds.check_limit(kind.key, name, getattr(kind, name))
    for operation, rule in kind.critical.items():
        valid = rule == "always" or callable(rule) or (isinstance(rule, Mapping) and set(rule) == {"above_minor"})
        if not valid:
            raise ValueError(f"{kind.key}: critical rule for {operation!r} must be 'always', {{'above_minor': N}} or a callable")
    if kind.delivery == Delivery.AT_MOST_ONCE and kind.max_attempts != 1:
        # A retry is a second delivery; at-most-once cannot have one.
        raise ValueError(f"{kind.key}: at_most_once kinds must have max_attempts=1")
    existing = _registry.get((kind.name, kind.version))
    if existing is not None and existing.body is not kind.body:
        raise ValueError(f"{kind.key} is registered twice with different bodies")
    _registry[(kind.name, kind.version)] = kind
    return kind


class KindPolicy(TypedDict, total=False):
    """The policy a kind is declared with (``job_kind(name, version=…, **policy)``): JobKind's
    fields, each optional, the two field sets as any collection of names."""

    queue: str
    delivery: str
    max_attempts: int
    timeout_seconds: float
    deadline_seconds: float | None
    backoff_base: float
    backoff_cap: float
    sensitive_fields: Collection[str]
    required_fields: Collection[str]
    validate: InputValidator | None
    max_input_bytes: int
    critical: Mapping[str, CriticalRule]
    retry_instead: str
    memory_limit_mb: int | None
    cpu_limit_seconds: int | None


def _policy(policy: KindPolicy) -> dict[str, Any]:
    frozen: dict[str, Any] = dict(policy)
    for key in ("sensitive_fields", "required_fields"):
        if key in frozen:
            frozen[key] = frozenset(frozen[key])
    return frozen


def declare(name: str, version: int, body: Body, policy: KindPolicy) -> JobKind:
    """Register the kind ``name@version`` with its body and policy (what ``@job_kind`` does)."""
    return register(JobKind(name=name, version=version, body=body, **_policy(policy)))


def _remote_body(ctx: JobContext, data: dict[str, Any]) -> Any:
    raise RuntimeError("this kind's body runs in HTTP workers (remote_kind); it has no body here")


def declare_remote(name: str, version: int, policy: KindPolicy) -> JobKind:
    """Register a kind whose bodies run in workers over HTTP: its contract, without a body here.
    Declaring the same remote kind again (its module imported twice) returns the first."""
    existing = _registry.get((name, version))
    if existing is not None and existing.remote:
        return existing  # the same declaration imported twice
    return register(JobKind(name=name, version=version, body=_remote_body, remote=True, **_policy(policy)))


# -- the spellings before the public root, deprecated ------------------------------------------
# ``from workers.kinds import job_kind`` (and ``remote_kind``) still work, for one release, and
# warn once per import: the engine never imports them (its own kinds use the root), so the
# warning reaches only a kind module that has not moved yet. They keep their old results: the
# bare body, and the JobKind.


def _old_job_kind(name: str, *, version: int = 1, **policy: Any) -> Callable[[Body], Body]:
    def decorate(body: Body) -> Body:
        declare(name, version, body, policy)  # type: ignore[arg-type]  # unchecked, as it always was
        return body

    return decorate


def _old_remote_kind(name: str, *, version: int = 1, **policy: Any) -> JobKind:
    return declare_remote(name, version, policy)  # type: ignore[arg-type]


DEPRECATED = {"job_kind": _old_job_kind, "remote_kind": _old_remote_kind}

if TYPE_CHECKING:
    job_kind = _old_job_kind
    remote_kind = _old_remote_kind
else:

    def __getattr__(name: str) -> Any:
        if name in DEPRECATED:
            warnings.warn(
                f"workers.kinds.{name} is deprecated and goes in the next release: "
                f"use `from workers import {name}` (it returns a handle with .enqueue)",
                DeprecationWarning,
                stacklevel=2,
            )
            return DEPRECATED[name]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unregister(name: str, version: int) -> None:
    """Drop a kind from this process (tests simulating a worker without it)."""
    _registry.pop((name, version), None)


def get(name: str, version: int) -> JobKind | None:
    return _registry.get((name, version))


def latest(name: str) -> JobKind:
    versions = [k for (n, _), k in _registry.items() if n == name]
    if not versions:
        raise UnknownName("kind", name, sorted({n for n, _ in _registry}))
    return max(versions, key=lambda k: k.version)


def job_redactor(job: Job) -> Redactor:
    """The redaction context of a stored job: what every page, command and report about it masks.

    Its kind's declared sensitive fields and their values in its input. A version not served in
    this process borrows the declarations of every version of the kind that is (a field declared
    sensitive once stays so); a kind unknown here has only the always-sensitive keys.
    """
    kind = get(job.kind, job.version)
    if kind is not None:
        return kind.redactor(job.input)
    declared = frozenset(f for (name, _), k in _registry.items() if name == job.kind for f in k.sensitive_fields)
    return Redactor.of(job.input, sensitive=declared)


def served() -> list[JobKind]:
    """Every kind Koala knows (the ones with a body here and the remote ones)."""
    return sorted(_registry.values(), key=lambda k: (k.name, k.version))


def runnable() -> list[JobKind]:
    """The kinds whose bodies run in this process: what an RQ worker serves (never a remote kind)."""
    return [k for k in served() if not k.remote]


def contracts_of(pairs: Collection[str]) -> dict[str, str]:
    """``{"name@version": contract_digest}`` for the pairs this process knows (a worker's row)."""
    found: dict[str, str] = {}
    for pair in pairs:
        name, _, version = pair.rpartition("@")
        kind = _registry.get((name, int(version))) if version.isdigit() else None
        if kind is not None:
            found[pair] = kind.contract_digest
    return found


def load_configured_kinds() -> None:
    for module in settings.KOALA_JOB_KIND_MODULES:
        importlib.import_module(module)
