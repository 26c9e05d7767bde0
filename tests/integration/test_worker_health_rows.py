"""The dashboard's worker-health rules on WorkerProcess rows as workers record them."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from workers.models import WorkerExit, WorkerProcess
from workers.selectors.workers import worker_health

pytestmark = pytest.mark.django_db


def _row(name: str, *, now: dt.datetime, exit: str = "", exits: list[tuple[str, float]] = (), silent: float = 0.0, **extra):  # type: ignore[no-untyped-def,assignment]
    return WorkerProcess.objects.create(
        name=name,
        hostname="h1",
        pid=100 + WorkerProcess.objects.count(),
        queues=["default"],
        worker_class="KoalaSimpleWorker",
        started_at=now - dt.timedelta(seconds=silent + 1),
        last_seen_at=now - dt.timedelta(seconds=silent),
        stopped_at=now - dt.timedelta(seconds=silent) if exit else None,
        exit=exit,
        recent_exits=[
            {"at": (now - dt.timedelta(seconds=ago)).isoformat(), "exit": how, "pid": 1, "detail": ""} for how, ago in exits
        ],
        **extra,
    )


def statuses(now: dt.datetime) -> dict[str, tuple[str, str]]:
    return {w.name: (w.status, w.why) for w in worker_health(now=now)}


def test_only_abnormal_exits_within_the_window_make_a_crash_loop(settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_CRASH_LOOP_STARTS, settings.KOALA_CRASH_LOOP_WINDOW_SECONDS = 3, 600
    settings.KOALA_LEASE_SECONDS, settings.KOALA_HEARTBEAT_SECONDS = 30, 10
    now = timezone.now()
    # Ten clean stops and two deaths long ago under one name, alive now: no loop.
    _row("a", now=now, exits=[(WorkerExit.STOPPED, 10 * i) for i in range(1, 11)] + [(WorkerExit.DIED, 4000)] * 2)
    assert statuses(now)["a"][0] == "idle"
    # One death under that name, one crashed process and one lost (silent, never restarted)
    # elsewhere on the host and queue set: three abnormal exits within the window.
    WorkerProcess.objects.filter(name="a").update(
        recent_exits=[{"at": (now - dt.timedelta(seconds=60)).isoformat(), "exit": WorkerExit.DIED, "pid": 1, "detail": ""}]
    )
    _row("b", now=now, exit=WorkerExit.CRASHED, exits=[(WorkerExit.CRASHED, 0)])
    assert statuses(now)["b"] == ("crashed", statuses(now)["b"][1]) and "exited on" in statuses(now)["b"][1]
    _row("c", now=now, silent=120)
    got = statuses(now)
    assert {name: s for name, (s, _) in got.items()} == {"a": "crash_looping", "b": "crash_looping", "c": "crash_looping"}
    assert "3 abnormal exits" in got["a"][1]
    # The same three on another host are that host's business.
    WorkerProcess.objects.filter(name="c").update(hostname="h2")
    got = statuses(now)
    assert (got["a"][0], got["b"][0], got["c"][0]) == ("idle", "crashed", "lost")
