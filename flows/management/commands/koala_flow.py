from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from flows import selectors, services
from flows.errors import FlowError
from flows.models import Run, RunState
from koala import cli
from workers.management.commands._common import add_actor_argument, cli_actor, id_of

run_id = id_of(Run)


class Command(BaseCommand):
    help = (
        "Workflow runs. `start DEFINITION [--version N] [--input JSON] [--key KEY]`, `signal RUN NAME --key KEY "
        "[--payload JSON]`, `cancel RUN [--reason]`, `show RUN` (audited), `list [--state S] [--definition D]`, "
        "`stranded` (live runs no live worker can serve), `move RUN --to-version N`. A bad value changes nothing "
        "and exits non-zero."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser("start", help="start a run of a definition")
        start.add_argument("definition", type=cli.text(60))
        start.add_argument("--version", type=cli.bounded_int(1, 2**31 - 1), default=None, help="default: the newest")
        start.add_argument("--input", type=cli.json_object(16_384), default={}, help="the run's input, a JSON object")
        start.add_argument("--key", type=cli.text(200), default=None, help="idempotency key")
        add_actor_argument(start, "starts it")
        signal = sub.add_parser("signal", help="deliver a signal to a run (a wait consumes it)")
        signal.add_argument("run_id", type=run_id)
        signal.add_argument("name", type=cli.text(100))
        signal.add_argument("--key", type=cli.text(200), required=True, help="deduplicates: the same key twice is one signal")
        signal.add_argument("--payload", type=cli.json_object(65_536), default={}, help="a JSON object")
        add_actor_argument(signal, "sends it")
        cancel = sub.add_parser("cancel", help="cancel a live run")
        cancel.add_argument("run_id", type=run_id)
        cancel.add_argument("--reason", type=cli.text(500, allow_empty=True), default="")
        add_actor_argument(cancel, "cancels it")
        show = sub.add_parser("show", help="one run's journal (JSON); the read is audited")
        show.add_argument("run_id", type=run_id)
        add_actor_argument(show, "reads")
        listing = sub.add_parser("list", help="runs, newest first")
        listing.add_argument("--state", choices=RunState.values, default=None)
        listing.add_argument("--definition", type=cli.text(60), default=None)
        listing.add_argument("--limit", type=cli.bounded_int(1, 500), default=50)
        sub.add_parser("stranded", help="live runs whose due step is of a version no live worker serves")
        move = sub.add_parser("move", help="move a live run to another version of its definition (from its next step)")
        move.add_argument("run_id", type=run_id)
        move.add_argument("--to-version", type=cli.bounded_int(1, 2**31 - 1), required=True)
        add_actor_argument(move, "moves it")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except FlowError as exc:
            raise CommandError(f"{exc.code}: {exc}") from None

    def _handle(self, options: dict[str, Any]) -> None:
        action = options["action"]
        if action == "start":
            started = services.start_run(
                definition=options["definition"],
                version=options["version"],
                input=options["input"],
                idempotency_key=options["key"],
                actor=cli_actor(options["actor"]),
            )
            run = started.run
            verb = "started" if started.created else "already started (same key and input)"
            self.stdout.write(f"run {run.pk} of {run.definition}@{run.version} {verb}: {run.state}")
        elif action == "signal":
            answer = services.send_signal(
                run_id=options["run_id"],
                name=options["name"],
                key=options["key"],
                payload=options["payload"],
                actor=cli_actor(options["actor"]),
            )
            self.stdout.write(f"signal {options['name']} to run {options['run_id']}: {answer.outcome}")
        elif action == "cancel":
            run = services.cancel_run(run_id=options["run_id"], actor=cli_actor(options["actor"]), reason=options["reason"])
            self.stdout.write(f"run {run.pk} {run.state}")
        elif action == "show":
            view = services.read_run(run_id=options["run_id"], actor=cli_actor(options["actor"]))
            self.stdout.write(json.dumps(dataclasses.asdict(view), indent=2, default=str))
        elif action == "list":
            runs = selectors.list_runs(state=options["state"], definition=options["definition"], limit=options["limit"])
            for run in runs:
                self.stdout.write(
                    f"run {run.pk}  {run.state:<10} {run.definition}@{run.version}  started {run.created_at:%Y-%m-%d %H:%M:%SZ}"
                    + (f"  {run.error_code}" if run.error_code else "")
                )
            if not runs:
                self.stdout.write("no runs")
        elif action == "stranded":
            stranded = selectors.stranded_runs()
            for s in stranded:
                versions = ", ".join(map(str, s.served_versions)) or "none"
                self.stdout.write(
                    f"run {s.run_id}  {s.definition}@{s.version}  needs {', '.join(s.missing)}  served versions: {versions}"
                )
            if not stranded:
                self.stdout.write("no stranded runs")
        elif action == "move":
            run = services.move_to_version(
                run_id=options["run_id"], to_version=options["to_version"], actor=cli_actor(options["actor"])
            )
            self.stdout.write(f"run {run.pk} now at {run.definition}@{run.version}: {run.state}")
        else:  # pragma: no cover - argparse refuses other actions
            raise CommandError(f"unknown action {action!r}")
