"""One host's kind module for ``contract.demo@1`` (tests/acceptance/test_kind_contracts.py): its
other host loads tests/contract_kinds_b.py, which declares the same kind@version differently."""

from typing import Any

from workers import JobContext, job_kind


@job_kind("contract.demo", version=1, queue="default", max_attempts=3, required_fields={"order_id"})
def demo(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    return {"seen": data.get("order_id")}
