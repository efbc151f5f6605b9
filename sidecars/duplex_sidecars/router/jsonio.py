"""JSON in and out of the router's hot path: orjson, with the standard library wherever orjson would not give back
exactly what came in (NaN, Infinity, integers beyond 64 bits, lone surrogates, a byte-order mark).

A value parsed by `loads` comes with an `exact` flag; `dumps(value, exact)` then writes it the way it was read, so
the router never changes a number or a string it forwards.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(raw: bytes | str, written_back: bool = True) -> tuple[Any, bool]:
    """Parse JSON; returns (value, exact). `exact` is False when the value needs the standard library to be written
    back unchanged (and may hold NaN). Raises ValueError (or UnicodeDecodeError) for what the standard library
    rejects too, and for a value nested deeper than orjson writes (254 levels) or the standard library recurses.
    `written_back=False` is for values that are only looked at, never written out again: it skips the check that
    orjson kept every integer (beyond 64 bits it reads a float)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _standard_loads(raw), False
    if not written_back:
        return value, True
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # the only value orjson reads and cannot write: one nested too deeply
        raise ValueError(f"JSON nested too deeply: {exc}") from None
    # orjson reads an integer beyond 64 bits as a float, silently; such a float always prints with "e+".
    if lost_precision(encoded):
        return _standard_loads(raw), False
    return value, True


def _standard_loads(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def lost_precision(encoded: bytes) -> bool:
    """Whether orjson output may hold a float that was an integer literal beyond 64 bits (or a string that looks like
    one: then the caller merely takes the slower, always-exact path)."""
    plus = encoded.find(b"+")  # rare in JSON text, unlike "e"
    while plus >= 0:
        if encoded[plus - 1 : plus] == b"e" and encoded[plus + 1 : plus + 2].isdigit():
            return True
        plus = encoded.find(b"+", plus + 1)
    return False


def dumps(value: Any, exact: bool = True) -> bytes:
    """Compact JSON; with exact=False the standard library's writer (for values `loads` could not read exactly)."""
    if exact:
        try:
            return orjson.dumps(value)
        except TypeError:  # an integer beyond 64 bits or a lone surrogate from somewhere else: written as it is
            pass
    return json.dumps(value, separators=(",", ":")).encode()
