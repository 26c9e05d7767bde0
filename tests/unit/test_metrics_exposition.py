"""The metrics endpoint's pure parts: label bounding, the auth decision, a snapshot's families."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metrics import auth, exposition
from metrics.selectors import BudgetLine, Snapshot
from metrics.services import BUCKETS, bounded_reason

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def parsed(snap: Snapshot, **kwargs: object) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """family sample name -> {sorted labels: value}, from the rendered text."""
    text = exposition.render(exposition.families(snap, **kwargs)).decode()  # type: ignore[arg-type]
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("default", "default"),
        ("email.send", "email.send"),
        ("shop.order_and_charge", "shop.order_and_charge"),
        ("daily-eu", "daily-eu"),
        ("", ""),
        ("has space", "other"),
        ('quote"d', "other"),
        ("line\nbreak", "other"),
        ("x" * 101, "other"),
        ("-leading-dash", "other"),
    ],
)
def test_a_label_value_is_a_name_or_other(value: str, expected: str) -> None:
    assert exposition.bounded(value) == expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("lease_expired", "lease_expired"),
        ("api_invalid_request", "api_invalid_request"),
        ("Bad Reason", "other"),
        ("x" * 49, "other"),
    ],
)
def test_a_rejection_reason_is_a_closed_name_or_other(reason: str, expected: str) -> None:
    assert bounded_reason(reason) == expected


@pytest.mark.parametrize(
    ("token", "authorization", "remote", "verdict"),
    [
        ("s3cret", "Bearer s3cret", "203.0.113.9", auth.Verdict.ALLOWED),
        ("s3cret", "bearer s3cret", "203.0.113.9", auth.Verdict.ALLOWED),
        ("s3cret", "Bearer wrong", "127.0.0.1", auth.Verdict.UNAUTHORIZED),  # a token set: loopback is no pass
        ("s3cret", "", "127.0.0.1", auth.Verdict.UNAUTHORIZED),
        ("s3cret", "Basic s3cret", "203.0.113.9", auth.Verdict.UNAUTHORIZED),
        ("s3cret", "Bearer s3cret2", "203.0.113.9", auth.Verdict.UNAUTHORIZED),
        ("", "", "127.0.0.1", auth.Verdict.ALLOWED),
        ("", "", "127.8.9.10", auth.Verdict.ALLOWED),
        ("", "", "::1", auth.Verdict.ALLOWED),
        ("", "", "::ffff:127.0.0.1", auth.Verdict.ALLOWED),
        ("", "", "10.0.0.5", auth.Verdict.FORBIDDEN),
        ("", "", "", auth.Verdict.FORBIDDEN),
        ("", "Bearer anything", "192.0.2.1", auth.Verdict.FORBIDDEN),
    ],
)
def test_who_may_scrape(token: str, authorization: str, remote: str, verdict: auth.Verdict) -> None:
    assert auth.decide(token=token, authorization=authorization, remote_addr=remote) is verdict


def test_every_known_queue_has_its_states_due_and_age_series_even_when_empty() -> None:
    snap = Snapshot(now=NOW, queues=["default", "bulk"], jobs={("default", "queued"): 3}, due={"default": 2})
    snap.oldest_due = {"default": NOW - dt.timedelta(seconds=90)}
    got = parsed(snap)
    assert got["koala_jobs"][(("queue", "default"), ("state", "queued"))] == 3
    assert got["koala_jobs"][(("queue", "bulk"), ("state", "succeeded"))] == 0
    assert len(got["koala_jobs"]) == 2 * 6
    assert got["koala_jobs_due"] == {(("queue", "bulk"),): 0, (("queue", "default"),): 2}
    assert got["koala_queue_oldest_due_age_seconds"] == {(("queue", "bulk"),): 0, (("queue", "default"),): 90}
    assert len(got["koala_jobs_parked"]) == 2 * 3
    assert set(got["koala_workers"]) >= {(("state", s),) for s in ("healthy", "idle", "stuck", "crash_looping", "lost")}


def test_the_histogram_is_cumulative_reaches_four_hours_and_sums() -> None:
    per_bucket = [0] * (len(BUCKETS) + 1)
    per_bucket[0], per_bucket[7], per_bucket[len(BUCKETS)] = 2, 1, 1  # two fast, one at 1 s, one past 4 h
    snap = Snapshot(now=NOW, durations={("noop", "total"): (per_bucket, 20000.5)})
    got = parsed(snap)
    buckets = got["koala_attempt_duration_seconds_bucket"]
    key = lambda le: (("kind", "noop"), ("le", le), ("part", "total"))  # noqa: E731
    assert buckets[key("0.005")] == 2
    assert buckets[key("1.0")] == 3
    assert buckets[key("14400.0")] == 3
    assert buckets[key("+Inf")] == 4
    assert max(BUCKETS) == 4 * 3600
    assert got["koala_attempt_duration_seconds_count"][(("kind", "noop"), ("part", "total"))] == 4
    assert got["koala_attempt_duration_seconds_sum"][(("kind", "noop"), ("part", "total"))] == 20000.5


def test_counters_merge_what_bounds_to_one_label_and_budgets_have_a_ratio_only_with_a_limit() -> None:
    snap = Snapshot(
        now=NOW,
        completions={("default", "bad kind", "succeeded"): 2, ("default", "worse kind", "succeeded"): 3},
        rejections={"lease_expired": 4},
        budgets=[BudgetLine("daily", "spend", "EUR", 800, 1000), BudgetLine("daily", "requests", "", 5, None)],
    )
    got = parsed(snap)
    assert got["koala_job_completions_total"] == {(("kind", "other"), ("outcome", "succeeded"), ("queue", "default")): 5}
    assert got["koala_rejections_total"] == {(("reason", "lease_expired"),): 4}
    assert got["koala_budget_used"][(("budget", "daily"), ("currency", "EUR"), ("resource", "spend"))] == 800
    assert got["koala_budget_used_ratio"] == {(("budget", "daily"), ("resource", "spend")): 0.8}
    assert (("budget", "daily"), ("currency", ""), ("resource", "requests")) not in got.get("koala_budget_limit", {})


def test_a_database_that_did_not_answer_is_koala_up_zero_and_nothing_else() -> None:
    got = parsed(Snapshot(now=NOW), up=False, scrape_seconds=0.25)
    assert got == {"koala_up": {(): 0.0}, "koala_scrape_duration_seconds": {(): 0.25}}
