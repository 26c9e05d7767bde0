"""Job kinds used only by the tests. Loaded through KOALA_JOB_KIND_MODULES.

``probe`` writes one line per body start and one per body end to a log file
named in its input. The file is outside Koala (the "outside world"), so counting
its lines counts real executions of the body, whatever Koala's own records say.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from workers import Delivery, JobContext, Retryable, TerminalFailure, job_kind, remote_kind


def effect(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def effect_lines(path: str) -> list[list[str]]:
    try:
        with open(path) as handle:
            return [line.split() for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def _probe(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    log = data["log"]
    effect(log, f"start {ctx.job_id} {ctx.attempt} {os.getpid()}")
    deadline = time.monotonic() + float(data.get("seconds", 0))
    while time.monotonic() < deadline:
        if data.get("cooperative", True) and ctx.cancelled.is_set():
            ctx.checkpoint()
        time.sleep(0.02)
    effect(log, f"end {ctx.job_id} {ctx.attempt} {os.getpid()}")
    return {"pid": os.getpid()}


job_kind("probe", version=1, queue="default", max_attempts=3, timeout_seconds=120, backoff_base=0.05, backoff_cap=0.2)(_probe)
job_kind("probe_once", version=1, queue="default", delivery=Delivery.AT_MOST_ONCE, max_attempts=1, timeout_seconds=120)(_probe)


@job_kind("transient", version=1, queue="default", max_attempts=4, backoff_base=0.2, backoff_cap=0.5)
def transient(ctx: JobContext, data: dict[str, Any]) -> None:
    raise Retryable(f"provider returned 503 (attempt {ctx.attempt})")


@job_kind("terminal", version=1, queue="default", max_attempts=4)
def terminal(ctx: JobContext, data: dict[str, Any]) -> None:
    raise TerminalFailure("account is not authorized", code="unauthorized")


@job_kind("boom", version=1, queue="default", max_attempts=4, sensitive_fields={"card"})
def boom(ctx: JobContext, data: dict[str, Any]) -> None:
    # The message carries secrets on purpose: they must not reach the database.
    raise ValueError(f"charge failed for card {data.get('card')} with Authorization: Bearer {data.get('bearer', '')}")


@job_kind(
    "slow_uncooperative", version=1, queue="default", max_attempts=2, timeout_seconds=0.5, backoff_base=0.01, backoff_cap=0.01
)
def slow_uncooperative(ctx: JobContext, data: dict[str, Any]) -> None:
    time.sleep(float(data.get("seconds", 5)))


@job_kind("versioned", version=1, queue="default", max_attempts=3)
def versioned_v1(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    if "log" in data:
        effect(data["log"], f"v1 {ctx.job_id} {os.getpid()}")
    return {"served_by": "v1", "pid": os.getpid()}


# Workers started with KOALA_TEST_NO_V2=1 lack version 2: the rolling-deploy case (R17).
if os.environ.get("KOALA_TEST_NO_V2") != "1":

    @job_kind("versioned", version=2, queue="default", max_attempts=3)
    def versioned_v2(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
        if "log" in data:
            effect(data["log"], f"v2 {ctx.job_id} {os.getpid()}")
        time.sleep(float(data.get("seconds", 0)))  # keeps the only v2 worker busy (rolling-deploy tests)
        return {"served_by": "v2", "pid": os.getpid()}


# --- Added for the acceptance fault tests (tests/acceptance/test_faults.py) ---------------------


def _probe_long_first(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Like ``probe``, but the job's first execution (no earlier 'start' line for this job in
    the log) runs ``first_seconds`` and ignores cancellation unless ``first_cooperative``; later
    executions run ``seconds``. Lets a test interrupt a long first run without waiting as long
    for the replacement run."""
    log = data["log"]
    earlier = [line for line in effect_lines(log) if line[:2] == ["start", str(ctx.job_id)]]
    effect(log, f"start {ctx.job_id} {ctx.attempt} {os.getpid()}")
    seconds = float(data.get("first_seconds", 20)) if not earlier else float(data.get("seconds", 0))
    cooperative = data.get("cooperative", True) if earlier else data.get("first_cooperative", False)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cooperative and ctx.cancelled.is_set():
            ctx.checkpoint()
        time.sleep(0.02)
    effect(log, f"end {ctx.job_id} {ctx.attempt} {os.getpid()}")
    return {"pid": os.getpid()}


job_kind("probe_long_first", version=1, queue="default", max_attempts=3, timeout_seconds=120)(_probe_long_first)


@job_kind("backoff_probe", version=1, queue="default", max_attempts=4, backoff_base=0.2, backoff_cap=0.5)
def backoff_probe(ctx: JobContext, data: dict[str, Any]) -> None:
    """Always transient. Records, at the start of each attempt, the job's scheduled_at as the
    engine stored it: for attempt n > 1 that is the time the previous retry scheduled."""
    from workers.models import Job

    scheduled_at = Job.objects.values_list("scheduled_at", flat=True).get(pk=ctx.job_id)
    effect(data["log"], f"try {ctx.job_id} {ctx.attempt} {os.getpid()} {scheduled_at.isoformat()}")
    raise Retryable(f"storage blip (attempt {ctx.attempt})")


# -- The safety layer's "outside world": an idempotent provider kept in a file -----------------
#
# Effects are lines "effect <key> <amount> <pid>" appended with fsync, so counting them counts
# real external effects across processes and kill -9. Like a real provider, a repeated key
# does not create a second effect, and lookup(key) answers found / absent.


def world_effects(path: str, key: str | None = None) -> list[list[str]]:
    return [line for line in effect_lines(path) if line[0] == "effect" and (key is None or line[1] == key)]


def _world_charge(path: str, key: str, amount: int) -> None:
    if not world_effects(path, key):
        effect(path, f"effect {key} {amount} {os.getpid()}")


def _world_lookup(path: str, key: str) -> Any:
    from workers import ABSENT, OperationResult

    found = world_effects(path, key)
    if not found:
        return ABSENT
    return OperationResult(external_id=f"ch_{key[-12:]}", data={"charged": int(found[0][2])})


def _marker(path: str, name: str) -> bool:
    """True the first time ``name`` is seen for this world file (scripted one-off faults)."""
    flag = f"{path}.{name}"
    if os.path.exists(flag):
        return False
    effect(flag, "seen")
    return True


def _charge_body(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    from workers import Declined, NotPerformed, OperationResult, OutcomeUnknown

    world = data["world"]
    amount = int(open(data["amount_file"]).read().strip()) if "amount_file" in data else int(data.get("amount", 100))
    mode = data.get("mode", "")
    effect(world, f"start {ctx.job_id} {ctx.attempt}")
    if ctx.attempt == 1 and data.get("first_attempt_sleep"):
        time.sleep(float(data["first_attempt_sleep"]))  # a long first attempt: room to partition it

    def perform(key: str) -> OperationResult:
        # Every call that reaches the provider, with the caller's pid: "which attempt sent it".
        effect(world, f"call {key} {ctx.attempt} {os.getpid()}")
        if mode == "declined":
            raise Declined("card declined")
        if mode == "not_performed_once" and _marker(world, "np"):
            raise NotPerformed("429 too many requests", retry_after=0.05)
        if mode == "secret_error":
            raise Declined(f"provider said no for card {data.get('card_number')} with token {data.get('api_token')}")
        _world_charge(world, key, amount)
        if mode == "crash_after_effect" and _marker(world, "crash"):
            os.kill(os.getpid(), 9)
        if mode == "unknown_once" and _marker(world, "unknown"):
            raise OutcomeUnknown("read timed out after the provider committed")
        extra = {"echo": f"token sk_live_{'a' * 24} card 4242 4242 4242 4242"} if mode == "secret_response" else {}
        return OperationResult(external_id=f"ch_{key[-12:]}", data={"charged": amount, **extra}, cost_minor=amount)

    reconcile = None if data.get("no_lookup") else (lambda key: _world_lookup(world, key))
    if data.get("raw_lookup"):
        # A kind's mistake: the provider's raw answer handed back instead of an OperationResult.
        reconcile = lambda key: {"found": bool(world_effects(world, key))}  # noqa: E731
    result = ctx.operation(
        "charge",
        kind="charge",
        params={"amount_minor": amount, "customer": data.get("customer", "cus_1")},
        perform=perform,
        reconcile=reconcile,
        estimate_minor=amount,
        amount_minor=amount,
        currency="EUR",
        target=data.get("customer", "cus_1"),
    )
    if mode == "retry_after_op_once" and _marker(world, "after"):
        raise Retryable("a later step failed; the retry must not charge again")
    effect(world, f"end {ctx.job_id} {ctx.attempt}")
    return result


job_kind(
    "tests.charge",
    version=1,
    queue="default",
    max_attempts=5,
    timeout_seconds=30,
    backoff_base=0.05,
    backoff_cap=0.2,
    sensitive_fields={"api_token"},
    critical={"charge": {"above_minor": 5000}},
)(_charge_body)


def _spend_body(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """A priced call of fixed estimate: for budget tests (several run at once in several workers)."""
    from workers import OperationResult

    world = data["world"]

    def perform(key: str) -> OperationResult:
        time.sleep(float(data.get("seconds", 0.05)))
        _world_charge(world, key, int(data["cost"]))
        return OperationResult(external_id=key, data={"ok": True}, cost_minor=int(data["cost"]))

    return ctx.operation(
        "spend",
        kind="model_call",
        params={"n": data.get("n", 0)},
        perform=perform,
        reconcile=lambda key: _world_lookup(world, key),
        estimate_minor=int(data["cost"]),
    )


job_kind("tests.spend", version=1, queue="default", max_attempts=3, timeout_seconds=30, backoff_base=0.05)(_spend_body)


def _crash_body(ctx: JobContext, data: dict[str, Any]) -> None:
    """Dies like a segfault or an OOM kill: the worker process (or fork horse) vanishes."""
    os.kill(os.getpid(), 9)


job_kind("tests.crash", version=1, queue="default", max_attempts=1, timeout_seconds=30)(_crash_body)


def _steady_body(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Runs ``seconds`` in small steps, checkpointing between them (a cooperative long body)."""
    log = data["log"]
    effect(log, f"start {ctx.job_id} {ctx.attempt}")
    deadline = time.monotonic() + float(data.get("seconds", 1))
    while time.monotonic() < deadline:
        ctx.checkpoint()
        time.sleep(0.05)
    effect(log, f"end {ctx.job_id} {ctx.attempt}")
    return {"done": True}


job_kind("tests.steady", version=1, queue="default", max_attempts=3, timeout_seconds=60)(_steady_body)


def _leaky_body(ctx: JobContext, data: dict[str, Any]) -> None:
    """Repeats what it was given everywhere a careless body would (tests/acceptance/test_console_crawl.py):
    an operation's parameters, target and result, and the error message it fails with."""
    from workers import OperationResult

    note, code = data["note"], data["customer_code"]
    ctx.operation(
        "notify",
        kind="email",
        params={"note": note, "customer_code": code},
        perform=lambda key: OperationResult(external_id=f"msg-{ctx.job_id}", data={"echo": note, "code": code}),
        reconcile=None,
        target=note,
    )
    raise ValueError(f"upstream refused customer {code}: {note}")


job_kind("tests.leaky", version=1, queue="default", max_attempts=1, timeout_seconds=30, sensitive_fields={"customer_code"})(
    _leaky_body
)


# -- Redaction (tests/integration/test_redaction_sinks.py, tests/acceptance/test_sentry.py) ------


def _careless_body(ctx: JobContext, data: dict[str, Any]) -> None:
    """A body careless with its secrets (tests.planted.Planted.job_input()): it repeats its
    declared-sensitive values and fragments of its prompt and document outside their fields, in
    log messages, log ``extra``, an exception logged with its traceback, its checkpoint, its run
    state, an operation's error and its own errors. Attempt 1 ends Retryable (through the ledger),
    attempt 2 fatal. Every sink must mask what it repeats."""
    import logging

    import sentry_sdk

    from workers import NotPerformed

    log = logging.getLogger("tests.leaky")
    memo, document = data["memo"], data["dossier"]
    log.warning("attempt %s quoting %s", ctx.attempt, memo)  # a log line and a Sentry breadcrumb
    log.info("note: %s", data.get("note", ""), extra={"excerpt": document[200:260], "pin_again": data["pin"]})
    log.error("the model refused %s", data["prompt"][:100], extra={"memo": memo, "request": {"prompt": data["prompt"][:80]}})
    try:
        raise LookupError(f"no clause like {document[len(document) // 2 : len(document) // 2 + 30]} for {data['pin']}")
    except LookupError:
        log.exception("lookup failed for %s", memo)
        sentry_sdk.capture_exception()  # an exception event (a no-op where Sentry is not configured)
    sentry_sdk.capture_message(f"still careless with {memo}")
    ctx.progress(checkpoint=memo, note=data.get("note", ""))
    ctx.heartbeat()  # stores the checkpoint now
    ctx.set_state(last_memo=memo)
    if ctx.attempt == 1:

        def refuse(key: str) -> Any:
            raise NotPerformed(f"the provider refused {memo}")

        ctx.operation("ask", kind="model_call", params={"question": memo}, perform=refuse)
    raise ValueError(f"could not summarise {data['prompt'][:100]} for {data['pin']} ({data.get('note', '')})")


job_kind(
    "leaky",
    version=1,
    queue="default",
    max_attempts=2,
    timeout_seconds=30,
    backoff_base=0.01,
    backoff_cap=0.02,
    sensitive_fields={"pin", "dossier"},
)(_careless_body)


def _logs_exception_body(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Logs one caught exception (raised from another: a chain) that quotes its secrets, with
    ``log.exception`` and with ``log.error(..., exc_info=True)``; then succeeds."""
    import logging

    log = logging.getLogger("tests.logs_exception")
    try:
        try:
            raise ConnectionError(f"cannot reach {data['url']} with {data['token']}")
        except ConnectionError as exc:
            raise LookupError(f"no account for {data['pin']}") from exc
    except LookupError:
        log.exception("charging %s failed", data["pin"])
        log.error("giving up on %s", data["pin"], exc_info=True)
    return {"logged": 2}


job_kind("tests.logs_exception", version=1, queue="default", max_attempts=1, timeout_seconds=30, sensitive_fields={"pin"})(
    _logs_exception_body
)

# -- kinds served by HTTP workers (tests/*/test_api_*) ----------------------------------------------
remote_kind("http.probe", version=1, queue="default", max_attempts=3, timeout_seconds=60.0, sensitive_fields={"secret"})
remote_kind("http.probe", version=2, queue="default", max_attempts=3, timeout_seconds=60.0, sensitive_fields={"secret"})
remote_kind("http.once", version=1, queue="default", delivery=Delivery.AT_MOST_ONCE, max_attempts=1, timeout_seconds=60.0)
remote_kind("http.charge", version=1, queue="default", max_attempts=3, critical={"charge": {"above_minor": 1000}})


# -- Records of unusual shapes (tests/support/odd_shapes.py: the pages that show them) ---------------
#
# A kind of one's own owes Koala nothing about the shape of what it records: its parameters need
# no "currency", its results may be lists or strings, its numbers may sit where another kind has
# text. Every page must show such records as they are, masked, without failing.


def odd_shape(shape: str, secret: str) -> Any:
    """The value ``shape`` names, with ``secret`` (the job's declared-sensitive value) buried in it."""
    if shape == "missing":
        return {}
    if shape == "nested":
        return {"items": [[1, [2, [3, {"deep": [None, [True, f"see {secret}"]]}]]]], "grid": [[0, 1] * 20] * 20}
    if shape == "huge":
        blob = "z" * 60_000 + f" {secret}"
        return {"blob": blob, "big": 10**30, "tiny": -(10**30), "float": 1.7e308, "many": list(range(3000))}
    if shape == "unicode":
        return {
            "名前": "模型调用预算",
            "emoji": "🙂🚀 " * 50,
            "rtl": "مرحبا بالعالم",
            "combining": "e\u0301\u200bz",
            "markup": "<script>alert('x')</script>&amp;",
            "note": f"référence {secret} ✓",
        }
    if shape == "numbers":  # numbers where other kinds keep text
        return {"currency": 978, "to": 42, "model": 3.5, "target": 7, "name": 0, "reason": -1, "memo": secret}
    if shape == "null":
        return {"currency": None, "to": None, "amount": None, "memo": None, "echo": secret}
    if shape == "types":
        return {"currency": ["EUR", "USD"], "flag": True, "when": {"at": None}, "echo": [secret]}
    raise ValueError(f"no shape {shape!r}")


SHAPES = ("missing", "nested", "huge", "unicode", "numbers", "null", "types")


def _shapes_body(ctx: JobContext, data: dict[str, Any]) -> Any:
    """Records what ``data["shape"]`` says everywhere a body can (progress, run state, usage, an
    operation's params, target, result, response and usage, its own result or error), then ends
    as ``data["ending"]`` says: ``succeed``, ``fail`` (an error of that shape), ``attention``
    (an operation whose outcome no lookup can settle) or ``review`` (a critical operation)."""
    from workers import OperationResult, OutcomeUnknown

    secret, ending = data["secret"], data.get("ending", "succeed")
    value = odd_shape(data["shape"], secret)
    numbers = {k: v for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    ctx.progress(**value)
    ctx.heartbeat()  # the checkpoint is stored now, whatever the ending
    ctx.set_state(**value)
    ctx.add_usage(**numbers)

    def perform(key: str) -> OperationResult:
        if ending == "attention" and ctx.attempt == 1:
            raise OutcomeUnknown(f"no answer for {secret} ({data['shape']}) 模型")
        return OperationResult(
            external_id=str(value.get("to", key))[:40],
            data=value,
            usage={"model": "no-such-price", "input_tokens": 3, "odd": value.get("currency")},
            summary={"answer": value},
        )

    ctx.operation(
        "odd step",
        kind="odd.thing",
        params=value,
        perform=perform,
        reconcile=None,
        amount_minor=int(data.get("amount_minor", 1234)),
        target=f"{data['shape']} target ✓",
    )
    if ending == "fail":
        raise ValueError(
            f"the {data['shape']} step went wrong: {json.dumps(value)[:3000]} 模型 <b>{secret}</b> {data.get('note', '')}"
        )
    # Not always an object: nothing, a list, a string or a number is a result too.
    returned: dict[str, Any] = {"missing": None, "nested": value.get("items"), "unicode": value.get("note"), "numbers": 42}
    return returned.get(data["shape"], value)


job_kind(
    "tests.shapes",
    version=1,
    queue="default",
    max_attempts=2,
    timeout_seconds=60,
    backoff_base=0.01,
    backoff_cap=0.02,
    sensitive_fields={"secret"},
    critical={"odd step": lambda params, amount: amount is not None and amount > 100_000},
)(_shapes_body)


# -- values PostgreSQL cannot store (tests/integration/test_unstorable_values.py) ------------------


@job_kind("tests.unstorable", version=1, queue="default", max_attempts=3)
def _unstorable(ctx: JobContext, data: dict[str, Any]) -> Any:
    """Returns, sets or counts what jsonb refuses, as ``data["what"]`` says; or a provider answers it."""
    from workers import OperationResult

    what = data["what"]
    if what == "nan_result":
        return {"score": float("nan")}
    if what == "nul_result":
        return "before\x00after"
    if what == "infinite_state":
        ctx.set_state(ratio=float("inf"))
        return {"ok": True}
    if what == "infinite_usage":
        ctx.add_usage(tokens=float("inf"), calls=1)
        return {"ok": True}
    if what == "provider_nan":
        return ctx.operation(
            "score",
            kind="model_call",
            params={"n": 1},
            perform=lambda key: OperationResult(
                external_id="s1", data={"score": float("nan"), "note": "a\x00b"}, usage={"input_tokens": float("nan")}
            ),
        )
    raise ValueError(what)


def _traced_body(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Records nested spans around a model call through the ledger; ``fail_first`` makes the
    first attempt fail after its spans (Retryable), ``sleep_first`` makes it outlive its lease
    (a reclaim's case), ``secret`` is a declared sensitive value it puts in an attribute."""
    from workers import OperationResult

    if ctx.attempt == 1 and data.get("sleep_first"):
        time.sleep(float(data["sleep_first"]))
    with ctx.span("agent", step="plan", secret=data.get("secret", "")) as agent:
        with ctx.span("draft") as draft:
            draft.add_usage(input_tokens=3, output_tokens=4, model="tiny")
            completion = ctx.operation(
                "complete",
                kind="model_call",
                params={"prompt": "hi"},
                perform=lambda key: OperationResult(
                    external_id=key, data={"text": "hello"}, cost_minor=7, usage={"input_tokens": 11, "output_tokens": 5}
                ),
                reconcile=lambda key: None,
                estimate_minor=7,
                target="tiny-model",
            )
        agent.set(words=len(completion["text"]))
    if ctx.attempt == 1 and data.get("fail_first"):
        raise Retryable("the first attempt fails after its spans")
    return completion


job_kind(
    "tests.traced",
    version=1,
    queue="default",
    max_attempts=3,
    timeout_seconds=30,
    backoff_base=0.01,
    backoff_cap=0.02,
    sensitive_fields={"secret"},
)(_traced_body)
