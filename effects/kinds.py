"""Built-in kinds whose work touches the outside world, each step through the operations ledger.

- ``email.send``: one message through Django's mailer (templates in effects/templates/koala/email/).
- ``shop.order_and_charge``: create an order, then charge it, at the payment provider; the
  charge needs a reviewer's approval above 50.00 in the order's currency.
- ``model.complete``: one priced model call; usage in tokens, cost priced by Koala from ModelPrice,
  reserved first at its upper bound (``token_bound``: prompt bytes in, ``max_tokens`` out).

Inputs are references and small values, never secrets: the provider credentials come from
settings, a message body from a template. A prompt is the one document a job carries: the
ledger keeps only its SHA-256, and ``prompt`` is an always-sensitive key, masked in admin pages,
error messages and logs. Each step passes its operation key to the provider as the idempotency
key and gives ``reconcile`` a lookup by that key, so a re-run after a crash or a timeout finds
what was done instead of doing it again (docs/effects.md).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.template import TemplateDoesNotExist
from django.template.loader import get_template

from effects.providers import email, models, payments
from workers import (
    ABSENT,
    JobContext,
    Miss,
    OperationResult,
    Processing,
    ReconcileAnswer,
    TerminalFailure,
    applicable_budgets,
    job_kind,
    model_price,
    price_tokens,
)

if TYPE_CHECKING:
    from workers import ModelPrice

MAX_RECIPIENTS = 10
TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
CURRENCY = re.compile(r"^[A-Z]{3}$")
CHARGE_REVIEW_ABOVE_MINOR = 5000
# The one limit a model call's input has, as people count a prompt: characters. The kind's input
# limit is derived from it (MODEL_INPUT_BYTES), so the engine never refuses a prompt this allows.
MAX_PROMPT_CHARS = 20_000
# A prompt character costs at most 6 bytes of JSON (a control character, written \u0001; a CJK one
# is 3, an emoji 4), plus room for the other fields (model, max_tokens, tenant, …).
MODEL_INPUT_BYTES = 6 * MAX_PROMPT_CHARS + 4_096


def _found(answer: dict[str, Any] | object | None, result: Any) -> ReconcileAnswer:
    """A provider lookup turned into what reconcile returns: the result, or the lookup's own
    verdict passed through (ABSENT, a Miss or Processing, which the ledger weighs against the
    provider's processing window), or None (cannot tell)."""
    if isinstance(answer, dict):
        return result(answer)
    if isinstance(answer, Miss | Processing):
        return answer
    return ABSENT if answer is ABSENT else None


def _external_id(result: dict[str, Any]) -> str:
    """The provider's id from a step's result: ours carry ``id``; one a person resolved as
    happened (workers.services.operations.resolve_operation) carries ``external_id``."""
    return str(result.get("id") or result.get("message_id") or result.get("external_id") or "")


def _small_context(value: Any) -> None:
    if not isinstance(value, dict) or len(value) > 20:
        raise ValueError("'context' must be an object of at most 20 entries")
    for key, item in value.items():
        if not isinstance(item, str | int | float | bool) or (isinstance(item, str) and len(item) > 200):
            raise ValueError(f"'context.{key}' must be a short string, a number or a boolean (references, not documents)")


# -- email.send ------------------------------------------------------------------------------------
def _recipients(data: dict[str, Any]) -> list[str]:
    to = data["to"]
    return [to] if isinstance(to, str) else list(to)


def _validate_email_input(data: dict[str, Any]) -> None:
    to = data.get("to")
    if not (isinstance(to, str) or (isinstance(to, list) and to and all(isinstance(a, str) for a in to))):
        raise ValueError("'to' must be an address or a non-empty list of addresses")
    addresses = _recipients(data)
    if len(addresses) > MAX_RECIPIENTS:
        raise ValueError(f"'to' holds at most {MAX_RECIPIENTS} addresses")
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError:
            raise ValueError(f"'to' has an invalid address: {address!r}") from None
    subject = data.get("subject")
    if not isinstance(subject, str) or not subject.strip() or len(subject) > 200 or "\n" in subject or "\r" in subject:
        raise ValueError("'subject' must be one line of 1-200 characters")
    template = data.get("template")
    if not isinstance(template, str) or not TEMPLATE_NAME.match(template):
        raise ValueError("'template' must name a template in koala/email/ (lowercase letters, digits, - and _)")
    try:
        get_template(f"koala/email/{template}.txt")
    except TemplateDoesNotExist:
        raise ValueError(f"there is no email template {template!r}") from None
    _small_context(data.get("context", {}))


@job_kind(
    "email.send",
    version=1,
    queue="default",
    max_attempts=5,
    timeout_seconds=120,
    backoff_base=2,
    backoff_cap=300,
    required_fields={"to", "subject", "template"},
    validate=_validate_email_input,
)
def send_email(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    to = _recipients(data)
    context = dict(data.get("context", {}))
    try:
        body = get_template(f"koala/email/{data['template']}.txt").render(context).strip() + "\n"
    except TemplateDoesNotExist:
        # Deployed without the template the job was enqueued with: no retry brings it back.
        raise TerminalFailure(f"email template {data['template']!r} is missing on this worker", code="template_missing") from None
    subject = data["subject"]

    def perform(key: str) -> OperationResult:
        sent = email.send(key=key, to=to, subject=subject, body=body)
        return OperationResult(external_id=sent["message_id"], data=sent)

    sent = ctx.operation(
        "send",
        kind="email",
        # The request as the job defined it (template + context), so a re-run after a template
        # edit still matches its own earlier row instead of failing as "other parameters".
        params={"to": to, "subject": subject, "template": data["template"], "context": context},
        perform=perform,
        # SMTP offers no lookup: an unknown outcome goes to a person, never a blind re-send.
        reconcile=None,
        target=", ".join(to),
    )
    return {"message_id": _external_id(sent), "recipients": len(to)}


# -- shop.order_and_charge --------------------------------------------------------------------------
def _validate_order_input(data: dict[str, Any]) -> None:
    reference = data.get("reference")
    if not isinstance(reference, str) or not 1 <= len(reference) <= 100:
        raise ValueError("'reference' must be a string of 1-100 characters (your order reference)")
    amount = data.get("amount_minor")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ValueError("'amount_minor' must be a positive integer (minor currency units)")
    if not isinstance(data.get("currency"), str) or not CURRENCY.match(data["currency"]):
        raise ValueError("'currency' must be a 3-letter ISO code in capitals")
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > 500:
        raise ValueError("'description' must be a string of at most 500 characters")


def _order_result(order: dict[str, Any]) -> OperationResult:
    # Keep what the next step and a person need; never the whole answer.
    kept = {k: order.get(k) for k in ("id", "status", "reference", "amount_minor", "currency")}
    return OperationResult(external_id=str(order["id"]), data=kept, cost_minor=0)


def _charge_result(charge: dict[str, Any]) -> OperationResult:
    # The provider's answer also carries a client secret and customer text: not kept.
    kept = {k: charge.get(k) for k in ("id", "status", "order", "amount_minor", "currency")}
    return OperationResult(external_id=str(charge["id"]), data=kept, cost_minor=int(charge["amount_minor"]))


@job_kind(
    "shop.order_and_charge",
    version=1,
    queue="default",
    max_attempts=5,
    timeout_seconds=120,
    backoff_base=1,
    backoff_cap=120,
    required_fields={"reference", "amount_minor", "currency"},
    # Free text a customer or an operator typed: masked in every record and message.
    sensitive_fields={"description"},
    validate=_validate_order_input,
    critical={"charge": {"above_minor": CHARGE_REVIEW_ABOVE_MINOR}},
)
def order_and_charge(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    client = payments.client()
    reference, amount, currency = data["reference"], int(data["amount_minor"]), data["currency"]
    description = data.get("description", "")

    order = ctx.operation(
        "order",
        kind="order",
        params={"reference": reference, "amount_minor": amount, "currency": currency, "description": description},
        perform=lambda key: _order_result(
            client.create_order(key=key, reference=reference, amount_minor=amount, currency=currency, description=description)
        ),
        reconcile=lambda key: _found(client.lookup_order(key), _order_result),
        target=reference,
    )
    order_id = _external_id(order)
    charge = ctx.operation(
        "charge",
        kind="charge",
        params={"order": order_id, "amount_minor": amount, "currency": currency},
        perform=lambda key: _charge_result(
            client.charge(key=key, order=order_id, amount_minor=amount, currency=currency, description=description)
        ),
        reconcile=lambda key: _found(client.lookup_charge(key), _charge_result),
        estimate_minor=amount,
        amount_minor=amount,
        currency=currency,
        target=reference,
    )
    return {
        "order": order_id,
        "charge": _external_id(charge),
        "status": charge.get("status", "resolved_manually"),
        "amount_minor": amount,
        "currency": currency,
    }


# -- model.complete ----------------------------------------------------------------------------------
# Every call names its output bound (the provider stops generating at max_tokens): the job's
# own value, or this default, never the provider's.
DEFAULT_MAX_TOKENS = 256
MAX_OUTPUT_TOKENS = models.MAX_OUTPUT_TOKENS


def _max_tokens(data: dict[str, Any]) -> int:
    max_tokens = data.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
        raise ValueError(f"'max_tokens' must be an integer from 1 to {MAX_OUTPUT_TOKENS}")
    return max_tokens


def _validate_model_input(data: dict[str, Any]) -> None:
    if not isinstance(data.get("model"), str) or not 1 <= len(data["model"]) <= 100:
        raise ValueError("'model' must name a model")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not 1 <= len(prompt) <= MAX_PROMPT_CHARS:
        raise ValueError(f"'prompt' must be a string of 1-{MAX_PROMPT_CHARS} characters")
    _max_tokens(data)


def token_bound(*, prompt: str, max_tokens: int) -> dict[str, int]:
    """The most tokens a call can be billed, from facts rather than a guess at density.

    Input: a byte-level tokenizer (BPE over UTF-8 bytes, as the model APIs use) merges bytes
    and never splits one, so it yields at most one token per UTF-8 byte of the prompt;
    digits, emoji and rare scripts come close to that, prose is far below. Output: the
    provider stops at ``max_tokens``. A provider that bills past this is breaking its own
    contract: the ledger records the overshoot and pauses the budget's scope.
    """
    if not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
        raise ValueError(f"max_tokens must be 1..{MAX_OUTPUT_TOKENS}, not {max_tokens}")
    return {"input_tokens": len(prompt.encode("utf-8")), "output_tokens": max_tokens}


def _completion_result(completion: dict[str, Any], price: ModelPrice | None = None) -> OperationResult:
    usage = completion.get("usage") or {}
    tokens_in, tokens_out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    tokens = {"model": str(completion.get("model", "")), "input_tokens": tokens_in, "output_tokens": tokens_out}
    return OperationResult(
        external_id=str(completion["id"]),
        data={"id": completion["id"], "output": completion.get("output", ""), "usage": tokens},
        # Koala prices the tokens, at the price the reservation was made with, so an edit of the
        # price table while the call runs cannot turn into a cost above its reservation.
        cost_minor=None if price is None else price_tokens(price, input_tokens=tokens_in, output_tokens=tokens_out),
        usage=tokens,
        summary={"id": completion["id"], "model": tokens["model"], "usage": tokens},
    )


@job_kind(
    "model.complete",
    version=1,
    queue="default",
    max_attempts=5,
    timeout_seconds=300,
    backoff_base=2,
    backoff_cap=120,
    required_fields={"model", "prompt"},
    sensitive_fields={"prompt"},
    validate=_validate_model_input,
    max_input_bytes=MODEL_INPUT_BYTES,
)
def complete(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    client = models.client()
    model, prompt, max_tokens = data["model"], data["prompt"], _max_tokens(data)
    price = model_price(model)
    if price is None:
        # Without a price the cost cannot be bounded, so no spend cap could hold it.
        capped = [
            b.name
            for b in applicable_budgets(kind=ctx.lease.kind, queue=ctx.lease.queue, tenant=ctx.lease.tenant)
            if b.spend_limit_minor is not None
        ]
        if capped:
            raise TerminalFailure(
                f"model {model!r} has no price, so its cost cannot be bounded under the spend limit of "
                f"{', '.join(repr(name) for name in capped)}; set its price, then retry the job",
                code="unpriced_model",
            )
    # Reserve the most this call can cost (token_bound, priced and rounded up): with a true
    # upper bound, concurrent reservations that fit the cap cannot spend past it.
    bound = token_bound(prompt=prompt, max_tokens=max_tokens)
    estimate = 0 if price is None else price_tokens(price, **bound)

    def result(answer: dict[str, Any]) -> OperationResult:
        return _completion_result(answer, price)

    completion = ctx.operation(
        "complete",
        kind="model_call",
        # The prompt is fingerprinted by digest and never stored.
        params={"model": model, "max_tokens": max_tokens, "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest()},
        perform=lambda key: result(client.complete(key=key, model=model, prompt=prompt, max_tokens=max_tokens)),
        reconcile=lambda key: _found(client.lookup(key), result),
        estimate_minor=estimate,
        target=model,
    )
    return {"completion": _external_id(completion), "usage": completion.get("usage"), "output": completion.get("output")}
