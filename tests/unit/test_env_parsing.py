"""koala.env's value parsers: what each accepts, what falls back to the default, what stops start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from koala import env
from koala.env import ConfigError

NAME = "KOALA_UNIT_T"


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.delenv(f"{NAME}_FILE", raising=False)
    return monkeypatch


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_booleans_that_mean_true(clean: pytest.MonkeyPatch, value: str) -> None:
    clean.setenv(NAME, value)
    assert env.boolean(NAME, default=False) is True


@pytest.mark.parametrize("value", ["0", "false", "False", "no", "OFF"])
def test_booleans_that_mean_false(clean: pytest.MonkeyPatch, value: str) -> None:
    clean.setenv(NAME, value)
    assert env.boolean(NAME, default=True) is False


@pytest.mark.parametrize("value", ["y", "2", "enabled", "truee"])
def test_anything_else_is_not_a_boolean(clean: pytest.MonkeyPatch, value: str) -> None:
    clean.setenv(NAME, value)
    with pytest.raises(ConfigError, match=rf"{NAME}='{value}' is not a boolean"):
        env.boolean(NAME)


@pytest.mark.parametrize(
    ("parse", "default"),
    [
        (lambda: env.boolean(NAME, default=True), True),
        (lambda: env.integer(NAME, 7), 7),
        (lambda: env.number(NAME, 2.5), 2.5),
    ],
)
def test_unset_or_empty_gives_the_default(clean: pytest.MonkeyPatch, parse, default: object) -> None:  # type: ignore[no-untyped-def]
    assert parse() == default
    clean.setenv(NAME, "")
    assert parse() == default


def test_numbers_are_stripped_and_bounded(clean: pytest.MonkeyPatch) -> None:
    clean.setenv(NAME, " 42 ")
    assert env.integer(NAME, 1, minimum=42) == 42
    clean.setenv(NAME, "0.25")
    assert env.number(NAME, 1.0, minimum=0.25) == 0.25
    clean.setenv(NAME, "0.24")
    with pytest.raises(ConfigError, match=rf"{NAME}=0.24 must be at least 0.25"):
        env.number(NAME, 1.0, minimum=0.25)
    clean.setenv(NAME, "4.0")
    with pytest.raises(ConfigError, match="is not an integer"):
        env.integer(NAME, 1)


def test_the_minimum_binds_the_default_too(clean: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=rf"{NAME}=0 must be at least 1"):
        env.integer(NAME, 0, minimum=1)  # no value, wherever it comes from, escapes the bound
    clean.setenv(NAME, "1")
    assert env.integer(NAME, 0, minimum=1) == 1


def test_strings_keep_their_value_and_an_empty_string_is_a_value(clean: pytest.MonkeyPatch) -> None:
    assert env.string(NAME, "fallback") == "fallback"
    clean.setenv(NAME, "")
    assert env.string(NAME, "fallback") == ""  # set but empty: not the default
    clean.setenv(NAME, "  spaced  ")
    assert env.string(NAME) == "  spaced  "  # strings are not stripped (a secret may have spaces)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a,b,c", ["a", "b", "c"]),
        (" a , b ,, c ,", ["a", "b", "c"]),
        ("single", ["single"]),
        ("   ", ["d1", "d2"]),
        ("", ["d1", "d2"]),
    ],
)
def test_string_lists_split_on_commas_and_drop_blanks(clean: pytest.MonkeyPatch, value: str, expected: list[str]) -> None:
    clean.setenv(NAME, value)
    assert env.string_list(NAME, ["d1", "d2"]) == expected


def test_a_string_list_default_is_a_copy(clean: pytest.MonkeyPatch) -> None:
    default = ["d1"]
    got = env.string_list(NAME, default)
    got.append("changed")
    assert default == ["d1"]


def test_a_file_variant_strips_only_the_final_line_break(clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"  two words \r\n")
    clean.setenv(f"{NAME}_FILE", str(secret))
    assert env.raw(NAME) == "  two words "
    secret.write_bytes(b"line one\nline two\n")
    assert env.raw(NAME) == "line one\nline two"


def test_a_file_variant_feeds_the_typed_parsers(clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    number = tmp_path / "n"
    number.write_text("17\n")
    clean.setenv(f"{NAME}_FILE", str(number))
    assert env.integer(NAME, 1) == 17
    number.write_text("seventeen\n")
    with pytest.raises(ConfigError, match=rf"{NAME}='seventeen' is not an integer"):
        env.integer(NAME, 1)


def test_raw_falls_back_to_its_default_only_when_unset(clean: pytest.MonkeyPatch) -> None:
    assert env.raw(NAME, "d") == "d"
    assert env.raw(NAME) is None
    clean.setenv(NAME, "")
    assert env.raw(NAME, "d") == ""
