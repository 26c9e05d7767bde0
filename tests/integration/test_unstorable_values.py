"""Values PostgreSQL cannot store (NaN, Infinity, a NUL character) never wedge an attempt's end.

Before, a body returning one made the end-of-attempt write raise DataError out of the worker's
drain: the job stayed running until the reaper took it, and an at_least_once job ran again, on
worker after worker. Now the decision says so: the job fails ``fatal`` (UnstorableResult) naming
where the value is; usage the body counted keeps its finite numbers; a provider's answer (its
call has happened) is kept with what cannot be stored written out.
"""

from __future__ import annotations

import pytest

from tests.inprocess import drain, run_until
from workers.models import Attempt, Job, JobState, Operation
from workers.services.jobs import enqueue

# transaction=True: claims compare scheduled_at with PostgreSQL's now(), which stands still
# inside one transaction, so a job enqueued in the test's transaction never falls due there.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("what", "where"),
    [
        ("nan_result", "result.score is not a finite number"),
        ("nul_result", "result contains a NUL character"),
        ("infinite_state", "state_delta.ratio is not a finite number"),
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_job_once(what: str, where: str, redis_clean: None) -> None:
    job_id = enqueue(kind="tests.unstorable", input={"what": what}).job_id
    assert drain(job_id=job_id) == 1  # the drain returns: the worker goes on serving
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.failure_reason, job.error_class) == (JobState.FAILED, "fatal", "UnstorableResult")
    assert where in job.error_message
    assert [a.outcome for a in Attempt.objects.filter(job_id=job_id)] == ["failed"]  # not run again


def test_usage_keeps_its_finite_numbers(redis_clean: None) -> None:
    job = run_until(enqueue(kind="tests.unstorable", input={"what": "infinite_usage"}).job_id)
    assert job.state == JobState.SUCCEEDED
    assert job.usage == {"calls": 1}


def test_a_provider_answer_with_unstorable_values_is_kept_written_out(redis_clean: None) -> None:
    job = run_until(enqueue(kind="tests.unstorable", input={"what": "provider_nan"}).job_id)
    assert job.state == JobState.SUCCEEDED
    op = Operation.objects.get(job_id=job.pk)
    assert op.state == "succeeded"
    assert op.result == {"score": "NaN", "note": "a\ufffdb"}
    assert job.result == op.result
