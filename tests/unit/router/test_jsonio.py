"""JSON in and out: what the router forwards is what it was given, value for value, whichever parser read it."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_sidecars.router.jsonio import dumps, loads, lost_precision

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.booleans())
def test_what_comes_in_goes_out_unchanged(value, spaced):
    raw = json.dumps(value, separators=(", ", ": ") if spaced else (",", ":")).encode()
    parsed, exact = loads(raw)
    assert parsed == value and json.loads(dumps(parsed, exact)) == value
    # integers keep their type and every digit (orjson alone would turn those beyond 64 bits into floats)
    assert json.dumps(json.loads(dumps(parsed, exact))) == json.dumps(value)


@pytest.mark.parametrize(
    "raw",
    [
        b"123456789012345678901234567890",
        b"-9223372036854775809",
        b'{"seed": 1e400}',
        b'{"a": NaN}',
        b"[Infinity, -Infinity]",
        b'"\\ud800"',
        b'\xef\xbb\xbf{"a": 1}',
    ],
)
def test_what_orjson_cannot_read_exactly_takes_the_standard_library(raw):
    parsed, exact = loads(raw)
    assert not exact
    again = json.loads(dumps(parsed, exact))
    expected = json.loads(raw.decode("utf-8-sig"))
    assert json.dumps(again) == json.dumps(expected)  # NaN stays NaN, the big integer keeps its digits


def test_near_the_64_bit_limits_orjson_is_exact():
    for value in (2**63 - 1, -(2**63), 2**64 - 1):
        parsed, exact = loads(str(value).encode())
        assert exact and parsed == value and type(parsed) is int


def test_invalid_json_is_a_value_error():
    for raw in (b"{", b"", b"nope", b"\xff"):
        with pytest.raises(ValueError):
            loads(raw)


def test_lost_precision_looks_for_an_exponent_only():
    assert lost_precision(b"[1.2345678901234568e+29]")
    assert not lost_precision(b'{"a":"C++ and a+b","n":1e-05}')
    assert lost_precision(b'{"t":"wrote 1e+5"}')  # a false alarm merely takes the slower exact path
    parsed, exact = loads(b'{"t":"wrote 1e+5"}')
    assert parsed == {"t": "wrote 1e+5"} and not exact


def test_values_only_read_skip_the_precision_check():
    parsed, exact = loads(b"123456789012345678901234567890", written_back=False)
    assert exact and math.isclose(parsed, 1.2345678901234568e29)


@pytest.mark.parametrize("depth", [255, 300, 2000, 100_000])
def test_json_nested_too_deep_to_write_back_is_a_value_error(depth):
    # orjson writes at most 254 levels, and the standard library recurses once a level: neither may escape as
    # anything but the ValueError invalid JSON is.
    with pytest.raises(ValueError, match="nested too deeply"):
        loads(b"[" * depth + b"]" * depth)


def test_json_nested_as_deep_as_orjson_writes_is_read():
    parsed, exact = loads(b"[" * 254 + b"]" * 254)
    assert exact and dumps(parsed) == b"[" * 254 + b"]" * 254
