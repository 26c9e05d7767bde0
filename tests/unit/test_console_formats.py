"""The console's number formats and its server-side bar charts (pure geometry, no page)."""

from __future__ import annotations

import datetime as dt

import pytest

from console.charts import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH, bar_chart, nice_ceiling
from console.templatetags.koala_console import duration, minor, percent, pretty_json, redacted, share


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (0, "0.0 s"), (59.94, "59.9 s"), (60, "1m 0s"), (3725.4, "1h 2m 5s"), (86400, "24h 0m 0s")],
)
def test_durations(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (None, "EUR", "—"),
        (1234, "EUR", "12.34 EUR"),
        (5, "", "0.05"),
        (123456789, "USD", "1,234,567.89 USD"),
        (-250, "EUR", "-2.50 EUR"),
    ],
)
def test_minor_units_as_amounts(amount: int | None, currency: str, text: str) -> None:
    assert minor(amount, currency) == text


def test_percent_and_share() -> None:
    assert (percent(None), percent(0.1234), percent(1)) == ("—", "12.3%", "100.0%")
    assert share(50, 200) == 25.0
    assert share(300, 200) == 100.0  # an overshoot fills the bar, no more
    assert share(5, None) == 0.0 and share(5, 0) == 0.0  # no limit: no bar
    assert share(1, 3) == 33.3


def test_identifiers_are_redacted_again_on_the_way_out() -> None:
    assert redacted(None) == ""
    assert redacted("import-tok_live_abcdefgh1234") == "import-[redacted]"
    assert redacted(42) == "42"


def test_pretty_json_is_stable() -> None:
    assert pretty_json({"b": 1, "a": [1]}) == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}'
    assert pretty_json({"at": dt.date(2026, 3, 1)}) == '{\n  "at": "2026-03-01"\n}'


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1.0), (1, 1.0), (1.01, 2.0), (2, 2.0), (2.5, 5.0), (7, 10.0), (10, 10.0), (11, 20.0), (999, 1000.0), (1001, 2000.0)],
)
def test_the_y_axis_ends_at_a_round_number(value: float, ceiling: float) -> None:
    assert nice_ceiling(value) == ceiling


def _hours(values: list[float]) -> list[tuple[dt.datetime, float]]:
    start = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    return [(start + dt.timedelta(hours=n), v) for n, v in enumerate(values)]


def test_bars_are_grouped_by_bucket_and_scaled_to_the_axis() -> None:
    chart = bar_chart(title="t", unit="jobs", series=[("ok", _hours([4, 0, 10, 2])), ("failed", _hours([1, 0, 5, 0]))])
    assert len(chart.bars) == 8 and chart.y_ticks[-1].label == "10"  # axis top: nice_ceiling(10)
    assert chart.plot_bottom == HEIGHT - BOTTOM and (chart.width, chart.height) == (WIDTH, HEIGHT)
    tallest = max(chart.bars, key=lambda b: b.value)
    assert (tallest.value, tallest.y, tallest.y + tallest.height) == (10, TOP, chart.plot_bottom)
    assert all(b.y + b.height == pytest.approx(chart.plot_bottom) for b in chart.bars)  # bars stand on the axis
    assert all(LEFT <= b.x and b.x + b.width <= WIDTH - RIGHT + 0.01 for b in chart.bars)
    heights = {b.value: b.height for b in chart.bars}
    assert heights[5] == pytest.approx(heights[10] / 2) and heights[0] == 0
    # Within a bucket the series sit side by side, in order.
    first_bucket = sorted((b for b in chart.bars if b.label.startswith("00:00")), key=lambda b: b.x)
    assert [b.series for b in first_bucket] == [0, 1]
    assert first_bucket[0].x + first_bucket[0].width == pytest.approx(first_bucket[1].x, abs=0.01)
    assert first_bucket[0].label == "00:00 ok: 4"
    assert chart.legend == [(0, "ok", 16), (1, "failed", 6)] and not chart.empty


def test_every_third_hour_is_labelled_and_an_all_zero_chart_is_empty() -> None:
    chart = bar_chart(title="t", unit="jobs", series=[("ok", _hours([0] * 7))])
    assert [t.label for t in chart.x_ticks] == ["00:00", "03:00", "06:00"]
    assert chart.empty and [t.label for t in chart.y_ticks] == ["0", "0.50", "1"]
    assert bar_chart(title="none", unit="jobs", series=[]).bars == []
