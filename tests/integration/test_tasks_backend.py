"""Django's Tasks API targeting Koala: @task functions become fenced, durable Koala jobs."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

from tests import django_tasks
from tests.inprocess import drain_until
from workers.models import Job
from workers.runtime import get_runtime

# transaction=True: the tasks run through the real runtime, whose claims need committed rows (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


def run_until_finished(result, queue: str = "default"):  # type: ignore[no-untyped-def]
    def finished() -> bool:
        result.refresh()
        return bool(result.is_finished)

    drain_until(finished, queue=queue, timeout=10, what=f"task {result.id} to finish")
    return result


def test_task_enqueues_a_koala_job_and_returns_its_value(redis_clean: None) -> None:
    result = django_tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    job = Job.objects.get(pk=int(result.id))
    assert (job.kind, job.queue, job.input["args"]) == ("django.task", "default", [2, 3])
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and result.worker_ids == [get_runtime().name]


def test_failing_task_is_failed_with_a_redacted_error(redis_clean: None) -> None:
    result = django_tasks.explode.enqueue("password=hunter2hunter2")
    job = Job.objects.get(pk=int(result.id))
    assert (job.queue, job.priority) == ("critical", 10)
    run_until_finished(result, queue="critical")
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is RuntimeError
    assert "hunter2hunter2" not in result.errors[0].traceback


def test_retryable_task_gets_context_and_a_second_attempt(redis_clean: None) -> None:
    result = django_tasks.which_attempt.enqueue(marker="m")
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 2, "marker": "m"}


@pytest.mark.django_db  # reads one missing row: no runtime, nothing to commit
def test_unknown_result_id() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        django_tasks.add.get_backend().get_result("999999")


@pytest.mark.parametrize(
    ("task", "args", "kwargs", "message"),
    [
        (django_tasks.add, (1,), {}, "missing a required argument: 'b'"),
        (django_tasks.add, (1, 2, 3), {}, "too many positional arguments"),
        (django_tasks.add, (1, 2), {"c": 3}, "unexpected keyword argument 'c'"),
        (django_tasks.add, (1,), {"a": 2}, "multiple values for argument 'a'"),
        (django_tasks.which_attempt, (), {}, "missing a required argument: 'marker'"),
        (django_tasks.which_attempt, ("m", "extra"), {}, "too many positional arguments"),
    ],
)
def test_arguments_that_do_not_fit_the_function_are_refused_at_enqueue(task, args, kwargs, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match=message) as refused:
        task.enqueue(*args, **kwargs)
    assert task.module_path in str(refused.value) and "nothing was enqueued" in str(refused.value)
    assert not Job.objects.exists()


def test_arguments_that_fit_are_enqueued(redis_clean: None) -> None:
    assert Job.objects.get(pk=int(django_tasks.add.enqueue(1, b=2).id)).input["kwargs"] == {"b": 2}
    assert Job.objects.get(pk=int(django_tasks.which_attempt.enqueue("m").id)).input["args"] == ["m"]
