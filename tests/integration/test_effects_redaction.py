"""Issue 3, test 9: secrets planted in a job's input, in the provider's error messages and in
the provider's answers never reach Koala's records, its log output or ``koala_reviews``.

These cases run in the test process against the loopback provider; the end-to-end case, with a
real worker subprocess and its log output, is tests/acceptance/test_effects_redaction.py.
"""

from __future__ import annotations

import logging

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.inprocess import drain, run_until
from tests.planted import planted
from tests.support.effects import PROVIDER_API_KEY
from workers.models import Operation
from workers.services.jobs import enqueue

# transaction=True: the in-process runtime (tests/inprocess.py) needs committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "tok_live_Q7w8E9r0T1y2U3i4"  # credential-shaped


def test_an_operation_target_is_stored_redacted(provider: FakeProvider, redis_clean: None) -> None:
    job_id = enqueue(
        kind="shop.order_and_charge", input={"reference": f"o-11 {TOKEN}", "amount_minor": 900, "currency": "EUR"}
    ).job_id
    drain(job_id=job_id)
    targets = list(Operation.objects.filter(job_id=job_id).values_list("target", flat=True))
    assert len(targets) == 2
    assert all(TOKEN not in target and "[redacted]" in target for target in targets), targets


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_the_provider_client_logs_no_provider_text_unmasked(provider: FakeProvider, redis_clean: None) -> None:
    """The payment client logs a failed call at WARNING; the provider's message (here it echoes
    the job's sensitive description) reaches no handler unmasked: not Koala's (filtered), not one
    a deployer adds to the client's own logger (which runs before any filter on the root)."""
    secrets = planted()
    direct, root = _Lines(), _Lines()
    providers = logging.getLogger("koala.providers")
    providers.addHandler(direct)
    logging.getLogger().addHandler(root)
    description = f"gift for {secrets.declared}: {secrets.prompt[:60]}"
    try:
        provider.fault("5xx", resource="orders", status=500, message=f"upstream failed for {description}", times=1)
        job_id = enqueue(
            kind="shop.order_and_charge",
            input={"reference": "o-1", "amount_minor": 900, "currency": "EUR", "description": description},
        ).job_id
        run_until(job_id, "succeeded")
    finally:
        providers.removeHandler(direct)
        logging.getLogger().removeHandler(root)
    assert any("orders" in line and "500" in line for line in direct.lines), direct.lines
    for lines in (direct.lines, root.lines):
        text = "\n".join(lines)
        assert secrets.declared not in text and secrets.prompt[:30] not in text, text
        assert PROVIDER_API_KEY not in text
