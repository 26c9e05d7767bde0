from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers import targets
from workers.errors import SafetyError
from workers.management.commands._common import add_actor_argument, cli_actor, scope_name, tenant_name
from workers.models import Budget, ModelPrice
from workers.services.budgets import LIMIT_FIELDS, create_budget, set_model_price, update_budget, usage_for

_LIMIT_OPTIONS = {
    "spend_limit_minor": "--spend",
    "request_limit": "--requests",
    "concurrency_limit": "--concurrency",
    "run_seconds_limit": "--run-seconds",
    "attempt_limit": "--attempts",
}


def _limit(field: str) -> cli.Parse:
    """'none' or '' clears a limit; anything else is a whole number the limit's column holds."""
    whole = cli.field_int(Budget, field, minimum=0)

    def parse(text: str) -> int | None:
        value = text.strip()
        if value.lower() in ("", "none"):
            return None
        if value.startswith("-") and value[1:].isdigit():
            raise argparse.ArgumentTypeError(f"cannot be negative (got {value}); 'none' removes the limit")
        return int(whole(text))

    return parse


class Command(BaseCommand):
    help = (
        "Budgets per scope and day: `list`, `create NAME --scope global|queue|kind [--target] [--tenant] [--timezone] "
        "[--spend MINOR] [--requests N] [--concurrency N] [--run-seconds N] [--attempts N] [--pause-on-exhaust]`, "
        "`set NAME [limits…]` ('none' clears a limit), and `price MODEL INPUT_PER_MTOK OUTPUT_PER_MTOK`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="budgets with today's usage")
        for name in ("create", "set"):
            cmd = sub.add_parser(name)
            cmd.add_argument("name", type=cli.field_text(Budget, "name"))
            if name == "create":
                cmd.add_argument("--scope", type=scope_name, required=True, help="global, queue or kind")
                cmd.add_argument(
                    "--target", type=cli.field_text(Budget, "target", allow_empty=True), default="", help="queue or kind name"
                )
                cmd.add_argument("--tenant", type=tenant_name, default="")
                cmd.add_argument("--timezone", type=cli.time_zone, default="UTC")
                cmd.add_argument(
                    "--currency",
                    type=cli.text(3),
                    default=None,
                    help="the budget's currency: only KOALA_COST_CURRENCY, the one costs are priced in (the default)",
                )
            for field, flag in _LIMIT_OPTIONS.items():
                cmd.add_argument(flag, dest=field, type=_limit(field), default=argparse_unset, help=f"{field} (none = no limit)")
            cmd.add_argument("--pause-on-exhaust", action="store_true", default=None)
            add_actor_argument(cmd, "changes budgets")
        price = sub.add_parser("price", help="set a model's price in minor units per million tokens")
        price.add_argument("model", type=cli.field_text(ModelPrice, "model"))
        price.add_argument("input_per_mtok", type=cli.field_int(ModelPrice, "input_minor_per_mtok", minimum=0))
        price.add_argument("output_per_mtok", type=cli.field_int(ModelPrice, "output_minor_per_mtok", minimum=0))
        add_actor_argument(price, "sets prices")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "list":
                self._list()
            elif action == "price":
                row = set_model_price(
                    model=options["model"],
                    input_minor_per_mtok=options["input_per_mtok"],
                    output_minor_per_mtok=options["output_per_mtok"],
                    actor=cli_actor(options["actor"]),
                )
                self.stdout.write(f"price for {row.model}: {row.input_minor_per_mtok}/{row.output_minor_per_mtok} per 1M tokens")
            else:
                limits = {f: options[f] for f in LIMIT_FIELDS if options[f] is not argparse_unset}
                if action == "create":
                    try:
                        targets.check_scope(options["scope"], options["target"])
                    except SafetyError as exc:
                        raise CommandError(f"--target: {exc}") from None
                    budget = create_budget(
                        name=options["name"],
                        scope=options["scope"],
                        target=options["target"],
                        tenant=options["tenant"],
                        timezone=options["timezone"],
                        currency=options["currency"],
                        pause_on_exhaust=bool(options["pause_on_exhaust"]),
                        actor=cli_actor(options["actor"]),
                        **limits,
                    )
                else:
                    found = Budget.objects.filter(name=options["name"]).first()
                    if found is None:
                        raise SafetyError(f"no budget named {options['name']!r}.")
                    budget = update_budget(
                        budget_id=found.pk,
                        actor=cli_actor(options["actor"]),
                        pause_on_exhaust=options["pause_on_exhaust"],
                        **limits,
                    )
                self.stdout.write(f"budget {budget.name}: {self._describe(budget)}")
        except SafetyError as exc:
            raise CommandError(str(exc)) from None

    def _describe(self, budget: Budget) -> str:
        limits = ", ".join(f"{f}={getattr(budget, f)}" for f in LIMIT_FIELDS if getattr(budget, f) is not None) or "no limits"
        return f"{budget.scope} {budget.target or '*'}{' tenant ' + budget.tenant if budget.tenant else ''} ({limits})"

    def _list(self) -> None:
        budgets = list(Budget.objects.all())
        if not budgets:
            self.stdout.write("no budgets")
        for budget in budgets:
            usage = usage_for(budget=budget)
            self.stdout.write(
                f"{budget.name}: {self._describe(budget)}; {usage.period} ({budget.timezone}): spent {usage.spent_minor} "
                f"reserved {usage.reserved_minor} {budget.currency}, requests {usage.requests}, attempts {usage.attempts}, "
                f"run {usage.run_seconds:.0f}s"
            )


argparse_unset = object()  # "not given" (distinct from "none", which clears the limit)
