"""koala_flow parses and calls the flows services: a bad value is a clear error and changes nothing."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from flows.models import Run, RunStep, Signal
from koala.models import AuditEvent
from workers.models import Job


def _counts() -> tuple[int, ...]:
    return (Run.objects.count(), RunStep.objects.count(), Signal.objects.count(), Job.objects.count(), AuditEvent.objects.count())


def _flow(*args: str) -> str:
    out = StringIO()
    call_command("koala_flow", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_start_signal_show_list_and_cancel(tmp_path: Path) -> None:
    said = _flow("start", "ticket", "--input", f'{{"log": "{tmp_path / "e"}"}}', "--key", "t-1", "--actor", "alice")
    run = Run.objects.get()
    assert f"run {run.pk} of ticket@1 started" in said
    assert "already started" in _flow("start", "ticket", "--input", f'{{"log": "{tmp_path / "e"}"}}', "--key", "t-1")
    assert "buffered" in _flow("signal", str(run.pk), "reviewer.approved", "--key", "k", "--payload", '{"ok": true}')
    assert "duplicate" in _flow("signal", str(run.pk), "reviewer.approved", "--key", "k")
    assert '"definition": "ticket"' in _flow("show", str(run.pk), "--actor", "alice")
    assert AuditEvent.objects.filter(action="read", target_type="run", actor="alice").count() == 1
    assert f"run {run.pk}" in _flow("list")
    assert "no stranded runs" in _flow("stranded") or "needs" in _flow("stranded")
    assert "cancelled" in _flow("cancel", str(run.pk), "--reason", "test")
    assert "rejected" in _flow("signal", str(run.pk), "reviewer.approved", "--key", "k2")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["start", "nope"], "unknown_definition"),
        (["start", "fan", "--version", "7", "--input", '{"log": "x"}'], "unknown_version"),
        (["start", "fan", "--version", "1"], "bad_input"),
        (["signal", "999999", "go", "--key", "k"], "unknown_run"),
        (["cancel", "999999"], "unknown_run"),
        (["move", "999999", "--to-version", "2"], "unknown_run"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(args: list[str], says: str) -> None:
    before = _counts()
    with pytest.raises(CommandError, match=says):
        _flow(*args)
    assert _counts() == before
