"""koala_schedule: list, show (with the next fires), create/update (options or a JSON file), pause,
resume (previewed with --dry-run), run-now and backfill (--dry-run first). It parses and calls
schedules' services and selectors, nothing more."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from schedules import selectors, services
from schedules.errors import ScheduleError
from schedules.models import Schedule
from workers.management.commands._common import add_actor_argument, cli_actor

_name = cli.field_text(Schedule, "name")


def _moment(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(cli.text(40)(value))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"{cli.shown(value)} is not a time (ISO 8601 with an offset, e.g. 2026-03-29T02:30:00+02:00)"
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{cli.shown(value)} needs an offset (e.g. +02:00 or Z)")
    return moment


def _spec_file(value: str) -> dict[str, Any]:
    path = Path(cli.text(4096)(value))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {cli.shown(value)}: {exc}") from None
    return cli.json_object(1_000_000)(text)


_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--kind", "kind", cli.field_text(Schedule, "kind"), "the job kind each slot runs"),
    ("--input", "input", cli.json_object(100_000), "the job's input, a JSON object (the same for every slot)"),
    ("--queue", "queue", cli.field_text(Schedule, "queue", allow_empty=True), "the queue (default: the kind's)"),
    ("--cron", "cron", cli.field_text(Schedule, "cron"), "5 cron fields or @hourly/@daily/@weekly/@monthly/@yearly"),
    ("--interval", "interval_seconds", cli.bounded_int(1, 10 * 366 * 86_400), "instead of --cron: a slot every N seconds"),
    ("--zone", "zone", cli.time_zone, "the IANA time zone the cron text is read in (required)"),
    ("--starts", "starts_at", _moment, "no slot before this time (ISO 8601 with offset)"),
    ("--ends", "ends_at", _moment, "no slot after this time (ISO 8601 with offset)"),
    ("--jitter", "jitter_seconds", cli.bounded_int(0, 86_400), "delay each slot's job by 0..N seconds (fixed per slot)"),
    ("--catch-up", "catch_up", cli.text(16), "after downtime: skip, latest or all_within"),
    (
        "--window",
        "catch_up_window_seconds",
        cli.bounded_int(1, 366 * 86_400),
        "all_within: how old a missed slot may be (seconds)",
    ),
    ("--max", "catch_up_max", cli.bounded_int(1, 10_000), "all_within: at most this many missed slots run"),
    ("--overlap", "overlap", cli.text(16), "while a run is live: skip, buffer_one or allow"),
    ("--pause-on-failures", "pause_on_failures", cli.bounded_int(0, 10_000), "pause after N failed runs in a row (0: never)"),
]


def _print_plan(out: Any, title: str, enqueue: list[datetime], skipped: list[tuple[datetime, str]], zone: str) -> None:
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone)
    out.write(f"{title}: {len(enqueue)} to run, {len(skipped)} to record skipped")
    for slot in enqueue:
        out.write(f"  run   {slot.astimezone(tz).isoformat()}")
    for slot, reason in skipped:
        out.write(f"  skip  {slot.astimezone(tz).isoformat()}  ({reason})")


class Command(BaseCommand):
    help = (
        "Schedules: list them, show one (its rule in words, next 10 fires in its zone and UTC, last runs), "
        "create or update one from options or a JSON file, pause, resume (--dry-run: what the catch-up would fire), "
        "run now (a manual slot) and backfill a past range (--dry-run: the slots it would run)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every schedule, one line each")
        show = sub.add_parser("show", help="one schedule: its rule in words, next fires, last runs")
        show.add_argument("name", type=_name)
        for verb in ("create", "update"):
            edit = sub.add_parser(verb, help=f"{verb} a schedule from options and/or --file")
            edit.add_argument("name", type=_name)
            edit.add_argument(
                "--file", type=_spec_file, default=None, help="a JSON object of the schedule's fields (options override it)"
            )
            for flag, dest, parse, what in _OPTIONS:
                edit.add_argument(flag, dest=dest, type=parse, default=None, help=what)
            add_actor_argument(edit, f"{verb}s it")
        pause = sub.add_parser("pause", help="stop new slots at once")
        pause.add_argument("name", type=_name)
        pause.add_argument(
            "--reason", type=cli.field_text(Schedule, "paused_reason"), required=True, help="why (shown with the schedule)"
        )
        add_actor_argument(pause, "pauses it")
        resume = sub.add_parser("resume", help="lift the pause; the next tick applies the catch-up policy")
        resume.add_argument("name", type=_name)
        resume.add_argument("--dry-run", action="store_true", help="print what the catch-up would fire now, change nothing")
        add_actor_argument(resume, "resumes it")
        run = sub.add_parser("run-now", help="one manual run now, outside the rule's slots")
        run.add_argument("name", type=_name)
        add_actor_argument(run, "runs it")
        backfill = sub.add_parser(
            "backfill", help=f"run the rule's past slots in a range that never ran (at most {services.MAX_BACKFILL_SLOTS})"
        )
        backfill.add_argument("name", type=_name)
        backfill.add_argument("--from", dest="start", type=_moment, required=True, help="first slot time (ISO 8601 with offset)")
        backfill.add_argument(
            "--to", dest="end", type=_moment, required=True, help="last slot time, inclusive (ISO 8601 with offset)"
        )
        backfill.add_argument("--dry-run", action="store_true", help="print the slots it would run, change nothing")
        add_actor_argument(backfill, "backfills it")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, "_" + options["action"].replace("-", "_"))(options)
        except ScheduleError as exc:
            raise CommandError(str(exc)) from None

    def _list(self, options: dict[str, Any]) -> None:
        for schedule in selectors.list_schedules():
            state = f"paused by {schedule.paused_by}: {schedule.paused_reason}" if schedule.paused else "active"
            upcoming = schedule.next_slot_at.isoformat() if schedule.next_slot_at else "-"
            self.stdout.write(f"{schedule.name}  {schedule.kind}  {selectors.explanation(schedule)}  next={upcoming}  {state}")

    def _show(self, options: dict[str, Any]) -> None:
        schedule = selectors.get_schedule(name=options["name"])
        detail = selectors.schedule_detail(schedule_id=schedule.pk)
        out = self.stdout
        out.write(f"{schedule.name}: {schedule.kind} {json.dumps(schedule.input, sort_keys=True)}")
        out.write(f"  rule      {detail.explanation} ({schedule.cron or f'every {schedule.interval_seconds} s'})")
        out.write(f"  policies  catch_up={schedule.catch_up} overlap={schedule.overlap} jitter={schedule.jitter_seconds}s")
        out.write(
            f"  state     {'paused by ' + schedule.paused_by + ': ' + schedule.paused_reason if schedule.paused else 'active'}"
        )
        out.write("  next fires (zone | UTC | jitter):")
        for fire in detail.next_fires:
            out.write(f"    {fire.fire_local.isoformat()} | {fire.fire_utc.isoformat()} | +{fire.jitter_seconds}s")
        out.write("  last runs:")
        for run in detail.runs:
            job = f"job #{run.job_id} {run.outcome}" if run.job_id else run.reason
            out.write(f"    {run.slot_local.isoformat()}  {run.state}  {job}")

    def _values(self, options: dict[str, Any]) -> dict[str, Any]:
        values = dict(options["file"] or {})
        for name in ("starts_at", "ends_at"):
            if isinstance(values.get(name), str):
                values[name] = _moment(values[name])
        values.update({dest: options[dest] for _, dest, _, _ in _OPTIONS if options[dest] is not None})
        if values.get("interval_seconds") is not None and "cron" not in values:
            values["cron"] = ""
        if values.get("cron") and "interval_seconds" not in values:
            values["interval_seconds"] = None
        return values

    def _create(self, options: dict[str, Any]) -> None:
        schedule = services.create_schedule(name=options["name"], actor=cli_actor(options["actor"]), **self._values(options))
        self.stdout.write(
            f"created schedule {schedule.name} (#{schedule.pk}): {selectors.explanation(schedule)}; next {schedule.next_slot_at}"
        )

    def _update(self, options: dict[str, Any]) -> None:
        schedule = selectors.get_schedule(name=options["name"])
        schedule = services.update_schedule(schedule_id=schedule.pk, actor=cli_actor(options["actor"]), **self._values(options))
        self.stdout.write(f"updated schedule {schedule.name}: {selectors.explanation(schedule)}; next {schedule.next_slot_at}")

    def _pause(self, options: dict[str, Any]) -> None:
        schedule = selectors.get_schedule(name=options["name"])
        services.pause_schedule(schedule_id=schedule.pk, actor=cli_actor(options["actor"]), reason=options["reason"])
        self.stdout.write(f"paused schedule {schedule.name}")

    def _resume(self, options: dict[str, Any]) -> None:
        schedule = selectors.get_schedule(name=options["name"])
        preview = selectors.preview_catch_up(schedule_id=schedule.pk)
        _print_plan(self.stdout, "on resume", preview.enqueue, [(s, str(r)) for s, r in preview.skipped], schedule.zone)
        if options["dry_run"]:
            return
        services.resume_schedule(schedule_id=schedule.pk, actor=cli_actor(options["actor"]))
        self.stdout.write(f"resumed schedule {schedule.name}")

    def _run_now(self, options: dict[str, Any]) -> None:
        schedule = selectors.get_schedule(name=options["name"])
        occurrence = services.run_now(schedule_id=schedule.pk, actor=cli_actor(options["actor"]))
        self.stdout.write(f"schedule {schedule.name}: job #{occurrence.job_id} enqueued now")

    def _backfill(self, options: dict[str, Any]) -> None:
        schedule = selectors.get_schedule(name=options["name"])
        plan = services.backfill(
            schedule_id=schedule.pk,
            actor=cli_actor(options["actor"]),
            start=options["start"],
            end=options["end"],
            dry_run=options["dry_run"],
        )
        _print_plan(
            self.stdout,
            "backfill" + (" (dry run)" if options["dry_run"] else ""),
            plan.run,
            [(s, f"already {state}") for s, state in plan.already],
            schedule.zone,
        )
        if plan.job_ids:
            self.stdout.write(f"enqueued jobs {', '.join(f'#{job_id}' for job_id in plan.job_ids)}")
