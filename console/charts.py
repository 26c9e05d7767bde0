"""Server-side SVG bar charts: geometry computed here, drawn by templates/console/_chart.html.

No JavaScript and nothing from a CDN: the page carries the chart as inline SVG, so it
renders (and prints) anywhere and the numbers in each bar's tooltip are the database's.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from zoneinfo import ZoneInfo

WIDTH, HEIGHT = 720, 190
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 26


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: int
    label: str
    value: float


@dataclass(frozen=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True)
class BarChart:
    title: str
    unit: str
    width: int
    height: int
    bars: list[Bar]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    legend: list[tuple[int, str, float]]  # (series index, name, total)
    plot_left: int
    plot_right: int
    plot_bottom: int
    zone: str = "UTC"  # the time zone of the hour labels
    whole: bool = False  # counts (their unit goes without saying) rather than amounts of ``unit``

    @property
    def caption(self) -> str:
        """The title with the time zone: "Cost per hour (EUR, Europe/Paris)"."""
        if self.title.endswith(")"):
            return f"{self.title[:-1]}, {self.zone})"
        return f"{self.title} ({self.zone})"

    @property
    def empty(self) -> bool:
        return all(total == 0 for _, _, total in self.legend)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times 10^n at or above ``value`` (at least 1), for a readable y axis."""
    if value <= 1:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return float(step * magnitude)
    return float(10 * magnitude)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _hour(when: dt.datetime, zone: ZoneInfo) -> str:
    local = when.astimezone(zone)
    return f"{local:%H:%M}" if local.minute else f"{local:%H:00}"


def bar_chart(
    *,
    title: str,
    series: list[tuple[str, list[tuple[dt.datetime, float]]]],
    unit: str,
    whole: bool = False,
    zone: ZoneInfo | None = None,
) -> BarChart:
    """Grouped bars, one group per bucket (the buckets of every series must match).

    ``whole``: the values are counts, so gridlines fall on whole numbers only (a "0.50" line on a
    chart of failed jobs reads as half a job). ``zone``: the time zone the hours are labelled in.
    """
    zone = zone or ZoneInfo("UTC")
    buckets = [when for when, _ in series[0][1]] if series else []
    top = nice_ceiling(max([value for _, points in series for _, value in points] or [0]))
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    group = plot_width / max(len(buckets), 1)
    bar_width = max((group - 2) / max(len(series), 1), 1)
    bars = []
    for index, (name, points) in enumerate(series):
        for slot, (when, value) in enumerate(points):
            height = plot_height * value / top
            bars.append(
                Bar(
                    x=round(LEFT + slot * group + 1 + index * bar_width, 2),
                    y=round(TOP + plot_height - height, 2),
                    width=round(bar_width, 2),
                    height=round(height, 2),
                    series=index,
                    label=f"{_hour(when, zone)} {name}: {_fmt(value)}",
                    value=value,
                )
            )
    x_ticks = [
        Tick(position=round(LEFT + slot * group + group / 2, 2), label=_hour(when, zone))
        for slot, when in enumerate(buckets)
        if slot % 3 == 0
    ]
    y_ticks = [
        Tick(position=round(TOP + plot_height * (1 - f), 2), label=_fmt(top * f))
        for f in (0, 0.5, 1)
        if not whole or (top * f).is_integer()
    ]
    legend = [(index, name, sum(v for _, v in points)) for index, (name, points) in enumerate(series)]
    return BarChart(
        title=title,
        unit=unit,
        width=WIDTH,
        height=HEIGHT,
        bars=bars,
        x_ticks=x_ticks,
        y_ticks=y_ticks,
        legend=legend,
        plot_left=LEFT,
        plot_right=WIDTH - RIGHT,
        plot_bottom=TOP + plot_height,
        zone=str(zone),
        whole=whole,
    )
