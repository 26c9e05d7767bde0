"""The names people give Koala: queues, job kinds, and the scopes pauses and budgets cover.

One rule for every way in (commands, console, admin, code), kept by the enqueue, pause and
budget services and used by the commands to refuse bad arguments before doing anything:

- a **queue** is known when it is configured (``KOALA_QUEUES``, i.e. ``settings.RQ_QUEUES``):
  no worker listens on any other, so a job there would wait for ever;
- a **kind** is known for *enqueueing* when this process registers it (``workers.kinds``), and
  for *pausing, budgeting and listing* also when jobs of it exist: a kind another deployment
  registers (or one retired with jobs left) is real, and an operator may need to hold it;
- a **tenant** is whatever a job's input names under ``"tenant"`` (Koala keeps no list of
  them): a pause or a budget for one holds that tenant's jobs only, empty means every tenant.
  The name must be one a job can carry and a row can store, as written (no spaces around it:
  " acme" would never match a job of acme).

A name Koala does not know is refused with ``UnknownName`` (an ``EnqueueError`` and a
``SafetyError``), naming what is known.
"""

from __future__ import annotations

from django.conf import settings

from koala.storable import column_length, text_problem
from workers import kinds
from workers.errors import SafetyError, UnknownName
from workers.models import Job, Pause, Scope

KIND_MAX_LENGTH = column_length(Job, "kind")
TENANT_MAX_LENGTH = column_length(Pause, "tenant")


def configured_queues() -> list[str]:
    return list(settings.RQ_QUEUES)


def check_queue(name: str) -> str:
    queues = configured_queues()
    if name not in queues:
        raise UnknownName("queue", name, queues)
    return name


def registered_kinds() -> list[str]:
    return sorted({kind.name for kind in kinds.served()})


def check_kind(name: str, *, with_jobs: bool = True) -> str:
    """``name`` if this process registers it (or, ``with_jobs``, any job of it exists)."""
    registered = registered_kinds()
    if name in registered:
        return name
    # One index probe (job_kind_state_list_idx leads with kind). A name longer than the column,
    # or text PostgreSQL cannot store, matches no job: it is not sent to be compared.
    storable = len(name) <= KIND_MAX_LENGTH and text_problem(name) is None
    if with_jobs and storable and Job.objects.filter(kind=name).exists():
        return name
    raise UnknownName("kind", name, registered)


def check_scope(scope: str, target: str) -> None:
    """A pause's or budget's scope and target: global takes none, queue and kind a known name."""
    if scope not in Scope.values:
        raise UnknownName("scope", scope, list(Scope.values))
    if scope == Scope.GLOBAL:
        if target:
            raise SafetyError("a global scope takes no target.")
        return
    if not target:
        raise SafetyError(f"a {scope} scope needs a target ({scope} name).")
    if scope == Scope.QUEUE:
        check_queue(target)
    else:
        check_kind(target)


def check_tenant(name: str) -> str:
    """A pause's or budget's tenant: empty (every tenant) or a name a job's input can carry."""
    if not isinstance(name, str):
        raise SafetyError(f"a tenant is a name, not {type(name).__name__}.")
    if not name:
        return name
    if name != name.strip():
        raise SafetyError(f"tenant {name[:40]!r} has spaces around it (no job's tenant has): write it with no spaces around.")
    if len(name) > TENANT_MAX_LENGTH:
        raise SafetyError(f"a tenant is at most {TENANT_MAX_LENGTH} characters (got {len(name)}).")
    if problem := text_problem(name):
        raise SafetyError(f"tenant {problem}.")
    return name
