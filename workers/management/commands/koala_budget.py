from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.errors import SafetyError
from workers.management.commands._common import cli_actor
from workers.models import Budget
from workers.services.budgets import LIMIT_FIELDS, create_budget, set_model_price, update_budget, usage_for

_LIMIT_OPTIONS = {
    "spend_limit_minor": "--spend",
    "request_limit": "--requests",
    "concurrency_limit": "--concurrency",
    "run_seconds_limit": "--run-seconds",
    "attempt_limit": "--attempts",
}


def _limit(value: str) -> int | None:
    """'none' or '' clears a limit; anything else must be a whole number (checked by the service)."""
    return None if value.lower() in ("", "none") else value  # type: ignore[return-value]


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
            cmd.add_argument("name")
            if name == "create":
                cmd.add_argument("--scope", required=True, help="global, queue or kind")
                cmd.add_argument("--target", default="", help="queue or kind name")
                cmd.add_argument("--tenant", default="")
                cmd.add_argument("--timezone", default="UTC")
                cmd.add_argument("--currency", default="EUR")
            for field, flag in _LIMIT_OPTIONS.items():
                cmd.add_argument(flag, dest=field, type=_limit, default=argparse_unset, help=f"{field} (none = no limit)")
            cmd.add_argument("--pause-on-exhaust", action="store_true", default=None)
            cmd.add_argument("--actor", default=None)
        price = sub.add_parser("price", help="set a model's price in minor units per million tokens")
        price.add_argument("model")
        price.add_argument("input_per_mtok", type=int)
        price.add_argument("output_per_mtok", type=int)
        price.add_argument("--actor", default=None)

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
