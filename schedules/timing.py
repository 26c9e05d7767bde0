"""When a schedule's slots fall: cron text (5 fields or an alias) or a fixed interval, in a zone.

Pure functions of the stored spec; nothing here reads the clock or the database.

The DST rule is cronsim's, which follows Debian cron (docs/schedules.md, "Daylight saving time"):

- a slot whose wall time falls in the hour skipped at spring-forward fires once, at the first
  valid wall time after the gap (``30 2 * * *`` in Europe/Paris on 2026-03-29 fires at 03:00+02:00);
- a fixed wall time in the hour repeated at fall-back fires once, on its first pass (``30 2 * * *``
  on 2026-10-25 fires at 02:30+02:00 only); an expression with a wildcard hour (``0 * * * *``)
  fires in each real hour, so the repeated 02:00 fires twice: at 02:00+02:00 and 02:00+01:00,
  an hour apart.

Slots are compared and stored as UTC instants, so "strictly after the last slot" is well defined
whatever the wall clock does. An interval counts real seconds from its anchor; its zone is only
how its times are shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class TimingError(ValueError):
    """The spec cannot define slots (bad cron text, unknown zone, bad interval): the message says why."""


@dataclass(frozen=True)
class Timing:
    """A schedule's slot rule: exactly one of ``cron`` and ``interval_seconds``."""

    zone: str
    cron: str = ""
    interval_seconds: int | None = None
    anchor: datetime | None = None  # an interval's first slot (its start, or when it was created)
    starts_at: datetime | None = None
    ends_at: datetime | None = None

    @property
    def tz(self) -> ZoneInfo:
        return zone_info(self.zone)

    def expression(self) -> str:
        """The cron text cronsim evaluates (an alias expanded)."""
        return ALIASES.get(self.cron.strip().lower(), self.cron.strip())

    def after(self, moment: datetime) -> Iterator[datetime]:
        """Slots strictly after ``moment``, ascending, as UTC instants, inside the bounds."""
        start = moment
        if self.starts_at is not None and start < self.starts_at:
            # The first slot may be the start itself: begin just before it.
            start = self.starts_at - timedelta(microseconds=1)
        slots = self._interval_after(start) if self.interval_seconds is not None else self._cron_after(start)
        for slot in slots:
            if self.ends_at is not None and slot > self.ends_at:
                return
            yield slot

    def next_after(self, moment: datetime) -> datetime | None:
        return next(iter(self.after(moment)), None)

    def upcoming(self, moment: datetime, count: int) -> list[datetime]:
        return list(islice(self.after(moment), count))

    def _interval_after(self, start: datetime) -> Iterator[datetime]:
        assert self.interval_seconds is not None and self.anchor is not None
        step = timedelta(seconds=self.interval_seconds)
        if start < self.anchor:
            slot = self.anchor
        else:
            slot = self.anchor + ((start - self.anchor) // step + 1) * step
        while True:
            yield slot
            slot += step

    def _cron_after(self, start: datetime) -> Iterator[datetime]:
        # cronsim walks wall time in the zone and yields aware datetimes strictly after its start.
        local = start.astimezone(self.tz).replace(microsecond=0)  # cronsim counts whole seconds
        previous: datetime | None = None
        for value in CronSim(self.expression(), local):
            slot = value.astimezone(UTC)
            # Two wall times can map to one instant (a skipped-hour slot moved to the next valid
            # time equals that time's own slot): one slot, once.
            if slot <= start or (previous is not None and slot <= previous):
                continue
            previous = slot
            yield slot


def zone_info(name: str) -> ZoneInfo:
    if not name or name != name.strip():
        raise TimingError("a schedule needs an IANA time zone (e.g. Europe/Paris, UTC); there is no implicit server zone.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise TimingError(f"unknown time zone {name!r}: use an IANA name such as Europe/Paris or UTC.") from None


def known_zones() -> set[str]:
    return available_timezones()


def check(timing: Timing) -> None:
    """Raise TimingError unless ``timing`` defines slots."""
    zone_info(timing.zone)
    if bool(timing.cron.strip()) == (timing.interval_seconds is not None):
        raise TimingError("give either a cron expression or an interval in seconds, not both and not neither.")
    if timing.interval_seconds is not None:
        if (
            isinstance(timing.interval_seconds, bool)
            or not isinstance(timing.interval_seconds, int)
            or timing.interval_seconds <= 0
        ):
            raise TimingError(f"interval_seconds must be a whole number of seconds above 0, not {timing.interval_seconds!r}.")
    else:
        expression = timing.expression()
        if expression.startswith("@"):
            raise TimingError(f"unknown cron alias {timing.cron!r}: use one of {', '.join(sorted(ALIASES))}.")
        if len(expression.split()) != 5:
            raise TimingError(
                f"cron expression {timing.cron!r} must have 5 fields (minute hour day month weekday) or be an alias."
            )
        try:
            CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise TimingError(f"invalid cron expression {timing.cron!r}: {exc}.") from None
    if timing.starts_at is not None and timing.ends_at is not None and timing.ends_at <= timing.starts_at:
        raise TimingError("ends_at must be later than starts_at.")


def explain(timing: Timing) -> str:
    """The rule in words, with its zone ("At 09:00 on Monday through Friday, Europe/Paris").

    Common cron forms are explained (cronsim's explainer); anything it cannot put in words is
    shown as the raw text."""
    if timing.interval_seconds is not None:
        seconds = timing.interval_seconds
        for unit, size in (("day", 86_400), ("hour", 3600), ("minute", 60)):
            if seconds % size == 0:
                count = seconds // size
                return f"Every {unit}" if count == 1 else f"Every {count} {unit}s"
        return "Every second" if seconds == 1 else f"Every {seconds} seconds"
    try:
        words = CronSim(timing.expression(), datetime(2000, 1, 1, tzinfo=UTC)).explain()
    except Exception:  # the explainer's gaps: show the rule itself
        words = timing.cron
    return f"{words}, {timing.zone}"
