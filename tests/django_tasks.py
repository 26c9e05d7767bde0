"""Plain django.tasks functions, run through Koala's Tasks backend in the tests."""

from django.tasks import task

from workers import Retryable


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(priority=10, queue_name="critical")
def explode(reason: str) -> None:
    raise RuntimeError(f"task failed: {reason}")


@task(takes_context=True)
def which_attempt(context, marker: str) -> dict:  # type: ignore[no-untyped-def]
    if context.attempt < 2:
        raise Retryable("first try fails")
    return {"attempt": context.attempt, "marker": marker}
