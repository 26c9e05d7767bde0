"""Django's Tasks API (``django.tasks``) on Koala: ordinary ``@task`` functions get
durable jobs, leases with fencing, crash recovery and redacted failure records.

    TASKS = {"default": {"BACKEND": "workers.tasks_backend.KoalaTaskBackend"}}

    @task(queue_name="default")
    def send_digest(user_id): ...

    result = send_digest.enqueue(42)   # a Koala job of kind "django.task"
    result.refresh(); result.status    # READY / RUNNING / SUCCESSFUL / FAILED

The job input holds the task's import path and its JSON arguments; raise
``workers.Retryable`` in a task to retry it with backoff.
"""

from __future__ import annotations

import builtins
import inspect
from typing import Any

from django.tasks import Task
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.json import normalize_json
from django.utils.module_loading import import_string
from django.utils.timezone import now

from workers import JobContext, job_kind
from workers.models import Job, JobState, Outcome

KIND = "django.task"

_STATUS = {
    JobState.QUEUED: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


class KoalaTaskBackend(BaseTaskBackend):
    supports_defer = True
    supports_get_result = True
    supports_priority = True

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        check_arguments(task, args, kwargs)
        delay = max((task.run_after - now()).total_seconds(), 0.0) if task.run_after else 0.0
        created = run_django_task.enqueue(
            {"task": task.module_path, "args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))},
            queue=task.queue_name,
            priority=task.priority,
            delay_seconds=delay,
        )
        return self.get_result(str(created.job_id))

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job = Job.objects.get(pk=int(result_id), kind=KIND)
        except (ValueError, Job.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        task = import_string(job.input["task"])
        attempts = [a for a in job.attempt_set.all() if a.outcome not in (Outcome.UNSERVABLE, Outcome.INTERRUPTED)]
        errors = [
            TaskError(exception_class_path=_exception_path(a.error_class), traceback=a.error_message)
            for a in attempts
            if a.outcome in (Outcome.FAILED, Outcome.RETRY)
        ]
        result: TaskResult = TaskResult(
            task=task,
            id=str(job.pk),
            status=_STATUS[JobState(job.state)],
            enqueued_at=job.created_at,
            started_at=attempts[0].started_at if attempts else None,
            last_attempted_at=attempts[-1].started_at if attempts else None,
            finished_at=job.finished_at,
            args=job.input["args"],
            kwargs=job.input["kwargs"],
            backend=self.alias,
            errors=errors,
            worker_ids=[a.worker_id for a in attempts],
        )
        if job.state == JobState.SUCCEEDED:
            object.__setattr__(result, "_return_value", job.result)
        return result


def check_arguments(task: Task, args: Any, kwargs: Any) -> None:
    """Refuse, at enqueue, arguments the task's function could not be called with.

    Otherwise the job would be stored and fail only when a worker calls the function, possibly
    hours later and far from the caller's mistake. A context-taking task gets its context first.
    """
    signature = inspect.signature(task.func)
    context = (None,) if task.takes_context else ()
    try:
        signature.bind(*context, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{task.module_path}{signature} cannot take these arguments: {exc}; nothing was enqueued.") from None


def _exception_path(error_class: str) -> str:
    # Koala stores the class name (and a code for typed failures), never a traceback.
    name = error_class.split(":", 1)[0]
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    if name in {"Retryable", "RetryableError", "TerminalFailure", "StepFailure", "AttemptTimeout"}:
        return f"workers.errors.{name}"
    return "builtins.Exception"


@job_kind(KIND, version=1, queue="default", max_attempts=3)
def run_django_task(ctx: JobContext, data: dict[str, Any]) -> Any:
    task = import_string(data["task"])
    if task.takes_context:
        context: TaskContext = TaskContext(task_result=task.get_backend().get_result(str(ctx.job_id)))
        return normalize_json(task.call(context, *data["args"], **data["kwargs"]))
    return normalize_json(task.call(*data["args"], **data["kwargs"]))
