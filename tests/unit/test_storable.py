"""koala.storable.written_out: what PostgreSQL refuses, written out so that it can be kept."""

from __future__ import annotations

import json

from koala.storable import json_problem, written_out


def test_what_jsonb_refuses_is_written_out_and_the_rest_kept() -> None:
    value = {
        "nan": float("nan"),
        "up": float("inf"),
        "down": float("-inf"),
        "nul": "a\x00b",
        "lone": "x\udcffy",
        "nested": [1.5, {"k\x00": "v"}],
        "ok": "fine",
        "n": 3,
        "none": None,
        True: "bool key",
    }
    out = written_out(value)
    assert out["nan"] == "NaN" and out["up"] == "Infinity" and out["down"] == "-Infinity"
    assert out["nul"] == "a\ufffdb" and out["lone"] == "x\ufffdy"
    assert out["nested"] == [1.5, {"k\ufffd": "v"}]
    assert (out["ok"], out["n"], out["none"], out[True]) == ("fine", 3, None, "bool key")
    assert json_problem(value) is not None and json_problem(out) is None
    json.dumps(out, allow_nan=False)  # the copy is JSON


def test_a_storable_value_is_returned_as_it_is() -> None:
    value = {"a": [1, "two", {"three": 3.0}]}
    assert written_out(value) == value
