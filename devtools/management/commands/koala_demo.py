from __future__ import annotations

from datetime import date
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from devtools import demo
from koala import cli
from workers import kinds
from workers.models import Budget, ModelPrice, Scope
from workers.services import budgets
from workers.services.jobs import JobSpec, enqueue_many


class Command(BaseCommand):
    help = (
        "Create the demo's people (admin; alice, requester and reviewer; bob, reviewer; carol, member of globex), print "
        "their logins and keep them in $KOALA_DATA_DIR/logins.json, and seed demo jobs, reviews, exports and one "
        "operation that needs attention. Safe to run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--username", type=cli.username(get_user_model()), default="admin", help="the demo admin (default admin)"
        )
        parser.add_argument("--no-jobs", action="store_true", help="only ensure the demo's people and their logins")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        # The passwords are kept in the data folder so the printed logins stay valid across runs.
        logins, problems = demo.ensure_people(admin=username)
        stored = demo.write_logins(logins)
        self.stdout.write(self.style.SUCCESS("Demo logins:"))
        for login in logins:
            self.stdout.write(f"  {login.username:<8} password={login.password}  ({', '.join(login.roles)})")
        self.stdout.write(f"Stored in {stored} (readable by you only); the same passwords on every run.")
        key, key_file = demo.ensure_api_key(actor="koala_demo")
        self.stdout.write(f"Worker API key (scopes worker, execute; kept in {key_file}): {key}")
        for problem in problems:
            self.stderr.write(problem)
        if options["no_jobs"]:
            return
        user = get_user_model().objects.get(username=username)
        specs = [JobSpec(kind="noop", input={"n": n}, idempotency_key=f"demo-noop-{n}") for n in range(5)]
        specs += [
            JobSpec(kind="sleep", input={"seconds": 3}, idempotency_key="demo-sleep"),
            JobSpec(kind="demo.flaky", input={"succeed_on": 2}, idempotency_key="demo-flaky"),
            JobSpec(kind="demo.flaky", input={"terminal": True}, idempotency_key="demo-terminal"),
            JobSpec(kind="sleep", input={"seconds": 1}, idempotency_key="demo-delayed", delay_seconds=30),
        ]
        specs += self.effect_specs()
        self.seed_safety()
        results = enqueue_many(specs=specs, created_by="koala_demo")
        # Alice's charges above the review threshold: she requested them, so four-eyes leaves
        # their approval to another reviewer (bob). The second one is a duplicate, to reject.
        results += enqueue_many(specs=self.review_specs(), created_by="alice")
        created = sum(r.created for r in results)
        self.stdout.write(f"Demo jobs: {created} new, {len(results) - created} already present")
        if apps.is_installed("exports"):
            self.seed_exports(user)
        demo.seed_uncertain_operation(stdout=self.stdout)

    def seed_exports(self, user: Any) -> None:
        """100k demo events (COPY, about a second), the demo people's memberships, and one
        export of acme that alice requested (she and the admin may download it)."""
        from exports.models import Account, Event, Export
        from exports.services import request_export

        if not Event.objects.exists():
            call_command(
                "koala_demo_data", "--rows", "100000", "--accounts", "3", "--member", user.get_username(), "--actor", "koala_demo"
            )
        demo.grant_memberships(actor="koala_demo")
        alice = get_user_model().objects.get(username="alice")
        account = Account.objects.filter(members=alice).order_by("pk").first()
        if account is None or Export.objects.exists():
            return
        export = request_export(user=alice, account_id=account.pk, date_from=date(2026, 1, 1), date_to=date(2026, 3, 31))
        self.stdout.write(
            f"Demo export {export.pk} of {account.slug} requested by alice; download it at /exports/{export.pk}/download/"
        )

    def seed_safety(self) -> None:
        """A price for the demo model and a daily budget, so cost and limits show from the start."""
        if not ModelPrice.objects.filter(model="m-small").exists():
            budgets.set_model_price(model="m-small", input_minor_per_mtok=300, output_minor_per_mtok=1500, actor="koala_demo")
        if not Budget.objects.filter(name="demo-daily").exists():
            budgets.create_budget(
                name="demo-daily",
                scope=Scope.GLOBAL,
                timezone="Europe/Paris",
                spend_limit_minor=50_000,
                request_limit=1_000,
                actor="koala_demo",
            )

    def review_specs(self) -> list[JobSpec]:
        """Two charges above the review threshold (50.00), when a payment provider is set."""
        if not settings.KOALA_PAYMENTS_URL or "shop.order_and_charge" not in {k.name for k in kinds.served()}:
            return []
        return [
            JobSpec(
                kind="shop.order_and_charge",
                input={"reference": reference, "amount_minor": amount, "currency": "EUR", "description": description},
                idempotency_key=reference,
            )
            for reference, amount, description in (
                ("demo-order-2", 7500, "annual plan, invoice 2231"),
                ("demo-order-3", 7500, "annual plan, invoice 2231 (sent twice)"),
            )
        ]

    def effect_specs(self) -> list[JobSpec]:
        """The side-effect kinds, for the providers that are configured (docs/effects.md).

        An email always (without EMAIL_HOST the console mailer prints it); an order and charge
        below and one above the review threshold when a payment provider is set; a model call
        when a model API is set. The test provider serves both:
        ``python -m devtools.sandbox.provider --port 8765 --state .koala-data/provider.jsonl``.
        """
        specs = [
            JobSpec(
                kind="email.send",
                input={"to": "demo@example.com", "subject": "Welcome", "template": "welcome", "context": {"name": "Demo"}},
                idempotency_key="demo-email-welcome",
            )
        ]
        if settings.KOALA_PAYMENTS_URL:
            for reference, amount in (("demo-order-1", 1200),):
                specs.append(
                    JobSpec(
                        kind="shop.order_and_charge",
                        input={"reference": reference, "amount_minor": amount, "currency": "EUR"},
                        idempotency_key=reference,
                    )
                )
        if settings.KOALA_MODELS_URL:
            specs.append(
                JobSpec(
                    kind="model.complete",
                    input={"model": "m-small", "prompt": "Summarise the day's orders in one line.", "max_tokens": 64},
                    idempotency_key="demo-model-1",
                )
            )
        # Only the kinds this deployment registers (KOALA_JOB_KIND_MODULES may leave them out).
        registered = {kind.name for kind in kinds.served()}
        return [spec for spec in specs if spec.kind in registered]
