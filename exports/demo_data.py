"""The demo data set: accounts and their events, generated in bulk with COPY.

Rows are produced in time order (as an append-only event table fills up), with accounts,
users, amounts and details drawn from a seeded generator, so a given seed and size always
yield the same data. Text for COPY is built from precomputed pieces: the per-row Python
cost is a few list look-ups, which keeps generation near PostgreSQL's own ingest speed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from django.db import connection, transaction

from exports import sql
from exports.models import Account

DEMO_ACCOUNTS = [
    ("acme", "Acme Corporation"),
    ("globex", "Globex"),
    ("initech", "Initech"),
    ("umbrella", "Umbrella Health"),
    ("hooli", "Hooli"),
    ("soylent", "Soylent Foods"),
    ("wayne", "Wayne Enterprises"),
    ("stark", "Stark Industries"),
    ("tyrell", "Tyrell Corporation"),
    ("cyberdyne", "Cyberdyne Systems"),
]

EVENT_TYPES = ["login", "page_view", "page_view", "page_view", "search", "purchase", "refund", "invoice_paid", "logout"]
CURRENCIES = ["EUR", "EUR", "USD", "GBP", "JPY"]
COUNTRIES = ["FR", "DE", "JP", "US", "GB", "ES", "IT", "NL", "SE", "BR"]
# Some details need CSV quoting (commas, double quotes), as real report text does.
DETAILS = [
    "",
    "plan=pro",
    "plan=team",
    "source=mobile",
    "source=web",
    'coupon "SPRING", 10% off',
    "items=3, shipping=express",
    "ua=Mozilla/5.0",
    "query=invoices 2026",
    "note=ok",
]
CHUNK_ROWS = 50_000
DEFAULT_START = date(2026, 1, 1)
USERS_PER_ACCOUNT = 5_000
MAX_ACCOUNTS = 1_000
MAX_DAYS = 36_500
MAX_ROWS = 100_000_000  # about ten minutes of COPY here: more is a typo, not a demo


@dataclass(frozen=True)
class GeneratedData:
    rows: int
    accounts: list[int]
    start: date
    days: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def ensure_demo_accounts(*, count: int) -> list[Account]:
    """The first ``count`` demo accounts (created when missing), in a stable order."""
    if not 1 <= count <= MAX_ACCOUNTS:
        raise ValueError(f"the number of accounts must be between 1 and {MAX_ACCOUNTS}.")
    specs = [DEMO_ACCOUNTS[i] if i < len(DEMO_ACCOUNTS) else (f"account-{i + 1:04d}", f"Account {i + 1}") for i in range(count)]
    accounts = []
    for slug, name in specs:
        account, _ = Account.objects.get_or_create(slug=slug, defaults={"name": name})
        accounts.append(account)
    return accounts


def clear_events() -> None:
    """Remove every event (the demo data set only; exports keep their published objects)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.TRUNCATE_EVENTS)


def _tails(rng: random.Random, size: int) -> list[str]:
    """Precomputed row endings: event type, user, amount, currency, country, detail (tab-separated)."""
    tails = []
    for _ in range(size):
        event_type = rng.choice(EVENT_TYPES)
        amount = rng.randrange(100, 500_000) if event_type in {"purchase", "refund", "invoice_paid"} else 0
        if event_type == "refund":
            amount = -amount
        user = f"u-{rng.randrange(USERS_PER_ACCOUNT):06d}"
        tails.append(
            f"{event_type}\t{user}\t{amount}\t{rng.choice(CURRENCIES)}\t{rng.choice(COUNTRIES)}\t{rng.choice(DETAILS)}\n"
        )
    return tails


def generate_events(
    *, rows: int, accounts: Sequence[Account], start: date = DEFAULT_START, days: int = 365, seed: int = 1
) -> GeneratedData:
    """Append ``rows`` events spread over ``days`` days from ``start`` (UTC), each to one of ``accounts``.

    One transaction: a failure leaves no half-loaded data set.
    """
    if rows < 0:
        raise ValueError("rows cannot be negative.")
    if rows > MAX_ROWS:
        raise ValueError(f"rows must be at most {MAX_ROWS}.")
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be between 1 and {MAX_DAYS}.")
    if not accounts:
        raise ValueError("at least one account is needed.")
    rng = random.Random(seed)
    account_ids = [a.pk for a in accounts]
    day_prefix = [f"{start + timedelta(days=d):%Y-%m-%d} " for d in range(days)]
    second_suffix = [f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}+00\t" for s in range(86_400)]
    account_prefix = [f"{pk}\t" for pk in account_ids]
    tails = _tails(rng, 8192)
    span = days * 86_400
    step = span / rows if rows else 0.0
    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor, cursor.copy(sql.COPY_EVENTS_IN) as copy:
        written = 0
        while written < rows:
            n = min(CHUNK_ROWS, rows - written)
            lines = []
            for i in range(written, written + n):
                # Time order with jitter inside the step, like an append-only log.
                at = int(i * step + rng.random() * step) if step >= 1 else int(i * step)
                at = min(at, span - 1)
                lines.append(
                    account_prefix[rng.randrange(len(account_prefix))]
                    + day_prefix[at // 86_400]
                    + second_suffix[at % 86_400]
                    + tails[rng.getrandbits(13)]
                )
            copy.write("".join(lines))
            written += n
    with connection.cursor() as cursor:
        cursor.execute(sql.ANALYZE_EVENTS)
    return GeneratedData(rows=rows, accounts=account_ids, start=start, days=days, seconds=time.monotonic() - started)
