"""workers.kinds.JobKind.contract_digest: what two hosts compare to find different kind modules."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workers.kinds import JobKind


def body(ctx: Any, data: dict[str, Any]) -> None:
    return None


def other_body(ctx: Any, data: dict[str, Any]) -> None:
    return None


def check(data: dict[str, Any]) -> None:
    return None


BASE = JobKind(name="k", version=1, body=body, required_fields=frozenset({"a", "b"}))


def test_the_same_declaration_gives_the_same_digest_whatever_the_body_or_the_order_of_fields() -> None:
    again = JobKind(name="k", version=1, body=other_body, required_fields=frozenset({"b", "a"}))
    assert BASE.contract_digest == again.contract_digest


def test_each_part_of_the_contract_changes_the_digest() -> None:
    variants = [
        replace(BASE, queue="other"),
        replace(BASE, max_attempts=9),
        replace(BASE, timeout_seconds=1.0),
        replace(BASE, required_fields=frozenset({"a"})),
        replace(BASE, sensitive_fields=frozenset({"card"})),
        replace(BASE, validate=check),
        replace(BASE, max_input_bytes=10),
        replace(BASE, critical={"charge": "always"}),
        replace(BASE, memory_limit_mb=64),
    ]
    digests = {kind.contract_digest for kind in variants}
    assert len(digests) == len(variants) and BASE.contract_digest not in digests
