"""One input limit per kind, measured one way on every way in.

A job's input is limited in UTF-8 bytes of its JSON (no ``\\u`` escapes: a CJK character is 3
bytes, not 6), to what its kind declares (``max_input_bytes``, the engine's default otherwise).
``model.complete`` advertises prompts of up to MAX_PROMPT_CHARS characters, and its input limit
is derived from that, so a prompt it advertises always fits, whatever its script. The service,
``koala_enqueue``, ``POST /api/v1/jobs`` and django.tasks all take the same inputs and refuse the
same ones with the same message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from api.keys import forget_cached
from effects.kinds import MAX_PROMPT_CHARS
from tests import django_tasks
from tests.support.apikeys import bearer, new_key
from workers import kinds
from workers.errors import EnqueueError
from workers.models import Job
from workers.services.jobs import enqueue

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.web.api_runs_urls")]

CJK = "模型调用预算上限"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget_cached()
    yield
    forget_cached()


def prompt(length: int, alphabet: str = CJK) -> str:
    return (alphabet * (length // len(alphabet) + 1))[:length]


def by_service(data: dict[str, Any]) -> int:
    return enqueue(kind="model.complete", input=data).job_id


def by_command(data: dict[str, Any]) -> int:
    out = StringIO()
    try:
        call_command("koala_enqueue", "model.complete", "--input", json.dumps(data, ensure_ascii=False), stdout=out)
    except CommandError as exc:
        raise EnqueueError(str(exc)) from None
    return int(out.getvalue().split()[0])


def by_api(data: dict[str, Any]) -> int:
    auth = bearer(new_key("execute", name="limits")[1])
    response = Client().post(
        "/api/v1/jobs", json.dumps({"kind": "model.complete", "input": data}), content_type="application/json", **auth
    )
    if response.status_code != 201:
        raise EnqueueError(response.json()["message"])
    return int(response.json()["job_id"])


WAYS_IN: dict[str, Callable[[dict[str, Any]], int]] = {"service": by_service, "command": by_command, "api": by_api}


@pytest.mark.parametrize("way", sorted(WAYS_IN))
@pytest.mark.parametrize(
    "alphabet",
    [CJK, "🙂🚀", "a", '"\\', "\x01\x1f"],
    ids=["cjk", "emoji", "ascii", "escaped", "control"],  # 3, 4, 1, 2 and 6 bytes of JSON a character
)
def test_an_advertised_prompt_of_any_script_enqueues_on_every_way_in(way: str, alphabet: str) -> None:
    data = {"model": "m-small", "prompt": prompt(MAX_PROMPT_CHARS, alphabet), "max_tokens": 4096, "tenant": "acme"}
    job_id = WAYS_IN[way](data)
    assert Job.objects.get(pk=job_id).input["prompt"] == data["prompt"]


@pytest.mark.parametrize("way", sorted(WAYS_IN))
def test_one_character_more_is_refused_naming_the_one_limit(way: str) -> None:
    data = {"model": "m-small", "prompt": prompt(MAX_PROMPT_CHARS + 1)}
    with pytest.raises(EnqueueError, match=f"'prompt' must be a string of 1-{MAX_PROMPT_CHARS} characters"):
        WAYS_IN[way](data)
    assert not Job.objects.exists()


def test_the_input_limit_is_the_kinds_in_utf8_bytes_of_json() -> None:
    noop = kinds.latest("noop")
    assert noop.max_input_bytes == kinds.MAX_INPUT_BYTES
    # 16 KiB of JSON: 5,400 CJK characters (3 bytes each), no longer 2,700 (6 bytes as \\u escapes).
    fits = {"note": prompt((kinds.MAX_INPUT_BYTES - 20) // 3)}
    assert len(json.dumps(fits, ensure_ascii=False).encode()) <= kinds.MAX_INPUT_BYTES
    enqueue(kind="noop", input=fits)
    too_big = {"note": prompt(kinds.MAX_INPUT_BYTES // 3 + 1)}
    size = len(json.dumps(too_big, ensure_ascii=False, separators=(",", ":")).encode())
    limit = kinds.MAX_INPUT_BYTES
    with pytest.raises(EnqueueError, match=f"is {size:,} bytes of JSON .*the limit for noop@1 is {limit:,} bytes"):
        enqueue(kind="noop", input=too_big)
    # django.tasks measures the same way (its kind has the default limit).
    django_tasks.add.enqueue(prompt(5_000), "")  # the arguments need not fit the function until it runs
    with pytest.raises(EnqueueError, match=f"the limit for django.task@1 is {kinds.MAX_INPUT_BYTES:,} bytes"):
        django_tasks.add.enqueue(prompt(6_000), "")
    assert Job.objects.count() == 2


def test_model_complete_declares_a_limit_its_advertised_prompt_fits() -> None:
    kind = kinds.latest("model.complete")
    # The worst a prompt character costs in JSON is 6 bytes (a control character as \\u0001).
    assert kind.max_input_bytes >= 6 * MAX_PROMPT_CHARS
