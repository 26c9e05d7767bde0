from __future__ import annotations

import os
import secrets
from datetime import date
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from koala import cli
from workers import kinds
from workers.models import Budget, ModelPrice
from workers.services import budgets
from workers.services.jobs import JobSpec, enqueue_many


class Command(BaseCommand):
    help = "Create the demo admin user (printing its login) and enqueue a few demo jobs. Safe to run again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--username", type=cli.username(get_user_model()), default="admin", help="the demo admin (default admin)"
        )
        parser.add_argument("--no-jobs", action="store_true", help="only ensure the admin user")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        username = options["username"]
        # The password is kept in the data folder so the printed login stays valid across runs.
        data_dir = Path(os.environ.get("KOALA_DATA_DIR", settings.BASE_DIR / ".koala-data"))
        data_dir.mkdir(parents=True, exist_ok=True)
        secret_file = data_dir / "demo-admin-password"
        if secret_file.exists():
            password = secret_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            secret_file.write_text(password + "\n")
            secret_file.chmod(0o600)
        user, _ = users.objects.get_or_create(username=username, defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(self.style.SUCCESS(f"Demo admin login: username={username} password={password}"))
        if options["no_jobs"]:
            return
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
        created = sum(r.created for r in results)
        self.stdout.write(f"Demo jobs: {created} new, {len(results) - created} already present")
        if apps.is_installed("exports"):
            self.seed_exports(user)

    def seed_exports(self, user: Any) -> None:
        """100k demo events (COPY, about a second) and one export the admin may download."""
        from exports.models import Account, Event, Export
        from exports.services import request_export

        if not Event.objects.exists():
            call_command(
                "koala_demo_data", "--rows", "100000", "--accounts", "3", "--member", user.get_username(), "--actor", "koala_demo"
            )
        account = Account.objects.filter(members=user).order_by("pk").first()
        if account is None or Export.objects.exists():
            return
        export = request_export(user=user, account_id=account.pk, date_from=date(2026, 1, 1), date_to=date(2026, 3, 31))
        self.stdout.write(f"Demo export {export.pk} of {account.slug} requested; download it at /exports/{export.pk}/download/")

    def seed_safety(self) -> None:
        """A price for the demo model and a daily budget, so cost and limits show from the start."""
        if not ModelPrice.objects.filter(model="m-small").exists():
            budgets.set_model_price(model="m-small", input_minor_per_mtok=300, output_minor_per_mtok=1500, actor="koala_demo")
        if not Budget.objects.filter(name="demo-daily").exists():
            budgets.create_budget(
                name="demo-daily",
                scope="global",
                timezone="Europe/Paris",
                spend_limit_minor=50_000,
                request_limit=1_000,
                actor="koala_demo",
            )

    def effect_specs(self) -> list[JobSpec]:
        """The side-effect kinds, for the providers that are configured (docs/effects.md).

        An email always (without EMAIL_HOST the console mailer prints it); an order and charge
        below and one above the review threshold when a payment provider is set; a model call
        when a model API is set. The test provider serves both:
        ``python -m tests.fakes.provider --port 8765 --state .koala-data/provider.jsonl``.
        """
        specs = [
            JobSpec(
                kind="email.send",
                input={"to": "demo@example.com", "subject": "Welcome", "template": "welcome", "context": {"name": "Demo"}},
                idempotency_key="demo-email-welcome",
            )
        ]
        if settings.KOALA_PAYMENTS_URL:
            for reference, amount in (("demo-order-1", 1200), ("demo-order-2", 7500)):
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
