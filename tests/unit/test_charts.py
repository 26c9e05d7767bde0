"""The console's server-side charts: axis labels a person can read for what the chart counts."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from console.charts import bar_chart

UTC = dt.UTC
START = dt.datetime(2026, 11, 29, 0, 0, tzinfo=UTC)


def hours(*values: float) -> list[tuple[dt.datetime, float]]:
    return [(START + dt.timedelta(hours=i), value) for i, value in enumerate(values)]


def labels(*values: float, whole: bool = True) -> list[str]:
    chart = bar_chart(title="Errors per hour", series=[("failed", hours(*values))], unit="errors", whole=whole)
    return [tick.label for tick in chart.y_ticks]


def test_a_chart_of_counts_has_gridlines_at_whole_numbers_only() -> None:
    assert labels(1, 0, 0) == ["0", "1"]  # not "0.50": half a failed job does not exist
    assert labels(5, 3) == ["0", "5"]  # not "2.50"
    assert labels(2, 1) == ["0", "1", "2"]
    assert labels(18) == ["0", "10", "20"]
    assert labels(0, 0) == ["0", "1"]


def test_a_chart_of_amounts_keeps_its_fractional_gridlines() -> None:
    assert labels(0.8, whole=False) == ["0", "0.50", "1"]


def test_hours_are_labelled_in_the_charts_time_zone() -> None:
    series = [("succeeded", hours(*([1.0] * 24)))]
    utc = bar_chart(title="Completed jobs per hour", series=series, unit="jobs", whole=True)
    paris = bar_chart(title="Completed jobs per hour", series=series, unit="jobs", whole=True, zone=ZoneInfo("Europe/Paris"))
    assert [t.label for t in utc.x_ticks][:2] == ["00:00", "03:00"]
    assert [t.label for t in paris.x_ticks][:2] == ["01:00", "04:00"]  # 29 November: UTC+1
    assert paris.bars[0].label.startswith("01:00 succeeded")
    # A zone half an hour off UTC labels the buckets' real start, minutes included.
    kolkata = bar_chart(title="t", series=series, unit="jobs", whole=True, zone=ZoneInfo("Asia/Kolkata"))
    assert kolkata.x_ticks[0].label == "05:30"
