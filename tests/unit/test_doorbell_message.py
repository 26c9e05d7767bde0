"""The doorbell's message: a job id and a contract version, addressed to the runtime's entry, and
nothing RQ would keep or retry on its own (the database is the record)."""

from __future__ import annotations

from django.utils.module_loading import import_string

from workers import doorbell
from workers.runtime import deliver


def test_a_message_names_the_job_and_its_version_only() -> None:
    message = doorbell._message(7, 2)
    assert (message.func, message.args, message.kwargs) == (doorbell.ENTRY, (7, 2), None)
    assert message.description == "koala job 7"
    assert message.meta is None and not message.at_front


def test_rq_keeps_no_result_no_timeout_and_no_retry() -> None:
    message = doorbell._message(7, 2)
    assert message.result_ttl == 0  # the result is the job row, not an RQ result
    assert message.timeout == -1  # Koala's own time limits apply (SIGALRM in the runtime)
    assert message.retry is None  # retries are database state (scheduled_at)
    assert message.failure_ttl == 86400  # a crashed delivery stays inspectable for a day


def test_the_entry_point_is_the_runtimes_deliver() -> None:
    # Queued messages name this dotted path: moving deliver would strand every pending message.
    assert doorbell.ENTRY == "workers.runtime.deliver"
    assert import_string(doorbell.ENTRY) is deliver


def test_a_passed_on_message_goes_first_and_counts_its_hops() -> None:
    message = doorbell._message(9, 3, at_front=True, meta={doorbell.HOPS: 2})
    assert (message.args, message.at_front, message.meta) == ((9, 3), True, {"koala_hops": 2})


def test_outside_a_delivery_no_worker_has_passed_anything_on() -> None:
    assert doorbell.hops() == 0
