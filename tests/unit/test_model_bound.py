"""The upper bound a model call reserves: tokens from facts (prompt bytes, max_tokens), priced
from the price table and rounded up, so the price of what a call is billed never exceeds it."""

from __future__ import annotations

import random

import pytest

from devtools.sandbox.provider import count_tokens
from effects.kinds import DEFAULT_MAX_TOKENS, MAX_OUTPUT_TOKENS, _max_tokens, _validate_model_input, token_bound
from effects.providers.http import Endpoint
from effects.providers.models import ModelsClient
from workers.models import ModelPrice
from workers.services.budgets import price_tokens

SAMPLES = {
    "digits": "31415926535897932384626433832795028841971",
    "prose": "The quick brown fox jumps over the lazy dog.",
    "accented": "Crème brûlée à la française, déjà vu",
    "cjk": "模型调用的费用上限",
    "emoji": "🙂🚀🎉🧮👩‍👩‍👧",
    "mixed": "Order #4711: 12 ☕ at 3,50 € — ok?",
    "one byte": "7",
}


@pytest.mark.parametrize("text", SAMPLES.values(), ids=SAMPLES.keys())
def test_input_bound_is_the_prompts_utf8_byte_count(text: str) -> None:
    bound = token_bound(prompt=text, max_tokens=64)
    assert bound == {"input_tokens": len(text.encode("utf-8")), "output_tokens": 64}
    # What the provider bills (a byte-level tokenizer) never exceeds it, whatever the density.
    assert count_tokens(text) <= bound["input_tokens"]


def test_dense_prompts_reach_the_bound_and_prose_stays_far_below() -> None:
    digits, prose = SAMPLES["digits"], SAMPLES["prose"]
    assert count_tokens(digits) == len(digits.encode()) > -(-len(digits.encode()) // 3)  # above bytes / 3
    assert count_tokens("🙂" * 10) == 40 == len(("🙂" * 10).encode())
    assert count_tokens(prose) < len(prose.encode()) / 3


def test_no_text_tokenises_above_its_byte_count() -> None:
    rng = random.Random(9)
    alphabet = "abcXYZ 0123456789.,;\n\t-éüß中文字🙂🚀\u200d€"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        assert 1 <= count_tokens(text) <= token_bound(prompt=text, max_tokens=1)["input_tokens"], repr(text)


def test_output_bound_is_max_tokens_defaulted_and_limited() -> None:
    assert _max_tokens({}) == DEFAULT_MAX_TOKENS == 256
    assert _max_tokens({"max_tokens": MAX_OUTPUT_TOKENS}) == 4096
    for bad in (0, -1, MAX_OUTPUT_TOKENS + 1, 1.5, "64", True, None):
        with pytest.raises(ValueError, match="max_tokens"):
            _validate_model_input({"model": "m", "prompt": "p", "max_tokens": bad})
    with pytest.raises(ValueError, match="max_tokens"):
        token_bound(prompt="p", max_tokens=MAX_OUTPUT_TOKENS + 1)


def test_price_is_rounded_up_and_exact_in_integers() -> None:
    price = ModelPrice(model="m", input_minor_per_mtok=300_000, output_minor_per_mtok=1_500_000)
    assert price_tokens(price, input_tokens=40, output_tokens=64) == 108  # 12 + 96
    assert price_tokens(price, input_tokens=1, output_tokens=0) == 1  # 0.3 rounds up
    assert price_tokens(price, input_tokens=0, output_tokens=0) == 0
    big = ModelPrice(model="m", input_minor_per_mtok=10**12 + 1, output_minor_per_mtok=0)
    assert price_tokens(big, input_tokens=10**6, output_tokens=0) == 10**12 + 1  # no float rounding
    with pytest.raises(ValueError):
        price_tokens(price, input_tokens=-1, output_tokens=0)


def test_the_priced_bound_covers_every_bill_within_it() -> None:
    # Monotone pricing: any (input, output) within the token bound costs at most the bound's price.
    rng = random.Random(3)
    for _ in range(500):
        price = ModelPrice(
            model="m", input_minor_per_mtok=rng.randint(0, 5_000_000), output_minor_per_mtok=rng.randint(0, 20_000_000)
        )
        bound_in, bound_out = rng.randint(1, 80_000), rng.randint(1, MAX_OUTPUT_TOKENS)
        reserved = price_tokens(price, input_tokens=bound_in, output_tokens=bound_out)
        billed = price_tokens(price, input_tokens=rng.randint(0, bound_in), output_tokens=rng.randint(0, bound_out))
        assert billed <= reserved


def test_the_client_never_sends_a_request_without_an_output_bound() -> None:
    # Port 9 on loopback (discard): a request that got past the check would fail differently.
    client = ModelsClient(Endpoint(name="models", base_url="http://127.0.0.1:9", api_key="", timeout=1, connect_timeout=1))
    for bad in (0, MAX_OUTPUT_TOKENS + 1, True, None):
        with pytest.raises(ValueError, match="max_tokens"):
            client.complete(key="k", model="m", prompt="p", max_tokens=bad)  # type: ignore[arg-type]
