"""The other host's ``contract.demo@1`` (see tests/contract_kinds_a.py): the same name and version,
another contract (more attempts, another required field, a secret field)."""

from typing import Any

from workers import JobContext, job_kind


@job_kind(
    "contract.demo",
    version=1,
    queue="default",
    max_attempts=5,
    required_fields={"order"},
    sensitive_fields={"card"},
)
def demo(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    return {"seen": data.get("order")}
