"""Secrets of every shape the redaction contract covers, new for each test run.

    from tests.planted import planted
    secrets = planted()
    job_input = secrets.job_input()          # for the ``leaky`` test kind (tests/kinds.py)
    assert not secrets.leaks(html), secrets.leaks(html)

Each value is generated (``secrets.token_hex``), so a test can only find it where the run put
it, and ``leaks(text)`` lists every planted value, or distinctive fragment of a long one, that
``text`` still contains. Share it: the redaction tests, the Sentry tests and the page crawl all
plant and look for the same shapes.
"""

from __future__ import annotations

import base64
import json
import random
import secrets as stdlib_secrets
from dataclasses import dataclass
from functools import cached_property
from typing import Any

# A fragment this long of a long value must never survive anywhere (koala.redaction masks
# every window of FRAGMENT_WINDOW = 20 characters; 24 leaves room for a window's edges).
FRAGMENT = 24

_WORDS = (
    "ledger", "harbour", "quartz", "meadow", "lantern", "copper", "orchid", "falcon", "glacier",
    "saffron", "tundra", "velvet", "walnut", "zephyr", "basalt", "cinder", "juniper", "marble",
)  # fmt: skip


def luhn_card() -> str:
    """16 digits that pass the Luhn check (like a real card number), starting with 4."""
    digits = [4] + [stdlib_secrets.randbelow(10) for _ in range(14)]
    total = 0
    for index, digit in enumerate(reversed(digits)):
        # The check digit will sit at index 0 of the reversed number: these start at index 1.
        doubled = digit * 2 if index % 2 == 0 else digit
        total += doubled - 9 if doubled > 9 else doubled
    return "".join(map(str, digits)) + str((10 - total % 10) % 10)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _text(length: int, rng: random.Random) -> str:
    """Prose-like text in which every 24-character stretch holds a word unique to this run."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < length:
        words.append(f"{rng.choice(_WORDS)}{stdlib_secrets.token_hex(2)}")
    return " ".join(words)


@dataclass(frozen=True)
class Planted:
    bearer_token: str  # sk_live_…, sent as "Authorization: Bearer <token>"
    project_key: str  # sk-proj-…
    aws_key: str  # AKIA…
    url_password: str  # inside url
    url: str  # scheme://user:password@host/…
    jwt: str
    card: str  # 16 Luhn-valid digits
    declared: str  # a short value under a field the ``leaky`` kind declares sensitive (no known shape)
    prompt: str  # a long prompt (> 300 characters) under ``prompt``
    document: str  # a long document (> 300 characters) under ``dossier``, declared sensitive

    @property
    def bearer(self) -> str:
        return f"Authorization: Bearer {self.bearer_token}"

    @property
    def card_spaces(self) -> str:
        return " ".join(self.card[i : i + 4] for i in range(0, 16, 4))

    @property
    def card_dashes(self) -> str:
        return "-".join(self.card[i : i + 4] for i in range(0, 16, 4))

    @property
    def card_plus(self) -> str:
        """As a URL-encoded form or query string writes the spaced number."""
        return "+".join(self.card[i : i + 4] for i in range(0, 16, 4))

    @property
    def card_pct(self) -> str:
        return "%20".join(self.card[i : i + 4] for i in range(0, 16, 4))

    def free_text(self) -> str:
        """One line of free text carrying every pattern-shaped secret."""
        return (
            f"{self.bearer}; key {self.project_key}; aws {self.aws_key}; repo {self.url}; jwt {self.jwt}; "
            f"cards {self.card_spaces} / {self.card_dashes} / {self.card_plus}"
        )

    def quote(self) -> str:
        """A memo quoting the declared value and distinctive fragments of the long ones."""
        middle = len(self.document) // 2
        return (
            f"re {self.declared}: starts '{self.prompt[:100]}' and says '{self.document[middle : middle + 30]}'"
            f" then '{self.document[-40:]}'"
        )

    def job_input(self, **extra: Any) -> dict[str, Any]:
        """Input for the ``leaky`` kind: each secret under its own field, and quoted in ``memo``."""
        return {
            "pin": self.declared,
            "prompt": self.prompt,
            "dossier": self.document,
            "memo": self.quote(),
            "note": self.free_text(),
            **extra,
        }

    @cached_property
    def needles(self) -> dict[str, str]:
        """Every literal that must never appear, by name."""
        return {
            "bearer token": self.bearer_token,
            "sk-proj key": self.project_key,
            "AKIA key": self.aws_key,
            "URL password": self.url_password,
            "JWT": self.jwt,
            "JWT signature": self.jwt.rsplit(".", 1)[1],
            "card": self.card,
            "card (spaces)": self.card_spaces,
            "card (dashes)": self.card_dashes,
            "card (+)": self.card_plus,
            "card (%20)": self.card_pct,
            "declared value": self.declared,
        }

    def leaks(self, text: str | bytes) -> list[str]:
        """What of the planted secrets ``text`` still holds: names of literals, and for the long
        values the first surviving fragment of FRAGMENT characters (any window, step 1)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        # JSON-escaped text (an envelope, a --json dump) holds the same characters here: the
        # planted values are plain ASCII without quotes or backslashes.
        found = [name for name, needle in self.needles.items() if needle in text]
        for name, value in (("prompt", self.prompt), ("document", self.document)):
            for start in range(len(value) - FRAGMENT + 1):
                window = value[start : start + FRAGMENT]
                if window in text:
                    found.append(f"{name} fragment {window!r}")
                    break
        return found


def planted() -> Planted:
    rng = random.Random(stdlib_secrets.randbits(64))
    password = f"pw{stdlib_secrets.token_hex(8)}"
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64(json.dumps({"sub": stdlib_secrets.token_hex(6), "scope": "admin"}).encode())
    return Planted(
        bearer_token=f"sk_live_{stdlib_secrets.token_hex(12)}",
        project_key=f"sk-proj-{stdlib_secrets.token_hex(16)}",
        aws_key="AKIA" + stdlib_secrets.token_hex(8).upper(),
        url_password=password,
        url=f"https://deploy:{password}@git.example.com/app.git",
        jwt=f"{header}.{payload}.{_b64(stdlib_secrets.token_bytes(32))}",
        card=luhn_card(),
        declared=f"zq{stdlib_secrets.token_hex(5)}",
        prompt="Summarise for the board: " + _text(420, rng),
        document="Clause one. " + _text(640, rng),
    )
