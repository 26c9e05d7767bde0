"""KOALA_RETENTION_* parse strictly: a bad value stops start-up naming it (koala/settings.py)."""

from __future__ import annotations

import pytest

from tests.unit.test_deploy_units import load_settings, refused


def test_retention_defaults_and_zero_means_keep_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "KOALA_RETENTION_DAYS",
        "KOALA_RETENTION_BATCH_SIZE",
        "KOALA_RETENTION_BATCHES",
        "KOALA_RETENTION_INTERVAL_SECONDS",
    ):
        monkeypatch.delenv(name, raising=False)
    loaded = load_settings(monkeypatch)
    assert (
        loaded["KOALA_RETENTION_DAYS"],
        loaded["KOALA_RETENTION_BATCH_SIZE"],
        loaded["KOALA_RETENTION_BATCHES"],
        loaded["KOALA_RETENTION_INTERVAL_SECONDS"],
    ) == (30, 1000, 5, 60.0)
    assert load_settings(monkeypatch, KOALA_RETENTION_DAYS="")["KOALA_RETENTION_DAYS"] == 30  # empty is unset
    assert load_settings(monkeypatch, KOALA_RETENTION_DAYS="0")["KOALA_RETENTION_DAYS"] == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KOALA_RETENTION_DAYS": "30d"}, "KOALA_RETENTION_DAYS='30d' is not an integer"),
        ({"KOALA_RETENTION_DAYS": "1.5"}, "KOALA_RETENTION_DAYS='1.5' is not an integer"),
        ({"KOALA_RETENTION_DAYS": "-1"}, "KOALA_RETENTION_DAYS=-1 must be at least 0"),
        ({"KOALA_RETENTION_BATCH_SIZE": "0"}, "KOALA_RETENTION_BATCH_SIZE=0 must be at least 1"),
        ({"KOALA_RETENTION_BATCH_SIZE": "10001"}, "KOALA_RETENTION_BATCH_SIZE=10001 must be at most 10000"),
        ({"KOALA_RETENTION_BATCHES": "0"}, "KOALA_RETENTION_BATCHES=0 must be at least 1"),
        ({"KOALA_RETENTION_INTERVAL_SECONDS": "0.5"}, "KOALA_RETENTION_INTERVAL_SECONDS=0.5 must be at least 1.0"),
        ({"KOALA_RETENTION_INTERVAL_SECONDS": "nan"}, "KOALA_RETENTION_INTERVAL_SECONDS='nan' is not a finite number"),
    ],
)
def test_a_bad_retention_setting_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    said = refused(monkeypatch, **env)
    assert said.startswith("Koala configuration error: ") and message in said, said
